"""Hugging Face decoder-only language models (task ``causal_lm``): ``hf_causal_lm`` and :class:`HFCausalLM`.

``hf_causal_lm`` builds either a pretrained model (``path``: a folder or a Hub name already in the local cache,
loaded offline with ``AutoModelForCausalLM``; on the meta device its architecture only) or a randomly initialised
one from a ``preset`` and/or sizes: ``family`` ``llama`` (LlamaConfig: RMSNorm, rotary positions, SwiGLU;
Touvron et al. 2023) or ``gpt2`` (GPT2Config: LayerNorm, learned positions, GELU; Radford et al. 2019), over the
dataset's vocabulary (``num_classes``). Options add gradient checkpointing, the weights' dtype, the attention
implementation and LoRA adapters (Hu et al. 2022, through ``peft``).

The model returns its logits *packed* (the design of :mod:`teachkit.data.lm`): the decoder body runs on the whole
batch, the hidden states at ``target_mask`` (the positions whose next token is a target) are gathered row-major
and only those rows go through the output head, so row r of the (N_tokens, V) logits predicts the batch's r-th
target token and every per-sample loss is a per-token loss. Key/value-cached decoding is :meth:`HFCausalLM.
decode_step` (used by :mod:`teachkit.models.lm_generate`).

``transformers`` and ``peft`` are imported inside functions only (the models package imports every module).
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data.text import model_inputs, resolve_pretrained
from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec, unwrap
from teachkit.models.text import layer_outputs
from teachkit.models.zoo import MODELS, first_line, fraction, input_shape_of, positive_int
from teachkit.options import short_repr
from teachkit.registry import closest

__all__ = ["OUTPUT_NAMES", "PRESETS", "HFCausalLM", "OutputHead", "cache_names", "causal_lm_of", "hf_causal_lm",
           "is_causal_lm", "save_adapter", "save_pretrained"]

NAME = "hf_causal_lm"
#: name: (family, layers, hidden, heads, intermediate)
PRESETS: dict[str, tuple[str, int, int, int, int]] = {
    "llama-tiny": ("llama", 2, 64, 2, 172),
    "llama-mini": ("llama", 4, 128, 4, 344),
    "llama-small": ("llama", 12, 256, 4, 688),
    "gpt2-tiny": ("gpt2", 2, 64, 2, 256),
    "gpt2-mini": ("gpt2", 4, 128, 4, 512),
    "gpt2-small": ("gpt2", 12, 256, 4, 1024),
}
FAMILIES = ("llama", "gpt2")
INPUTS = ("student", "teacher")
ATTENTIONS = ("sdpa", "eager")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the structured outputs :meth:`HFCausalLM.request_outputs` can add to the logits
OUTPUT_NAMES = ("hidden_states", "attentions")
MAX_POSITIONS = 512
#: LoRA's target modules by family when ``lora.target_modules`` is not given
LORA_TARGETS = {"llama": ("q_proj", "k_proj", "v_proj", "o_proj"), "gpt2": ("c_attn", "c_proj")}
LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "summary_first_dropout", "mlp_dropout")


# -- the KV-cache keyword: ``cache`` (transformers 5.x) or ``past_key_values`` (4.x) ---------------------------
@functools.lru_cache(maxsize=64)
def _cache_names_of(forward: Any) -> tuple[str, str]:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "cache" in params:
        return "cache", "cache"
    return "past_key_values", "past_key_values"


def cache_names(module: nn.Module) -> tuple[str, str]:
    """(forward keyword, output field) of a Hugging Face model's key/value cache: ``("cache", "cache")`` in
    transformers 5.x, ``("past_key_values", "past_key_values")`` in 4.x; read once per class from the signature of
    its ``forward``."""
    return _cache_names_of(type(module).forward)


def max_positions_of(config: Any) -> int | None:
    """The longest sequence (prompt + response) the model's positions take: ``max_position_embeddings``
    (GPT-2's ``n_positions``); None when the config does not say."""
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def positions_from_mask(mask: Tensor) -> Tensor:
    """Position ids (B, L) int64 counting real tokens only: left or right padding gives every real token its
    position in its own sequence (padding positions get 0 or repeat the last; they are never read)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class OutputHead(nn.Module):
    """The output projection as the model applies it: ``hf``'s output embedding (weights stay at their Hugging
    Face path, so this module holds none and adds no state_dict keys), then the logit transform the config
    declares (Gemma-2's ``final_logit_softcapping``: ``c * tanh(z / c)``; Cohere's ``logit_scale``; Granite's
    ``logits_scaling`` divisor), then the first ``width`` columns when the head is wider (a padded vocabulary).
    Its input is the hidden state each logit row comes from (the ``embedding`` tap), its output the logits."""

    def __init__(self, hf: nn.Module, width: int | None = None) -> None:
        super().__init__()
        self._hf = (hf,)  # a tuple: not a registered submodule (its weights belong to HFCausalLM.hf)
        self.width = width
        config = hf.config
        kind = str(getattr(config, "model_type", ""))
        cap = getattr(config, "final_logit_softcapping", None)
        self.softcap = float(cap) if isinstance(cap, (int, float)) and cap else None
        self.scale: float | None = None
        if kind.startswith("cohere") and isinstance(getattr(config, "logit_scale", None), (int, float)):
            self.scale = float(config.logit_scale)
        elif kind.startswith("granite") and isinstance(getattr(config, "logits_scaling", None), (int, float)):
            self.scale = 1.0 / float(config.logits_scaling)

    def forward(self, hidden: Tensor) -> Tensor:
        logits = self._hf[0].get_output_embeddings()(hidden)
        if self.width is not None and logits.shape[-1] > self.width:
            logits = logits[..., : self.width]
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def extra_repr(self) -> str:
        return f"width={self.width}, softcap={self.softcap}, scale={self.scale}"


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM (``self.hf``) returning packed per-target-token logits.

    ``model(x)`` (``x`` a mapping such as :class:`teachkit.data.lm.LMText`, or an ``input_ids`` tensor) and
    ``model(**x)`` are the same. ``inputs="student"`` reads the unprefixed keys, ``"teacher"`` the
    ``teacher.``-prefixed ones (:func:`teachkit.data.text.tokenisation`). With ``target_mask`` the output is
    (N_tokens, V): the logits at the True positions, row-major; without it (B, L, V). While
    :meth:`request_outputs` holds names, a dict ``{"logits": ..., <name>: ...}`` with ``hidden_states`` (tuple of
    (B, L, H): the embeddings, then every layer) and/or ``attentions`` (tuple of (B, heads, L, L), eager attention).
    The ``embedding`` tap names :attr:`head` (an :class:`OutputHead`): its input is the packed (N, H) hidden state.
    With LoRA, :attr:`peft_model` is the ``peft`` wrapper (not a registered submodule: state_dict keys are
    ``hf.*`` either way) and the base weights are frozen.
    """

    def __init__(self, hf: nn.Module, inputs: str = "student", attention: str = "sdpa",
                 width: int | None = None) -> None:
        super().__init__()
        self.hf = hf
        self.head = OutputHead(hf, width)
        self.inputs = inputs
        self.attention = attention
        self._requested: frozenset[str] = frozenset()
        self._peft: tuple[Any, ...] = ()
        self.input_kind = "tokens"
        #: the tokenizer the model was trained with (``path`` models), else None
        self.tokenizer_name: str | None = None
        #: how messages name this model (``model 'hf_causal_lm' (preset 'llama-tiny')``)
        self.label = f"model {type(hf).__name__}"
        #: the longest sequence its positions take (None: no limit known)
        self.max_tokens = max_positions_of(hf.config)
        self.tap_spec = TapSpec(embedding="head")

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: every token id the model reads must be below it."""
        return int(self.hf.get_input_embeddings().num_embeddings)

    @property
    def num_logits(self) -> int:
        """Columns of the logits."""
        out = int(self.hf.get_output_embeddings().out_features)
        return min(out, self.head.width) if self.head.width is not None else out

    @property
    def peft_model(self) -> Any:
        """The ``peft.PeftModel`` wrapping :attr:`hf` (LoRA), else None."""
        return self._peft[0] if self._peft else None

    def attach_peft(self, peft_model: Any) -> None:
        """Keep ``peft_model`` (whose underlying model is :attr:`hf`) without registering it as a submodule."""
        self._peft = (peft_model,)

    # -- structured outputs ---------------------------------------------------------------------------------
    def request_outputs(self, names: Iterable[str]) -> None:
        """Return ``{"logits", *names}`` from now on (an empty set: the logits tensor again); attentions switch
        the model to eager attention while requested. Names other than :data:`OUTPUT_NAMES` are ignored."""
        names = frozenset([names] if isinstance(names, str) else names)
        self._requested = names
        self._set_attention("eager" if "attentions" in names else self.attention)

    @property
    def requested_outputs(self) -> frozenset[str]:
        return self._requested

    def _set_attention(self, impl: str) -> None:
        config = self.hf.config
        if getattr(config, "_attn_implementation", None) == impl:
            return
        setter = getattr(self.hf, "set_attn_implementation", None)
        if callable(setter):
            setter(impl)
        else:  # transformers 4.4x: sdpa falls back to eager by itself when asked for attentions
            config._attn_implementation = impl

    # -- forward --------------------------------------------------------------------------------------------
    def check_length(self, length: int) -> None:
        """A one-line ConfigError when ``length`` tokens do not fit the model's positions."""
        if self.max_tokens is not None and length > self.max_tokens:
            raise ConfigError(f"{self.label} takes at most {self.max_tokens} tokens (its position embeddings) but got "
                              f"a batch of {length}; set data.options.max_length to at most {self.max_tokens}")

    def forward(self, inputs: Mapping[str, Tensor] | Tensor | None = None, **named: Tensor) -> Any:
        x = model_inputs(inputs, named, self.inputs, self.label)
        ids = x["input_ids"].long()  # token columns are stored as int32
        self.check_length(ids.shape[-1])
        mask = x.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask.long()
        want = self._requested & set(OUTPUT_NAMES)
        extra = {"output_hidden_states": True} if "hidden_states" in want else {}
        if "attentions" in want:
            extra["output_attentions"] = True
        out = self.hf.base_model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                                 use_cache=False, **extra)
        hidden = out.last_hidden_state
        target = x.get("target_mask")
        if target is not None:
            hidden = hidden[target.bool()]
        logits = self.head(hidden)
        if not self._requested:
            return logits
        return {"logits": logits, **layer_outputs(self.hf, out, want)}

    def decode_step(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                    cache: Any = None) -> tuple[Tensor, Any]:
        """One cached decoding step: the new tokens ``input_ids`` (B, S) with the mask of the cached and new
        positions (B, C + S) and their position ids (B, S); returns the last position's logits (B, V) in float32
        (after the output head's transform and width) and the updated cache."""
        base = self.hf.base_model
        keyword, field = cache_names(base)
        out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                   **{keyword: cache})
        return self.head(out.last_hidden_state[:, -1]).float(), getattr(out, field)


def is_causal_lm(model: nn.Module) -> bool:
    """True for a causal LM (an :class:`HFCausalLM`, possibly inside DDP / torch.compile / FrozenTeacher)."""
    return isinstance(unwrap(model), HFCausalLM)


def causal_lm_of(model: nn.Module) -> HFCausalLM:
    """The :class:`HFCausalLM` inside ``model`` (DDP, torch.compile, a FrozenTeacher's ``.module``)."""
    inner = unwrap(model)
    if not isinstance(inner, HFCausalLM) and isinstance(getattr(inner, "module", None), nn.Module):
        inner = unwrap(inner.module)
    if not isinstance(inner, HFCausalLM):
        raise ConfigError(f"model {type(inner).__name__} is not a causal language model (hf_causal_lm)")
    return inner


# -- saving ---------------------------------------------------------------------------------------------------
def save_adapter(model: nn.Module, folder: str | Path) -> Path:
    """Write the model's LoRA adapter with peft's ``save_pretrained`` (``adapter_config.json`` and
    ``adapter_model.safetensors``) into ``folder``; a ConfigError for a model without LoRA."""
    lm = causal_lm_of(model)
    if lm.peft_model is None:
        raise ConfigError(f"{lm.label} has no LoRA adapter to save; build it with model.options.lora")
    folder = Path(folder)
    lm.peft_model.save_pretrained(str(folder))
    return folder


def save_pretrained(model: nn.Module, folder: str | Path) -> Path:
    """Write a full Hugging Face model folder (``config.json`` and weights) loadable with
    ``AutoModelForCausalLM.from_pretrained`` (and ``hf_causal_lm`` ``path``). LoRA adapters are merged into a copy
    of the weights (``merge_and_unload``), so the folder needs no peft; the model itself is unchanged. The head
    keeps its full width; the tokenizer files are the data's (``tokenizer.json`` in the run folder)."""
    lm = causal_lm_of(model)
    folder = Path(folder)
    hf = copy.deepcopy(lm.peft_model).merge_and_unload() if lm.peft_model is not None else lm.hf
    hf.save_pretrained(str(folder))
    return folder


# -- the builder ------------------------------------------------------------------------------------------------
def _choice(option: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"model {NAME!r} option {option!r}={short_repr(value)} is not allowed"
                          f"{closest(str(value), allowed)}; allowed: {', '.join(allowed)}")
    return value


def _flag(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"model {NAME!r} option {option!r} must be true or false; got {short_repr(value)}")
    return value


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"model {NAME!r} needs transformers: pip install 'teachkit[lm]'") from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _on_meta() -> bool:
    return torch.get_default_device().type == "meta"


def _set_dropout(config: Any, dropout: float) -> None:
    for key in _DROPOUT_KEYS:
        if isinstance(getattr(config, key, None), (int, float)) and not isinstance(getattr(config, key), bool):
            setattr(config, key, dropout)


def _dtype_keyword(transformers: Any) -> str:
    """``dtype`` (transformers >= 4.56) or ``torch_dtype`` (older) for ``from_pretrained``."""
    try:
        major, minor = (int(p) for p in str(transformers.__version__).split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _check_exclusive(path: Any, random_only: dict[str, Any]) -> None:
    """``path`` (pretrained) excludes the options that size a random model; ``path`` is a string."""
    if path is None:
        return
    if not isinstance(path, str):
        raise ConfigError(f"model {NAME!r} option 'path' must be a folder or model name; got {short_repr(path)}")
    given = [k for k, v in random_only.items() if v is not None]
    if given:
        raise ConfigError(f"model {NAME!r} options 'path' and {given[0]!r} exclude each other: 'path' loads a "
                          f"pretrained model, {given[0]!r} sizes a random one")


def _sizes(preset: Any, family: Any, layers: Any, hidden: Any, heads: Any,
           intermediate: Any) -> tuple[str, int, int, int, int]:
    """(family, layers, hidden, heads, intermediate) of a preset with overrides, or of explicit sizes."""
    if preset is not None:
        base = PRESETS[_choice("preset", preset, PRESETS)]
        if family is not None and _choice("family", family, FAMILIES) != base[0]:
            raise ConfigError(f"model {NAME!r} option 'family'={family!r} contradicts preset {preset!r} (a "
                              f"{base[0]} model); drop one of them")
    elif layers is None or hidden is None:
        raise ConfigError(f"model {NAME!r} needs one of option 'path' (a pretrained model) or 'preset' "
                          f"({', '.join(PRESETS)}) or both 'layers' and 'hidden' (random init)")
    else:
        fam = "llama" if family is None else _choice("family", family, FAMILIES)
        h = positive_int(NAME, "hidden", hidden)
        # SwiGLU's ~8/3 h (its three matrices cost about what GPT-2's two 4h ones do), as the llama presets
        base = (fam, 0, h, max(1, h // 64), 4 * -(-43 * h // 64) if fam == "llama" else 4 * h)
    values = [default if value is None else positive_int(NAME, name, value) for name, value, default in
              zip(("layers", "hidden", "heads", "intermediate"), (layers, hidden, heads, intermediate), base[1:],
                  strict=True)]
    n_layers, n_hidden, n_heads, n_inter = values
    if n_hidden % n_heads or (base[0] == "llama" and (n_hidden // n_heads) % 2):
        even = " with an even quotient (rotary positions)" if base[0] == "llama" else ""
        allowed = [d for d in range(1, min(n_hidden, 64) + 1)
                   if n_hidden % d == 0 and (base[0] != "llama" or (n_hidden // d) % 2 == 0)]
        raise ConfigError(f"model {NAME!r} option 'heads'={n_heads} must divide 'hidden'={n_hidden}{even}; allowed "
                          f"heads: {', '.join(map(str, allowed))}")
    return base[0], n_layers, n_hidden, n_heads, n_inter


def _random_config(transformers: Any, sizes: tuple[str, int, int, int, int], vocab: int, kv_heads: Any,
                   positions: int, dropout: float, tie: bool) -> Any:
    """The config of a random ``llama`` or ``gpt2`` model of ``sizes`` over ``vocab`` token ids."""
    family, n_layers, n_hidden, n_heads, n_inter = sizes
    if family == "gpt2":
        if kv_heads is not None:
            raise ConfigError(f"model {NAME!r} option 'kv_heads' applies to family 'llama' only (grouped-query "
                              "attention); gpt2 has as many key/value heads as heads")
        return transformers.GPT2Config(
            vocab_size=vocab, n_embd=n_hidden, n_layer=n_layers, n_head=n_heads, n_inner=n_inter,
            n_positions=positions, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
            tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    kv = n_heads if kv_heads is None else positive_int(NAME, "kv_heads", kv_heads)
    if n_heads % kv:
        raise ConfigError(f"model {NAME!r} option 'kv_heads'={kv} must divide 'heads'={n_heads}; allowed: "
                          f"{', '.join(str(d) for d in range(1, n_heads + 1) if n_heads % d == 0)}")
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=n_hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
        num_key_value_heads=kv, intermediate_size=n_inter, max_position_embeddings=positions,
        attention_dropout=dropout, tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _pretrained(transformers: Any, path: str, dropout: float, attention: str, dtype: torch.dtype) -> Any:
    """The pretrained causal LM in ``path``, loaded offline (on the meta device: its architecture only)."""
    folder = resolve_pretrained(path, f"model {NAME!r} option 'path'")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a broken folder is one line
        raise ConfigError(f"model {NAME!r} option 'path'={path!r}: cannot read a config in {folder!r} "
                          f"({first_line(e)})") from None
    _set_dropout(config, dropout)
    auto = transformers.AutoModelForCausalLM
    try:
        if _on_meta():
            return _with_attention(auto.from_config, attention, config)
        return _with_attention(auto.from_pretrained, attention, folder, config=config, local_files_only=True,
                               **{_dtype_keyword(transformers): dtype})
    except Exception as e:  # noqa: BLE001 - an unsupported architecture or broken weights are one line
        raise ConfigError(f"model {NAME!r} option 'path'={path!r}: cannot load a causal language model from "
                          f"{folder!r} ({first_line(e)})") from None


def _with_attention(build: Any, attention: str, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, attn_implementation=attention, **kwargs)``; an architecture without SDPA support (GPT-2
    before transformers 4.44) gets eager attention, which computes the same."""
    try:
        return build(*args, attn_implementation=attention, **kwargs)
    except ValueError as e:
        if attention != "sdpa" or "sdpa" not in str(e).lower():
            raise
        return build(*args, attn_implementation="eager", **kwargs)


@torch.no_grad()
def _check_head(model: HFCausalLM, path: str) -> None:
    """The packed head reproduces the Hugging Face model's own logits on a short input (a model type whose
    ``ForCausalLM`` transforms its logits in a way :class:`OutputHead` does not know is one line, not silent)."""
    was = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids = torch.arange(min(4, model.vocab_size), device=device)[None]
        ours = model(input_ids=ids).float()
        theirs = model.hf(input_ids=ids).logits.float()[..., : ours.shape[-1]]
    finally:
        model.train(was)
    if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=2e-2, atol=2e-2 * (1 + float(
            theirs.abs().max()))):
        raise ConfigError(f"model {NAME!r} option 'path'={path!r}: its model type "
                          f"{getattr(model.hf.config, 'model_type', '?')!r} computes its logits in a way hf_causal_lm "
                          "does not reproduce (a logit transform it does not know)")


def _lora_options(lora: Any, model_type: str, hf: nn.Module) -> dict[str, Any]:
    """``lora`` (a mapping with r, alpha, dropout, target_modules) checked, with the family's default targets."""
    if not isinstance(lora, Mapping):
        raise ConfigError(f"model {NAME!r} option 'lora' must be null or a mapping with keys {', '.join(LORA_KEYS)}; "
                          f"got {short_repr(lora)}")
    bad = [k for k in lora if k not in LORA_KEYS]
    if bad:
        raise ConfigError(f"model {NAME!r} option 'lora' has no key {bad[0]!r}{closest(str(bad[0]), LORA_KEYS)}; "
                          f"allowed: {', '.join(LORA_KEYS)}")
    r = positive_int(NAME, "lora.r", lora.get("r", 8))
    alpha = lora.get("alpha", 16)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ConfigError(f"model {NAME!r} option 'lora.alpha' must be a number > 0; got {short_repr(alpha)}")
    drop = fraction(NAME, "lora.dropout", lora.get("dropout", 0.0))
    targets = lora.get("target_modules")
    if targets is None:
        family = "gpt2" if model_type == "gpt2" else "llama"
        names = {p.rsplit(".", 1)[-1] for p, _ in hf.named_modules()}
        if not set(LORA_TARGETS[family]) & names:
            raise ConfigError(f"model {NAME!r} option 'lora': no default target modules for model type "
                              f"{model_type!r}; name them in lora.target_modules")
        targets = list(LORA_TARGETS[family])
    elif isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ConfigError(f"model {NAME!r} option 'lora.target_modules' must be a list of module names; "
                          f"got {short_repr(targets)}")
    return {"r": r, "lora_alpha": alpha, "lora_dropout": drop, "target_modules": list(targets),
            "fan_in_fan_out": model_type == "gpt2"}


def _add_lora(model: HFCausalLM, lora: Any) -> None:
    """Inject LoRA adapters (Hu et al. 2022) into ``model.hf`` in place with ``peft``: the base weights freeze,
    the adapters train; the PeftModel is kept off the module tree."""
    kind = str(getattr(model.hf.config, "model_type", ""))
    options = _lora_options(lora, kind, model.hf)
    try:
        import peft
    except ImportError:
        raise ConfigError(f"model {NAME!r} option 'lora' needs peft: pip install 'teachkit[lm]'") from None
    config = peft.LoraConfig(task_type="CAUSAL_LM", bias="none", **options)
    try:
        with warnings.catch_warnings():  # peft calls transformers APIs 5.x deprecates
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.get_peft_model(model.hf, config)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"model {NAME!r} option 'lora': {first_line(e)}") from None
    model.attach_peft(wrapped)


@MODELS.register(NAME, "Hugging Face causal language model (decoder only): pretrained (path) or random llama / gpt2 "
                       "(preset, sizes); packed logits per target token, LoRA, gradient checkpointing")
def hf_causal_lm(input_shape: tuple[int, ...], num_classes: int, path: str | None = None, preset: str | None = None,
                 family: str | None = None, layers: int | None = None, hidden: int | None = None,
                 heads: int | None = None, kv_heads: int | None = None, intermediate: int | None = None,
                 max_positions: int | None = None, dropout: float = 0.0, tie_embeddings: bool | None = None,
                 gradient_checkpointing: bool = False, dtype: str = "float32", attention: str = "sdpa",
                 inputs: str = "student", lora: dict[str, Any] | None = None) -> nn.Module:
    """A Hugging Face causal LM returning packed logits (module docstring).

    - ``path``: a pretrained model (folder, or a Hub name in the local cache), loaded offline; its tokenizer is
      ``path``. ``num_classes`` (the data's tokenizer size) must not exceed its vocabulary; a wider head (a padded
      vocabulary) is cut to ``num_classes`` columns (``inputs: teacher``: the teacher's own tokenizer, not cut).
    - else a random model: ``preset`` (:data:`PRESETS`) with ``layers`` / ``hidden`` / ``heads`` / ``kv_heads``
      (llama) / ``intermediate`` overriding it, or ``family`` (default llama) with ``layers`` and ``hidden``
      (heads = hidden // 64, intermediate ~ 8/3 hidden for llama, 4 hidden for gpt2); vocabulary ``num_classes``;
      ``max_positions`` (default the larger of 512 and the data's padded length); ``tie_embeddings`` (default
      true: the head reuses the input embedding).
    - ``dropout`` (default 0): every dropout probability of the config; ``dtype``: the weights' dtype;
      ``attention``: ``sdpa`` or ``eager``; ``gradient_checkpointing``: recompute each layer in backward;
      ``inputs``: ``student`` or ``teacher`` (the ``teacher.``-prefixed tokenisation); ``lora``: null or
      {r: 8, alpha: 16, dropout: 0, target_modules: null (llama q/k/v/o_proj, gpt2 c_attn/c_proj)}.
    """
    dims = input_shape_of(input_shape, NAME)
    inputs = _choice("inputs", inputs, INPUTS)
    attention = _choice("attention", attention, ATTENTIONS)
    weights = DTYPES[_choice("dtype", dtype, DTYPES)]
    drop = fraction(NAME, "dropout", dropout)
    checkpointing = _flag("gradient_checkpointing", gradient_checkpointing)
    _check_exclusive(path, {"preset": preset, "family": family, "layers": layers, "hidden": hidden, "heads": heads,
                            "kv_heads": kv_heads, "intermediate": intermediate, "max_positions": max_positions,
                            "tie_embeddings": tie_embeddings})
    transformers = _import_transformers()
    if path is not None:
        hf = _pretrained(transformers, path, drop, attention, weights)
        source = f"path {path!r}"
    else:
        sizes = _sizes(preset, family, layers, hidden, heads, intermediate)
        positions = max(MAX_POSITIONS, dims[0]) if max_positions is None else \
            positive_int(NAME, "max_positions", max_positions)
        tie = True if tie_embeddings is None else _flag("tie_embeddings", tie_embeddings)
        config = _random_config(transformers, sizes, num_classes, kv_heads, positions, drop, tie)
        hf = _with_attention(transformers.AutoModelForCausalLM.from_config, attention, config).to(weights)
        source = f"preset {preset!r}" if preset is not None else f"{sizes[0]}, {sizes[1]} layers x {sizes[2]}"
    model = _wrap(hf, num_classes, inputs, attention, f"model {NAME!r} ({source})", dims)
    if path is not None:
        model.tokenizer_name = path
        if not _on_meta():
            _check_head(model, path)
    if checkpointing:
        _enable_checkpointing(hf)
    if lora is not None:
        _add_lora(model, lora)
    return model


def _enable_checkpointing(hf: Any) -> None:
    """Gradient (activation) checkpointing of every decoder layer, non-reentrant (Chen et al. 2016): transformers
    5.x's ``activation_checkpointing_enable``, else 4.x's ``gradient_checkpointing_enable``."""
    kwargs = {"use_reentrant": False}
    enable = getattr(hf, "activation_checkpointing_enable", None)
    if callable(enable):
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _wrap(hf: nn.Module, num_classes: int, inputs: str, attention: str, label: str,
          dims: tuple[int, ...]) -> HFCausalLM:
    """``hf`` as an :class:`HFCausalLM` with its checks: the data's length fits its positions, the data's
    vocabulary (``num_classes``, student side) fits its head."""
    rows = int(hf.get_output_embeddings().out_features)
    if inputs == "student" and num_classes > min(rows, int(hf.get_input_embeddings().num_embeddings)):
        raise ConfigError(f"{label} has a vocabulary of {rows} token ids but the data's tokenizer has {num_classes}; "
                          "give the data the model's tokenizer (data.options.tokenizer)")
    attention = str(getattr(hf.config, "_attn_implementation", None) or attention)
    model = HFCausalLM(hf, inputs, attention, width=num_classes if inputs == "student" and rows > num_classes
                       else None)
    model.label = label
    limit = model.max_tokens
    if len(dims) == 1 and limit is not None and dims[0] > limit:
        raise ConfigError(f"{label} takes sequences of at most {limit} tokens (its positions); the data has "
                          f"{dims[0]}: set data.options.max_length to at most {limit}")
    return model
