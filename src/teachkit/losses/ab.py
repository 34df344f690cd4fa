"""Heo, Lee, Yun & Choi 2019, "Knowledge Transfer via Distillation of Activation Boundaries Formed by Hidden
Neurons" (AB, AAAI 2019), the alternative (piecewise-differentiable) activation transfer loss.

AB transfers where each teacher neuron is active (its pre-ReLU response ``t > 0``) rather than how strongly.
The student's pre-ReLU map ``s``, through a connector to the teacher's shape, is pushed beyond a margin
``mu`` on the teacher's side of the boundary: the paper's alternative loss, a squared hinge

    L(s, t) = sum over elements of (s + mu)^2 [s > -mu and t <= 0] + (s - mu)^2 [s <= mu and t > 0],

which approximates the (non-differentiable) activation transfer loss ``|| 1[t > 0] - 1[s > 0] ||_1``.

The numbers are those of RepDistiller (HobbitLong/RepDistiller): ``distiller_zoo/AB.py`` (``ABLoss``,
``criterion_alternative_l2``), ``models/util.py`` (``Connector``, ``ConvReg``), ``train_student.py`` and
``helper/pretrain.py`` / ``helper/loops.py`` (which maps, which modules train, the ``init`` stage).
Conventions:

- maps: the pre-ReLU output of each stage on both sides (``preact=True``, ``feat[1:-1]``: teachkit's
  ``stages_pre``, the last block's residual sum before its ReLU). Where the stage counts differ the last
  ``min(n_s, n_t)`` are paired (RepDistiller requires equal counts).
- term: stage ``i`` of ``n`` is weighted ``2^(i - n + 1)`` (the deepest 1, then 1/2, 1/4, ...); each stage's
  sum over every element is divided by the batch size and multiplied by 3 / 1000; the stages are summed.
  Margin ``mu`` = 1 (``ABLoss(margin=1.0)``). The teacher's maps are detached (and computed under no grad).
- connector (``Connector``): per stage, the identity where the student's and the teacher's maps have the same
  shape (C, H, W), else ``ConvReg(use_relu=False)``: a conv to the teacher's channels followed by BatchNorm,
  no ReLU. The conv is 3x3 stride 2 padding 1 when the student's map is twice the teacher's height,
  a 4x4 stride-2 padding-1 transposed conv when it is half, else a valid conv of kernel
  ``(1 + H_s - H_t, 1 + W_s - W_t)`` (1x1 for equal sizes: the paper's conv1x1 + BN connector).
- pre-training stage (``train_student.py`` ``init_trainable_list`` = connector + ``model_s.get_feat_modules()``,
  ``helper/pretrain.py`` ``init``): the student's body and the connectors learn the boundaries alone for
  ``init_epochs`` epochs (30), SGD at a constant ``init_lr`` (0.05, RepDistiller's ``--learning_rate``,
  which its ``train_student.py`` lowers to 0.01 for MobileNetV2 / ShuffleNet students), momentum 0.9,
  weight decay 5e-4, batch size the run's, on the student's transfer set, with the student (and connectors)
  in train mode and the teacher frozen. The student's classifier reads no stage map, so it gets no gradient
  and stays as initialised. The ``kd`` recipe runs the stage through the engine in the run folder's
  ``ab_init/`` (NaN guard, checkpoints, exact resume; a finished stage is loaded, not retrained).
- default weight 0: after the stage RepDistiller trains the student on CE alone (``helper/loops.py`` sets
  ``loss_kd = 0`` for ``abound``; ``scripts/run_cifar_distill.sh`` runs ``--distill abound -a 0 -b 1``), so
  the objective skips AB in the main training.

Both uses are offered: the stage then CE (defaults, the reference), and the plain loss added to CE in the main
training (``kd.gamma.ab`` > 0, with or without the stage: ``init_epochs: 0`` skips it), in which case the
connectors train with the student (RepDistiller keeps them in eval mode there, unused).

Deviations: a connector for a student map smaller than the teacher's but not exactly half its height (for
which RepDistiller's ``ConvReg`` raises) is refused with a ConfigError; the identity connector needs the whole
(C, H, W) shape to match (RepDistiller compares C and H only). The connectors' weights are also part of the
objective's state (``methods.ab.connectors.*``) in the student checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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
#: RepDistiller's per-stage scale after the batch mean (``l / 1000 * 3``)
SCALE = 3.0 / 1000.0


def boundary_loss(source: Tensor, target: Tensor, margin: float) -> Tensor:
    """The alternative loss summed over every element: the squared hinge of the student's pre-activation
    ``source`` beyond ``margin`` on the side of the boundary the teacher's ``target`` is on
    (RepDistiller's ``criterion_alternative_l2``)."""
    source, target = upcast(source), upcast(target)
    off = ((source > -margin) & (target <= 0)).to(source.dtype)
    on = ((source <= margin) & (target > 0)).to(source.dtype)
    return ((source + margin).pow(2) * off + (source - margin).pow(2) * on).sum()


def stage_weights(n: int) -> list[float]:
    """RepDistiller's ``2^(i - n + 1)`` for stage i of n: 1 for the deepest, halving towards the input."""
    return [2.0 ** (i - n + 1) for i in range(n)]


def conv_reg(s_shape: tuple[int, ...], t_shape: tuple[int, ...]) -> nn.Module | None:
    """RepDistiller ``ConvReg``'s conv from a (B, C_s, H_s, W_s) map to a (B, C_t, H_t, W_t) one: 3x3 stride 2
    (H_s = 2 H_t), 4x4 stride-2 transposed (2 H_s = H_t) or valid (H_s >= H_t); None where it has none."""
    (s_c, s_h, s_w), (t_c, t_h, t_w) = s_shape[1:4], t_shape[1:4]
    if s_h == 2 * t_h:
        return nn.Conv2d(s_c, t_c, kernel_size=3, stride=2, padding=1)
    if 2 * s_h == t_h:
        return nn.ConvTranspose2d(s_c, t_c, kernel_size=4, stride=2, padding=1)
    if s_h >= t_h and s_w >= t_w:
        return nn.Conv2d(s_c, t_c, kernel_size=(1 + s_h - t_h, 1 + s_w - t_w))
    return None


class Connector(nn.Module):
    """One stage's connector (RepDistiller ``Connector`` / ``ConvReg(use_relu=False)``): ``conv`` then ``bn``,
    or the identity (no parameters) where the shapes agree; see the module docstring for the conv's form.
    ``s_shape`` / ``t_shape`` are the probed (B, C, H, W) maps; ``pair`` names the stage pair in errors."""

    def __init__(self, s_shape: tuple[int, ...], t_shape: tuple[int, ...], pair: str = "a stage pair") -> None:
        super().__init__()
        self.identity = tuple(s_shape[1:4]) == tuple(t_shape[1:4])
        if self.identity:
            return
        conv = conv_reg(s_shape, t_shape)
        if conv is None or _out_size(conv, s_shape) != tuple(t_shape[2:4]):
            raise ConfigError(f"'ab' cannot connect {pair} (student map {tuple(s_shape[1:])}, teacher map "
                              f"{tuple(t_shape[1:])}): RepDistiller's connector needs the student's map twice, half "
                              "or at least the teacher's size in both H and W (pair other stages in "
                              "model.taps.stages_pre)")
        self.conv = conv
        self.bn = nn.BatchNorm2d(int(t_shape[1]))

    def forward(self, x: Tensor) -> Tensor:
        return x if self.identity else self.bn(self.conv(x))


def _out_size(conv: nn.Module, s_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The (H, W) ``conv`` maps a ``s_shape`` map to."""
    with torch.no_grad():
        return tuple(conv(torch.zeros(1, *s_shape[1:4])).shape[2:])


@dataclass
class ABOptions(Options):
    """``margin``: mu of the alternative loss (1, RepDistiller's); ``init_epochs``: epochs of the pre-training
    stage (30; 0 = none); ``init_lr``: its constant SGD learning rate (0.05)."""

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
        first_s, first_t = len(student.stages_pre) - len(pairs), len(teacher.stages_pre) - len(pairs)
        connectors = []
        for i, (f_s, f_t) in enumerate(pairs):
            name = f"student stage {first_s + i} / teacher stage {first_t + i}"
            if f_s.dim() != 4 or f_t.dim() != 4:
                raise ConfigError(f"'ab' needs spatial pre-activation maps (B, C, H, W); {name} have shapes "
                                  f"{tuple(f_s.shape)} and {tuple(f_t.shape)}")
            connectors.append(Connector(tuple(f_s.shape), tuple(f_t.shape), name))
        self.connectors = nn.ModuleList(connectors)
        self.weights = stage_weights(len(pairs))

    def loss(self, student: Taps, teacher: Taps) -> Tensor:
        """The term ``ab`` (RepDistiller ``sum(ABLoss(n)(connector(feat_s[1:-1]), feat_t[1:-1]))``)."""
        pairs = paired_stages(student.stages_pre, teacher.stages_pre)
        batch = pairs[0][0].shape[0]
        return sum(w * boundary_loss(c(s), t.detach(), self.margin) / batch * SCALE
                   for w, c, (s, t) in zip(self.weights, self.connectors, pairs, strict=True))

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage | None:
        """RepDistiller's ``init``: the student's body and the connectors learn the boundaries alone first
        (modules ``model`` = the student, ``connectors``); None when ``init_epochs`` is 0."""
        opts = self.options
        return student_pretraining_stage(INIT_STAGE, self.loss, teacher, student, {"connectors": self.connectors},
                                         epochs=opts.init_epochs, lr=opts.init_lr, method="ab")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"ab": self.loss(student, teacher)}
