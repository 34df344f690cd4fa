"""Park, Kim, Lu & Cho 2019, "Relational Knowledge Distillation" (CVPR 2019), Eqs. 3-7 (distance- and
angle-wise losses)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def pairwise_distances(e: Tensor, eps: float = 1e-12) -> Tensor:
    """Euclidean distance matrix (B, B): sqrt(clamp(|e_i|^2 + |e_j|^2 - 2 e_i.e_j, eps)), diagonal 0."""
    sq = e.pow(2).sum(dim=1)
    d = (sq[:, None] + sq[None, :] - 2 * e @ e.t()).clamp(min=eps).sqrt()
    eye = torch.eye(e.shape[0], dtype=torch.bool, device=e.device)
    return d.masked_fill(eye, 0.0)


def normalised_distances(e: Tensor) -> Tensor:
    """Distances divided by their mean over the positive entries (paper Eq. 4's mu)."""
    d = pairwise_distances(e)
    positive = d > 0
    mu = (d * positive).sum() / positive.sum().clamp(min=1)
    return d / mu.clamp(min=1e-12)


def angles(e: Tensor) -> Tensor:
    """cos of the angle at e_i between e_j and e_k: <n(e_j - e_i), n(e_k - e_i)>, shape (B^3,).

    n() is L2 normalisation with zero vectors kept zero, so entries with j = i or k = i are 0.
    """
    diff = e[None, :, :] - e[:, None, :]  # diff[i, j] = e_j - e_i
    unit = F.normalize(diff, p=2, dim=2)
    return torch.bmm(unit, unit.transpose(1, 2)).flatten()


def rkd_terms(f_s: Tensor, f_t: Tensor) -> tuple[Tensor, Tensor]:
    """Unweighted (L_distance, L_angle): Huber (smooth L1, beta 1) losses, mean over B^2 / B^3 entries."""
    s = upcast(f_s).flatten(1)
    t = upcast(f_t).flatten(1).detach()
    loss_d = F.smooth_l1_loss(normalised_distances(s), normalised_distances(t))
    loss_a = F.smooth_l1_loss(angles(s), angles(t))
    return loss_d, loss_a


@dataclass
class RKDOptions(Options):
    """``distance_weight`` / ``angle_weight``: the lambdas of the two terms (25 and 50, the paper's and
    RepDistiller's)."""

    distance_weight: float = option(25.0, ge=0.0)
    angle_weight: float = option(50.0, ge=0.0)


@LOSSES.register("rkd", "relational KD: 25 x distance + 50 x angle Huber losses on embeddings (Park et al. 2019)",
                 options=RKDOptions)
class RKD(DistillLoss):
    """Relational KD (Park et al. 2019) on the pooled embeddings, as RepDistiller's ``RKDLoss``:

    - distance (Eq. 3-5): psi_D = ||e_i - e_j|| / mu, mu the mean of the positive distances of the
      batch, both sides; Huber (``F.smooth_l1_loss``, beta 1, mean over the B x B matrix incl. diagonal);
    - angle (Eq. 6-7): psi_A = <n(e_j - e_i), n(e_k - e_i)> over all (i, j, k); Huber, mean over B^3.

    Returns the unweighted ``{"distance": L_D, "angle": L_A}``; their lambdas (``distance_weight`` 25 and
    ``angle_weight`` 50, the paper's and RepDistiller's) are ``term_weights``, which the objective applies
    together with gamma (``default_weight`` 1), so the two are logged separately and weighted as
    ``rkd.distance`` / ``rkd.angle``. Student and teacher dimensions may differ. No trainable parameters.
    """

    student_needs = teacher_needs = ("embedding",)
    term_names = ("distance", "angle")
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, options: RKDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or RKDOptions()
        require_taps("rkd", student, teacher, "embedding")
        self.term_weights = {"distance": self.options.distance_weight, "angle": self.options.angle_weight}

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        loss_d, loss_a = rkd_terms(student.embedding, teacher.embedding)
        return {"distance": loss_d, "angle": loss_a}
