"""Hidden-state distillation for text encoders: TinyBERT's hidden-state and embedding losses (Jiao et al.
2020, "TinyBERT: Distilling BERT for Natural Language Understanding", Eq. 7-8) and an MSE on pooled outputs.

Text models expose (as named extra taps, :meth:`teachkit.types.Taps.get`) ``hidden_states``: a tuple of
(B, L, H) tensors, the embedding output first and then one per layer (Hugging Face's ``hidden_states``,
length ``num_layers + 1``), and ``pooled``: (B, H). Token-level losses read ``batch.x["attention_mask"]``
(B, L) (1 = real token), when the batch has one, to ignore padding; student and teacher must share the
tokenizer (``token_level = True``: recipes refuse these methods otherwise).

The helpers here (:func:`uniform_layer_map`, :func:`token_mask`, :func:`sequence_tap`) are shared with
:mod:`teachkit.losses.attention`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.registry import LOSSES
from teachkit.options import Options
from teachkit.types import Batch, Progress, Taps, upcast

__all__ = ["HiddenMSE", "HiddenMSEOptions", "PooledMSE", "PooledMSEOptions", "masked_token_mse", "projection",
           "require_layers", "sequence_tap", "token_mask", "uniform_layer_map"]


def uniform_layer_map(method: str, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """TinyBERT's uniform mapping: student layer m (1..M) <- teacher layer g(m) = floor(m * N / M).

    Returns 1-based (m, g(m)) pairs; the last student layer always meets the last teacher layer. When N is a
    multiple of M (TinyBERT: 12 / 4) this is exactly ``m * N / M``. A student with more layers than the
    teacher, or with none, is a one-line ConfigError.
    """
    m_, n_ = student_layers, teacher_layers
    require_layers(method, m_, n_)
    if m_ > n_:
        raise ConfigError(f"{method!r} maps each student layer to a teacher layer (g(m) = m * N / M) but the "
                          f"student has more layers ({m_}) than the teacher ({n_})")
    return [(m, m * n_ // m_) for m in range(1, m_ + 1)]


def require_layers(method: str, student_layers: int, teacher_layers: int) -> None:
    """A one-line ConfigError unless both sides have at least one transformer layer."""
    if student_layers < 1 or teacher_layers < 1:
        raise ConfigError(f"{method!r} needs at least one transformer layer on each side; the probed student has "
                          f"{student_layers} and the teacher {teacher_layers}")


def sequence_tap(method: str, side: str, taps: Taps, name: str, dims: int, what: str) -> list[Tensor]:
    """The probed tap ``name`` as a non-empty list of ``dims``-dimensional tensors, or a one-line ConfigError
    (``what`` describes the expected layout for the message)."""
    value: Any = taps.get(name)
    if value is None:
        raise ConfigError(f"{method!r} needs the {side}'s {name!r} tap ({what}) but the probed {side} has none; "
                          f"use a text model that returns {name} (Hugging Face: output_{name}=True)")
    if isinstance(value, Tensor) or not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(t, Tensor) and t.dim() == dims for t in value):
        if isinstance(value, (list, tuple)):
            shapes = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__ for t in value]
            got = f"{type(value).__name__} of {shapes}"
        else:
            got = f"a {tuple(value.shape)} tensor" if isinstance(value, Tensor) else type(value).__name__
        raise ConfigError(f"{method!r} needs the {side}'s {name!r} tap as {what}; the probed {side} gives "
                          f"{got[:200]}")
    return list(value)


def token_mask(batch: Batch, rows: int, length: int) -> Tensor | None:
    """``batch.x["attention_mask"]`` as a (rows, length) bool tensor (True = real token), or None when the
    batch's input is not a mapping with an attention mask (then every position counts)."""
    x = batch.x
    if not isinstance(x, Mapping) or "attention_mask" not in x:
        return None
    mask = x["attention_mask"]
    if tuple(mask.shape) != (rows, length):
        raise ValueError(f"the batch's attention_mask has shape {tuple(mask.shape)} but the taps are for "
                         f"{rows} sequences of length {length}")
    return mask != 0


def masked_token_mse(a: Tensor, b: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``(a - b)^2`` over (real tokens x hidden dims) of (B, L, H) tensors; over every position
    when ``mask`` is None. A batch without any real token gives 0."""
    sq = (a - b).pow(2)
    if mask is None:
        return sq.mean()
    keep = mask[..., None]
    count = keep.sum() * sq.shape[-1]
    return sq.masked_fill(~keep, 0.0).sum() / count.clamp_min(1)


def projection(method: str, key: str, project: bool | None, s_size: int, t_size: int, what: str) -> nn.Module:
    """A trainable ``nn.Linear(s_size, t_size)`` (with bias, as TinyBERT's ``fit_dense``) when ``project`` is
    True, or when it is None and the sizes differ; else identity. ``project=False`` with different sizes is
    a one-line ConfigError naming ``key``."""
    if project is None:
        project = s_size != t_size
    if project:
        return nn.Linear(s_size, t_size)
    if s_size != t_size:
        raise ConfigError(f"{key}=False but the student's {what} size ({s_size}) differs from the teacher's "
                          f"({t_size}); set it to true or null to learn a projection")
    return nn.Identity()


def _width(method: str, side: str, states: list[Tensor], indices: list[int], what: str) -> int:
    sizes = sorted({int(states[i].shape[-1]) for i in indices})
    if len(sizes) != 1:
        raise ConfigError(f"{method!r}: the {side}'s mapped {what} have different sizes {sizes}; one projection "
                          "cannot map them")
    return sizes[0]


def _check_pair(method: str, s: Tensor, t: Tensor, tap: str) -> None:
    if s.shape[:2] != t.shape[:2]:
        raise ConfigError(f"{method!r} is token-level: student and teacher {tap} must have the same (batch, length) "
                          f"but the probes give {tuple(s.shape[:2])} and {tuple(t.shape[:2])}; both models must "
                          "use the same tokenizer")


@dataclass
class HiddenMSEOptions(Options):
    """``layers``: ``uniform`` (student layer m <- teacher layer m * N / M, TinyBERT) or ``last`` (the final
    layer only); ``embeddings``: also match the embedding outputs (hidden state 0 <- 0, TinyBERT Eq. 8);
    ``project``: learn a linear map student -> teacher size (null: only when the sizes differ);
    ``mask_padding``: average over real tokens only (the batch's attention mask), else over all positions."""

    layers: Literal["uniform", "last"] = "uniform"
    embeddings: bool = True
    project: bool | None = None
    mask_padding: bool = True


@LOSSES.register("hidden_mse", "TinyBERT hidden-state + embedding MSE(H_s W_h, H_t), uniform layer map "
                 "(Jiao et al. 2020)", options=HiddenMSEOptions)
class HiddenMSE(DistillLoss):
    """TinyBERT's hidden-state loss (Jiao et al. 2020, Eq. 7) and embedding loss (Eq. 8).

    ``L_hidn = sum_m MSE(H^S_m W_h, H^T_{g(m)})`` over the mapped layers, with the uniform mapping
    ``g(m) = m * N / M`` (floor when N is not a multiple of M; see :func:`uniform_layer_map`) for a student of
    M layers and a teacher of N, or only ``(M, N)`` with ``layers=last``; ``L_embd = MSE(E^S W_e, E^T)`` on
    the embedding outputs (hidden state 0) when ``embeddings`` is true (independently of ``layers``).
    Each MSE is the mean over (real tokens x teacher hidden dims) -- the batch's attention mask picks the
    real tokens when ``mask_padding`` is true and the batch has one, else every position counts -- and the
    hidden term sums it over the mapped layers. Terms: ``hidden`` and, with embeddings, ``embedding``
    (their sum is TinyBERT's ``L_embd + L_hidn``; weight 1, as in the paper).

    ``W_h`` (one matrix shared by every mapped layer, as in the paper) and ``W_e`` are trainable
    ``nn.Linear`` maps from the student's to the teacher's size, built from the probed shapes, with a bias
    as in the reference code's ``fit_dense`` (which also shares one map between embeddings and layers; the
    paper has two). They are identity (no parameters) when the sizes agree unless ``project`` is true.
    The teacher's states are detached. A student deeper than the teacher (``uniform``), or a missing
    ``hidden_states`` tap, is a one-line ConfigError at construction.

    Options: :class:`HiddenMSEOptions` (``layers``, ``embeddings``, ``project``, ``mask_padding``).
    """

    student_needs = teacher_needs = ("hidden_states",)
    term_names = ("hidden", "embedding")
    default_weight = 1.0
    token_level = True

    def __init__(self, student: Taps, teacher: Taps, options: HiddenMSEOptions | None = None, *,
                 num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or HiddenMSEOptions()
        opts = self.options
        what = "a tuple of (B, L, H) tensors, embedding output first"
        s_states = sequence_tap("hidden_mse", "student", student, "hidden_states", 3, what)
        t_states = sequence_tap("hidden_mse", "teacher", teacher, "hidden_states", 3, what)
        _check_pair("hidden_mse", s_states[0], t_states[0], "hidden states")
        m_, n_ = len(s_states) - 1, len(t_states) - 1
        require_layers("hidden_mse", m_, n_)
        pairs = uniform_layer_map("hidden_mse", m_, n_) if opts.layers == "uniform" else [(m_, n_)]
        #: (student index, teacher index) into ``hidden_states`` (0 = embeddings) of the hidden term
        self.pairs: list[tuple[int, int]] = pairs
        self.num_states = (len(s_states), len(t_states))
        key = opts.key("project")
        s_w = _width("hidden_mse", "student", s_states, [m for m, _ in pairs], "hidden states")
        t_w = _width("hidden_mse", "teacher", t_states, [g for _, g in pairs], "hidden states")
        self.proj_hidden = projection("hidden_mse", key, opts.project, s_w, t_w, "hidden")
        self.proj_embedding = (projection("hidden_mse", key, opts.project, int(s_states[0].shape[-1]),
                                          int(t_states[0].shape[-1]), "embedding")
                               if opts.embeddings else None)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        s_states, t_states = list(student.get("hidden_states")), list(teacher.get("hidden_states"))
        if (len(s_states), len(t_states)) != self.num_states:
            raise ValueError(f"hidden_mse was built for {self.num_states} hidden states (student, teacher) but got "
                             f"{(len(s_states), len(t_states))}")
        rows, length = s_states[0].shape[:2]
        mask = token_mask(batch, rows, length) if self.options.mask_padding else None

        def mse(proj: nn.Module, s: Tensor, t: Tensor) -> Tensor:
            return masked_token_mse(upcast(proj(upcast(s))), upcast(t.detach()), mask)

        out = {"hidden": sum(mse(self.proj_hidden, s_states[m], t_states[g]) for m, g in self.pairs)}
        if self.proj_embedding is not None:
            out["embedding"] = mse(self.proj_embedding, s_states[0], t_states[0])
        return out

    def extra_repr(self) -> str:
        return f"pairs={self.pairs}, embeddings={self.proj_embedding is not None}"


@dataclass
class PooledMSEOptions(Options):
    """``project``: learn a linear map from the student's pooled size to the teacher's (null: only when the
    sizes differ)."""

    project: bool | None = None


@LOSSES.register("pooled_mse", "MSE(W p_s, p_t) between projected pooled (sentence) outputs",
                 options=PooledMSEOptions)
class PooledMSE(DistillLoss):
    """``mean((W p_s - p_t)^2)`` over (batch x teacher dims) of the pooled outputs ``pooled`` (B, H).

    A plain feature regression on the sentence representation (the FitNet idea on BERT's pooler output),
    not a specific paper's loss. ``W`` is a trainable ``nn.Linear`` (built from the probed sizes; identity
    when they agree unless ``project`` is true); the teacher's output is detached. Sentence-level, so it does
    not need a shared tokenizer (``token_level = False``).
    """

    student_needs = teacher_needs = ("pooled",)
    term_names = ("pooled",)
    default_weight = 1.0
    token_level = False

    def __init__(self, student: Taps, teacher: Taps, options: PooledMSEOptions | None = None, *,
                 num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or PooledMSEOptions()
        sizes = []
        for side, taps in (("student", student), ("teacher", teacher)):
            p = taps.get("pooled")
            if not isinstance(p, Tensor) or p.dim() != 2:
                got = "none" if p is None else (f"shape {tuple(p.shape)}" if isinstance(p, Tensor)
                                                 else type(p).__name__)
                raise ConfigError(f"'pooled_mse' needs the {side}'s 'pooled' tap, a (B, H) tensor; the probed "
                                  f"{side} gives {got}")
            sizes.append(int(p.shape[1]))
        self.proj = projection("pooled_mse", self.options.key("project"), self.options.project, *sizes, "pooled")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        p_s = upcast(self.proj(upcast(student.get("pooled"))))
        return {"pooled": (p_s - upcast(teacher.get("pooled").detach())).pow(2).mean()}
