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


@LOSSES.register("kd", "Hinton KD: T^2 KL(p_t^T || p_s^T), batchmean; with CE 0.1 / KD 0.9, T=4")
class HintonKD(DistillLoss):
    """T^2 * KL(p_t^T || p_s^T) (Hinton et al. 2015). Alone it is weighted ``kd.alpha`` (0.9) with
    CE weighted 1 - alpha (0.1), the RepDistiller recipe the ECCV 2024 paper follows."""

    needs = ("logits",)
    default_weight = 0.9

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, *, num_classes: int = 0,
                 num_samples: int = 0, temperature: float = 4.0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.temperature = float(temperature)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"kl": kd_kl(student.logits, teacher.logits, self.temperature)}
