"""Zhao, Cui, Song, Qiu & Liang 2022, "Decoupled Knowledge Distillation" (CVPR 2022).

KD's KL splits into a target-class term and a non-target term (paper Eq. 7,
``KD = TCKD + (1 - p_t^T) NCKD``); DKD drops the coupling factor and weights the two freely
(Eq. 8: ``DKD = alpha TCKD + beta NCKD``). Computed as mdistiller's ``dkd_loss``
(megvii-research/mdistiller ``mdistiller/distillers/DKD.py``): each KL summed over its classes and
divided by the batch size ("batchmean"), times T^2, and the whole loss ramped up linearly over the
first ``warmup`` epochs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.data.base import Batch
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps

#: What mdistiller subtracts from the (temperature-scaled) target logit to drop it from NCKD's softmax.
TARGET_MASK = 1000.0


def _positive(name: str, value: float, *, allow_zero: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"kd.options.dkd.{name}={value!r} is not allowed: must be a finite number {bound}")
    return float(value)


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
    zs = student_logits.float() / temperature
    zt = teacher_logits.float() / temperature
    batch = zs.shape[0]
    scale = temperature**2 / batch
    tckd = _kl_sum(binary_log_probs(zt, target), binary_log_probs(zs, target)) * scale
    mask = TARGET_MASK * F.one_hot(target, zs.shape[1]).to(zs.dtype)
    nckd = _kl_sum(F.log_softmax(zt - mask, dim=1), F.log_softmax(zs - mask, dim=1)) * scale
    return tckd, nckd


def warmup_factor(epoch_float: float, warmup: float) -> float:
    """min(epoch / warmup, 1): 0 at the start, 1 from epoch ``warmup`` on (1 throughout when warmup = 0)."""
    return 1.0 if warmup <= 0 else min(epoch_float / warmup, 1.0)


@LOSSES.register("dkd", "Decoupled KD: warm-up * (alpha TCKD + beta NCKD) * T^2; alpha 1, beta 8, T 4, 20 epochs")
class DKD(DistillLoss):
    """Decoupled KD (Zhao et al. 2022, Eq. 8): ``min(epoch / warmup, 1) * (alpha TCKD + beta NCKD)``.

    Returns ``{"tckd": w * alpha * TCKD, "nckd": w * beta * NCKD}`` with the warm-up factor ``w`` and
    alpha/beta already applied, so the two terms sum to the paper's DKD loss; the Distiller's gamma
    (``default_weight`` 1) multiplies both. The warm-up reads ``progress.epoch_float`` (per step), where
    mdistiller uses the integer epoch counted from 1 (its first epoch is already at 1/20). The paper's
    beta varies per pair (0.2 ... 8, METHODS.md section 1); 8 is mdistiller's default.
    """

    needs = ("logits",)
    default_weight = 1.0

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, *, num_classes: int = 0,
                 num_samples: int = 0, alpha: float = 1.0, beta: float = 8.0, temperature: float = 4.0,
                 warmup: float = 20) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.alpha = _positive("alpha", alpha)
        self.beta = _positive("beta", beta)
        self.temperature = _positive("temperature", temperature, allow_zero=False)
        self.warmup = _positive("warmup", warmup)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        tckd, nckd = dkd_terms(student.logits, teacher.logits, batch.y, self.temperature)
        w = warmup_factor(progress.epoch_float, self.warmup)
        return {"tckd": w * self.alpha * tckd, "nckd": w * self.beta * nckd}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, beta={self.beta}, temperature={self.temperature}, warmup={self.warmup}"
