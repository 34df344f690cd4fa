"""Ahn, Hu, Damianou, Lawrence & Dai 2019, "Variational Information Distillation for Knowledge Transfer"
(CVPR 2019), Eqs. 2-5 (Gaussian variational bound with heteroscedastic per-channel variance)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Batch
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.fitnet import as_map, match_spatial, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps


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
        mu = self.regressor(f_s).float()
        var = self.variance().float().view(1, -1, 1, 1)
        return (0.5 * ((mu - f_t.float()).pow(2) / var + var.log())).mean()


@LOSSES.register("vid", "variational information distillation: Gaussian NLL per stage (Ahn et al. 2019)")
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

    needs = ("stages",)
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int = 0, num_samples: int = 0,
                 init_pred_var: float = 5.0, eps: float = 1e-5, mid_channels: int | None = None) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        require_taps("vid", student, teacher, "stages")
        if not init_pred_var > eps > 0:
            raise ConfigError(f"kd.options.vid needs init_pred_var > eps > 0; got init_pred_var={init_pred_var!r}, "
                              f"eps={eps!r}")
        if mid_channels is not None and (isinstance(mid_channels, bool) or not isinstance(mid_channels, int)
                                         or mid_channels < 1):
            raise ConfigError(f"kd.options.vid.mid_channels must be an int >= 1 or null; got {mid_channels!r}")
        self.stages = nn.ModuleList()
        for f_s, f_t in paired_stages(student.stages, teacher.stages):
            s_c, t_c = as_map(f_s).shape[1], as_map(f_t).shape[1]
            self.stages.append(VIDStage(s_c, mid_channels or t_c, t_c, float(init_pred_var), float(eps)))

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        pairs = paired_stages(student.stages, teacher.stages)
        terms = [stage(as_map(f_s), as_map(f_t).detach()) for stage, (f_s, f_t) in zip(self.stages, pairs, strict=True)]
        return {"vid": sum(terms)}
