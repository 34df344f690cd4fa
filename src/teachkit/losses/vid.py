"""Ahn, Hu, Damianou, Lawrence & Dai 2019, "Variational Information Distillation for Knowledge Transfer"
(CVPR 2019), Eqs. 2-5 (Gaussian variational bound with heteroscedastic per-channel variance)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import as_map, match_spatial, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def inverse_softplus(y: float) -> float:
    """x with log(1 + e^x) = y (y > 0), stable for large y."""
    return y + math.log(-math.expm1(-y))


class VIDStage(nn.Module):
    """One stage of VID: mean regressor conv1x1-ReLU-conv1x1-ReLU-conv1x1 (no biases) from the student's
    channels via ``mid`` channels to the teacher's, and a per-channel variance softplus(alpha) + eps."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, init_pred_var: float,
                 eps: float) -> None:
        super().__init__()
        self.regressor = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, 1, bias=False),
            nn.ReLU(),
            nn.Conv2d(mid_channels, mid_channels, 1, bias=False),
            nn.ReLU(),
            nn.Conv2d(mid_channels, out_channels, 1, bias=False),
        )
        self.log_scale = nn.Parameter(torch.full((out_channels,), inverse_softplus(init_pred_var - eps)))
        self.eps = eps

    def variance(self) -> Tensor:
        return F.softplus(self.log_scale) + self.eps

    def forward(self, f_s: Tensor, f_t: Tensor) -> Tensor:
        """mean over batch, channels and positions of 0.5 * ((mu(f_s) - f_t)^2 / var + log var)."""
        f_s, f_t = match_spatial(f_s, f_t)
        mu = upcast(self.regressor(f_s))
        var = upcast(self.variance()).view(1, -1, 1, 1)
        return (0.5 * ((mu - upcast(f_t)).pow(2) / var + var.log())).mean()


@dataclass
class VIDOptions(Options):
    """``init_pred_var``: the variance each channel starts at (5.0, RepDistiller's); ``eps``: the variance's
    floor (1e-5); ``mid_channels``: the regressor's hidden width (null: the teacher stage's channels)."""

    init_pred_var: float = option(5.0, gt=0.0)
    eps: float = option(1e-5, gt=0.0)
    mid_channels: int | None = option(None, ge=1)

    def validate(self) -> None:
        if not self.init_pred_var > self.eps:
            raise ConfigError(f"{self.key('init_pred_var')}={self.init_pred_var!r} is not allowed: must be > "
                              f"{self.key('eps')}={self.eps!r}")


@LOSSES.register("vid", "variational information distillation: Gaussian NLL per stage (Ahn et al. 2019)",
                 options=VIDOptions)
class VID(DistillLoss):
    """Variational information distillation (Ahn et al. 2019, Eq. 5 with the Gaussian of Eq. 4), as
    RepDistiller's ``VIDLoss``: per stage pair, ``mean(0.5 * ((mu(f_s) - f_t)^2 / var + log var))`` with
    mu a conv1x1-ReLU-conv1x1-ReLU-conv1x1 regressor and var = softplus(alpha_c) + eps per teacher
    channel, alpha initialised so that var starts at ``init_pred_var`` (5.0); summed over stages. The
    constant 0.5 log(2 pi) is dropped. The mean runs over B, C, H, W (not a sum over C, H, W as in the
    paper), which is the scale gamma = 1 refers to in the CRD benchmark.

    Stages: every stage, as RepDistiller (``feat[1:-1]``); with different stage counts, the last
    ``min(n_s, n_t)`` of each side are paired in order. Sizes are matched by adaptive-average-pooling
    the larger map. ``mid_channels`` defaults to the teacher stage's channels (RepDistiller's
    ``VIDLoss(s, t, t)``). All sizes come from the probed taps.
    """

    student_needs = teacher_needs = ("stages",)
    term_names = ("vid",)
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, options: VIDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or VIDOptions()
        opts = self.options
        require_taps("vid", student, teacher, "stages")
        self.stages = nn.ModuleList()
        for f_s, f_t in paired_stages(student.stages, teacher.stages):
            s_c, t_c = as_map(f_s).shape[1], as_map(f_t).shape[1]
            self.stages.append(VIDStage(s_c, opts.mid_channels or t_c, t_c, opts.init_pred_var, opts.eps))

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        pairs = paired_stages(student.stages, teacher.stages)
        terms = [stage(as_map(f_s), as_map(f_t).detach()) for stage, (f_s, f_t) in zip(self.stages, pairs, strict=True)]
        return {"vid": sum(terms)}
