"""Romero et al. 2015, "FitNets: Hints for Thin Deep Nets" (ICLR 2015), Eq. 3 -- the hint loss.

Also home of the small feature-map helpers the other feature losses share (tap checks, stage
pairing, spatial matching by adaptive average pooling).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Batch
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps

_CONFIG_KEY = {"student": "model.taps", "teacher": "teacher.model.taps"}


def require_taps(method: str, student: Taps, teacher: Taps, tap: str) -> None:
    """ConfigError naming ``tap`` when the probed student or teacher lacks it (None or no stages)."""
    for side, taps in (("student", student), ("teacher", teacher)):
        value = getattr(taps, tap, None)
        if value is None or (isinstance(value, list) and not value):
            raise ConfigError(f"{method!r} needs the {side}'s {tap!r} tap but the probed {side} has none; "
                              f"name its module path(s) in {_CONFIG_KEY[side]}.{tap}")


def as_map(f: Tensor) -> Tensor:
    """A stage output as a (B, C, H, W) map: (B, C) -> (B, C, 1, 1), (B, C, L) -> (B, C, L, 1)."""
    if f.dim() == 2:
        return f[:, :, None, None]
    if f.dim() == 3:
        return f[..., None]
    if f.dim() == 4:
        return f
    raise ConfigError(f"stage maps must be (B, C), (B, C, L) or (B, C, H, W); got shape {tuple(f.shape)}")


def match_spatial(f_s: Tensor, f_t: Tensor) -> tuple[Tensor, Tensor]:
    """Adaptive-average-pool whichever (B, C, H, W) map is larger to the smaller's (H, W).

    (Per dimension: the target is (min(H_s, H_t), min(W_s, W_t)); RepDistiller pools to a square
    of the smaller height, which is the same for the square maps of its zoo.)
    """
    size = (min(f_s.shape[2], f_t.shape[2]), min(f_s.shape[3], f_t.shape[3]))
    if tuple(f_s.shape[2:]) != size:
        f_s = F.adaptive_avg_pool2d(f_s, size)
    if tuple(f_t.shape[2:]) != size:
        f_t = F.adaptive_avg_pool2d(f_t, size)
    return f_s, f_t


def paired_stages(student: Sequence[Tensor], teacher: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Pair the last ``min(n_s, n_t)`` stages of each side, in order (deepest with deepest)."""
    n = min(len(student), len(teacher))
    return list(zip(student[len(student) - n:], teacher[len(teacher) - n:], strict=True))


def stage_index(method: str, side: str, index: int, count: int) -> int:
    """``index`` into ``count`` stages (negative counts from the end) or a ConfigError."""
    if isinstance(index, bool) or not isinstance(index, int) or not -count <= index < count:
        raise ConfigError(f"kd.options.{method}: {side} has {count} stage(s), so stage index {index!r} is out of "
                          f"range (allowed {-count}..{count - 1})")
    return index % count


@LOSSES.register("fitnet", "FitNet hint: MSE(regressor(f_s), f_t) on one middle stage (Romero et al. 2015)")
class FitNet(DistillLoss):
    """Hint loss (Romero et al. 2015, Eq. 3): ``mean((r(f_s) - f_t)^2)`` on one stage map.

    ``r`` is a trainable regressor conv(k x k, padding k // 2) -> BN -> ReLU from the student's stage
    channels to the teacher's (RepDistiller's ``ConvReg`` with ``use_relu=True``), sized from the
    probed taps. Spatial sizes are matched by adaptive average pooling the larger map (the student's
    before the regressor, or the teacher's target) -- RepDistiller's ConvReg instead uses a strided /
    transposed / valid conv, which only exists for a few size ratios. The mean runs over every
    element (``nn.MSELoss()``), and gamma is 100 (RepDistiller's ``-b 100``). The paper's two-stage
    hint pre-training is not done: as in RepDistiller, the hint is a term added to CE throughout.

    Options: ``stage`` (index into the student's ``stages``; default 1, the middle stage of a CIFAR
    ResNet = RepDistiller's ``--hint_layer 2``), ``teacher_stage`` (index into the teacher's stages;
    default: same as ``stage``), ``kernel_size`` (1 or 3).
    """

    needs = ("stages",)
    default_weight = 100.0

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int = 0, num_samples: int = 0,
                 stage: int = 1, teacher_stage: int | None = None, kernel_size: int = 1) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        require_taps("fitnet", student, teacher, "stages")
        self.stage = stage_index("fitnet", "the student", stage, len(student.stages))
        t_index = stage if teacher_stage is None else teacher_stage
        self.teacher_stage = stage_index("fitnet", "the teacher", t_index, len(teacher.stages))
        if isinstance(kernel_size, bool) or kernel_size not in (1, 3):
            raise ConfigError(f"kd.options.fitnet.kernel_size must be 1 or 3; got {kernel_size!r}")
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
        return {"hint": F.mse_loss(self.regressor(f_s).float(), f_t.float())}
