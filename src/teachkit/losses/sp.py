"""Tung & Mori 2019, "Similarity-Preserving Knowledge Distillation" (ICCV 2019), Eqs. 2-4."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import require_taps
from teachkit.losses.registry import LOSSES
from teachkit.types import Batch, Progress, Taps, upcast


def similarity_matrix(f: Tensor) -> Tensor:
    """G = row-L2-normalise(Q Q^T) for Q the per-sample flattened map (paper Eqs. 2-3); (B, B)."""
    q = upcast(f).flatten(1)
    return F.normalize(q @ q.t(), p=2, dim=1)


def sp_loss(f_s: Tensor, f_t: Tensor) -> Tensor:
    """||G_t - G_s||_F^2 / B^2 (paper Eq. 4, one stage pair)."""
    b = f_s.shape[0]
    return (similarity_matrix(f_t) - similarity_matrix(f_s)).pow(2).sum() / (b * b)


@LOSSES.register("sp", "similarity-preserving KD: ||G_t - G_s||_F^2 / B^2 on the last stage (Tung & Mori 2019)")
class SimilarityPreserving(DistillLoss):
    """Similarity-preserving KD (Tung & Mori 2019, Eq. 4), as RepDistiller's ``Similarity`` on the
    last stage map (``feat[-2]``): G = row-normalise(F F^T) of the flattened (B, C*H*W) map per side,
    loss = ||G_t - G_s||_F^2 / B^2. Channel counts and spatial sizes may differ (G is B x B).
    No options, no trainable parameters.
    """

    student_needs = teacher_needs = ("stages",)
    term_names = ("sp",)
    default_weight = 3000.0

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        require_taps("sp", student, teacher, "stages")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"sp": sp_loss(student.stages[-1], teacher.stages[-1].detach())}
