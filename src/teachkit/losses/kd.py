"""Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from teachkit.data.base import Batch
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps


def kd_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """T^2 * KL(p_t^T || p_s^T), summed over classes, mean over batch ('batchmean', never 'mean')."""
    log_ps = F.log_softmax(student_logits.float() / temperature, dim=1)
    log_pt = F.log_softmax(teacher_logits.float() / temperature, dim=1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(dim=1).mean()
    return kl * temperature**2


@LOSSES.register("kd", "Hinton KD: (1-alpha) CE + alpha T^2 KL(p_t^T || p_s^T), batchmean")
class HintonKD(DistillLoss):
    """Student loss = (1 - alpha) * CE(z_s, y) + alpha * T^2 * KL(p_t^T || p_s^T) (Hinton et al. 2015)."""

    needs = ("logits",)

    def __init__(self, alpha: float = 0.9, temperature: float = 4.0, student_probe: Taps | None = None,
                 teacher_probe: Taps | None = None) -> None:
        super().__init__(student_probe, teacher_probe)
        self.alpha = float(alpha)
        self.temperature = float(temperature)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        terms = {}
        if self.alpha < 1:
            terms["ce"] = (1 - self.alpha) * F.cross_entropy(student.logits.float(), batch.y)
        if self.alpha > 0:
            terms["kd"] = self.alpha * kd_kl(student.logits, teacher.logits, self.temperature)
        return terms
