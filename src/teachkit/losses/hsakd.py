"""Yang, An, Cai & Xu 2021, "Hierarchical Self-supervised Augmented Knowledge Distillation" (IJCAI).

HSAKD augments the label space with a self-supervised task: every image ``x`` is shown with its four
rotations ``t_r(x)``, ``r in {0, 90, 180, 270}``, and *auxiliary classifiers* attached to the hidden stages
of each network predict the joint (class, rotation) label ``y * 4 + r`` over ``4C`` outputs (the paper's
self-supervised augmented distribution, paper Sec. 3). The method has two steps:

1. **Teacher heads** (official ``train_teacher_cifar.py --freezed``): with the teacher
   backbone frozen, train its auxiliary heads with ``sum_l CE(c^t_l(t_r(x)), y * 4 + r)`` over the
   rotated training set. Here :meth:`HSAKD.training_stage` describes this as a training stage
   (:data:`HEADS_STAGE`) that the ``kd`` recipe runs through the engine before the student trains, in
   the run folder's ``hsakd_teacher_heads/`` sub-folder: with its NaN guard, checkpoints and exact
   resume, and skipped when that folder's stage has finished (its heads are loaded instead).
2. **Student** (the paper's overall student loss; official ``train_student_cifar.py``)::

       L_S = CE(g^s(x), y)                                        originals only       ("ce")
           + T^2 KL(p^t_T(t_r(x)) || p^s_T(t_r(x)))               main logits, 4B rows ("kd")
           + sum_l T^2 KL(q^t_l,T(t_r(x)) || q^s_l,T(t_r(x)))     aux heads,   4B rows ("aux_kd")

   with T = 3 and KL "batchmean" (summed over classes, mean over the 4B rows), exactly the official
   ``DistillKL``. The student heads and backbone both receive the auxiliary gradients (official
   ``net(input, grad=True)``); the teacher and its heads are frozen.

Rotated batches (:meth:`HSAKD.transform_batch`) are laid out as four blocks of B rows,
``[x, rot90(x), rot180(x), rot270(x)]`` (originals first, as the engine requires), where the official
code interleaves them per sample; the joint label of row ``r * B + i`` is ``y_i * 4 + r``.

Head design (reduced official ``Auxiliary_Classifier``): the head on stage ``l`` is the rest of the
backbone's stage pyramid rebuilt as residual basic blocks -- one group per later stage, moving to that
stage's width and (ceil-)stride, ``head_blocks`` blocks per group (official: as many as the backbone
has per stage) -- or one stride-1 group for the last stage; then global average pooling and a Linear
to ``4C``. Every shape is read from the probed stage maps. A 2-D stage map (MLPs) gets
``Linear-BN-ReLU-Linear``.

Deviations from the official code (documented choices):

- Reduced size: ``head_blocks=1`` block per group by default (official: as many as the backbone stage,
  e.g. 9 for resnet56), basic blocks for every backbone (official: the backbone's own block type, e.g.
  bottlenecks for ResNet50), and widths capped at ``head_max_width=256`` (the official widths of the
  CIFAR ResNets / WRNs are <= 256; without a cap a 2048-wide ResNet50 stage would get ~200M head
  parameters).
- Student and teacher with different stage counts (e.g. lenet 2 vs resnet 3) pair their *last*
  ``min(K_s, K_t)`` stages, deepest with deepest (the official code assumes equal counts).
- ``aux_ce=True`` adds ``sum_l CE(c^s_l, y * 4 + r)`` ("aux_ce"): not in the official student loss
  (nor the paper's), hence off by default.
- Teacher-head stage: ``teacher_head_epochs`` (default 10, official 100) of SGD (momentum 0.9,
  Nesterov, weight decay 5e-4, lr ``teacher_head_lr`` 0.05 as official) with the official x0.1 steps at
  30/60/90 % of the epochs, batches of ``teacher_head_batch_size`` originals (default: the run's
  ``data.batch_size``; x4 rows; official 64). The official script also adds the (constant) CE of the
  frozen main classifier, which changes nothing and is dropped. Data: ``teacher_head_data="full"``
  (default) trains on the teacher's full training split (``data.train_subset`` / ``omit_classes`` /
  ``few_shot`` ignored, as the teacher itself was trained) when the student's split is a reduced transfer
  set, ``"student"`` on the student's transfer set; the batches come from the engine's loader with the
  run's augmentation, applied before rotating, as in the official loader. The stage logs the heads'
  joint (class, rotation) accuracy in % (``joint_acc``, train and val) and selects on it.
- The trained heads are also part of the objective's state (``methods.hsakd.teacher_heads.*``) in the
  student checkpoints.
- :meth:`HSAKD.forward` also accepts a batch that was not rotated (B rows: rotation 0 only), so
  generic one-step tests work; real training always goes through ``transform_batch``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.kd import kd_kl
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Evaluator, Progress, StepOutput, Taps, TrainingStage, upcast

NUM_ROTATIONS = 4
#: The name of the teacher-head training stage (the run folder's sub-folder it trains in).
HEADS_STAGE = "hsakd_teacher_heads"
#: the official frozen-backbone schedule (100 epochs, x0.1 at 30, 60, 90) as fractions of the epochs
HEAD_MILESTONES = (0.3, 0.6, 0.9)
#: originals per evaluation batch of the teacher heads (x4 rows)
EVAL_BATCH = 250


def rotate4(x: Tensor) -> Tensor:
    """``cat([x, rot90(x), rot180(x), rot270(x)])`` along the batch, rotating the last two (square) dims.

    Paper Sec. 3: the transformations ``t_r``, r = 0..3, of each image (``torch.rot90`` over
    (H, W) as in the official code). Raises :class:`ConfigError` unless ``x`` is (B, C, H, W) with H == W.
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ConfigError(f"hsakd rotates images: inputs must be (batch, C, H, W), got {shape}")
    if x.shape[-1] != x.shape[-2]:
        raise ConfigError(f"hsakd rotates images by 90 degrees, so it needs square inputs; got "
                          f"{x.shape[-2]}x{x.shape[-1]}")
    return torch.cat([torch.rot90(x, k, dims=(-2, -1)) for k in range(NUM_ROTATIONS)])


def joint_labels(y: Tensor, copies: int = NUM_ROTATIONS) -> Tensor:
    """Joint (class, rotation) labels ``y * 4 + r`` for ``copies`` blocks of B rows, block r rotated r*90 deg."""
    r = torch.arange(copies, device=y.device).repeat_interleave(y.shape[0])
    return y.repeat(copies) * NUM_ROTATIONS + r


class BasicBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN plus (1x1 conv-BN) shortcut, then ReLU (the official head block)."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, int] = (1, 1)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if cin != cout or stride != (1, 1):
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _init(module: nn.Module) -> None:
    """Official head initialisation: conv N(0, 2 / (k*k*out)), BN (1, 0), Linear bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
        elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def build_head(shapes: Sequence[Sequence[int]], index: int, out_dim: int, blocks: int = 1,
               max_width: int = 256) -> nn.Sequential:
    """The auxiliary classifier on stage ``index`` of a model whose stage maps have per-sample ``shapes``.

    A (C, H, W) stage gets one group of ``blocks`` basic blocks per later (C', H', W') stage (width
    min(C', max_width), stride ceil(H/H') x ceil(W/W')), or one stride-1 group when it is the last,
    then global average pooling and a Linear to ``out_dim``. A (C,) stage gets Linear-BN-ReLU-Linear
    (hidden width min(C, max_width)).
    """
    shape = tuple(shapes[index])
    if len(shape) == 1:
        c, hidden = shape[0], min(shape[0], max_width)
        head = nn.Sequential(nn.Linear(c, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
        _init(head)
        return head
    if len(shape) != 3:
        raise ConfigError(f"hsakd heads need stage maps shaped (C, H, W) or (C,); stage {index} has {shape}")
    later = [tuple(s) for s in shapes[index + 1:] if len(s) == 3] or [shape]
    layers: list[nn.Module] = []
    c, h, w = shape
    for c_next, h_next, w_next in later:
        stride = (max(1, math.ceil(h / h_next)), max(1, math.ceil(w / w_next)))
        width = min(c_next, max_width)
        for b in range(blocks):
            layers.append(BasicBlock(c, width, stride if b == 0 else (1, 1)))
            c = width
        h, w = math.ceil(h / stride[0]), math.ceil(w / stride[1])
    head = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(c, out_dim))
    _init(head)
    return head


@dataclass
class HSAKDOptions(Options):
    """HSAKD's options (see the module docstring): ``temperature`` T of every KL (3); ``head_blocks`` basic
    blocks per head group (1); ``head_max_width`` the cap on head widths (256); ``aux_ce`` add the student
    heads' joint-label CE; ``teacher_head_*``: the teacher-head stage's epochs (10), lr (0.05), weight
    decay (5e-4), batch size in originals (null: ``data.batch_size``) and data (``full`` | ``student``)."""

    temperature: float = option(3.0, gt=0.0)
    head_blocks: int = option(1, ge=1)
    head_max_width: int = option(256, ge=1)
    aux_ce: bool = False
    teacher_head_epochs: int = option(10, ge=1)
    teacher_head_lr: float = option(0.05, gt=0.0)
    teacher_head_weight_decay: float = option(5e-4, ge=0.0)
    teacher_head_batch_size: int | None = option(None, ge=1)
    teacher_head_data: Literal["full", "student"] = "full"


class TeacherHeadsEvaluator(Evaluator):
    """The teacher heads' joint (class, rotation) accuracy (%, primary) and CE summed over heads, on the
    rotated validation split, under no grad in eval mode (the modules' train/eval flags are restored).

    ``evaluate(heads)`` takes the stage's model (the :class:`~torch.nn.ModuleList` of teacher heads);
    ``teacher`` is the frozen, tapped teacher whose ``stages`` (at ``stages``) feed them.
    """

    primary = "joint_acc"

    def __init__(self, teacher: nn.Module, stages: Sequence[int], split: Any, batch_size: int = EVAL_BATCH) -> None:
        self.teacher = teacher
        self.stages = list(stages)
        self.split = split
        self.batch_size = int(batch_size)

    def metric_names(self) -> tuple[str, ...]:
        return ("joint_acc", "loss")

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        heads = model
        modes = [(m, m.training) for m in heads.modules()]
        heads.eval()
        try:
            device = next(heads.parameters()).device
            correct = torch.zeros((), dtype=torch.long, device=device)
            loss = torch.zeros((), device=device)
            rows = 0
            x_all, y_all = self.split.x, self.split.y
            for i in range(0, len(y_all), self.batch_size):
                x = rotate4(x_all[i:i + self.batch_size].to(device))
                labels = joint_labels(y_all[i:i + self.batch_size].to(device))
                stages = self.teacher(x).stages
                for head, s in zip(heads, self.stages, strict=True):
                    z = upcast(head(stages[s]))
                    loss = loss + F.cross_entropy(z, labels, reduction="sum").float()
                    correct += (z.argmax(1) == labels).sum()
                rows += labels.shape[0]
        finally:
            for m, mode in modes:
                m.training = mode
        if rows == 0:
            return {"val": {"joint_acc": float("nan"), "loss": float("nan")}}
        acc, mean_loss = torch.stack([100.0 * correct.float() / (len(self.stages) * rows), loss / rows]).tolist()
        return {"val": {"joint_acc": acc, "loss": mean_loss}}


@LOSSES.register("hsakd", "HSAKD: 4 rotations, aux heads on stages predict (class, rotation); CE + KL(T=3) "
                          "on main logits and every head; teacher heads trained first, backbone frozen",
                 options=HSAKDOptions)
class HSAKD(DistillLoss):
    """Hierarchical self-supervised augmented KD (Yang et al., IJCAI 2021; see the module docstring).

    Terms (unweighted): ``ce`` = CE on the B original rows, ``kd`` = T^2 KL on the main logits of all
    rows, ``aux_kd`` = sum over head pairs of T^2 KL on the joint (class, rotation) logits, and with
    ``aux_ce=True`` also ``aux_ce`` = sum over student heads of CE on the joint labels. The teacher heads
    are trained beforehand by the stage :meth:`training_stage` returns.
    """

    student_needs = teacher_needs = ("logits", "stages")
    term_names = ("ce", "kd", "aux_kd", "aux_ce")
    frozen_parts = ("teacher_heads",)
    default_weight = 1.0
    replaces_ce = True

    def __init__(self, student: Taps, teacher: Taps, options: HSAKDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or HSAKDOptions()
        opts = self.options
        self.temperature = opts.temperature
        self.head_blocks = opts.head_blocks
        self.head_max_width = opts.head_max_width
        self.aux_ce = opts.aux_ce
        if not student.stages or not teacher.stages:
            raise ConfigError("hsakd needs the 'stages' taps of both student and teacher")
        if num_classes < 1:
            raise ConfigError(f"hsakd needs the number of classes (its heads predict 4 x num_classes joint "
                              f"labels); got num_classes={num_classes}")
        self.num_classes = int(num_classes)
        out = NUM_ROTATIONS * self.num_classes
        s_shapes = [tuple(t.shape[1:]) for t in student.stages]
        t_shapes = [tuple(t.shape[1:]) for t in teacher.stages]
        k = min(len(s_shapes), len(t_shapes))
        # pair the last k stages, deepest with deepest
        self.student_stages = list(range(len(s_shapes) - k, len(s_shapes)))
        self.teacher_stages = list(range(len(t_shapes) - k, len(t_shapes)))
        self.teacher_shapes = [list(t_shapes[i]) for i in self.teacher_stages]
        self.student_heads = nn.ModuleList(build_head(s_shapes, i, out, self.head_blocks, self.head_max_width)
                                           for i in self.student_stages)
        self.teacher_heads = nn.ModuleList(build_head(t_shapes, i, out, self.head_blocks, self.head_max_width)
                                           for i in self.teacher_stages)
        self.freeze_parts()

    # ------------------------------------------------------------------ hooks

    def transform_batch(self, batch: Batch) -> Batch:
        """``x`` -> its 4 rotations (4B rows, originals first); ``y`` and ``index`` stay the B originals'."""
        return Batch(rotate4(batch.x), batch.y, batch.index)

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage:
        """The teacher-head stage (official ``--freezed`` step, see the module docstring): the heads
        (unfrozen here) learn the joint labels of the rotated batches from the frozen ``teacher``'s stage
        maps; ``finish`` freezes them again. ``teacher`` is the tapped, frozen teacher (returns Taps)."""
        heads = self.teacher_heads
        for p in heads.parameters():
            p.requires_grad_(True)
        stages = list(self.teacher_stages)

        def step(batch: Batch, progress: Progress) -> StepOutput:
            x = rotate4(batch.x)
            labels = joint_labels(batch.y)
            with torch.no_grad():
                maps = teacher(x).stages
            logits = [upcast(head(maps[i])) for head, i in zip(heads, stages, strict=True)]
            ce = sum((F.cross_entropy(z, labels) for z in logits), start=logits[0].new_zeros(()))
            with torch.no_grad():
                correct = sum((z.argmax(1) == labels).sum() for z in logits)
                # 100 * correct rows, averaged over heads, / 4 rotations: a sum over the batch's originals
                joint_acc = correct.float() * (100.0 / (len(logits) * NUM_ROTATIONS))
            return StepOutput({"ce": ce}, metrics={"joint_acc": joint_acc})

        def evaluator(splits: Any, batch_size: int) -> Evaluator:  # batch_size rows = batch_size / 4 originals
            return TeacherHeadsEvaluator(teacher, stages, splits.val, max(1, batch_size // NUM_ROTATIONS))

        epochs = self.options.teacher_head_epochs
        optim = {"name": "sgd", "lr": self.options.teacher_head_lr, "momentum": 0.9, "nesterov": True,
                 "weight_decay": self.options.teacher_head_weight_decay, "schedule": "multistep",
                 "milestones": [round(f * epochs) for f in HEAD_MILESTONES], "gamma": 0.1, "warmup_epochs": 0.0}
        return TrainingStage(name=HEADS_STAGE, modules={"model": heads}, step=step, evaluator=evaluator,
                             optim=optim, epochs=epochs, batch_size=self.options.teacher_head_batch_size,
                             data=self.options.teacher_head_data, finish=self.freeze_parts)

    # ------------------------------------------------------------------ the student loss

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        """The paper's student loss as in the official ``train_student_cifar.py`` (see the module docstring)."""
        b = batch.y.shape[0]
        rows = student.logits.shape[0]
        if rows % b or not 1 <= rows // b <= NUM_ROTATIONS:
            raise ValueError(f"hsakd expects B or 4B rows (transform_batch) for {b} labels, got {rows}")
        labels = joint_labels(batch.y, rows // b)
        t = self.temperature
        terms = {"ce": F.cross_entropy(upcast(student.logits[:b]), batch.y),
                 "kd": kd_kl(student.logits, teacher.logits.detach(), t)}
        s_aux = [head(student.stages[i]) for head, i in zip(self.student_heads, self.student_stages, strict=True)]
        with torch.no_grad():
            t_aux = [head(teacher.stages[i].detach()) for head, i in zip(self.teacher_heads, self.teacher_stages,
                                                                         strict=True)]
        zero = student.logits.new_zeros((), dtype=upcast(student.logits).dtype)
        terms["aux_kd"] = sum((kd_kl(s, z, t) for s, z in zip(s_aux, t_aux, strict=True)), start=zero)
        if self.aux_ce:
            terms["aux_ce"] = sum((F.cross_entropy(upcast(s), labels) for s in s_aux), start=zero)
        return terms
