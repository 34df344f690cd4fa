"""The logit divergences Hinton KD can use (``kd.options.kd.divergence``), each on the softened
distributions ``p = softmax(z_t / T)`` (teacher) and ``q = softmax(z_s / T)`` (student), summed over
classes and averaged over the batch ("batchmean"); :class:`~teachkit.losses.kd.HintonKD` multiplies
by T^2 (``scale_t2``).

- forward KL, ``KL(p || q)`` (Hinton et al. 2015): mass-covering, today's default;
- reverse KL, ``KL(q || p)``: mode-seeking, the student concentrates on the teacher's top classes
  (MiniLLM, Gu et al. ICLR 2024, for generative LMs);
- generalised Jensen-Shannon, ``JSD(beta) = beta KL(p || m) + (1 - beta) KL(q || m)`` with
  ``m = beta p + (1 - beta) q`` (GKD, Agarwal et al. ICLR 2024, Eq. 3 as Hugging Face TRL's
  ``generalized_jsd_loss`` computes it: beta = 0 is forward KL and beta = 1 reverse KL exactly, the
  limits of JSD(beta) / (beta (1 - beta)); in between the raw mixture form, which is small);
- total variation, ``TV = 1/2 sum_c |p_c - q_c|`` (bounded by 1, DistiLLM's and Wen et al.'s f-divergence
  family);
- top-k forward KL: the teacher's k most probable classes kept and every other class merged into one
  bucket, for both distributions: ``sum_{c in S} p_c log(p_c / q_c) + r_p log(r_p / r_q)`` with
  ``r = 1 - sum_{c in S}``. It is the KL of the two (k + 1)-outcome distributions, which are normalised as
  they stand (the bucket carries the rest of the mass), so it needs only the teacher's k largest
  probabilities and their total: what a sparse teacher cache stores for a large vocabulary. By the data
  processing inequality it is <= the full forward KL, and equal when k = C - 1.

Every function works in at least float32, from log-probabilities (log_softmax), with no log(0).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.types import upcast

Divergence = Literal["forward_kl", "reverse_kl", "jsd", "tv"]
DIVERGENCES: tuple[str, ...] = ("forward_kl", "reverse_kl", "jsd", "tv")


def _log_probs(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    return (F.log_softmax(upcast(student_logits) / temperature, dim=-1),
            F.log_softmax(upcast(teacher_logits) / temperature, dim=-1))


def _kl_rows(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a || b) per row from log-probabilities (0 log 0 = 0)."""
    return torch.where(log_a > -math.inf, log_a.exp() * (log_a - log_b), log_a.new_zeros(())).sum(dim=-1)


def forward_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``KL(p || q)``, batchmean."""
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    return _kl_rows(log_p, log_q).mean()


def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``KL(q || p)``, batchmean: the student's own distribution weighs the log-ratio."""
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    return _kl_rows(log_q, log_p).mean()


def jensen_shannon(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0,
                   beta: float = 0.5) -> Tensor:
    """``beta KL(p || m) + (1 - beta) KL(q || m)``, ``m = beta p + (1 - beta) q``, batchmean (GKD / TRL
    convention: beta = 0 gives forward KL, beta = 1 reverse KL). ``log m`` is a logsumexp of the two
    log-probabilities, so no probability is formed where it could underflow."""
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    if beta == 0.0:
        return _kl_rows(log_p, log_q).mean()
    if beta == 1.0:
        return _kl_rows(log_q, log_p).mean()
    log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1.0 - beta)]), dim=0)
    return (beta * _kl_rows(log_p, log_m) + (1.0 - beta) * _kl_rows(log_q, log_m)).mean()


def total_variation(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``1/2 sum_c |p_c - q_c|`` per row, batchmean (in [0, 1])."""
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(dim=-1).mean()


def top_k_forward_kl(student_logits: Tensor, teacher_logits: Tensor, k: int, temperature: float = 1.0) -> Tensor:
    """Forward KL over the teacher's ``k`` most probable classes plus one bucket for the rest (module
    docstring), batchmean. ``k`` must be below the number of classes."""
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    classes = log_p.shape[-1]
    if not 1 <= k < classes:
        raise ValueError(f"top_k={k} must be in 1..{classes - 1} for {classes} classes")
    top = log_p.topk(k, dim=-1).indices
    log_p_top, log_q_top = log_p.gather(-1, top), log_q.gather(-1, top)
    rest = torch.ones_like(log_p, dtype=torch.bool).scatter(-1, top, False)
    neg_inf = log_p.new_full((), -math.inf)
    log_p_rest = torch.logsumexp(torch.where(rest, log_p, neg_inf), dim=-1, keepdim=True)
    log_q_rest = torch.logsumexp(torch.where(rest, log_q, neg_inf), dim=-1, keepdim=True)
    return _kl_rows(torch.cat([log_p_top, log_p_rest], dim=-1), torch.cat([log_q_top, log_q_rest], dim=-1)).mean()


def logit_divergence(student_logits: Tensor, teacher_logits: Tensor, temperature: float,
                     divergence: str = "forward_kl", beta: float = 0.5, top_k: int | None = None) -> Tensor:
    """The divergence named ``divergence`` (top-k forward KL when ``top_k`` is set), unscaled."""
    if top_k is not None:
        if divergence != "forward_kl":
            raise ValueError(f"top_k applies to forward_kl only, not {divergence!r}")
        return top_k_forward_kl(student_logits, teacher_logits, top_k, temperature)
    if divergence == "forward_kl":
        return forward_kl(student_logits, teacher_logits, temperature)
    if divergence == "reverse_kl":
        return reverse_kl(student_logits, teacher_logits, temperature)
    if divergence == "jsd":
        return jensen_shannon(student_logits, teacher_logits, temperature, beta)
    if divergence == "tv":
        return total_variation(student_logits, teacher_logits, temperature)
    raise ValueError(f"unknown divergence {divergence!r}; allowed: {', '.join(DIVERGENCES)}")
