"""Kim, Park & Kwak 2018, "Paraphrasing Complex Network: Network Compression via Factor Transfer" (FT, NeurIPS 2018).

FT moves knowledge through *factors*: compressed codes of a feature map. It has two steps:

1. **Paraphraser** (paper Sec. 3.1, Eq. 1): a convolutional autoencoder on the teacher's last stage map
   ``x``, trained alone (teacher frozen) on the reconstruction loss ``L_rec = ||x - P(x)||^2``; its
   encoder output is the teacher factor ``F_T``. Here :meth:`FactorTransfer.training_stage` describes
   this as a training stage (:data:`PARAPHRASER_STAGE`) that the ``kd`` recipe runs through the engine
   before the student trains, in the run folder's ``ft_paraphraser/`` sub-folder (NaN guard, checkpoints,
   exact resume; a finished stage is loaded, not retrained). Its term ``rec`` is ``nn.MSELoss()`` (the
   mean over every element) between the reconstruction and the teacher map, as RepDistiller's ``init``.
2. **Translator** (paper Sec. 3.2, Eqs. 2-3): a convolutional encoder on the student's last stage map,
   trained with the student, whose output ``F_S`` is pulled towards the frozen paraphraser's ``F_T``::

       L_student = CE + beta * L_FT,   L_FT = || F_T / ||F_T||_2 - F_S / ||F_S||_2 ||_p   (p = 1)

The numbers are those of RepDistiller (HobbitLong/RepDistiller): ``distiller_zoo/FT.py``
(``FactorTransfer(p1=2, p2=1)``), ``models/util.py`` (``Paraphraser``, ``Translator``),
``train_student.py`` / ``helper/loops.py`` (which maps, which modules train) and ``helper/pretrain.py``
(the paraphraser stage). Conventions:

- maps: the *last* stage's post-activation output of each network (RepDistiller's ``feat[-2]``, which is
  teachkit's ``stages[-1]``). (B, C, L) maps are read as (B, C, L, 1); (B, C) vectors are refused.
- paraphraser (teacher side, ``k = rate``, ``C' = int(k C_t)``): encoder conv3x3(C_t -> C_t) ->
  conv3x3(C_t -> C') -> conv3x3(C' -> C'), decoder convT3x3(C' -> C') -> convT3x3(C' -> C_t) ->
  convT3x3(C_t -> C_t); every conv stride 1, padding 1, with bias, each followed by [BatchNorm] and
  LeakyReLU(0.1). RepDistiller builds it with ``use_bn=False`` (``Paraphraser(t_shape)``): no BN by default.
- translator (student side): conv3x3(C_s -> C_s) -> conv3x3(C_s -> C') -> conv3x3(C' -> C'), each followed
  by BatchNorm (``use_bn=True``) and LeakyReLU(0.1): stride 1, so both factors keep their stage's (H, W).
- factor loss (``factor="attention"``, RepDistiller's ``factor_loss``): each factor ``F`` becomes
  ``normalize(mean_c F^2)`` flattened to (B, H*W) (``F.normalize``: L2 over positions, eps 1e-12), and
  ``L_FT = mean |Q_S - Q_T|`` (p = 1) or ``mean (Q_S - Q_T)^2`` (p = 2), the mean over batch and positions.
  Where the factors' sizes differ the larger is adaptive-average-pooled to the smaller first.
- detach points: the teacher map is detached, and the frozen paraphraser's encoder runs under no grad in
  eval mode (RepDistiller keeps ``module_list[2].eval()`` and leaves it out of ``trainable_list``); only
  the translator (and the student) train in the main stage.
- paraphraser stage (``helper/pretrain.py`` ``init``): ``init_epochs`` 30 epochs of SGD (momentum 0.9,
  weight decay 5e-4, constant lr ``init_lr``, no warm-up), batch size the run's; teacher and student in
  eval mode, the paraphraser in train mode.
- default weight 200: RepDistiller's ``scripts/run_cifar_distill.sh`` runs ``--distill factor -a 0 -b 200``
  (CE weight 1, no KD term).

Deviations (documented choices):

- ``factor="flatten"`` offers the paper's Eq. 3 instead, as the authors' own code writes it
  (Jangho-Kim/Factor-Transfer-pytorch ``train_student.py``: ``nn.L1Loss()(FT(factor_s), FT(factor_t))``
  with ``utils.FT(x) = F.normalize(x.view(B, -1))``): the whole factor flattened to (B, C' H W),
  L2-normalised, then the mean |difference| (p = 1). RepDistiller's channel-mean ``factor_loss`` (the
  default) is an attention-map-like variant of it. The authors' code also differs from RepDistiller in
  ways not offered here: no BatchNorm in the translator, ``int(round(k C))`` factor channels, an L1
  reconstruction loss for the paraphraser (lr 0.1, 6 epochs) and beta 500 on CIFAR-10.
- ``init_lr`` defaults to 0.01: RepDistiller's ``init`` uses 0.01 for every ResNet / WRN student with
  ``--distill factor`` and its ``--learning_rate`` otherwise, which is 0.01 for MobileNetV2 / ShuffleNets
  and 0.05 (the default) only for the VGG students.
- ``init_data="full"`` (default) trains the paraphraser, a teacher-side module, on the teacher's full
  training split when the student's split is a reduced transfer set (as the HSAKD teacher heads);
  ``"student"`` uses the student's transfer set. RepDistiller has one training set for both.
- Non-square maps are pooled per dimension to (min H, min W) (RepDistiller pools to a square of the
  smaller height; the same for its square maps).
- A pair whose pooled size is 1 x 1 is refused with ``factor="attention"``: its normalised channel mean is
  then the constant 1, so the loss would be identically 0.
- The paraphraser's weights are also part of the objective's state (``methods.ft.paraphraser.*``) in the
  student checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import as_map, match_spatial, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.losses.stage_eval import StageLossEvaluator, pretrain_optim
from teachkit.options import Options, option
from teachkit.types import Batch, Evaluator, Progress, StepOutput, Taps, TrainingStage, upcast

#: The name of the paraphraser training stage (the run folder's sub-folder it trains in).
PARAPHRASER_STAGE = "ft_paraphraser"
#: LeakyReLU slope of the paraphraser and translator (RepDistiller's 0.1).
SLOPE = 0.1


def conv_stack(channels: list[int], bn: bool, transpose: bool = False) -> nn.Sequential:
    """3x3 stride-1 padding-1 (transposed) convs ``channels[i] -> channels[i+1]``, each followed by
    BatchNorm (or an identity when ``bn`` is False) and LeakyReLU(0.1): indices 3i, 3i+1, 3i+2, as
    RepDistiller's ``Paraphraser`` / ``Translator`` lay out their ``nn.Sequential``."""
    conv = nn.ConvTranspose2d if transpose else nn.Conv2d
    layers: list[nn.Module] = []
    for cin, cout in zip(channels[:-1], channels[1:], strict=True):
        layers += [conv(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout) if bn else nn.Identity(), nn.LeakyReLU(SLOPE)]
    return nn.Sequential(*layers)


class Paraphraser(nn.Module):
    """The teacher-side autoencoder (paper Sec. 3.1): ``encoder`` C_t -> C_t -> C' -> C' gives the factor,
    ``decoder`` C' -> C' -> C_t -> C_t reconstructs the map (see the module docstring)."""

    def __init__(self, channels: int, factor_channels: int, bn: bool = False) -> None:
        super().__init__()
        self.encoder = conv_stack([channels, channels, factor_channels, factor_channels], bn)
        self.decoder = conv_stack([factor_channels, factor_channels, channels, channels], bn, transpose=True)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(factor, reconstruction) of a (B, C_t, H, W) map."""
        factor = self.encoder(x)
        return factor, self.decoder(factor)


class Translator(nn.Module):
    """The student-side encoder (paper Sec. 3.2): C_s -> C_s -> C' -> C' (see the module docstring)."""

    def __init__(self, channels: int, factor_channels: int, bn: bool = True) -> None:
        super().__init__()
        self.encoder = conv_stack([channels, channels, factor_channels, factor_channels], bn)

    def forward(self, x: Tensor) -> Tensor:
        return self.encoder(x)


def factor_code(f: Tensor, factor: Literal["attention", "flatten"] = "attention") -> Tensor:
    """A factor map (B, C', H, W) as an L2-normalised (B, D) code: ``normalize(mean_c F^2)`` over the
    H*W positions (RepDistiller's ``factor``, p1 = 2) or ``normalize(vec(F))`` over C' H W (paper Eq. 3)."""
    f = upcast(f)
    code = f.pow(2).mean(1).flatten(1) if factor == "attention" else f.flatten(1)
    return F.normalize(code, dim=1)


def factor_loss(factor_s: Tensor, factor_t: Tensor, p: int = 1,
                factor: Literal["attention", "flatten"] = "attention") -> Tensor:
    """L_FT (paper Eq. 3 as RepDistiller's ``factor_loss``): the larger factor pooled to the smaller's (H, W),
    then ``mean |Q_s - Q_t|^p`` over batch and code entries (p = 1: L1, p = 2: squared) of the codes of
    :func:`factor_code`."""
    factor_s, factor_t = match_spatial(factor_s, factor_t)
    diff = factor_code(factor_s, factor) - factor_code(factor_t, factor)
    return diff.abs().mean() if p == 1 else diff.pow(2).mean()


@dataclass
class FTOptions(Options):
    """FT's options (see the module docstring): ``rate`` k of the factor channels int(k C_t) (0.5);
    ``factor``: ``attention`` (RepDistiller's normalised channel mean of F^2) or ``flatten`` (paper Eq. 3);
    ``p`` the norm of L_FT (1); ``paraphraser_bn`` / ``translator_bn`` BatchNorm after each conv (False /
    True, as RepDistiller); ``init_*``: the paraphraser stage's epochs (30), lr (0.01), weight decay
    (5e-4), batch size (null: ``data.batch_size``) and data (``full`` | ``student``)."""

    rate: float = option(0.5, gt=0.0)
    factor: Literal["attention", "flatten"] = "attention"
    p: Literal[1, 2] = 1
    paraphraser_bn: bool = False
    translator_bn: bool = True
    init_epochs: int = option(30, ge=1)
    init_lr: float = option(0.01, gt=0.0)
    init_weight_decay: float = option(5e-4, ge=0.0)
    init_batch_size: int | None = option(None, ge=1)
    init_data: Literal["full", "student"] = "full"


def _last_map(method: str, side: str, taps: Taps) -> Tensor:
    """The last stage map of ``side`` as (B, C, H, W), or a ConfigError naming its shape."""
    f = taps.stages[-1]
    if f.dim() not in (3, 4):
        raise ConfigError(f"{method!r} needs a spatial last stage map (B, C, H, W) or (B, C, L); the {side}'s "
                          f"stage {len(taps.stages) - 1} has shape {tuple(f.shape)} (use an embedding method "
                          "such as pkt or rkd)")
    return as_map(f)


@LOSSES.register("ft", "factor transfer: L1 between normalised factors of a student translator and a pre-trained "
                       "teacher paraphraser on the last stage (Kim et al. 2018)", options=FTOptions)
class FactorTransfer(DistillLoss):
    """Factor transfer (Kim, Park & Kwak, NeurIPS 2018; see the module docstring).

    Term (unweighted): ``ft`` = :func:`factor_loss` between ``translator(f_s)`` and the frozen
    ``paraphraser.encoder(f_t)`` on the last stage maps. The paraphraser is trained beforehand by the stage
    :meth:`training_stage` returns.
    """

    student_needs = teacher_needs = ("stages",)
    term_names = ("ft",)
    frozen_parts = ("paraphraser",)
    default_weight = 200.0

    def __init__(self, student: Taps, teacher: Taps, options: FTOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or FTOptions()
        opts = self.options
        require_taps("ft", student, teacher, "stages")
        f_s, f_t = _last_map("ft", "student", student), _last_map("ft", "teacher", teacher)
        c_s, c_t = int(f_s.shape[1]), int(f_t.shape[1])
        factor_channels = int(c_t * opts.rate)
        if factor_channels < 1:
            raise ConfigError(f"{opts.key('rate')}={opts.rate!r} gives int({c_t} * {opts.rate}) = 0 factor channels "
                              f"for the teacher's last stage {tuple(f_t.shape[1:])}; use a larger rate")
        size = (min(f_s.shape[2], f_t.shape[2]), min(f_s.shape[3], f_t.shape[3]))
        if opts.factor == "attention" and size == (1, 1):
            raise ConfigError(f"'ft' with {opts.key('factor')}='attention' compares normalised channel means over "
                              f"positions, but the last stages (student {tuple(f_s.shape[1:])}, teacher "
                              f"{tuple(f_t.shape[1:])}) pool to 1x1, where it is constant (loss 0); use larger "
                              f"inputs or {opts.key('factor')}='flatten'")
        self.factor = opts.factor
        self.p = opts.p
        self.factor_channels = factor_channels
        self.translator = Translator(c_s, factor_channels, opts.translator_bn)
        self.paraphraser = Paraphraser(c_t, factor_channels, opts.paraphraser_bn)
        self.freeze_parts()  # the paraphraser only encodes the teacher's map (RepDistiller's module_list[2].eval())

    # ------------------------------------------------------------------ the paraphraser stage

    def reconstruction_loss(self, teacher: nn.Module, x: Tensor) -> Tensor:
        """``nn.MSELoss()`` between the paraphraser's reconstruction of the frozen teacher's last stage map
        on ``x`` and that map (paper Eq. 1; RepDistiller ``init``)."""
        with torch.no_grad():
            f_t = as_map(teacher(x).stages[-1]).detach()
        _, rec = self.paraphraser(f_t)
        return F.mse_loss(upcast(rec), upcast(f_t))

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage:
        """The paraphraser stage (RepDistiller ``helper/pretrain.py`` ``init``; see the module docstring): the
        paraphraser (unfrozen here) learns to reconstruct the frozen ``teacher``'s last stage map; ``finish``
        freezes it again. ``teacher`` is the tapped, frozen teacher (returns Taps); the student is not used."""
        paraphraser = self.paraphraser
        for p in paraphraser.parameters():
            p.requires_grad_(True)

        def step(batch: Batch, progress: Progress) -> StepOutput:
            return StepOutput({"rec": self.reconstruction_loss(teacher, batch.x)})

        def evaluator(splits: Any, batch_size: int) -> Evaluator:
            return StageLossEvaluator(lambda x: self.reconstruction_loss(teacher, x), [paraphraser], splits.val,
                                      batch_size)

        opts = self.options
        return TrainingStage(name=PARAPHRASER_STAGE, modules={"model": paraphraser}, step=step, evaluator=evaluator,
                             optim=pretrain_optim(opts.init_lr, opts.init_weight_decay), epochs=opts.init_epochs,
                             batch_size=opts.init_batch_size, data=opts.init_data, finish=self.freeze_parts)

    # ------------------------------------------------------------------ the student loss

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        """``L_FT(translator(f_s), paraphraser.encoder(f_t))`` on the last stage maps (RepDistiller ``loops.py``)."""
        factor_s = self.translator(as_map(student.stages[-1]))
        with torch.no_grad():
            factor_t = self.paraphraser.encoder(as_map(teacher.stages[-1]).detach())
        return {"ft": factor_loss(factor_s, factor_t, self.p, self.factor)}
