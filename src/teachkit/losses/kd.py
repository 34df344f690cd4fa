"""Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network".

Options beyond T: the divergence (forward KL by default; reverse KL, generalised Jensen-Shannon, total
variation, and a top-k sparse forward KL: :mod:`teachkit.losses.divergences`), whether the T^2 factor
applies, and logit standardisation (Sun et al. CVPR 2024, :mod:`teachkit.losses.logit_standardization`:
z-score both logits before the softmax; the authors run it with T = 2 and the KD weight 9).

A cached top-k teacher (a :class:`~teachkit.losses.divergences.TopKLogits` under ``teacher.extra["topk"]``, for a
vocabulary of 100k+ tokens) is read through the bucketed divergences (the k classes plus one bucket for the rest).
Large logits (a causal LM's packed (N_tokens, V)) are computed a block of rows at a time with bounded memory
(:mod:`teachkit.losses.chunked`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss, LogitRanks
from teachkit.losses.chunked import chunk_plan, chunked_row_mean
from teachkit.losses.divergences import TopKLogits, bucket_divergence, logit_divergence
from teachkit.losses.logit_standardization import maybe_standardize
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: T of a directly constructed :class:`HintonKD` (the RepDistiller / ECCV 2024 value; ``kd.temperature``).
DEFAULT_TEMPERATURE = 4.0


def _kd_kl_rows(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """KL(p_t^T || p_s^T) per row of (rows, classes) logits, by :func:`kd_kl`'s formula."""
    log_ps = F.log_softmax(upcast(student_logits) / temperature, dim=-1)
    log_pt = F.log_softmax(upcast(teacher_logits) / temperature, dim=-1)
    return (log_pt.exp() * (log_pt - log_ps)).sum(dim=-1)


def kd_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float, *,
          chunk_rows: int | None = None) -> Tensor:
    """T^2 * KL(p_t^T || p_s^T), summed over classes, mean over batch ('batchmean', never 'mean').

    Classes on axis 1. Above ``CHUNK_THRESHOLD`` rows x classes (or with ``chunk_rows``) a block of rows at a
    time, saving no log-probabilities for backward (:mod:`teachkit.losses.chunked`; no gradient reaches the
    teacher's logits there, which callers detach)."""
    classes = student_logits.shape[1] if student_logits.dim() > 1 else 1
    plan = chunk_plan(student_logits.numel() // max(1, classes), classes, chunk_rows)
    if plan is not None:
        zs, zt = (z.movedim(1, -1).reshape(-1, classes) for z in (student_logits, teacher_logits))
        return chunked_row_mean(partial(_kd_kl_rows, temperature=temperature), zs, zt,
                                chunk_rows=plan) * temperature**2
    log_ps = F.log_softmax(upcast(student_logits) / temperature, dim=1)
    log_pt = F.log_softmax(upcast(teacher_logits) / temperature, dim=1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(dim=1).mean()
    return kl * temperature**2


@dataclass
class KDOptions(Options):
    """``temperature``: T (null: ``kd.temperature``, which the objective fills in; 4 when built directly).
    ``divergence``: ``forward_kl`` (Hinton), ``reverse_kl``, ``jsd`` (generalised, weight ``jsd_beta`` in
    [0, 1]) or ``tv``; ``top_k``: keep the teacher's k most probable classes and bucket the rest (forward
    KL only, k below the class count); ``scale_t2``: multiply by T^2 (Hinton's gradient-scale correction);
    ``logit_standardize``: z-score both logits first (Sun et al. 2024)."""

    temperature: float | None = option(None, gt=0.0)
    divergence: Literal["forward_kl", "reverse_kl", "jsd", "tv"] = "forward_kl"
    jsd_beta: float = option(0.5, ge=0.0, le=1.0)
    top_k: int | None = option(None, ge=1)
    scale_t2: bool = True
    logit_standardize: bool = False

    def validate(self) -> None:
        if self.top_k is not None and self.divergence != "forward_kl":
            raise ConfigError(f"{self.key('top_k')}={self.top_k} applies to divergence forward_kl only, not "
                              f"{self.key('divergence')}={self.divergence}")


@LOSSES.register("kd", "Hinton KD: T^2 KL(p_t^T || p_s^T), batchmean; with CE 0.1 / KD 0.9, T=4; or reverse KL, "
                       "JSD(beta), TV, top-k KL; logit standardisation switch", options=KDOptions)
class HintonKD(DistillLoss):
    """T^2 * KL(p_t^T || p_s^T) (Hinton et al. 2015). Alone it is weighted ``kd.alpha`` (0.9) with
    CE weighted 1 - alpha (0.1), the RepDistiller recipe the ECCV 2024 paper follows. The options swap
    the divergence (:mod:`teachkit.losses.divergences`) and switch on logit standardisation (z-scored
    logits, Sun et al. 2024: the authors' ``kd_loss`` with ``logit_stand``); the default options give
    exactly :func:`kd_kl`. Logits (B, C, *positions) are distributions over axis 1 at every position,
    averaged over the batch and the positions, whichever divergence is chosen."""

    student_needs = teacher_needs = ("logits",)
    term_names = ("kl",)
    default_weight = 0.9
    #: class axis 1, any further axes are positions averaged over (a QA model's (B, L, 2) start/end logits)
    logit_ranks = LogitRanks(2, None, "(batch, classes) or (batch, classes, *positions)")

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: KDOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or KDOptions()
        opts = self.options
        t = opts.temperature
        self.temperature = DEFAULT_TEMPERATURE if t is None else float(t)
        if opts.top_k is not None and num_classes and opts.top_k >= num_classes:
            raise ConfigError(f"kd.options.kd.top_k={opts.top_k} must be below the number of classes ({num_classes}): "
                              f"allowed 1..{num_classes - 1}")
        if opts.logit_standardize and num_classes == 1:
            raise ConfigError("kd.options.kd.logit_standardize=true needs at least 2 classes (the standard "
                              "deviation of one logit is undefined)")
        self.plain = (opts.divergence == "forward_kl" and opts.top_k is None and opts.scale_t2
                      and not opts.logit_standardize)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        topk = teacher.extra.get("topk") if isinstance(teacher.extra, dict) else None
        if isinstance(topk, TopKLogits):  # a cached top-k teacher: never read teacher.logits (built densely)
            value = self.bucketed(student.logits, topk)
            return {"kl": value * self.temperature**2 if self.options.scale_t2 else value}
        if self.plain:
            return {"kl": kd_kl(student.logits, teacher.logits.detach(), self.temperature)}
        opts = self.options
        zs, zt = student.logits, teacher.logits.detach()  # the divergences upcast (per block of rows when chunked)
        if zs.dim() > 2:  # the divergences and standardisation read the last axis: move the classes there
            zs, zt = zs.movedim(1, -1), zt.movedim(1, -1)
        if opts.logit_standardize:
            zs, zt = maybe_standardize(upcast(zs), upcast(zt), True)
        value = logit_divergence(zs, zt, self.temperature, opts.divergence, opts.jsd_beta, opts.top_k)
        return {"kl": value * self.temperature**2 if opts.scale_t2 else value}

    def bucketed(self, student_logits: Tensor, topk: TopKLogits) -> Tensor:
        """The chosen divergence between the top-k teacher's k classes plus rest bucket and the student's, unscaled
        (:func:`~teachkit.losses.divergences.bucket_divergence`); ``top_k`` keeps fewer of the cached classes."""
        opts = self.options
        if opts.logit_standardize:
            raise ConfigError("kd.options.kd.logit_standardize=true needs the teacher's full logits, but the teacher "
                              f"is a cached top-{topk.k}; set logit_standardize=false or cache the full logits")
        if opts.top_k is not None and opts.top_k > topk.k:
            raise ConfigError(f"kd.options.kd.top_k={opts.top_k} is more than the cached teacher's top-{topk.k}: "
                              f"allowed 1..{topk.k}")
        if opts.top_k is not None:
            topk = topk.keep(opts.top_k)
        zs = student_logits
        if zs.dim() > 2:  # classes on axis 1, positions after: one row per (sample, position), as the cache's rows
            zs = zs.movedim(1, -1).reshape(-1, zs.shape[1])
        return bucket_divergence(zs, topk, self.temperature, opts.divergence, opts.jsd_beta)

    def extra_repr(self) -> str:
        opts = self.options
        extra = "" if self.plain else (f", divergence={opts.divergence}, top_k={opts.top_k}, scale_t2={opts.scale_t2}, "
                                       f"logit_standardize={opts.logit_standardize}")
        return f"temperature={self.temperature}{extra}"
