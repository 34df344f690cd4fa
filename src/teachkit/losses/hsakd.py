"""Yang, Zhu, An, Xu & Tian 2021, "Hierarchical Self-supervised Augmented Knowledge Distillation" (IJCAI).

HSAKD augments the label space with a self-supervised task: every image ``x`` is shown with its four
rotations ``t_r(x)``, ``r in {0, 90, 180, 270}``, and *auxiliary classifiers* attached to the hidden stages
of each network predict the joint (class, rotation) label ``y * 4 + r`` over ``4C`` outputs (the paper's
self-supervised augmented distribution, paper Sec. 3). The method has two steps:

1. **Teacher heads** (official ``train_teacher_cifar.py --freezed``): with the teacher
   backbone frozen, train its auxiliary heads with ``sum_l CE(c^t_l(t_r(x)), y * 4 + r)`` over the
   rotated training set. Here :meth:`HSAKD.prepare_teacher` (run once by the ``kd`` recipe).
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
- Teacher-head training: ``teacher_head_epochs`` (default 10, official 100) of SGD (momentum 0.9,
  Nesterov, weight decay 5e-4, lr ``teacher_head_lr`` 0.05 as official) with the official x0.1 steps at
  30/60/90 % of the epochs, batch ``data.batch_size`` originals (x4 rows; official 64). The official
  script also adds the (constant) CE of the frozen main classifier, which changes nothing and is
  dropped. Data: ``teacher_head_data="full"`` (default) trains on the teacher's full training split
  (``data.train_subset`` / ``omit_classes`` / ``few_shot`` ignored, as the teacher itself was trained)
  when the student's split is a reduced transfer set, ``"student"`` on the student's ``splits.train``;
  the student's augmentation (``data.augment``) is applied before rotating, as in the official loader.
- The trained heads are written to ``run_dir/hsakd_teacher_heads.safetensors`` and reloaded on a later
  call (resume) instead of being retrained; they are also part of the Distiller's state in the
  student checkpoints.
- :meth:`HSAKD.forward` also accepts a batch that was not rotated (B rows: rotation 0 only), so
  generic one-step tests work; real training always goes through ``transform_batch``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.augment import make_augment
from teachkit.data.base import Batch, TensorSplit
from teachkit.data.loader import BatchLoader
from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.errors import CheckpointError, ConfigError
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.kd import kd_kl
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps

NUM_ROTATIONS = 4
HEADS_FILE = "hsakd_teacher_heads.safetensors"
#: the official frozen-backbone schedule (100 epochs, x0.1 at 30, 60, 90) as fractions of the epochs
HEAD_MILESTONES = (0.3, 0.6, 0.9)


def rotate4(x: Tensor) -> Tensor:
    """``cat([x, rot90(x), rot180(x), rot270(x)])`` along the batch, rotating the last two (square) dims.

    Paper Sec. 3: the transformations ``t_r``, r = 0..3, of each image (``torch.rot90`` over
    (H, W) as in the official code). Raises :class:`ConfigError` unless ``x`` is (B, C, H, W) with H == W.
    """
    if x.dim() != 4:
        raise ConfigError(f"hsakd rotates images: inputs must be (batch, C, H, W), got shape {tuple(x.shape)}")
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


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"kd.options.hsakd.{name} must be an integer >= 1, got {value!r}")
    return value


def _positive_float(name: str, value: Any, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(f"kd.options.hsakd.{name} must be a finite number {'>=' if allow_zero else '>'} 0, "
                          f"got {value!r}")
    return float(value)


@LOSSES.register("hsakd", "HSAKD: 4 rotations, aux heads on stages predict (class, rotation); CE + KL(T=3) "
                          "on main logits and every head; teacher heads trained first, backbone frozen")
class HSAKD(DistillLoss):
    """Hierarchical self-supervised augmented KD (Yang et al., IJCAI 2021; see the module docstring).

    Terms (unweighted): ``ce`` = CE on the B original rows, ``kd`` = T^2 KL on the main logits of all
    rows, ``aux_kd`` = sum over head pairs of T^2 KL on the joint (class, rotation) logits, and with
    ``aux_ce=True`` also ``aux_ce`` = sum over student heads of CE on the joint labels.
    """

    needs = ("logits", "stages")
    default_weight = 1.0
    replaces_ce = True

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int, num_samples: int,
                 temperature: float = 3.0, head_blocks: int = 1, head_max_width: int = 256, aux_ce: bool = False,
                 teacher_head_epochs: int = 10, teacher_head_lr: float = 0.05,
                 teacher_head_weight_decay: float = 5e-4, teacher_head_batch_size: int | None = None,
                 teacher_head_data: str = "full") -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.temperature = _positive_float("temperature", temperature)
        self.head_blocks = _positive_int("head_blocks", head_blocks)
        self.head_max_width = _positive_int("head_max_width", head_max_width)
        if not isinstance(aux_ce, bool):
            raise ConfigError(f"kd.options.hsakd.aux_ce must be true or false, got {aux_ce!r}")
        self.aux_ce = aux_ce
        self.teacher_head_epochs = _positive_int("teacher_head_epochs", teacher_head_epochs)
        self.teacher_head_lr = _positive_float("teacher_head_lr", teacher_head_lr)
        self.teacher_head_weight_decay = _positive_float("teacher_head_weight_decay", teacher_head_weight_decay,
                                                         allow_zero=True)
        self.teacher_head_batch_size = (None if teacher_head_batch_size is None
                                        else _positive_int("teacher_head_batch_size", teacher_head_batch_size))
        if teacher_head_data not in ("full", "student"):
            raise ConfigError(f"kd.options.hsakd.teacher_head_data must be 'full' or 'student', "
                              f"got {teacher_head_data!r}")
        self.teacher_head_data = teacher_head_data
        if not student.stages or not teacher.stages:
            raise ConfigError("hsakd needs the 'stages' taps of both student and teacher")
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
        self._freeze_teacher_heads()
        #: per-epoch {"epoch", "loss", "joint_acc"} of the teacher-head training; loaded from the heads file
        self.teacher_head_history: list[dict[str, float]] = []
        self.teacher_heads_loaded = False

    # ------------------------------------------------------------------ frozen teacher heads

    def _freeze_teacher_heads(self) -> None:
        for p in self.teacher_heads.parameters():
            p.requires_grad_(False)
        self.teacher_heads.eval()

    def train(self, mode: bool = True) -> HSAKD:
        """Student heads follow ``mode``; the teacher heads stay in eval mode (frozen BN statistics)."""
        super().train(mode)
        self.teacher_heads.eval()
        return self

    # ------------------------------------------------------------------ hooks

    def transform_batch(self, batch: Batch) -> Batch:
        """``x`` -> its 4 rotations (4B rows, originals first); ``y`` and ``index`` stay the B originals'."""
        return Batch(rotate4(batch.x), batch.y, batch.index)

    def prepare_teacher(self, teacher: nn.Module, splits: Any, cfg: Any, run_dir: Any) -> None:
        """Train the teacher's auxiliary heads on joint labels with the backbone frozen (official
        ``--freezed`` step), save them to ``run_dir/hsakd_teacher_heads.safetensors`` and freeze them; if
        that file exists (resume), load it instead. ``teacher`` is the tapped, frozen teacher."""
        path = Path(run_dir) / HEADS_FILE
        if path.is_file():
            self._load_heads(path)
            return
        history = self._train_teacher_heads(teacher, splits, cfg)
        state = {"method": "hsakd", "num_classes": self.num_classes, "teacher_stages": self.teacher_stages,
                 "teacher_shapes": self.teacher_shapes, "head_blocks": self.head_blocks,
                 "head_max_width": self.head_max_width,
                 "epochs": self.teacher_head_epochs, "lr": self.teacher_head_lr, "history": history}
        save_checkpoint(path, dict(self.teacher_heads.state_dict()), state)
        self.teacher_head_history = history
        self.teacher_heads_loaded = False

    def _load_heads(self, path: Path) -> None:
        tensors, state = load_checkpoint(path)
        try:
            self.teacher_heads.load_state_dict(tensors)
        except RuntimeError:
            raise CheckpointError(f"{str(path)!r} holds HSAKD teacher heads of another teacher or head "
                                  "configuration; delete it to retrain them") from None
        self._freeze_teacher_heads()
        self.teacher_head_history = list(state.get("history", []))
        self.teacher_heads_loaded = True

    def _head_split(self, splits: Any, cfg: Any) -> TensorSplit:
        data = getattr(cfg, "data", None)
        reduced = data is not None and (data.train_subset is not None or data.omit_classes or data.few_shot)
        if self.teacher_head_data == "full" and reduced:
            from teachkit.recipes.common import load_data  # the recipes import losses: import late

            return load_data(data, splits.train.x.device, subset=False).train
        return splits.train

    def _train_teacher_heads(self, teacher: nn.Module, splits: Any, cfg: Any) -> list[dict[str, float]]:
        data, train = getattr(cfg, "data", None), getattr(cfg, "train", None)
        split = self._head_split(splits, cfg)
        batch_size = self.teacher_head_batch_size or (data.batch_size if data is not None else 64)
        seed = train.seed if train is not None else 0
        augment = make_augment(data.augment, splits) if data is not None else None
        loader = BatchLoader(split, batch_size, shuffle=True, seed=seed, augment=augment)
        device = next(self.teacher_heads.parameters()).device
        bf16 = train is not None and train.precision == "bf16"
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
        progress = train is not None and train.progress
        params = list(self.teacher_heads.parameters())
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.SGD(params, lr=self.teacher_head_lr, momentum=0.9, nesterov=True,
                              weight_decay=self.teacher_head_weight_decay)
        epochs = self.teacher_head_epochs
        milestones = [round(f * epochs) for f in HEAD_MILESTONES]
        history: list[dict[str, float]] = []
        self.teacher_heads.train()
        try:
            for epoch in range(epochs):
                lr = self.teacher_head_lr * 0.1 ** sum(epoch >= m for m in milestones)
                for group in opt.param_groups:
                    group["lr"] = lr
                total = correct = rows = 0.0
                for batch in loader.batches(epoch):
                    x = rotate4(batch.x)
                    labels = joint_labels(batch.y)
                    with autocast:
                        with torch.no_grad():
                            stages = teacher(x).stages
                        logits = [head(stages[i]) for head, i in zip(self.teacher_heads, self.teacher_stages,
                                                                     strict=True)]
                        loss = sum(F.cross_entropy(z.float(), labels) for z in logits)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    n = labels.shape[0]
                    total += float(loss.detach()) * n
                    correct += sum(float((z.detach().argmax(1) == labels).sum()) for z in logits) / len(logits)
                    rows += n
                record = {"epoch": epoch + 1, "lr": lr, "loss": total / rows, "joint_acc": correct / rows}
                history.append(record)
                if progress:
                    print(f"hsakd teacher heads epoch {epoch + 1}/{epochs}  loss {record['loss']:.4f}  "
                          f"joint acc {100 * record['joint_acc']:.1f}%", flush=True)
        finally:
            self._freeze_teacher_heads()
        return history

    # ------------------------------------------------------------------ the student loss

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        """The paper's student loss as in the official ``train_student_cifar.py`` (see the module docstring)."""
        b = batch.y.shape[0]
        rows = student.logits.shape[0]
        if rows % b or not 1 <= rows // b <= NUM_ROTATIONS:
            raise ValueError(f"hsakd expects B or 4B rows (transform_batch) for {b} labels, got {rows}")
        labels = joint_labels(batch.y, rows // b)
        t = self.temperature
        terms = {"ce": F.cross_entropy(student.logits[:b].float(), batch.y),
                 "kd": kd_kl(student.logits, teacher.logits.detach(), t)}
        s_aux = [head(student.stages[i]) for head, i in zip(self.student_heads, self.student_stages, strict=True)]
        with torch.no_grad():
            t_aux = [head(teacher.stages[i]) for head, i in zip(self.teacher_heads, self.teacher_stages,
                                                                strict=True)]
        terms["aux_kd"] = sum((kd_kl(s, z, t) for s, z in zip(s_aux, t_aux, strict=True)),
                              start=torch.zeros((), device=student.logits.device))
        if self.aux_ce:
            terms["aux_ce"] = sum((F.cross_entropy(s.float(), labels) for s in s_aux),
                                  start=torch.zeros((), device=student.logits.device))
        return terms
