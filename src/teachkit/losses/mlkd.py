"""Jin, Wang & Lin 2023, "Multi-Level Logit Distillation" (MLKD, CVPR 2023).

MLKD aligns teacher and student predictions at three levels, each over a set of temperatures and on a
weak and a strong augmented view of every image (paper Sec. 3, Eqs. 2-8): instance level (KL of the
per-sample distributions, Eq. 3), batch level (the B x B Gram matrix of predictions across samples,
Eqs. 4-5) and class level (the C x C Gram matrix across classes, Eqs. 6-7), plus CE on both views
(Eq. 8). Low-confidence samples / classes of the teacher are kept by "prediction augmentation" masks.

The numbers are those of the authors' code, Jin-Ying/Multi-Level-Logit-Distillation
``mdistiller/distillers/KD_ours.py`` (``KD_ours.forward_train``; identical, apart from ``logit_stand``, to
``mdistiller/distillers/MLKD.py`` of sunshangquan/logit-standardization-KD). With weak / strong logits
``s_w, s_s`` (student) and ``t_w, t_s`` (teacher), B samples, C classes, Ts = (T, 3, 5, 2, 6)::

    kd(s, t, T) = T^2 * mean_i sum_c p_t,T log(p_t,T / p_s,T)               ("batchmean" KL)
    cc(s, t, T) = || P_t^T P_t - P_s^T P_s ||_F^2 / C    (C x C, P = softmax(z / T), B x C)
    bc(s, t, T) = || P_t P_t^T - P_s P_s^T ||_F^2 / B    (B x B)
    conf_i = max_c softmax(t_w)_i;   mask_i = conf_i <= median(conf)         (samples, T = 1)
    cconf_c = sum_i softmax(t_w)_ic; cmask_c = cconf_c <= median(cconf)      (classes, T = 1)

    ce = CE(s_w, y) + CE(s_s, y)                                                  -> weight ce_weight
    kd = frac(mask) sum_{T in Ts} kd(s_w, t_w, T)
         + kd(s_s, t_s, T) + kd(s_s, t_s, 3) + kd(s_s, t_s, 5) + kd(s_w, t_w, 2) + kd(s_w, t_w, 6)
                                                                                  -> weight kd_weight
    cc = frac(cmask) sum_{T in Ts} cc(s_w, t_w, T)                                -> weight kd_weight
    bc = frac(mask)  sum_{T in Ts} bc(s_w, t_w, T)                                -> weight kd_weight

and the reference's loss is ``ce_weight * ce + kd_weight * (kd + cc + bc)`` (its ``losses_dict`` summed by
the trainer). Medians are ``np.percentile(., 50)`` (linear interpolation), here ``torch.quantile(.., 0.5,
interpolation="linear")``; the masks and confidences carry no gradient. The teacher's logits are detached.

Quirks of the reference, reproduced exactly (they decide the numbers):

- ``(kd_loss(...) * mask).mean()``: ``kd_loss`` is already reduced to a scalar, so the mask does not pick
  samples; it multiplies the whole term by the *fraction* of masked samples (about 1/2), ``frac(mask)``
  above; likewise ``cc * frac(cmask)`` and ``bc * frac(mask)``;
- the "strong" instance-level sum uses the *weak* logits for T = 2 and T = 6 (copy-paste in the
  reference), so those two weak terms count once unmasked on top of the masked weak sum;
- the strong class- and batch-level sums (``loss_cc_strong``, ``loss_bc_strong``) are computed by the
  reference but not returned in ``losses_dict``, so they neither count nor train; they are not computed here;
- the confidence masks read the teacher's raw weak logits at T = 1, also with ``logit_standardize``.

``logit_standardize`` (Sun et al. CVPR 2024, :mod:`teachkit.losses.logit_standardization`) z-scores both
logits inside ``kd`` only, exactly where the logit-standardisation authors' ``MLKD.py`` applies its
``logit_stand`` (``kd_loss``; not ``cc_loss`` / ``bc_loss`` nor the masks). Their CIFAR-100 setting for
MLKD with standardisation is base temperature 2 and KD weight 9 (their ``cfg.py``: ``KD.TEMPERATURE 2``,
``KD.LOSS.KD_WEIGHT 9``, ``CE_WEIGHT 0.1``; some of their logs use weight 6):
``kd.options.mlkd: {logit_standardize: true, temperature: 2, kd_weight: 9}``.

Defaults are the MLKD reference configs (``configs/cifar100/ours/*.yaml`` set no KD section, so
``cfg.py``'s ``KD.TEMPERATURE 4``, ``KD.LOSS.CE_WEIGHT 0.1``, ``KD.LOSS.KD_WEIGHT 0.9`` apply). The
method's own weight (``default_weight``, ``kd.gamma.mlkd``) is 1; the CE / KD weights are ``term_weights``,
so the objective logs ``mlkd.ce`` / ``mlkd.kd`` / ``mlkd.cc`` / ``mlkd.bc`` and adds no CE of its own
(``replaces_ce``).

Views (:meth:`MLKD.transform_batch`): the loader's batch is the weak view (the run's crop / flip, if any);
the strong view is :func:`teachkit.data.strong_augment.rand_augment` of it (RandAugment(2, 10) + Cutout, see
that module for how it differs from the PIL version), and the batch becomes ``cat(weak, strong)``: rows
``:B`` weak (the training metrics read them, as the reference returns the weak logits), rows ``B:`` strong;
``y`` and ``index`` stay the B originals'. The strong view of a batch is drawn from a CPU generator seeded
from (``seed`` option, the batch's sample ids ``index``, a call counter): reproducible for a given run,
different every epoch, and resumed exactly, since the counter is a buffer saved and restored with the
objective (without ``index``: the counter alone).

Deviations from the reference (deliberate):

- the strong view shares the weak view's crop / flip (the reference draws an independent crop / flip for
  it) and is computed on the training device from the normalised weak tensor (strong_augment docstring);
- teacher and student each run once on the 2B rows, so the student's BatchNorm statistics in training
  mode are those of both views together (the reference runs two forwards, one per view);
- the KD weight multiplies each term once outside the temperature sums (the reference multiplies inside):
  the same value to rounding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.data.strong_augment import rand_augment
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.kd import kd_kl
from teachkit.losses.logit_standardization import maybe_standardize
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: the temperatures the reference adds to the configured one, in its order
EXTRA_TEMPERATURES = (3.0, 5.0, 2.0, 6.0)


def median_mask(values: Tensor) -> Tensor:
    """``values <= np.percentile(values, 50)`` (linear interpolation), as a bool mask; no gradient."""
    values = values.detach()
    return values <= torch.quantile(values, 0.5, interpolation="linear")


def instance_kd(student: Tensor, teacher: Tensor, temperature: float, standardize: bool = False) -> Tensor:
    """The reference's ``kd_loss``: T^2 * KL(p_t^T || p_s^T), summed over classes, mean over rows, after
    the optional logit standardisation of both sides."""
    zs, zt = maybe_standardize(student, teacher, standardize)
    return kd_kl(zs, zt, temperature)


def class_consistency(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """The reference's ``cc_loss`` (paper Eqs. 6-7): ``|| P_t^T P_t - P_s^T P_s ||_F^2 / C``."""
    ps = F.softmax(student / temperature, dim=1)
    pt = F.softmax(teacher / temperature, dim=1)
    return ((pt.t() @ pt - ps.t() @ ps) ** 2).sum() / student.shape[1]


def batch_consistency(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """The reference's ``bc_loss`` (paper Eqs. 4-5): ``|| P_t P_t^T - P_s P_s^T ||_F^2 / B``."""
    ps = F.softmax(student / temperature, dim=1)
    pt = F.softmax(teacher / temperature, dim=1)
    return ((pt @ pt.t() - ps @ ps.t()) ** 2).sum() / student.shape[0]


def mlkd_terms(s_weak: Tensor, s_strong: Tensor, t_weak: Tensor, t_strong: Tensor, y: Tensor, temperature: float,
               standardize: bool = False) -> dict[str, Tensor]:
    """Unweighted ``{"ce", "kd", "cc", "bc"}`` of the reference from the four (B, C) logit tensors (module
    docstring); the reference's total is ``ce_weight * ce + kd_weight * (kd + cc + bc)``."""
    t_weak, t_strong = t_weak.detach(), t_strong.detach()
    with torch.no_grad():
        p = F.softmax(t_weak, dim=1)
        sample_frac = median_mask(p.max(dim=1).values).to(s_weak.dtype).mean()
        class_frac = median_mask(p.sum(dim=0)).to(s_weak.dtype).mean()
    temps = (float(temperature), *EXTRA_TEMPERATURES)
    kd_weak = [instance_kd(s_weak, t_weak, t, standardize) for t in temps]
    # the reference's strong sum: (T, 3, 5) on the strong logits, then (2, 6) on the *weak* ones (quirk)
    kd_strong = [instance_kd(s_strong, t_strong, t, standardize) for t in temps[:3]] + kd_weak[3:]
    return {"ce": F.cross_entropy(s_weak, y) + F.cross_entropy(s_strong, y),
            "kd": sample_frac * sum(kd_weak) + sum(kd_strong),
            "cc": class_frac * sum(class_consistency(s_weak, t_weak, t) for t in temps),
            "bc": sample_frac * sum(batch_consistency(s_weak, t_weak, t) for t in temps)}


@dataclass
class MLKDOptions(Options):
    """``temperature``: the configured T (4; the set is T, 3, 5, 2, 6); ``ce_weight`` (0.1) and ``kd_weight``
    (0.9): the reference's CE and KD loss weights; ``logit_standardize``: z-score the logits inside the
    instance-level KL (Sun et al. 2024; their setting T = 2, kd_weight = 9); ``seed``: mixed into the
    strong views' random numbers."""

    temperature: float = option(4.0, gt=0.0)
    ce_weight: float = option(0.1, ge=0.0)
    kd_weight: float = option(0.9, ge=0.0)
    logit_standardize: bool = False
    seed: int = option(0, ge=0)


@LOSSES.register("mlkd", "MLKD: weak + strong (RandAugment) views; instance KL, batch and class Gram alignment over "
                         "T in {4,3,5,2,6}, median-confidence masks; CE 0.1, KD 0.9", options=MLKDOptions)
class MLKD(DistillLoss):
    """Multi-level logit distillation (Jin, Wang & Lin, CVPR 2023; see the module docstring).

    Terms (unweighted): ``ce`` = CE on the weak plus the strong view, ``kd`` = instance-level KL sums,
    ``cc`` = class-level and ``bc`` = batch-level Gram-matrix alignment; ``term_weights`` hold the reference's
    ``ce_weight`` and ``kd_weight``. Expects the 2B rows of :meth:`transform_batch` (weak, then strong).
    """

    student_needs = teacher_needs = ("logits",)
    term_names = ("ce", "kd", "cc", "bc")
    default_weight = 1.0
    replaces_ce = True

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: MLKDOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or MLKDOptions()
        opts = self.options  # (batch, classes) logits: DistillLoss.logit_ranks, checked by the base class
        classes = num_classes or (student.logits.shape[-1] if student is not None else 0)
        if opts.logit_standardize and classes == 1:
            raise ConfigError("kd.options.mlkd.logit_standardize=true needs at least 2 classes (the standard "
                              "deviation of one logit is undefined)")
        self.temperature = float(opts.temperature)
        self.term_weights = {"ce": opts.ce_weight, "kd": opts.kd_weight, "cc": opts.kd_weight, "bc": opts.kd_weight}
        #: strong views drawn so far: part of each batch's seed, saved and restored with the objective
        self.register_buffer("views_drawn", torch.zeros((), dtype=torch.long))

    def view_generator(self, index: Tensor | None) -> torch.Generator:
        """The CPU generator for the next strong view: seeded from (seed, sample ids, call counter); advances
        the counter."""
        count = int(self.views_drawn.item())
        self.views_drawn += 1
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"mlkd-strong-view:{self.options.seed}:{count}:".encode())
        if isinstance(index, Tensor):
            digest.update(index.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") & (2**63 - 1))

    def transform_batch(self, batch: Batch) -> Batch:
        """``x`` -> ``cat(weak, strong(weak))`` (2B rows, weak first); ``y`` and ``index`` stay the B originals'."""
        x = batch.x
        if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ConfigError(f"mlkd makes strong views of images: inputs must be float (batch, C, H, W), got {shape}")
        index = batch.index if isinstance(batch.index, Tensor) else None
        strong = rand_augment(x, self.view_generator(index))
        return Batch(torch.cat([x, strong]), batch.y, batch.index)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        """The reference's four terms from the weak rows ``:B`` and strong rows ``B:`` (module docstring)."""
        b = batch.y.shape[0]
        rows = student.logits.shape[0]
        if rows != 2 * b or teacher.logits.shape[0] != rows:
            raise ValueError(f"mlkd expects 2B rows (weak then strong views, transform_batch) for {b} labels, got "
                             f"{rows} student / {teacher.logits.shape[0]} teacher rows")
        s, t = upcast(student.logits), upcast(teacher.logits.detach())
        return mlkd_terms(s[:b], s[b:], t[:b], t[b:], batch.y, self.temperature, self.options.logit_standardize)

    def extra_repr(self) -> str:
        opts = self.options
        return (f"temperature={self.temperature}, ce_weight={opts.ce_weight}, kd_weight={opts.kd_weight}, "
                f"logit_standardize={opts.logit_standardize}, seed={opts.seed}")
