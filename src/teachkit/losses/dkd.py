"""Zhao, Cui, Song, Qiu & Liang 2022, "Decoupled Knowledge Distillation" (CVPR 2022).

KD's KL splits into a target-class term and a non-target term (paper Eq. 7,
``KD = TCKD + (1 - p_t^T) NCKD``); DKD drops the coupling factor and weights the two freely
(Eq. 8: ``DKD = alpha TCKD + beta NCKD``). Computed as mdistiller's ``dkd_loss``
(megvii-research/mdistiller ``mdistiller/distillers/DKD.py``): each KL summed over its classes and
divided by the batch size ("batchmean"), times T^2, and the whole loss ramped up linearly over the
first ``warmup`` epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.logit_standardization import maybe_standardize
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: What mdistiller subtracts from the (temperature-scaled) target logit to drop it from NCKD's softmax.
TARGET_MASK = 1000.0


def binary_log_probs(logits: Tensor, target: Tensor) -> Tensor:
    """log [p_target, 1 - p_target] (B, 2) of softmax(logits), computed in log space.

    mdistiller forms the two probabilities by summing softmax entries and then takes ``log``; that
    gives -inf (and a NaN loss) once p_target rounds to 1 in float32. Here log(1 - p_target) is the
    logsumexp of the non-target log-probabilities: the same value, finite for any confident model.
    """
    log_p = F.log_softmax(logits, dim=1)
    gt = F.one_hot(target, logits.shape[1]).bool()
    log_target = log_p.gather(1, target.unsqueeze(1))
    log_rest = torch.logsumexp(log_p.masked_fill(gt, float("-inf")), dim=1, keepdim=True)
    return torch.cat([log_target, log_rest], dim=1)


def _kl_sum(log_pt: Tensor, log_ps: Tensor) -> Tensor:
    """KL(p_t || p_s) summed over every element (classes and batch), from log-probabilities."""
    return (log_pt.exp() * (log_pt - log_ps)).sum()


def dkd_terms(student_logits: Tensor, teacher_logits: Tensor, target: Tensor,
              temperature: float) -> tuple[Tensor, Tensor]:
    """Unweighted (TCKD, NCKD) of Zhao et al. 2022, Eq. 7-8, each T^2 * KL summed / batch size.

    - TCKD = KL(b_t || b_s) over the binary distributions b = [p_target, 1 - p_target] of p = softmax(z / T);
    - NCKD = KL(p~_t || p~_s) over the non-target classes: softmax(z / T - 1000 * onehot(target)), as
      mdistiller masks the target (its probability is exp(-1000)-small, i.e. 0 in float32).
    """
    zs = upcast(student_logits) / temperature
    zt = upcast(teacher_logits) / temperature
    batch = zs.shape[0]
    scale = temperature**2 / batch
    tckd = _kl_sum(binary_log_probs(zt, target), binary_log_probs(zs, target)) * scale
    mask = TARGET_MASK * F.one_hot(target, zs.shape[1]).to(zs.dtype)
    nckd = _kl_sum(F.log_softmax(zt - mask, dim=1), F.log_softmax(zs - mask, dim=1)) * scale
    return tckd, nckd


def warmup_factor(epoch_float: float, warmup: float) -> float:
    """min(epoch / warmup, 1): 0 at the start, 1 from epoch ``warmup`` on (1 throughout when warmup = 0)."""
    return 1.0 if warmup <= 0 else min(epoch_float / warmup, 1.0)


@dataclass
class DKDOptions(Options):
    """``alpha`` / ``beta``: the weights of TCKD and NCKD (1 and 8, mdistiller's CIFAR defaults);
    ``temperature``: T (4); ``warmup``: epochs of the linear ramp (20); ``logit_standardize``: z-score
    both logits before the softmax (Sun et al. CVPR 2024; the authors run DKD with it at T = 2 and alpha,
    beta times 9)."""

    alpha: float = option(1.0, ge=0.0)
    beta: float = option(8.0, ge=0.0)
    temperature: float = option(4.0, gt=0.0)
    warmup: float = option(20.0, ge=0.0)
    logit_standardize: bool = False


@LOSSES.register("dkd", "Decoupled KD: warm-up * (alpha TCKD + beta NCKD) * T^2; alpha 1, beta 8, T 4, 20 epochs",
                 options=DKDOptions)
class DKD(DistillLoss):
    """Decoupled KD (Zhao et al. 2022, Eq. 8): ``min(epoch / warmup, 1) * (alpha TCKD + beta NCKD)``.

    Returns the unweighted ``{"tckd": TCKD, "nckd": NCKD}``; alpha and beta are ``term_weights`` and the
    warm-up factor ``min(epoch / warmup, 1)`` is :meth:`ramp`, so the objective's weighted terms (times its
    gamma, ``default_weight`` 1) sum to the paper's DKD loss and are logged as ``dkd.tckd`` / ``dkd.nckd``.
    The warm-up reads ``progress.epoch_float`` (per step), where mdistiller uses the integer epoch counted
    from 1 (its first epoch is already at 1/20). The paper tunes beta per teacher-student pair; 8 is
    mdistiller's default (``CFG.DKD.BETA`` in ``mdistiller/engine/cfg.py``).
    """

    student_needs = teacher_needs = ("logits",)
    term_names = ("tckd", "nckd")
    default_weight = 1.0

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: DKDOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or DKDOptions()
        opts = self.options
        self.alpha, self.beta = opts.alpha, opts.beta
        self.temperature, self.warmup = opts.temperature, opts.warmup
        self.term_weights = {"tckd": self.alpha, "nckd": self.beta}

    def ramp(self, progress: Progress) -> float:
        """The linear warm-up factor ``min(epoch / warmup, 1)`` at ``progress``."""
        return warmup_factor(progress.epoch_float, self.warmup)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        zs, zt = maybe_standardize(upcast(student.logits), upcast(teacher.logits.detach()),
                                   self.options.logit_standardize)
        tckd, nckd = dkd_terms(zs, zt, batch.y, self.temperature)
        return {"tckd": tckd, "nckd": nckd}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, beta={self.beta}, temperature={self.temperature}, warmup={self.warmup}"
