"""Self-attention distillation for text encoders: TinyBERT's attention MSE (Jiao et al. 2020, "TinyBERT",
Eq. 6) and MiniLM's last-layer attention KL (Wang et al. 2020, "MiniLM: Deep Self-Attention Distillation
for Task-Agnostic Compression of Pre-Trained Transformers", Eq. 4).

Both read the ``attentions`` tap: a tuple of (B, heads, L, L) attention probabilities (softmax over the
last, key, dimension), one per layer, as Hugging Face returns them with ``output_attentions=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.hidden import require_layers, sequence_tap, token_mask, uniform_layer_map
from teachkit.losses.registry import LOSSES
from teachkit.options import Options
from teachkit.types import Batch, Progress, Taps, upcast

__all__ = ["AttentionKD", "AttentionKDOptions", "attention_kl", "attention_mse"]


def _pair_mask(mask: Tensor | None) -> Tensor | None:
    """(B, L) real-token mask -> (B, 1, L, L): real query row and real key column."""
    if mask is None:
        return None
    return (mask[:, :, None] & mask[:, None, :])[:, None]


def attention_mse(a_s: Tensor, a_t: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``(a_s - a_t)^2`` over heads x real query rows x real key columns of (B, h, L, L) maps (over
    every entry when ``mask`` is None): TinyBERT's ``(1/h) sum_heads MSE(A^S_i, A^T_i)``. No real token: 0."""
    sq = (a_s - a_t).pow(2)
    keep = _pair_mask(mask)
    if keep is None:
        return sq.mean()
    count = keep.sum() * sq.shape[1]
    return sq.masked_fill(~keep, 0.0).sum() / count.clamp_min(1)


def attention_kl(a_s: Tensor, a_t: Tensor, mask: Tensor | None) -> Tensor:
    """``KL(A_t || A_s)`` of each (query row) attention distribution, summed over keys and averaged over heads
    x real query rows of the batch (every row when ``mask`` is None), for (B, h, L, L) probabilities.

    Padded key columns are left out of the sum (their probability is ~0 on both sides anyway); ``A_s`` is
    clamped at the smallest positive float before the log, so an exact 0 against a positive teacher
    probability stays finite. No real token: 0."""
    tiny = torch.finfo(a_s.dtype).tiny
    kl = torch.special.xlogy(a_t, a_t) - a_t * a_s.clamp_min(tiny).log()
    keep = _pair_mask(mask)
    if keep is None:
        return kl.sum(dim=-1).mean()
    rows = keep[..., 0]  # (B, 1, L): real query rows (a real row always has a real key: itself)
    kl = kl.masked_fill(~keep, 0.0).sum(dim=-1)  # (B, h, L)
    return kl.sum() / (rows.sum() * kl.shape[1]).clamp_min(1)


@dataclass
class AttentionKDOptions(Options):
    """``mode``: ``tinybert`` (MSE of every mapped layer's attention maps, per head; heads must match) or
    ``minilm`` (KL of the last layer's attention distributions); ``mask_padding``: ignore padded query rows
    and key columns (the batch's attention mask), else every entry counts."""

    mode: Literal["tinybert", "minilm"] = "tinybert"
    mask_padding: bool = True


@LOSSES.register("attention_kd", "Attention distillation: TinyBERT per-head MSE over uniformly mapped layers, or "
                 "MiniLM last-layer KL(A_t || A_s)", options=AttentionKDOptions)
class AttentionKD(DistillLoss):
    """Self-attention distillation between text encoders, on attention *probabilities*.

    ``mode=tinybert`` (Jiao et al. 2020, Eq. 6): ``L_attn = sum_m (1/h) sum_i MSE(A^S_{m,i}, A^T_{g(m),i})``
    over the student's layers m = 1..M with TinyBERT's uniform mapping ``g(m) = m * N / M`` (floor when N
    is not a multiple of M), each MSE the mean over real query rows x real key columns. The paper's
    reference code compares the *pre-softmax* attention scores (padded entries zeroed); the models here
    expose only the probabilities, so those are compared instead -- the same minimiser, a different scale
    and gradient. Student and teacher must have the same number of heads per mapped layer, and the student
    no more layers than the teacher (else a one-line ConfigError).

    ``mode=minilm`` (Wang et al. 2020, Eq. 4): ``KL(A^T_N || A^S_M)`` between the last layers' attention
    distributions (each query row a distribution over keys), summed over keys, averaged over heads and
    over the real query rows of the batch (every real token weighs the same; the paper averages per
    sequence). Layer counts may differ. When the head counts differ, each side's attention is first
    averaged over its heads and the KL is taken between the head-averaged distributions (MiniLM itself
    requires equal heads). MiniLM's second term, the value-relation transfer (Eq. 5), is not implemented:
    the models do not expose their value vectors.

    Padding: with ``mask_padding`` and an ``attention_mask`` in the batch, padded query rows and padded
    key columns are left out (the latter already carry ~0 probability). The teacher's maps are detached.
    The term is ``attention`` (weight 1, as in both papers).

    Options: :class:`AttentionKDOptions` (``mode``, ``mask_padding``).
    """

    student_needs = teacher_needs = ("attentions",)
    term_names = ("attention",)
    default_weight = 1.0
    token_level = True

    def __init__(self, student: Taps, teacher: Taps, options: AttentionKDOptions | None = None, *,
                 num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or AttentionKDOptions()
        opts = self.options
        what = "a tuple of (B, heads, L, L) attention probabilities, one per layer"
        s_att = sequence_tap("attention_kd", "student", student, "attentions", 4, what)
        t_att = sequence_tap("attention_kd", "teacher", teacher, "attentions", 4, what)
        for side, maps in (("student", s_att), ("teacher", t_att)):
            bad = [tuple(a.shape) for a in maps if a.shape[-1] != a.shape[-2] or a.shape[:1] != maps[0].shape[:1]
                   or a.shape[-1] != maps[0].shape[-1]]
            if bad:
                raise ConfigError(f"'attention_kd' needs the {side}'s 'attentions' as {what}; the probed {side} "
                                  f"gives shape(s) {bad[:3]}")
        s_bl, t_bl = (s_att[0].shape[0], s_att[0].shape[-1]), (t_att[0].shape[0], t_att[0].shape[-1])
        if s_bl != t_bl:
            raise ConfigError(f"'attention_kd' is token-level: student and teacher attentions must have the same "
                              f"(batch, length) but the probes give {tuple(s_bl)} and {tuple(t_bl)}; both models "
                              "must use the same tokenizer")
        m_, n_ = len(s_att), len(t_att)
        require_layers("attention_kd", m_, n_)
        if opts.mode == "tinybert":
            #: (student, teacher) 0-based indices into ``attentions``
            self.pairs = [(m - 1, g - 1) for m, g in uniform_layer_map("attention_kd", m_, n_)]
            for i, j in self.pairs:
                h_s, h_t = s_att[i].shape[1], t_att[j].shape[1]
                if h_s != h_t:
                    raise ConfigError(f"{opts.key('mode')}='tinybert' compares attention maps head by head but "
                                      f"student layer {i + 1} has {h_s} heads and teacher layer {j + 1} has {h_t}; "
                                      "use mode 'minilm' (averages heads when they differ)")
        else:
            self.pairs = [(m_ - 1, n_ - 1)]
        i, j = self.pairs[-1]
        #: minilm: compare head-averaged distributions (the head counts differ)
        self.average_heads = opts.mode == "minilm" and s_att[i].shape[1] != t_att[j].shape[1]
        self.num_layers = (m_, n_)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        s_att, t_att = list(student.get("attentions")), list(teacher.get("attentions"))
        if (len(s_att), len(t_att)) != self.num_layers:
            raise ValueError(f"attention_kd was built for {self.num_layers} attention layers (student, teacher) but "
                             f"got {(len(s_att), len(t_att))}")
        rows, length = s_att[0].shape[0], s_att[0].shape[-1]
        mask = token_mask(batch, rows, length) if self.options.mask_padding else None
        if self.options.mode == "tinybert":
            loss = sum(attention_mse(upcast(s_att[i]), upcast(t_att[j].detach()), mask) for i, j in self.pairs)
            return {"attention": loss}
        i, j = self.pairs[0]
        a_s, a_t = upcast(s_att[i]), upcast(t_att[j].detach())
        if self.average_heads:
            a_s, a_t = a_s.mean(dim=1, keepdim=True), a_t.mean(dim=1, keepdim=True)
        return {"attention": attention_kl(a_s, a_t, mask)}

    def extra_repr(self) -> str:
        return f"mode={self.options.mode!r}, pairs={self.pairs}, average_heads={self.average_heads}"
