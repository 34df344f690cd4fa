"""Yim, Joo, Bae & Kim 2017, "A Gift from Knowledge Distillation: Fast Optimization, Network Minimization and
Transfer Learning" (FSP, CVPR 2017), Eq. 1-2.

The "flow of solution procedure" between two layers is their Gram matrix over the positions,
``G[i, j] = sum_{h,w} F1[i, h, w] F2[j, h, w] / (h w)`` (Eq. 1), and FSP fits the student's flow matrices
to the teacher's with a squared error (Eq. 2). The paper uses it to *pre-train* the student, then trains
on the task alone.

The numbers are those of RepDistiller (HobbitLong/RepDistiller ``distiller_zoo/FSP.py``): one matrix per
pair of consecutive maps, the larger map average-pooled to the smaller one's (square) size first, of shape
(B, C_top, C_bottom) with the mean over positions; the loss of a pair is the mean over every element of
``(G_s - G_t)^2``, and the pairs are summed. The student's and the teacher's maps must have the same
channel counts. As in RepDistiller's ``train_student.py`` / ``helper/pretrain.py``, FSP is a pre-training
stage: the student's body learns the flow matrices alone for ``init_epochs`` epochs (30; SGD, constant lr
0.05, momentum 0.9, weight decay 5e-4: RepDistiller's ``init``), then the student trains on CE alone
(``helper/loops.py`` sets ``loss_kd = 0`` for FSP): its main-stage weight is 0. The stage runs through the
engine in the run folder's ``fsp_init/`` (checkpoints, exact resume; a finished stage is loaded).

Both uses are offered: the stage (``init_epochs`` > 0, default) and the plain loss added to CE during the
main training (``kd.gamma.fsp`` > 0, e.g. with ``init_epochs: 0``).

Deviation: RepDistiller's maps are ``feat[:-1]``, the stem's output and the three stage outputs, so
three pairs; teachkit's ``stages`` are the stage outputs without the stem, so a CIFAR ResNet gives the
two pairs (stage 1, stage 2) and (stage 2, stage 3). With different stage counts the last
``min(n_s, n_t)`` stages are used. Non-square maps are pooled per dimension (same for square maps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import match_spatial, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.losses.stage_eval import student_pretraining_stage
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, TrainingStage, upcast

#: the run-folder sub-folder of FSP's pre-training stage
INIT_STAGE = "fsp_init"


def fsp_matrix(bottom: Tensor, top: Tensor) -> Tensor:
    """Eq. 1: ``G[b, j, i] = mean_{h,w} top[b, j, h, w] bottom[b, i, h, w]``, (B, C_top, C_bottom), after
    pooling the larger map to the smaller one's size."""
    bottom, top = match_spatial(upcast(bottom), upcast(top))
    return top.flatten(2) @ bottom.flatten(2).transpose(1, 2) / bottom.shape[2] / bottom.shape[3]


def fsp_terms(student_maps: list[Tensor], teacher_maps: list[Tensor]) -> list[Tensor]:
    """Eq. 2 per consecutive pair: ``mean((G_s - G_t)^2)``."""
    return [(fsp_matrix(s0, s1) - fsp_matrix(t0, t1)).pow(2).mean()
            for s0, s1, t0, t1 in zip(student_maps, student_maps[1:], teacher_maps, teacher_maps[1:], strict=False)]


@dataclass
class FSPOptions(Options):
    """``init_epochs``: epochs of the pre-training stage (30, RepDistiller's; 0 = none, the plain loss only);
    ``init_lr``: its constant SGD learning rate (0.05)."""

    init_epochs: int = option(30, ge=0)
    init_lr: float = option(0.05, gt=0.0)


@LOSSES.register("fsp", "FSP: MSE between flow (Gram) matrices of consecutive stages (Yim et al. 2017); student "
                        "pre-trained on it for 30 epochs, then CE (weight 0)", options=FSPOptions)
class FSP(DistillLoss):
    """FSP (Yim et al. 2017) as RepDistiller computes it (module docstring): term ``fsp`` = the sum over
    consecutive stage pairs of ``mean((G_s - G_t)^2)``; :meth:`training_stage` pre-trains the student on it."""

    student_needs = teacher_needs = ("stages",)
    term_names = ("fsp",)
    default_weight = 0.0

    def __init__(self, student: Taps, teacher: Taps, options: FSPOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or FSPOptions()
        require_taps("fsp", student, teacher, "stages")
        pairs = paired_stages(student.stages, teacher.stages)
        if len(pairs) < 2:
            raise ConfigError(f"'fsp' needs at least 2 stage maps on each side for a flow matrix; the probed models "
                              f"pair {len(pairs)} (name more in model.taps.stages)")
        n_s = len(student.stages)
        for i, (f_s, f_t) in enumerate(pairs):
            if f_s.dim() != 4 or f_t.dim() != 4:
                raise ConfigError(f"'fsp' needs spatial stage maps (B, C, H, W); stage pair {i} has shapes "
                                  f"{tuple(f_s.shape)} and {tuple(f_t.shape)}")
            if f_s.shape[1] != f_t.shape[1]:
                raise ConfigError(f"'fsp' compares flow matrices, so student and teacher stages need equal channel "
                                  f"counts: student stage {n_s - len(pairs) + i} has {f_s.shape[1]}, the paired "
                                  f"teacher stage {f_t.shape[1]} (choose a pair of equal widths, or use at / nst)")

    def loss(self, student: Taps, teacher: Taps) -> Tensor:
        pairs = paired_stages(student.stages, teacher.stages)
        return sum(fsp_terms([s for s, _ in pairs], [t.detach() for _, t in pairs]))

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage | None:
        """RepDistiller's ``init``: the student's body learns the teacher's flow matrices alone first."""
        def loss_fn(x: Any, s_taps: Taps, t_taps: Taps) -> Tensor:
            return self.loss(s_taps, t_taps)

        opts = self.options
        return student_pretraining_stage(INIT_STAGE, loss_fn, teacher, student, {}, epochs=opts.init_epochs,
                                         lr=opts.init_lr, method="fsp")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"fsp": self.loss(student, teacher)}
