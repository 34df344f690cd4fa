"""Yim, Joo, Bae & Kim 2017, "A Gift from Knowledge Distillation: Fast Optimization, Network Minimization and
Transfer Learning" (FSP, CVPR 2017), Eq. 1-2.

The "flow of solution procedure" between two layers is their Gram matrix over the positions (Eq. 1)

    G[i, j] = sum_{h,w} F1[h, w, i] F2[h, w, j] / (h w),

and FSP fits the student's flow matrices to the teacher's with a squared error (Eq. 2,
``sum_i lambda_i ||G_i^T - G_i^S||_2^2`` averaged over the samples). The paper uses it to *pre-train* the
student, then trains on the task alone.

The numbers are those of RepDistiller (HobbitLong/RepDistiller): ``distiller_zoo/FSP.py`` (``FSP``),
``train_student.py`` (``feat[:-1]``, ``init_trainable_list``), ``helper/pretrain.py`` (``init``) and
``helper/loops.py`` (the main stage). Conventions:

- maps: the post-activation stage outputs (``stages``), one flow matrix per pair of consecutive maps; the
  larger map of a pair is adaptive-average-pooled to the smaller one's size first. A matrix is
  (B, C_top, C_bottom), the mean over positions of ``top[j] * bottom[i]``.
- term: per pair, ``mean((G_s - G_t)^2)`` over batch and matrix entries (RepDistiller's ``compute_loss``:
  equal lambda_i, and a mean rather than the paper's sum over entries), summed over the pairs. The teacher's
  maps are detached (and computed under no grad). Student and teacher need equal channel counts per stage.
- pre-training stage (``helper/pretrain.py`` ``init``, ``init_trainable_list`` = ``model_s.get_feat_modules()``):
  the student's body learns the teacher's flow matrices alone for ``init_epochs`` epochs (30), SGD at a
  constant ``init_lr`` (0.05, RepDistiller's ``--learning_rate``, which its ``train_student.py`` lowers to
  0.01 for MobileNetV2 / ShuffleNet students: set ``init_lr: 0.01`` there), momentum 0.9, weight decay 5e-4,
  batch size the run's, on the student's transfer set, with the student in train mode and the teacher frozen.
  The student's classifier reads no stage map, so it gets no gradient and stays as initialised. The ``kd``
  recipe runs the stage through the engine in the run folder's ``fsp_init/`` (NaN guard, checkpoints, exact
  resume; a finished stage is loaded, not retrained).
- default weight 0: after the stage RepDistiller trains the student on CE alone (``helper/loops.py`` sets
  ``loss_kd = 0`` for ``fsp``; ``scripts/run_cifar_distill.sh`` runs ``--distill fsp -a 0 -b 50``, where
  ``-b`` multiplies that 0), so the objective skips FSP in the main training.

Both uses are offered: the stage then CE (defaults, the reference), and the plain loss added to CE in the
main training (``kd.gamma.fsp`` > 0, with or without the stage: ``init_epochs: 0`` skips it).

Deviations: RepDistiller's maps are ``feat[:-1]``, the stem's output and the stage outputs (three pairs for a
CIFAR ResNet); teachkit's ``stages`` exclude the stem, so by default FSP uses the consecutive pairs of the
available stages ((stage 1, stage 2) and (stage 2, stage 3) for a CIFAR ResNet). To include the stem pair as
RepDistiller does, name the stem in both tap specs, e.g. for the CIFAR ResNets
``model.taps: {stages: [relu, layer1, layer2, layer3]}`` and the same under ``teacher.model.taps``: the maps are
then exactly RepDistiller's ``feat[:-1]`` (test ``test_stem_in_the_taps_gives_repdistillers_three_pairs``).
With different stage counts the last ``min(n_s, n_t)`` stages are used (RepDistiller requires equal counts).
Non-square maps are pooled per dimension to (min H, min W) (RepDistiller pools to a square of the smaller
height; the same for square maps).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import equal_width_stage_pairs, match_spatial, paired_stages
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
        equal_width_stage_pairs("fsp", student, teacher, "compares flow matrices")

    def loss(self, student: Taps, teacher: Taps) -> Tensor:
        """The term ``fsp`` (RepDistiller ``sum(FSP(...)(feat_s[:-1], feat_t[:-1]))`` on teachkit's stages)."""
        pairs = paired_stages(student.stages, teacher.stages)
        return sum(fsp_terms([s for s, _ in pairs], [t.detach() for _, t in pairs]))

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage | None:
        """RepDistiller's ``init``: the student's body learns the teacher's flow matrices alone first (module
        ``model`` = the student); None when ``init_epochs`` is 0."""
        opts = self.options
        return student_pretraining_stage(INIT_STAGE, self.loss, teacher, student, {}, epochs=opts.init_epochs,
                                         lr=opts.init_lr, method="fsp")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        return {"fsp": self.loss(student, teacher)}
