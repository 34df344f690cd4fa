"""Hugging Face encoders (BERT family) for sequence classification / regression and extractive QA.

``hf_text`` builds either a pretrained model (``path``: a folder, a bundled name such as ``minilm-l6``, or a
Hub name already in the local cache; nothing is downloaded) or a randomly initialised BERT from a ``preset``
or explicit sizes, optionally initialised from a teacher's layers (``init_from``). The returned
:class:`HFTextModel` takes token inputs as a mapping (``model(x)``) or as keywords (``model(**x)``), picks
its own tokenisation (``inputs``: the student's keys, or the ``teacher.``-prefixed ones) and returns a
plain logits tensor; :meth:`HFTextModel.request_outputs` makes it return a dict with ``hidden_states``,
``attentions`` and ``pooled`` as well, for losses that ask for them.

``transformers`` is imported inside functions only (the models package imports every module).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data.text import load_tokenizer, model_inputs, resolve_pretrained, tokenisation, tokenizer_of
from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, build_model, fraction, input_shape_of, positive_int
from teachkit.options import short_repr
from teachkit.registry import closest

__all__ = ["HEADS", "OUTPUT_NAMES", "PRESETS", "HFTextModel", "check_fits", "check_recorded_fits", "hf_text",
           "max_tokens"]

#: name: (layers, hidden, heads, intermediate)
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "bert-tiny": (2, 128, 2, 512),
    "bert-mini": (4, 256, 4, 1024),
    "bert-small": (4, 512, 8, 2048),
    "bert-medium": (8, 512, 8, 2048),
    "distil-6": (6, 768, 12, 3072),
    "minilm-l6-shape": (6, 384, 12, 1536),
}
HEADS = ("sequence", "qa")
INPUTS = ("student", "teacher")
ATTENTIONS = ("sdpa", "eager")
#: the structured outputs :meth:`HFTextModel.request_outputs` can add to the logits
OUTPUT_NAMES = ("hidden_states", "attentions", "pooled")
#: the inputs passed on to the Hugging Face model (token_type_ids only when its config has several types)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_POSITIONS = 512
#: attention implementation returning the softmax probabilities *before* attention dropout (see below)
PROBS_ATTENTION = "teachkit_probs"
#: model types whose attention is plain scaled dot-product (no relative bias, softcap, sinks): the
#: ``teachkit_probs`` implementation computes exactly their eager attention
_PLAIN_ATTENTION = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert")
#: model types whose position ids start after the padding id: ``pad_token_id + 1`` positions are never inputs
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
_DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "dropout",
                 "attention_dropout", "seq_classif_dropout", "qa_dropout")


def _probs_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **_: Any) -> tuple[Tensor, Tensor]:
    """Eager scaled dot-product attention returning the attention *probabilities* (rows sum to 1) even in
    training, where Hugging Face's eager attention returns them after dropout. query (B, H, Lq, D),
    key/value (B, Hkv, Lk, D); returns the output (B, Lq, H, D) and the probabilities (B, H, Lq, Lk)."""
    if key.shape[1] != query.shape[1]:  # grouped-query attention
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


def _register_probs_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    if PROBS_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PROBS_ATTENTION, _probs_attention)
    if PROBS_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(PROBS_ATTENTION, eager_mask)




def max_tokens(config: Any) -> int | None:
    """The longest input, in tokens, a Hugging Face encoder's position embeddings take: its
    ``max_position_embeddings`` (RoBERTa-type models, whose positions start after the padding id: minus
    ``pad_token_id + 1``); None when it does not say or has no absolute positions (DeBERTa without
    position-biased input)."""
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or isinstance(n, bool):
        return None
    kind = str(getattr(config, "model_type", ""))
    if kind.startswith("deberta") and not getattr(config, "position_biased_input", True):
        return None
    if kind in _OFFSET_POSITIONS:
        n -= int(getattr(config, "pad_token_id", None) or 0) + 1
    return n


class HFTextModel(nn.Module):
    """A Hugging Face encoder (``self.hf``) with a sequence or QA head, called on token inputs.

    ``model(x)`` (``x`` a mapping such as :class:`teachkit.data.text.TokenFeatures`, or an ``input_ids``
    tensor) and ``model(**x)`` are the same. Inputs: ``inputs="student"`` reads the unprefixed keys,
    ``"teacher"`` the ``teacher.``-prefixed ones (prefix stripped; the unprefixed ones when none are
    there). Only ``input_ids``, ``attention_mask`` and (when the config has ``type_vocab_size > 1``)
    ``token_type_ids`` reach the model.

    Output: the logits tensor, (B, C) for ``head="sequence"`` ((B, 1) for regression), (B, L, 2) for
    ``head="qa"`` (``[..., 0]`` start, ``[..., 1]`` end logits; dim 1 is the token position). While
    :meth:`request_outputs` holds names, a dict ``{"logits": ..., <name>: ...}`` with, as requested:

    - ``hidden_states``: tuple of (B, L, H), the embeddings output then every layer's output;
    - ``attentions``: tuple of (B, heads, L, L) attention probabilities per layer (each row sums to 1,
      also in training: taken before attention dropout for the BERT family, see ``_PLAIN_ATTENTION``;
      other model types use Hugging Face's eager attention, whose weights are after dropout in training);
    - ``pooled``: (B, H), the classifier's pooled input before dropout: the BERT pooler's output
      (tanh(W h_CLS)) for sequence heads of models with a pooler, else the last layer's [CLS] hidden
      state (QA heads, models without a pooler).
    """

    def __init__(self, hf: nn.Module, head: str, inputs: str = "student", attention: str = "sdpa") -> None:
        super().__init__()
        self.hf = hf
        self.head = head
        self.inputs = inputs
        self.attention = attention
        self._requested: frozenset[str] = frozenset()
        config = hf.config
        self._model_inputs = tuple(k for k in MODEL_INPUTS
                                   if k != "token_type_ids" or getattr(config, "type_vocab_size", 0) > 1)
        base = getattr(hf, "base_model", hf)
        self._has_pooler = head == "sequence" and isinstance(getattr(base, "pooler", None), nn.Module)
        self.input_kind = "tokens"
        self.tokenizer_name: str | None = None
        #: how messages name this model (``model 'hf_text' (preset 'bert-tiny')``), set by :func:`hf_text`
        self.label = f"model {type(hf).__name__}"
        #: the longest input its position embeddings take (None: no limit known), see :func:`max_tokens`
        self.max_tokens = max_tokens(config)
        self.tap_spec = TapSpec(embedding=self._classifier_path())

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: every token id the model reads must be below it."""
        return int(self.hf.get_input_embeddings().num_embeddings)

    def _classifier_path(self) -> str | None:
        """The Linear mapping the pooled feature to the logits (``hf.classifier`` for BERT-type sequence
        heads; RoBERTa-type heads end in ``classifier.out_proj``); None for QA heads."""
        if self.head != "sequence":
            return None
        clf = getattr(self.hf, "classifier", None)
        if isinstance(clf, nn.Linear):
            return "hf.classifier"
        if isinstance(getattr(clf, "out_proj", None), nn.Linear):
            return "hf.classifier.out_proj"
        return None

    # -- structured outputs ---------------------------------------------------------------------------------
    def request_outputs(self, names: Iterable[str]) -> None:
        """Return ``{"logits", *names}`` from now on (an empty set: the logits tensor again). Names other
        than :data:`OUTPUT_NAMES` are ignored (a tap reading them then reports the fields there are)."""
        names = frozenset([names] if isinstance(names, str) else names)
        self._requested = names
        self._set_attention(PROBS_ATTENTION if "attentions" in names else self.attention)

    @property
    def requested_outputs(self) -> frozenset[str]:
        return self._requested

    def _set_attention(self, impl: str) -> None:
        config = self.hf.config
        if impl == PROBS_ATTENTION:
            if getattr(config, "model_type", None) in _PLAIN_ATTENTION:
                _register_probs_attention()
            else:
                impl = "eager"
        if getattr(config, "_attn_implementation", None) != impl:
            self.hf.set_attn_implementation(impl)

    # -- forward --------------------------------------------------------------------------------------------
    def forward(self, inputs: Mapping[str, Tensor] | Tensor | None = None, **named: Tensor) -> Any:
        x = model_inputs(inputs, named, self.inputs, type(self).__name__)
        args = {k: x[k].long() for k in self._model_inputs if k in x}  # token columns are stored as int32
        length = args["input_ids"].shape[-1]
        if self.max_tokens is not None and length > self.max_tokens:  # else an IndexError deep in the embeddings
            raise ConfigError(f"{self.label} takes at most {self.max_tokens} tokens (its position embeddings) but "
                              f"got a batch of {length}; set data.options.max_length to at most {self.max_tokens}")
        want = self._requested & set(OUTPUT_NAMES)
        if not self._requested:
            return self._logits(self.hf(**args))
        pooled: list[Tensor] = []
        handle = None
        if "pooled" in want and self._has_pooler:
            pooler = self.hf.base_model.pooler
            handle = pooler.register_forward_hook(lambda _m, _a, out: pooled.append(out))
        need_hidden = "hidden_states" in want or ("pooled" in want and not self._has_pooler)
        try:
            out = self.hf(**args, output_hidden_states=need_hidden, output_attentions="attentions" in want)
        finally:
            if handle is not None:
                handle.remove()
        result: dict[str, Any] = {"logits": self._logits(out), **layer_outputs(self.hf, out, want)}
        if "pooled" in want:
            result["pooled"] = pooled[-1] if pooled else out.hidden_states[-1][:, 0]
        return result

    def _logits(self, out: Any) -> Tensor:
        if self.head == "qa":
            return torch.stack([out.start_logits, out.end_logits], dim=-1)
        return out.logits


def layer_outputs(hf: nn.Module, out: Any, want: Iterable[str]) -> dict[str, Any]:
    """The ``hidden_states`` and ``attentions`` tuples of a Hugging Face model's output ``out``, those in ``want``;
    a RuntimeError when attentions were asked for and the attention implementation returned none."""
    fields: dict[str, Any] = {}
    if "hidden_states" in want:
        fields["hidden_states"] = tuple(out.hidden_states)
    if "attentions" in want:
        if out.attentions is None or any(a is None for a in out.attentions):
            raise RuntimeError(f"{type(hf).__name__} returned no attention probabilities with attention "
                               f"implementation {getattr(hf.config, '_attn_implementation', None)!r}")
        fields["attentions"] = tuple(out.attentions)
    return fields


# -- the builder ------------------------------------------------------------------------------------------------
def _choice(option: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"model 'hf_text' option {option!r}={short_repr(value)} is not allowed"
                          f"{closest(str(value), allowed)}; allowed: {', '.join(allowed)}")
    return value


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("model 'hf_text' needs transformers: pip install 'teachkit[text]'") from None
    transformers.utils.logging.set_verbosity_error()  # "newly initialized" notices: the heads are new
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _one_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:200] if str(e).strip() else type(e).__name__


def _set_dropout(config: Any, dropout: float | None) -> None:
    if dropout is None:
        return
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, dropout)


def _on_meta() -> bool:
    return torch.get_default_device().type == "meta"


def _sizes(preset: str | None, layers: Any, hidden: Any, heads: Any, intermediate: Any) -> tuple[int, int, int, int]:
    """(layers, hidden, heads, intermediate) of a preset with overrides, or of explicit sizes."""
    if preset is not None:
        preset = _choice("preset", preset, PRESETS)
        base = PRESETS[preset]
    elif layers is None or hidden is None:
        raise ConfigError("model 'hf_text' needs one of option 'path' (a pretrained model) or 'preset' "
                          f"({', '.join(PRESETS)}) or both 'layers' and 'hidden' (random init)")
    else:
        h = positive_int("hf_text", "hidden", hidden)
        base = (0, h, max(1, h // 64), 4 * h)
    values = []
    for name, value, default in zip(("layers", "hidden", "heads", "intermediate"),
                                    (layers, hidden, heads, intermediate), base, strict=True):
        values.append(default if value is None else positive_int("hf_text", name, value))
    n_layers, n_hidden, n_heads, n_inter = values
    if n_hidden % n_heads:
        raise ConfigError(f"model 'hf_text' option 'heads'={n_heads} must divide 'hidden'={n_hidden}; allowed heads: "
                          f"{', '.join(str(d) for d in range(1, n_hidden + 1) if n_hidden % d == 0 and d <= 64)}")
    return n_layers, n_hidden, n_heads, n_inter


def _check_exclusive(path: Any, sizes: dict[str, Any], init_from: Any, init_every: Any) -> None:
    """``path`` (pretrained) excludes the sizes and ``init_from``/``init_every`` (random init); ``init_every``
    needs ``init_from``; ``path`` is a string."""
    if path is not None:
        given = [k for k, v in sizes.items() if v is not None]
        if given:
            raise ConfigError(f"model 'hf_text' options 'path' and {given[0]!r} exclude each other: 'path' loads a "
                              f"pretrained model, {given[0]!r} sizes a random one")
        for key, value in (("init_from", init_from), ("init_every", init_every)):
            if value is not None:
                raise ConfigError(f"model 'hf_text' option {key!r} applies to random init only (preset or sizes), "
                                  "not with 'path'")
    elif init_every is not None and init_from is None:
        raise ConfigError("model 'hf_text' option 'init_every' needs option 'init_from'")
    if path is not None and not isinstance(path, str):
        raise ConfigError(f"model 'hf_text' option 'path' must be a folder or model name; got {short_repr(path)}")


def _pretrained(transformers: Any, auto: Any, path: str, head: str, num_labels: int, drop: float | None,
                attention: str) -> Any:
    """The pretrained model in ``path`` (loaded offline; on the meta device its architecture only) with a new
    ``head``."""
    folder = resolve_pretrained(path, "model 'hf_text' option 'path'")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, num_labels=num_labels)
    except Exception as e:  # noqa: BLE001 - a broken folder is one line
        raise ConfigError(f"model 'hf_text' option 'path'={path!r}: cannot read a config in {folder!r} "
                          f"({_one_line(e)})") from None
    _set_dropout(config, drop)
    config._attn_implementation = attention
    try:
        if _on_meta():  # the option check builds on the meta device: same architecture, no weights
            return auto.from_config(config, attn_implementation=attention)
        return auto.from_pretrained(folder, config=config, local_files_only=True, attn_implementation=attention)
    except Exception as e:  # noqa: BLE001 - an unsupported architecture or broken weights are one line
        raise ConfigError(f"model 'hf_text' option 'path'={path!r}: cannot load a {head} model from {folder!r} "
                          f"({_one_line(e)})") from None


def _random_bert(transformers: Any, auto: Any, sizes: tuple[int, int, int, int], tokenizer: Any, num_labels: int,
                 drop: float | None, attention: str, init_from: Any,
                 init_every: Any) -> tuple[Any, list[int] | None]:
    """A randomly initialised BERT of ``sizes`` (layers, hidden, heads, intermediate) over ``tokenizer``'s
    vocabulary, with the layers of ``init_from`` copied in when given; (model, teacher layers copied)."""
    n_layers, n_hidden, n_heads, n_inter = sizes
    if not isinstance(tokenizer, str):
        raise ConfigError(f"model 'hf_text' option 'tokenizer' must be a tokenizer name or folder; "
                          f"got {short_repr(tokenizer)}")
    tok = load_tokenizer(tokenizer)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    config = transformers.BertConfig(
        vocab_size=len(tok), hidden_size=n_hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
        intermediate_size=n_inter, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
        pad_token_id=pad, num_labels=num_labels)
    _set_dropout(config, drop)
    teacher = _load_teacher(transformers, init_from, config) if init_from is not None else None
    hf = auto.from_config(config, attn_implementation=attention)
    copied = None
    if teacher is not None:
        k = _init_every(init_every, teacher.config.num_hidden_layers, n_layers)
        copied = [i * k for i in range(n_layers)] if _on_meta() else copy_teacher_layers(hf, teacher, k)
    return hf, copied


@MODELS.register("hf_text", "Hugging Face BERT-family encoder for sequence classification/regression or extractive "
                            "QA: pretrained (path) or random init (preset, sizes, init_from a teacher's layers)")
def hf_text(input_shape: tuple[int, ...], num_classes: int, path: str | None = None, preset: str | None = None,
            head: str = "sequence", layers: int | None = None, hidden: int | None = None, heads: int | None = None,
            intermediate: int | None = None, tokenizer: str = "minilm-l6", init_from: str | None = None,
            init_every: int | None = None, inputs: str = "student", dropout: float | None = None,
            attention: str = "sdpa") -> nn.Module:
    """A Hugging Face encoder with a ``head`` (``sequence``: ``num_classes`` logits, 1 = regression;
    ``qa``: start/end logits per token, (B, L, 2); ``num_classes`` is not used).

    - ``path``: a pretrained model (folder, bundled name such as ``minilm-l6``, or a Hub name in the local
      cache), loaded offline; the head is new (drawn from torch's global RNG). Its tokenizer is ``path``.
    - else a random BERT: ``preset`` (:data:`PRESETS`) with ``layers`` / ``hidden`` / ``heads`` /
      ``intermediate`` overriding it, or ``layers`` and ``hidden`` alone (heads = hidden // 64,
      intermediate = 4 * hidden); vocabulary and pad id from ``tokenizer``; 512 positions.
    - ``init_from`` (random init only): a pretrained BERT (e.g. the teacher) whose embeddings, pooler and
      encoder layers ``0, k, 2k, ...`` (student layer ``i`` <- teacher layer ``i * k``, ``k = init_every``,
      default ``teacher_layers // student_layers``) are copied; hidden size, vocabulary, heads and
      intermediate size must match.
    - ``inputs``: ``student`` or ``teacher`` (read the ``teacher.``-prefixed tokenisation);
      ``dropout``: every dropout probability of the config; ``attention``: ``sdpa`` or ``eager``.
    """
    dims = input_shape_of(input_shape, "hf_text")
    head = _choice("head", head, HEADS)
    inputs = _choice("inputs", inputs, INPUTS)
    attention = _choice("attention", attention, ATTENTIONS)
    drop = None if dropout is None else fraction("hf_text", "dropout", dropout)
    sizes = {"preset": preset, "layers": layers, "hidden": hidden, "heads": heads, "intermediate": intermediate}
    _check_exclusive(path, sizes, init_from, init_every)
    transformers = _import_transformers()
    copied: list[int] | None = None
    num_labels = 2 if head == "qa" else num_classes
    auto = (transformers.AutoModelForQuestionAnswering if head == "qa"
            else transformers.AutoModelForSequenceClassification)
    if path is not None:
        hf = _pretrained(transformers, auto, path, head, num_labels, drop, attention)
        tokenizer_name, source = path, f"path {path!r}"
    else:
        n_layers, n_hidden, n_heads, n_inter = _sizes(preset, layers, hidden, heads, intermediate)
        hf, copied = _random_bert(transformers, auto, (n_layers, n_hidden, n_heads, n_inter), tokenizer, num_labels,
                                  drop, attention, init_from, init_every)
        tokenizer_name = tokenizer
        source = f"preset {preset!r}" if preset is not None else f"{n_layers} layers x {n_hidden}"
    max_pos = max_tokens(hf.config)
    if len(dims) == 1 and max_pos is not None and dims[0] > max_pos:
        raise ConfigError(f"model 'hf_text' ({source}) takes sequences of at most {max_pos} tokens; the data has "
                          f"{dims[0]}: set data.options.max_length to at most {max_pos}")
    model = HFTextModel(hf, head, inputs, attention)
    model.tokenizer_name = tokenizer_name
    model.label = f"model 'hf_text' ({source})"
    #: the teacher layer each student layer was copied from (init_from), else None
    model.init_from_layers = copied
    return model


def _load_teacher(transformers: Any, init_from: Any, config: Any) -> Any:
    """The base model (weights, or on the meta device only its config) named by ``init_from``, checked
    against the student ``config``: same model type (bert), hidden size, vocabulary, heads, ffn size."""

    if not isinstance(init_from, str):
        raise ConfigError(f"model 'hf_text' option 'init_from' must be a folder or model name; "
                          f"got {short_repr(init_from)}")
    folder = resolve_pretrained(init_from, "model 'hf_text' option 'init_from'")
    try:
        tconf = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"model 'hf_text' option 'init_from'={init_from!r}: cannot read a config in {folder!r} "
                          f"({_one_line(e)})") from None
    if tconf.model_type != "bert":
        raise ConfigError(f"model 'hf_text' option 'init_from'={init_from!r} is a {tconf.model_type!r} model; "
                          "layers can be copied from a 'bert' model only")
    for what, key in (("hidden size", "hidden_size"), ("vocabulary size", "vocab_size"),
                      ("attention heads", "num_attention_heads"), ("intermediate size", "intermediate_size"),
                      ("positions", "max_position_embeddings"), ("token types", "type_vocab_size")):
        t, s = getattr(tconf, key), getattr(config, key)
        if t != s:
            raise ConfigError(f"model 'hf_text' option 'init_from'={init_from!r}: the teacher's {what} is {t}, the "
                              f"student's {s}; they must match to copy layers")
    if _on_meta():
        return transformers.AutoModel.from_config(tconf)
    try:
        return transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"model 'hf_text' option 'init_from'={init_from!r}: cannot load weights from {folder!r} "
                          f"({_one_line(e)})") from None


def _init_every(init_every: Any, teacher_layers: int, student_layers: int) -> int:
    if init_every is None:
        k = teacher_layers // student_layers
        if k < 1:
            raise ConfigError(f"model 'hf_text' option 'init_from': the teacher has {teacher_layers} layers, fewer "
                              f"than the student's {student_layers}")
        return k
    k = positive_int("hf_text", "init_every", init_every)
    if (student_layers - 1) * k >= teacher_layers:
        raise ConfigError(f"model 'hf_text' option 'init_every'={k}: student layer {student_layers - 1} would copy "
                          f"teacher layer {(student_layers - 1) * k}, but the teacher has {teacher_layers} layers; "
                          f"allowed: 1..{max(1, (teacher_layers - 1) // max(1, student_layers - 1))}")
    return k


@torch.no_grad()
def copy_teacher_layers(student: nn.Module, teacher: nn.Module, every: int) -> list[int]:
    """Copy ``teacher``'s embeddings, its pooler (when both have one) and encoder layer ``i * every`` into
    ``student``'s layer ``i`` (BERT-type base models); returns the teacher layers copied, in student order."""
    s_base, t_base = student.base_model, getattr(teacher, "base_model", teacher)
    s_base.embeddings.load_state_dict(t_base.embeddings.state_dict())
    copied = []
    for i, layer in enumerate(s_base.encoder.layer):
        layer.load_state_dict(t_base.encoder.layer[i * every].state_dict())
        copied.append(i * every)
    s_pool, t_pool = getattr(s_base, "pooler", None), getattr(t_base, "pooler", None)
    if isinstance(s_pool, nn.Module) and isinstance(t_pool, nn.Module):
        s_pool.load_state_dict(t_pool.state_dict())
    return copied


def check_fits_splits(model: nn.Module, splits: Iterable[Any], train_x: Any, dataset: str) -> None:
    """:func:`check_fits` on the evaluated ``splits``' inputs and the training inputs ``train_x`` (when given),
    naming the model by its ``label``: what a text task's evaluator checks before a run."""
    xs = [s.x for s in splits] + ([] if train_x is None else [train_x])
    check_fits(model, xs, getattr(model, "label", "the model"), dataset)


def check_fits(model: nn.Module, features: Iterable[Any], who: str, dataset: str, side: str | None = None) -> None:
    """A one-line ConfigError when tokenised ``features`` (the splits' ``x``) cannot go through text ``model``:
    their ``max_length`` is more than its position embeddings take, or their largest token id (in the
    tokenisation the model reads: ``side``, default its own ``inputs``) has no row in its embedding (an
    IndexError deep in the model otherwise). ``who`` names the model in the message; models other than
    :class:`HFTextModel` and data other than tokens pass."""
    if not isinstance(model, HFTextModel):
        return
    xs = [x for x in features if hasattr(x, "inputs") and hasattr(x, "max_length")]
    if not xs:
        return
    side = side or model.inputs
    limit, length = model.max_tokens, max(int(x.max_length) for x in xs)
    if limit is not None and length > limit:
        raise ConfigError(f"data.options.max_length={length} is more than {who} takes: at most {limit} tokens (its "
                          f"position embeddings); set data.options.max_length to at most {limit}")
    largest = -1
    for x in xs:
        ids = tokenisation(x.inputs, side).get("input_ids")
        if isinstance(ids, Tensor) and ids.numel():
            largest = max(largest, int(ids.max()))
    vocab = model.vocab_size
    if largest >= vocab:
        tok = tokenizer_of(xs[0], side)
        named = f" of tokenizer {tok['name']!r}" if tok else ""
        fix = ("set data.options.teacher_tokenizer to the tokenizer the teacher was trained with" if side == "teacher"
               else "give the model the data's tokenizer (model.options.tokenizer or path) or the data the model's "
                    "(data.options.tokenizer)")
        raise ConfigError(f"{who} has a vocabulary of {vocab} token ids (0..{vocab - 1}) but dataset {dataset!r} "
                          f"gives it ids up to {largest}{named}; {fix}")


def check_recorded_fits(state: Mapping[str, Any], features: Iterable[Any], who: str, dataset: str,
                        side: str | None = None) -> None:
    """:func:`check_fits` for the ``hf_text`` model a checkpoint's ``state`` records (``model``, ``input_shape``,
    ``num_classes``), built on the meta device (its config only, no weights); other models pass."""
    model = state.get("model")
    if not isinstance(model, Mapping) or model.get("name") != "hf_text":
        return
    options = model.get("options") if isinstance(model.get("options"), Mapping) else {}
    with torch.device("meta"):
        built = build_model("hf_text", tuple(state["input_shape"]), int(state["num_classes"]), **options)
    check_fits(built, features, who, dataset, side)
