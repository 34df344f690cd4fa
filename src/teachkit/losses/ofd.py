"""Heo, Kim, Yun, Park, Kwak & Choi 2019, "A Comprehensive Overhaul of Feature Distillation" (OFD, ICCV 2019).

OFD distils the teacher's *pre-ReLU* features (Sec. 3.2) through a student connector ``r`` (Sec. 3.3,
conv1x1 + BN) with the margin ReLU (Eq. 2) and the partial L2 distance (Eq. 3)::

    sigma_m(x) = max(x, m)                                       (teacher target, Eq. 2)
    d_p(T, S) = sum_i  0                 if S_i <= T_i <= 0      (Eq. 3)
                       (T_i - S_i)^2     otherwise
    L_distill = d_p(sigma_m(F_t), r(F_s))                        (Eq. 4)

The margin of each channel (Eq. 1) is the expectation of its negative responses, computed from the teacher's
BatchNorm before that ReLU, whose output is taken as Gaussian with mean = BN bias and std = |BN weight|:
``m = E[x | x < 0] = mu - s phi(mu / s) / Phi(-mu / s)``.

The numbers are those of mdistiller (megvii-research/mdistiller, ``mdistiller/distillers/OFD.py`` with
``mdistiller/engine/cfg.py``):

- margins (``get_margin_from_BN``): ``s = |weight|``, ``m = bias``; ``-s exp(-(m/s)^2 / 2) / sqrt(2 pi) /
  Phi(-m/s) + m`` where ``Phi(-m/s) > 0.001``, else ``-3 s``. Phi is scipy's ``norm.cdf`` there, here the
  float64 ``0.5 erfc(-x / sqrt 2)`` (equal to scipy's to float64 rounding; accurate in the tail too). They
  come from the BN's affine parameters only (not its running statistics), are computed once at construction
  from the teacher as it is then, in float64, and kept as buffers in the BN weight's dtype (float32: the
  reference's ``FloatTensor``), so they save and resume with the objective. A BN weight of exactly 0 (where
  the reference divides by zero) gives the limit: the bias when it is negative, else 0;
- ``feat_loss``: the reference's three masked terms are ``(s - t')^2 * ((s > t') | (t' > 0))`` with the
  teacher clamped at the margin, ``t' = max(t, m)`` (the margin is never positive); summed over channels and
  positions and averaged over the batch (``.mean(dim=0).sum()``);
- stages: the student's and the teacher's ``stages_pre`` (mdistiller's ``preact_feats[1:]``: its index 0 is
  the stem, which teachkit's stage taps leave out), the deepest ``min(n_s, n_t)`` of each paired in order;
  stage ``i`` of ``n`` weighs ``1 / 2^(n - 1 - i)`` (the deepest 1, the one before 1/2, ...);
- the teacher's map is adaptive-average-pooled to the student connector's output size (the reference does
  this whatever the sizes, so a larger student map gets the teacher's values repeated), then detached;
- connectors: per stage conv(k x k, padding (k - 1) // 2, no bias) from the student's channels to the
  teacher's, then BatchNorm2d; conv weights ``N(0, 2 / (k^2 out_channels))``, BN weight 1, bias 0
  (``ConnectorConvBN``); ``CONNECTOR.KERNEL_SIZE`` 1;
- weights: ``FEAT_WEIGHT`` 0.001 (``default_weight``; mdistiller's ImageNet config uses 1e-4), CE 1.

Deviations: mdistiller indexes its margin list by the position in the *aligned* feature list, so it needs a
teacher whose ``get_bn_before_relu`` returns exactly as many BNs as stages are distilled (its ImageNet ResNet
drops layer1's); here every teacher stage declares its BN (``teacher.model.taps.stages_bn``, one per
``stages_pre`` entry) and each distilled stage takes the margin of its own BN, which is what the reference
computes in every pairing it supports. teachkit's VGG ``stages_pre`` include ``block0`` (mdistiller's stem
``f0``), so a VGG-VGG pair distils 5 stages where mdistiller distils 4; ``num_stages=4`` reproduces it.
The teacher is teachkit's frozen teacher, in eval mode, so its pre-ReLU maps use its BNs' running statistics.
mdistiller's ``OFD.train`` overrides ``Distiller.train`` without its ``self.teacher.eval()``, and the authors'
CIFAR script (clovaai/overhaul-distillation) calls ``t_net.train()``, so there the teacher's maps are
normalised with batch statistics (and its running statistics drift; the margins, from the affine parameters
only, do not). The loss of given maps is the reference's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import as_map, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Tapped, spec_of, unwrap
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: mdistiller's threshold on Phi(-m / s) below which the margin falls back to ``-3 s``.
CDF_FLOOR = 0.001


def normal_cdf(x: Tensor) -> Tensor:
    """Phi(x) of the standard normal, ``0.5 erfc(-x / sqrt 2)`` (scipy's ``norm.cdf``)."""
    return 0.5 * torch.special.erfc(-x / math.sqrt(2.0))


def bn_margin(weight: Tensor, bias: Tensor) -> Tensor:
    """Per-channel margin (Heo et al. 2019, Eq. 1) of a BN output taken as N(bias, weight^2), in float64.

    ``E[x | x < 0] = m - s phi(m / s) / Phi(-m / s)`` with ``s = |weight|``, ``m = bias``, or ``-3 s`` where
    ``Phi(-m / s) <= 0.001`` (mdistiller's ``get_margin_from_BN``). Always <= 0.
    """
    s = weight.detach().to(torch.float64).abs()
    m = bias.detach().to(torch.float64)
    cdf = normal_cdf(-m / s)
    expectation = -s * torch.exp(-((m / s) ** 2) / 2) / math.sqrt(2 * math.pi) / cdf + m
    return torch.where(cdf > CDF_FLOOR, expectation, -3 * s)


def partial_l2(source: Tensor, target: Tensor, margin: Tensor) -> Tensor:
    """OFD's distance (Eqs. 2-3) summed over channels and positions, averaged over the batch.

    ``target`` is clamped at the per-channel ``margin`` (shape (C,)); positions where the student is at or
    below a non-positive target cost nothing (the teacher's ReLU would zero both).
    """
    target = torch.maximum(target, margin.to(source).view(1, -1, *([1] * (source.dim() - 2))))
    mask = (source > target) | (target > 0)
    return ((source - target) ** 2 * mask).mean(dim=0).sum()


@dataclass
class OFDOptions(Options):
    """``kernel_size``: the connectors' conv kernel (mdistiller's ``CONNECTOR.KERNEL_SIZE``, 1);
    ``num_stages``: how many of the deepest paired ``stages_pre`` to distil (null: all ``min(n_s, n_t)``;
    4 reproduces mdistiller for a VGG pair, whose teachkit stages include ``block0``)."""

    kernel_size: Literal[1, 3] = 1
    num_stages: int | None = option(None, ge=1)


@LOSSES.register("ofd", "OFD: partial L2 of conv+BN(student pre-ReLU) to the teacher's pre-ReLU maps clamped at "
                        "BN margins (Heo et al. 2019)", options=OFDOptions)
class OFD(DistillLoss):
    """OFD (Heo et al. 2019): ``sum_i 2^-(n-1-i) d_p(max(F_t^i, m^i), r_i(F_s^i))`` over the paired stages.

    Reads both sides' ``stages_pre`` and, through ``teacher_model``, the teacher's BatchNorm before each
    stage's ReLU (``teacher.model.taps.stages_bn``) for the margins ``m^i`` (buffers ``margin_0``...,
    shallowest distilled stage first). The connectors ``r_i`` (conv + BN) train with the student.
    Returns the unweighted ``{"feat": ...}``; ``default_weight`` 0.001 is mdistiller's ``FEAT_WEIGHT``.
    """

    student_needs = teacher_needs = ("stages_pre",)
    term_names = ("feat",)
    default_weight = 0.001
    reads_teacher_model = True

    def __init__(self, student: Taps, teacher: Taps, options: OFDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0, teacher_model: Tapped | None = None) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or OFDOptions()
        if teacher_model is None:
            raise ConfigError("'ofd' reads the teacher's BatchNorm parameters for its margins but was given no "
                              "teacher model; pass teacher_model= (the tapped teacher) to build_objective")
        require_taps("ofd", student, teacher, "stages_pre")
        s_maps = [as_map(f) for f in student.stages_pre]
        t_maps = [as_map(f) for f in teacher.stages_pre]
        bns = self._teacher_bns(teacher_model, t_maps)
        paired = min(len(s_maps), len(t_maps))
        n = self.options.num_stages if self.options.num_stages is not None else paired
        if n > paired:
            raise ConfigError(f"{self.options.key('num_stages')}={n} is out of range: the student has "
                              f"{len(s_maps)} and the teacher {len(t_maps)} stages_pre, so at most {paired}")
        self.num_stages = n
        k = self.options.kernel_size
        connectors = []
        for i, (f_s, f_t, bn) in enumerate(zip(s_maps[-n:], t_maps[-n:], bns[-n:], strict=True)):
            connectors.append(self._connector(f_s.shape[1], f_t.shape[1], k))
            margin = bn_margin(bn.weight, bn.bias).to(bn.weight.dtype)
            self.register_buffer(f"margin_{i}", margin)
        self.connectors = nn.ModuleList(connectors)

    @staticmethod
    def _teacher_bns(teacher_model: Tapped, t_maps: list[Tensor]) -> list[_BatchNorm]:
        """The teacher's ``stages_bn`` modules, one affine BatchNorm per stage with that stage's channels."""
        inner = unwrap(teacher_model.model if isinstance(teacher_model, Tapped) else teacher_model)
        spec = teacher_model.spec if isinstance(teacher_model, Tapped) else spec_of(inner)
        name = type(inner).__name__
        if not spec.stages_bn:
            raise ConfigError(f"'ofd' needs the BatchNorm before each stage's ReLU for its margins, but teacher "
                              f"model {name} declares none; name them in teacher.model.taps.stages_bn")
        if len(spec.stages_bn) != len(t_maps):
            raise ConfigError(f"'ofd': teacher model {name} declares {len(spec.stages_bn)} stages_bn for "
                              f"{len(t_maps)} stages_pre; name one BatchNorm per stage in teacher.model.taps.stages_bn")
        modules = dict(inner.named_modules())
        bns = []
        for j, (path, f_t) in enumerate(zip(spec.stages_bn, t_maps, strict=True)):
            key = f"teacher.model.taps.stages_bn[{j}]={path!r}"
            mod = modules.get(path)
            if mod is None:
                raise ConfigError(f"'ofd': teacher model {name} has no module {key}")
            if not isinstance(mod, _BatchNorm) or not mod.affine:
                what = "BatchNorm without affine parameters" if isinstance(mod, _BatchNorm) else type(mod).__name__
                raise ConfigError(f"'ofd': {key} of teacher model {name} is a {what}, not an affine BatchNorm; "
                                  "name the BatchNorm before that stage's ReLU")
            if mod.num_features != f_t.shape[1]:
                raise ConfigError(f"'ofd': {key} of teacher model {name} has {mod.num_features} channels but "
                                  f"stages_pre[{j}] has {f_t.shape[1]}; name the BatchNorm before that stage's ReLU")
            bns.append(mod)
        return bns

    @staticmethod
    def _connector(s_channels: int, t_channels: int, kernel_size: int) -> nn.Sequential:
        """conv(k x k, no bias) + BN, initialised as mdistiller's ``ConnectorConvBN``."""
        conv = nn.Conv2d(s_channels, t_channels, kernel_size, padding=(kernel_size - 1) // 2, bias=False)
        nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / (kernel_size * kernel_size * t_channels)))
        return nn.Sequential(conv, nn.BatchNorm2d(t_channels))

    def margins(self) -> list[Tensor]:
        """The per-channel margins of the distilled teacher stages, shallowest first."""
        return [getattr(self, f"margin_{i}") for i in range(self.num_stages)]

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        n = self.num_stages
        terms = []
        for i, (f_s, f_t, connector, margin) in enumerate(zip(
                student.stages_pre[-n:], teacher.stages_pre[-n:], self.connectors, self.margins(), strict=True)):
            source = upcast(connector(as_map(f_s)))
            target = upcast(F.adaptive_avg_pool2d(as_map(f_t).detach(), source.shape[-2:]))
            terms.append(partial_l2(source, target, margin) / 2 ** (n - 1 - i))
        return {"feat": sum(terms[1:], terms[0])}

    def extra_repr(self) -> str:
        return f"num_stages={self.num_stages}, kernel_size={self.options.kernel_size}"
