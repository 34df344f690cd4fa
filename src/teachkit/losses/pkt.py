"""Passalis & Tefas 2018, "Learning Deep Representations with Probabilistic Knowledge Transfer" (ECCV 2018),
Eqs. 7-10 (cosine-similarity kernel, conditional probabilities, KL divergence)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def conditional_probabilities(f: Tensor, eps: float) -> Tensor:
    """Rows of ((cos(f_i, f_j) + 1) / 2), each normalised to sum 1 (paper Eq. 9 with the cosine kernel)."""
    f = upcast(f).flatten(1)
    f = f / (f.pow(2).sum(dim=1, keepdim=True).sqrt() + eps)
    sim = (f @ f.t() + 1.0) / 2.0
    return sim / sim.sum(dim=1, keepdim=True)


def pkt_loss(f_s: Tensor, f_t: Tensor, eps: float = 1e-7) -> Tensor:
    """mean_{i,j} P_t[i,j] * log((P_t[i,j] + eps) / (P_s[i,j] + eps)): the B x B KL terms *averaged*,
    i.e. the KL(P_t || P_s) summed over j and over rows, divided by B^2 (RepDistiller / the authors' code)."""
    p_s = conditional_probabilities(f_s, eps)
    p_t = conditional_probabilities(f_t, eps)
    return torch.mean(p_t * torch.log((p_t + eps) / (p_s + eps)))


@dataclass
class PKTOptions(Options):
    """``eps``: the guard added to norms and probabilities (1e-7, RepDistiller's)."""

    eps: float = option(1e-7, gt=0.0)


@LOSSES.register("pkt", "probabilistic knowledge transfer: KL of cosine-similarity distributions (Passalis 2018)",
                 options=PKTOptions)
class PKT(DistillLoss):
    """Probabilistic knowledge transfer (Passalis & Tefas 2018) on the pooled embeddings, exactly as
    RepDistiller's ``PKT.cosine_similarity_loss`` (the authors' code):

    - x <- x / (||x||_2 + eps) per sample (eps = 1e-7), cosine matrix S = X X^T;
    - S <- (S + 1) / 2, rows normalised to sum 1: P_s, P_t (B x B);
    - loss = mean over all B^2 entries of P_t * log((P_t + eps) / (P_s + eps)), i.e. the sum over rows
      of KL(P_t[i] || P_s[i]) divided by B^2 (not 'batchmean'; gamma 30000 is calibrated to this).

    RepDistiller also zeroes NaNs after the normalisation; with finite features there are none (a
    zero vector divides by eps to zero), so that step is omitted. Student and teacher dimensions may
    differ. No trainable parameters.
    """

    student_needs = teacher_needs = ("embedding",)
    term_names = ("pkt",)
    default_weight = 30000.0

    def __init__(self, student: Taps, teacher: Taps, options: PKTOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or PKTOptions()
        require_taps("pkt", student, teacher, "embedding")
        self.eps = self.options.eps

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"pkt": pkt_loss(student.embedding, teacher.embedding.detach(), self.eps)}
