"""Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: T of a directly constructed :class:`HintonKD` (the RepDistiller / ECCV 2024 value; ``kd.temperature``).
DEFAULT_TEMPERATURE = 4.0


def kd_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """T^2 * KL(p_t^T || p_s^T), summed over classes, mean over batch ('batchmean', never 'mean')."""
    log_ps = F.log_softmax(upcast(student_logits) / temperature, dim=1)
    log_pt = F.log_softmax(upcast(teacher_logits) / temperature, dim=1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(dim=1).mean()
    return kl * temperature**2


@dataclass
class KDOptions(Options):
    """``temperature``: T (null: ``kd.temperature``, which the objective fills in; 4 when built directly)."""

    temperature: float | None = option(None, gt=0.0)


@LOSSES.register("kd", "Hinton KD: T^2 KL(p_t^T || p_s^T), batchmean; with CE 0.1 / KD 0.9, T=4", options=KDOptions)
class HintonKD(DistillLoss):
    """T^2 * KL(p_t^T || p_s^T) (Hinton et al. 2015). Alone it is weighted ``kd.alpha`` (0.9) with
    CE weighted 1 - alpha (0.1), the RepDistiller recipe the ECCV 2024 paper follows."""

    student_needs = teacher_needs = ("logits",)
    term_names = ("kl",)
    default_weight = 0.9

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: KDOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or KDOptions()
        t = self.options.temperature
        self.temperature = DEFAULT_TEMPERATURE if t is None else float(t)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"kl": kd_kl(student.logits, teacher.logits.detach(), self.temperature)}

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
