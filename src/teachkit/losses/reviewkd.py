"""Chen, Liu, Zhao & Jia 2021, "Distilling Knowledge via Knowledge Review" (CVPR 2021).

The student's features, from the deepest (pooled) level to the shallowest stage, pass through
attention-based fusion (ABF, paper Sec. 3.3 and its Fig. 3) modules: each maps its level to ``mid_channel``
channels, fuses it with the already-fused deeper level (nearest-resized) through two sigmoid attention
maps, and projects the result to the teacher's channels and spatial size. The hierarchical context loss
(HCL, same section) compares every fused level with the teacher's feature at full size and at 4x4, 2x2
and 1x1 average pools, weights 1, 1/2, 1/4, 1/8, normalised by their sum; the sum over levels is the
review loss with residual fusion of the paper's Sec. 3.2, as mdistiller's ``hcl_loss`` in
``mdistiller/distillers/ReviewKD.py`` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.dkd import warmup_factor
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: Pool sizes of the hierarchical context loss (a level is skipped once it is not smaller than the map).
HCL_LEVELS = (4, 2, 1)
#: mdistiller's cap on the fusion width: mid_channel = min(MAX_MID_CHANNEL, student's deepest channels).
MAX_MID_CHANNEL = 512


class ABF(nn.Module):
    """Attention-based fusion of one student level with the fused deeper level (Chen et al. 2021, Sec. 3.3).

    ``conv1`` (1x1 conv + BN) maps the student feature to ``mid_channel``; when ``fuse``, the deeper
    result is nearest-resized to this level's size and mixed in with two attention maps
    (1x1 conv on the concatenation + sigmoid); the mix is nearest-resized to the teacher's size and
    ``conv2`` (3x3 conv + BN) maps it to the teacher's channels. Returns (output, fused mix).
    """

    def __init__(self, in_channel: int, mid_channel: int, out_channel: int, fuse: bool) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(in_channel, mid_channel, kernel_size=1, bias=False),
                                   nn.BatchNorm2d(mid_channel))
        self.conv2 = nn.Sequential(nn.Conv2d(mid_channel, out_channel, kernel_size=3, padding=1, bias=False),
                                   nn.BatchNorm2d(out_channel))
        self.att_conv = (nn.Sequential(nn.Conv2d(mid_channel * 2, 2, kernel_size=1), nn.Sigmoid())
                         if fuse else None)
        nn.init.kaiming_uniform_(self.conv1[0].weight, a=1)
        nn.init.kaiming_uniform_(self.conv2[0].weight, a=1)

    @staticmethod
    def _conv_bn(block: nn.Sequential, x: Tensor) -> Tensor:
        """conv + BN; with one value per channel (a last batch of 1 at the 1x1 pooled level) batch
        statistics do not exist, so BN normalises with its running statistics instead of failing."""
        conv, bn = block[0], block[1]
        y = conv(x)
        if bn.training and y.shape[0] * y.shape[2] * y.shape[3] == 1:
            return F.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
        return bn(y)

    def forward(self, x: Tensor, deeper: Tensor | None, out_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        x = self._conv_bn(self.conv1, x)
        if self.att_conv is not None:
            if deeper is None:
                raise ValueError("a fusing ABF needs the deeper level's fused feature")
            deeper = F.interpolate(deeper, size=x.shape[-2:], mode="nearest")
            att = self.att_conv(torch.cat([x, deeper], dim=1))
            x = x * att[:, 0:1] + deeper * att[:, 1:2]
        if tuple(x.shape[-2:]) != tuple(out_size):
            x = F.interpolate(x, size=tuple(out_size), mode="nearest")
        return self._conv_bn(self.conv2, x), x


def hcl_loss(student: list[Tensor], teacher: list[Tensor]) -> Tensor:
    """Hierarchical context loss (mdistiller's ``hcl_loss``), summed over levels.

    Per level: (MSE(f_s, f_t) + sum_l w_l MSE(pool_l(f_s), pool_l(f_t))) / (1 + sum_l w_l), l = 4, 2, 1
    with w = 1/2, 1/4, 1/8, skipping pools l >= min(H, W) (mdistiller tests H only; same on square maps).
    MSE is the element mean, in at least float32 (float64 stays float64).
    """
    total = student[0].new_zeros((), dtype=upcast(student[0]).dtype)
    for fs, ft in zip(student, teacher, strict=True):
        fs, ft = upcast(fs), upcast(ft)
        loss = F.mse_loss(fs, ft)
        weight, norm = 1.0, 1.0
        for size in HCL_LEVELS:
            if size >= min(fs.shape[-2:]):
                continue
            weight /= 2
            loss = loss + weight * F.mse_loss(F.adaptive_avg_pool2d(fs, size), F.adaptive_avg_pool2d(ft, size))
            norm += weight
        total = total + loss / norm
    return total


def _levels(taps: Taps, tap: str, side: str) -> list[Tensor]:
    """The 4-D maps of ``tap`` plus the embedding as a (B, C, 1, 1) map; ConfigError naming what is missing."""
    maps = taps.get(tap)
    if not maps:
        raise ConfigError(f"reviewkd needs the {side}'s {tap!r} tap (stage feature maps); "
                          f"name its modules in model.taps.{tap}")
    if taps.embedding is None:
        raise ConfigError(f"reviewkd needs the {side}'s 'embedding' tap (pooled penultimate feature); "
                          f"name its classifier module in model.taps.embedding")
    for i, m in enumerate(maps):
        if m.dim() != 4:
            raise ConfigError(f"reviewkd needs 4-D (N, C, H, W) stage maps, but the {side}'s {tap!r} tap {i} "
                              f"has shape {tuple(m.shape)}; it fuses spatial feature maps (use a CNN)")
    return [*maps, taps.embedding.flatten(1)[:, :, None, None]]


@dataclass
class ReviewKDOptions(Options):
    """``warmup``: epochs of the linear ramp (20, mdistiller's); ``mid_channel``: the ABF width (null:
    mdistiller's rule min(512, C), C = the student's pooled feature width)."""

    warmup: float = option(20.0, ge=0.0)
    mid_channel: int | None = option(None, ge=1)


@LOSSES.register("reviewkd", "Knowledge review: ABF fusion of student stages, HCL vs teacher pre-ReLU maps, "
                             "20-epoch warm-up", options=ReviewKDOptions)
class ReviewKD(DistillLoss):
    """ReviewKD (Chen et al. 2021): ``min(epoch / warmup, 1) * HCL(ABF(student levels), teacher levels)``.

    Levels (all shapes probed): student = post-activation ``stages`` + pooled ``embedding`` as a
    C x 1 x 1 map (mdistiller's default, ``STU_PREACT=False``); teacher = pre-activation ``stages_pre``
    + pooled ``embedding``. When the two have different numbers of stages, the deepest
    min(S_student, S_teacher) stages of each are paired (deepest with deepest), plus the pooled level.

    ``mid_channel`` (the ABF width) defaults to mdistiller's rule min(512, C), C = the student's pooled
    feature width: 64 for CIFAR ResNet-20/56 students, 256 for ResNet8x4, as the original ReviewKD code
    sets per pair. Returns the unweighted ``{"hcl": HCL}``; the warm-up (``warmup`` epochs, default 20)
    is :meth:`ramp`, linear in ``progress.epoch_float`` (mdistiller steps it once per epoch, counting from
    1), and the objective's gamma (default 1; the paper uses 0.6, 1, 5 or 8 per pair, e.g. 5 for
    ResNet32x4 -> ResNet8x4) multiplies it.
    """

    student_needs = ("stages", "embedding")
    teacher_needs = ("stages_pre", "embedding")
    term_names = ("hcl",)
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, options: ReviewKDOptions | None = None, *,
                 num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or ReviewKDOptions()
        s_levels, t_levels = self._pair(student, teacher)
        mid_channel = self.options.mid_channel
        if mid_channel is None:
            mid_channel = min(MAX_MID_CHANNEL, s_levels[-1].shape[1])
        self.warmup = self.options.warmup
        self.mid_channel = int(mid_channel)
        #: Teacher (H, W) per level, shallow to deep: the size each ABF output is resized to.
        self.out_sizes = [tuple(t.shape[-2:]) for t in t_levels]
        last = len(s_levels) - 1
        self.abfs = nn.ModuleList(ABF(s.shape[1], self.mid_channel, t.shape[1], fuse=i < last)
                                  for i, (s, t) in enumerate(zip(s_levels, t_levels, strict=True)))

    def ramp(self, progress: Progress) -> float:
        """The linear warm-up factor ``min(epoch / warmup, 1)`` at ``progress`` (1 when warmup = 0)."""
        return warmup_factor(progress.epoch_float, self.warmup)

    @staticmethod
    def _pair(student: Taps, teacher: Taps) -> tuple[list[Tensor], list[Tensor]]:
        s = _levels(student, "stages", "student")
        t = _levels(teacher, "stages_pre", "teacher")
        n = min(len(s), len(t)) - 1  # stages kept from each side, deepest first
        return s[len(s) - 1 - n:], t[len(t) - 1 - n:]

    def fuse(self, student: Taps) -> list[Tensor]:
        """The student's fused levels, shallow to deep, each shaped like the paired teacher level."""
        s_levels = _levels(student, "stages", "student")
        s_levels = s_levels[len(s_levels) - len(self.abfs):]
        outputs: list[Tensor] = []
        deeper: Tensor | None = None
        for i in reversed(range(len(self.abfs))):
            out, deeper = self.abfs[i](s_levels[i], deeper, self.out_sizes[i])
            outputs.insert(0, out)
        return outputs

    def teacher_levels(self, teacher: Taps) -> list[Tensor]:
        """The teacher's levels the fused student levels are compared with, shallow to deep."""
        t_levels = _levels(teacher, "stages_pre", "teacher")
        return t_levels[len(t_levels) - len(self.abfs):]

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        teacher_levels = [t.detach() for t in self.teacher_levels(teacher)]
        return {"hcl": hcl_loss(self.fuse(student), teacher_levels)}

    def extra_repr(self) -> str:
        return f"warmup={self.warmup}, mid_channel={self.mid_channel}, out_sizes={self.out_sizes}"
