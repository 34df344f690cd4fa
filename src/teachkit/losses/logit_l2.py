"""Logit regression: Ba & Caruana 2014, "Do Deep Nets Really Need to be Deep?" (their Eq. 1).

The student regresses the teacher's logits (or, for a regression task such as GLUE's STS-B, its real-valued
outputs): ``||z_s - z_t||^2`` summed over outputs, averaged over the batch (Ba & Caruana's L2 on logits,
without their 1/2). It reads no probabilities, so unlike Hinton KD it also distils models whose outputs are
not class scores; it is Pro-KD's phase-I loss at T = 1.
"""

from __future__ import annotations

from torch import Tensor

from teachkit.losses.base import DistillLoss, LogitRanks
from teachkit.losses.registry import LOSSES
from teachkit.types import Batch, Progress, Taps, upcast


@LOSSES.register("logit_l2", "logit regression (Ba & Caruana 2014): ||z_s - z_t||^2, batch mean; also for "
                              "real-valued outputs (STS-B)")
class LogitL2(DistillLoss):
    """``sum_c (z_s - z_t)^2`` averaged over the batch; weighted ``kd.alpha`` alone, like Hinton KD."""

    student_needs = teacher_needs = ("logits",)
    term_names = ("mse",)
    default_weight = 0.9
    regression_ok = True
    #: one real output per sample, (batch,), or any outputs per sample, summed
    logit_ranks = LogitRanks(1, None, "(batch,) or (batch, outputs, ...)")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        zs, zt = upcast(student.logits), upcast(teacher.logits.detach())
        return {"mse": (zs - zt).pow(2).reshape(len(zs), -1).sum(dim=1).mean()}
