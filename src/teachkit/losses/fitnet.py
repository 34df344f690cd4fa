"""Romero et al. 2015, "FitNets: Hints for Thin Deep Nets" (ICLR 2015), Eq. 3 -- the hint loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import as_map, match_spatial, require_taps, stage_index
from teachkit.losses.registry import LOSSES
from teachkit.options import Options
from teachkit.types import Batch, Progress, Taps, upcast


@dataclass
class FitNetOptions(Options):
    """``stage``: index into the student's ``stages`` (negative counts from the end; 1 = the middle stage
    of a CIFAR ResNet, RepDistiller's ``--hint_layer 2``); ``teacher_stage``: index into the teacher's
    stages (null: the same as ``stage``); ``kernel_size``: the regressor's conv kernel, 1 or 3."""

    stage: int = 1
    teacher_stage: int | None = None
    kernel_size: Literal[1, 3] = 1


@LOSSES.register("fitnet", "FitNet hint: MSE(regressor(f_s), f_t) on one middle stage (Romero et al. 2015)",
                 options=FitNetOptions)
class FitNet(DistillLoss):
    """Hint loss (Romero et al. 2015, Eq. 3): ``mean((r(f_s) - f_t)^2)`` on one stage map.

    ``r`` is a trainable regressor conv(k x k, padding k // 2) -> BN -> ReLU from the student's stage
    channels to the teacher's (RepDistiller's ``ConvReg`` with ``use_relu=True``), sized from the
    probed taps. Spatial sizes are matched by adaptive average pooling the larger map (the student's
    before the regressor, or the teacher's target) -- RepDistiller's ConvReg instead uses a strided /
    transposed / valid conv, which only exists for a few size ratios. The mean runs over every
    element (``nn.MSELoss()``), and gamma is 100 (RepDistiller's ``-b 100``). The paper's two-stage
    hint pre-training is not done: as in RepDistiller, the hint is a term added to CE throughout.

    Options: :class:`FitNetOptions` (``stage``, ``teacher_stage``, ``kernel_size``).
    """

    student_needs = teacher_needs = ("stages",)
    term_names = ("hint",)
    default_weight = 100.0

    def __init__(self, student: Taps, teacher: Taps, options: FitNetOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or FitNetOptions()
        opts = self.options
        require_taps("fitnet", student, teacher, "stages")
        self.stage = stage_index(opts.key("stage"), "the student", opts.stage, len(student.stages))
        t_key, t_index = ((opts.key("stage"), opts.stage) if opts.teacher_stage is None
                          else (opts.key("teacher_stage"), opts.teacher_stage))
        self.teacher_stage = stage_index(t_key, "the teacher", t_index, len(teacher.stages))
        kernel_size = opts.kernel_size
        f_s, f_t = as_map(student.stages[self.stage]), as_map(teacher.stages[self.teacher_stage])
        s_c, t_c = f_s.shape[1], f_t.shape[1]
        self.regressor = nn.Sequential(
            nn.Conv2d(s_c, t_c, kernel_size, padding=kernel_size // 2),
            nn.BatchNorm2d(t_c),
            nn.ReLU(),
        )

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        f_s = as_map(student.stages[self.stage])
        f_t = as_map(teacher.stages[self.teacher_stage]).detach()
        f_s, f_t = match_spatial(f_s, f_t)
        return {"hint": F.mse_loss(upcast(self.regressor(f_s)), upcast(f_t))}
