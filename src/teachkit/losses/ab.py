"""Heo, Lee, Yun & Choi 2019, "Knowledge Transfer via Distillation of Activation Boundaries Formed by Hidden
Neurons" (AB, AAAI 2019), Eq. 6-7.

AB transfers where each teacher neuron is active (its pre-ReLU response > 0) rather than how strongly.
The student's pre-ReLU map, through a connector to the teacher's width, is pushed beyond a margin
``mu`` on the teacher's side of the boundary: the alternative squared hinge loss (Eq. 7)

    (s + mu)^2 [s > -mu and t <= 0] + (s - mu)^2 [s <= mu and t > 0], summed over every element.

The numbers are those of RepDistiller (HobbitLong/RepDistiller ``distiller_zoo/AB.py``, ``ABLoss``, and
``models/util.py`` ``Connector``): margin 1; the maps are the pre-ReLU stage outputs of both networks
(``preact=True``, ``feat[1:-1]``: teachkit's ``stages_pre``); stage i of n is weighted ``2^(i - n + 1)``
(the deepest 1, then 1/2, 1/4, ...), and each stage's sum is divided by the batch size and multiplied by
3 / 1000. The connector is the identity where the two maps have the same channels and size, else a
conv (1x1 for equal sizes) followed by BatchNorm, no ReLU (``ConvReg(use_relu=False)``). As in
RepDistiller's ``train_student.py`` / ``helper/pretrain.py``, AB is a pre-training stage: the student's body
and the connectors learn the boundaries alone for ``init_epochs`` epochs (30; SGD, constant lr 0.05,
momentum 0.9, weight decay 5e-4), then the student trains on CE alone (``loss_kd = 0`` for AB in
``helper/loops.py``): its main-stage weight is 0. The stage runs through the engine in ``ab_init/``.

Both uses are offered: the stage (``init_epochs`` > 0, default) and the plain loss added to CE during the
main training (``kd.gamma.ab`` > 0), which trains the connectors with the student.

Deviation: where spatial sizes differ the student's map is adaptive-average-pooled to the teacher's size
before a 1x1 connector (RepDistiller's ``ConvReg`` uses a strided / transposed / valid conv that exists
only for some size ratios). With different stage counts the last ``min(n_s, n_t)`` stages are paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.losses.stage_eval import student_pretraining_stage
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, TrainingStage, upcast

#: the run-folder sub-folder of AB's pre-training stage
INIT_STAGE = "ab_init"
#: RepDistiller's per-stage scale after the batch mean
SCALE = 3.0 / 1000.0


def boundary_loss(source: Tensor, target: Tensor, margin: float) -> Tensor:
    """Eq. 7 summed over every element: the alternative squared hinge of the student's pre-activation
    ``source`` against the sign of the teacher's ``target``, with margin ``margin``."""
    source, target = upcast(source), upcast(target)
    off = ((source > -margin) & (target <= 0)).to(source.dtype)
    on = ((source <= margin) & (target > 0)).to(source.dtype)
    return ((source + margin).pow(2) * off + (source - margin).pow(2) * on).sum()


def stage_weights(n: int) -> list[float]:
    """RepDistiller's ``2^(i - n + 1)`` for stage i of n: 1 for the deepest, halving towards the input."""
    return [2.0 ** (i - n + 1) for i in range(n)]


class Connector(nn.Module):
    """The identity where shapes agree, else [pool to the teacher's size] -> conv1x1 -> BatchNorm (no ReLU)."""

    def __init__(self, s_shape: tuple[int, ...], t_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.size = tuple(t_shape[2:])
        self.identity = tuple(s_shape[1:]) == tuple(t_shape[1:])
        self.body = nn.Identity() if self.identity else nn.Sequential(
            nn.Conv2d(s_shape[1], t_shape[1], kernel_size=1), nn.BatchNorm2d(t_shape[1]))

    def forward(self, x: Tensor) -> Tensor:
        if not self.identity and tuple(x.shape[2:]) != self.size:
            x = F.adaptive_avg_pool2d(x, self.size)
        return self.body(x)


@dataclass
class ABOptions(Options):
    """``margin``: mu of Eq. 7 (1, RepDistiller's); ``init_epochs``: epochs of the pre-training stage (30;
    0 = none, the plain loss only); ``init_lr``: its constant SGD learning rate (0.05)."""

    margin: float = option(1.0, gt=0.0)
    init_epochs: int = option(30, ge=0)
    init_lr: float = option(0.05, gt=0.0)


@LOSSES.register("ab", "activation boundaries: margin hinge of connector(pre-ReLU student) vs the teacher's "
                       "pre-ReLU signs (Heo et al. 2019); student pre-trained on it 30 epochs, then CE (weight 0)",
                 options=ABOptions)
class ActivationBoundaries(DistillLoss):
    """AB (Heo et al. 2019) as RepDistiller computes it (module docstring): term ``ab`` = the sum over stage
    pairs of ``2^(i-n+1) * 3/1000 * boundary_loss(connector(s_i), t_i) / B``; :meth:`training_stage`
    pre-trains the student's body and the connectors on it."""

    student_needs = teacher_needs = ("stages_pre",)
    term_names = ("ab",)
    default_weight = 0.0

    def __init__(self, student: Taps, teacher: Taps, options: ABOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or ABOptions()
        self.margin = self.options.margin
        require_taps("ab", student, teacher, "stages_pre")
        pairs = paired_stages(student.stages_pre, teacher.stages_pre)
        for i, (f_s, f_t) in enumerate(pairs):
            if f_s.dim() != 4 or f_t.dim() != 4:
                raise ConfigError(f"'ab' needs spatial pre-activation maps (B, C, H, W); stage pair {i} has shapes "
                                  f"{tuple(f_s.shape)} and {tuple(f_t.shape)}")
        self.connectors = nn.ModuleList(Connector(tuple(s.shape), tuple(t.shape)) for s, t in pairs)
        self.weights = stage_weights(len(pairs))

    def loss(self, student: Taps, teacher: Taps) -> Tensor:
        pairs = paired_stages(student.stages_pre, teacher.stages_pre)
        batch = pairs[0][0].shape[0]
        return sum(w * boundary_loss(c(s), t.detach(), self.margin) / batch * SCALE
                   for w, c, (s, t) in zip(self.weights, self.connectors, pairs, strict=True))

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage | None:
        """RepDistiller's ``init``: the student's body and the connectors learn the boundaries alone first."""
        def loss_fn(x: Any, s_taps: Taps, t_taps: Taps) -> Tensor:
            return self.loss(s_taps, t_taps)

        opts = self.options
        return student_pretraining_stage(INIT_STAGE, loss_fn, teacher, student, {"connectors": self.connectors},
                                         epochs=opts.init_epochs, lr=opts.init_lr, method="ab")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"ab": self.loss(student, teacher)}
