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
- bucketed divergences (:func:`bucket_divergence`): any of the four above between the same two (k + 1)-outcome
  distributions, from a cached top-k teacher (:class:`TopKLogits`: the k largest logits and the log of the
  leftover mass, the DistillKit "rest bucket"); each is an f-divergence, so each is <= its full value.

Every function works in at least float32, from log-probabilities (log_softmax), with no log(0). Above
:data:`~teachkit.losses.chunked.CHUNK_THRESHOLD` rows x classes (a causal LM's packed (N_tokens, V) logits) each
computes a block of rows at a time with bounded memory (:mod:`teachkit.losses.chunked`; ``chunk_rows`` forces it);
the chunked form never backpropagates into the teacher's logits, which every caller detaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.chunked import chunk_plan, chunked_row_mean
from teachkit.types import upcast

Divergence = Literal["forward_kl", "reverse_kl", "jsd", "tv"]
DIVERGENCES: tuple[str, ...] = ("forward_kl", "reverse_kl", "jsd", "tv")
#: the logit :meth:`TopKLogits.dense` gives every class outside the top k (softmax: probability 0)
DENSE_FILL = -1e9


def _log_probs(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    return (F.log_softmax(upcast(student_logits) / temperature, dim=-1),
            F.log_softmax(upcast(teacher_logits) / temperature, dim=-1))


def _kl_rows(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a || b) per row from log-probabilities (0 log 0 = 0)."""
    return torch.where(log_a > -math.inf, log_a.exp() * (log_a - log_b), log_a.new_zeros(())).sum(dim=-1)


def _divergence_rows(log_q: Tensor, log_p: Tensor, divergence: str, beta: float = 0.5) -> Tensor:
    """The divergence named ``divergence`` per row from the student's ``log_q`` and the teacher's ``log_p``."""
    if divergence == "forward_kl" or (divergence == "jsd" and beta == 0.0):
        return _kl_rows(log_p, log_q)
    if divergence == "reverse_kl" or (divergence == "jsd" and beta == 1.0):
        return _kl_rows(log_q, log_p)
    if divergence == "jsd":
        log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1.0 - beta)]), dim=0)
        return beta * _kl_rows(log_p, log_m) + (1.0 - beta) * _kl_rows(log_q, log_m)
    if divergence == "tv":
        return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(dim=-1)
    raise ValueError(f"unknown divergence {divergence!r}; allowed: {', '.join(DIVERGENCES)}")


def _full_rows(student_logits: Tensor, teacher_logits: Tensor, temperature: float, divergence: str,
               beta: float = 0.5) -> Tensor:
    return _divergence_rows(*_log_probs(student_logits, teacher_logits, temperature), divergence, beta)


def _batchmean(student_logits: Tensor, teacher_logits: Tensor, temperature: float, divergence: str, beta: float,
               chunk_rows: int | None) -> Tensor:
    """The per-row divergence averaged over every row (all axes but the last), chunked for large inputs."""
    classes = student_logits.shape[-1]
    rows = student_logits.numel() // max(1, classes)
    plan = chunk_plan(rows, classes, chunk_rows)
    if plan is None:
        return _full_rows(student_logits, teacher_logits, temperature, divergence, beta).mean()
    fn = partial(_full_rows, temperature=temperature, divergence=divergence, beta=beta)
    return chunked_row_mean(fn, student_logits.reshape(-1, classes), teacher_logits.reshape(-1, classes),
                            chunk_rows=plan)


def forward_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0, *,
               chunk_rows: int | None = None) -> Tensor:
    """``KL(p || q)``, batchmean."""
    return _batchmean(student_logits, teacher_logits, temperature, "forward_kl", 0.5, chunk_rows)


def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0, *,
               chunk_rows: int | None = None) -> Tensor:
    """``KL(q || p)``, batchmean: the student's own distribution weighs the log-ratio."""
    return _batchmean(student_logits, teacher_logits, temperature, "reverse_kl", 0.5, chunk_rows)


def jensen_shannon(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0,
                   beta: float = 0.5, *, chunk_rows: int | None = None) -> Tensor:
    """``beta KL(p || m) + (1 - beta) KL(q || m)``, ``m = beta p + (1 - beta) q``, batchmean (GKD / TRL
    convention: beta = 0 gives forward KL, beta = 1 reverse KL). ``log m`` is a logsumexp of the two
    log-probabilities, so no probability is formed where it could underflow."""
    return _batchmean(student_logits, teacher_logits, temperature, "jsd", beta, chunk_rows)


def total_variation(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0, *,
                    chunk_rows: int | None = None) -> Tensor:
    """``1/2 sum_c |p_c - q_c|`` per row, batchmean (in [0, 1])."""
    return _batchmean(student_logits, teacher_logits, temperature, "tv", 0.5, chunk_rows)


def _rest_logsumexp(log_probs: Tensor, ids: Tensor) -> Tensor:
    """``log sum_{c not in ids} exp(log_probs_c)`` per row, (rows, 1): a logsumexp with ``ids`` masked out."""
    rest = torch.ones_like(log_probs, dtype=torch.bool).scatter(-1, ids, False)
    return torch.logsumexp(torch.where(rest, log_probs, log_probs.new_full((), -math.inf)), dim=-1, keepdim=True)


def _top_k_rows(student_logits: Tensor, teacher_logits: Tensor, k: int, temperature: float) -> Tensor:
    log_q, log_p = _log_probs(student_logits, teacher_logits, temperature)
    top = log_p.topk(k, dim=-1).indices
    log_p_top, log_q_top = log_p.gather(-1, top), log_q.gather(-1, top)
    log_p_rest, log_q_rest = _rest_logsumexp(log_p, top), _rest_logsumexp(log_q, top)
    return _kl_rows(torch.cat([log_p_top, log_p_rest], dim=-1), torch.cat([log_q_top, log_q_rest], dim=-1))


def top_k_forward_kl(student_logits: Tensor, teacher_logits: Tensor, k: int, temperature: float = 1.0, *,
                     chunk_rows: int | None = None) -> Tensor:
    """Forward KL over the teacher's ``k`` most probable classes plus one bucket for the rest (module
    docstring), batchmean. ``k`` must be below the number of classes."""
    classes = teacher_logits.shape[-1]
    if not 1 <= k < classes:
        raise ValueError(f"top_k={k} must be in 1..{classes - 1} for {classes} classes")
    rows = student_logits.numel() // classes
    plan = chunk_plan(rows, classes, chunk_rows)
    if plan is None:
        return _top_k_rows(student_logits, teacher_logits, k, temperature).mean()
    fn = partial(_top_k_rows, k=k, temperature=temperature)
    return chunked_row_mean(fn, student_logits.reshape(-1, classes), teacher_logits.reshape(-1, classes),
                            chunk_rows=plan)


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate at both ends (Maechler 2012): 0 at ``x = -inf``."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


@dataclass(eq=False)
class TopKLogits:
    """A cached top-k teacher: per row the ``k`` largest raw logits and the mass of all other classes.

    ``ids`` (N, k) int64 and ``values`` (N, k) (the teacher's k largest logits, any float dtype); ``log_rest`` (N,)
    the log of the probability (at T = 1) of the ``vocab_size - k`` other classes, i.e. their logsumexp minus the
    logsumexp of all logits (-inf when nothing is left, k = vocab_size); float32, float64 for float64 logits.
    What a sparse teacher cache stores for a vocabulary of 100k+ classes (DistillKit's top-k + rest bucket)."""

    ids: Tensor
    values: Tensor
    log_rest: Tensor
    vocab_size: int

    def __post_init__(self) -> None:
        if self.values.dim() != 2 or self.ids.shape != self.values.shape \
                or self.log_rest.shape != self.values.shape[:1]:
            raise ValueError(f"TopKLogits needs ids and values (N, k) and log_rest (N,); got ids "
                             f"{tuple(self.ids.shape)}, values {tuple(self.values.shape)}, log_rest "
                             f"{tuple(self.log_rest.shape)}")
        if not 1 <= self.k <= self.vocab_size:
            raise ValueError(f"TopKLogits k={self.k} must be in 1..vocab_size={self.vocab_size}")

    @property
    def k(self) -> int:
        return int(self.values.shape[-1])

    @property
    def rows(self) -> int:
        return int(self.values.shape[0])

    @classmethod
    def from_logits(cls, logits: Tensor, k: int) -> TopKLogits:
        """The top-k form of full (N, V) logits (detached): the k largest and the log of the rest's T = 1 mass."""
        vocab = int(logits.shape[-1])
        if logits.dim() != 2 or not 1 <= k <= vocab:
            raise ValueError(f"TopKLogits.from_logits needs (N, V) logits and k in 1..V; got shape "
                             f"{tuple(logits.shape)} and k={k}")
        logits = logits.detach()
        values, ids = logits.topk(k, dim=-1)
        z = upcast(logits)
        lse = torch.logsumexp(z, dim=-1)
        lse_rest = torch.logsumexp(z.scatter(-1, ids, -math.inf), dim=-1)
        return cls(ids, values, lse_rest - lse, vocab)

    def to(self, device: torch.device | str) -> TopKLogits:
        return TopKLogits(self.ids.to(device), self.values.to(device), self.log_rest.to(device), self.vocab_size)

    def rows_of(self, index: Tensor | slice | list[int]) -> TopKLogits:
        """The rows ``index`` (a slice, a list or an index tensor)."""
        return TopKLogits(self.ids[index], self.values[index], self.log_rest[index], self.vocab_size)

    def log_normalizer(self) -> Tensor:
        """The logsumexp of all ``vocab_size`` logits per row (N,): that of the top k minus ``log(1 - rest)``."""
        z = upcast(self.values)
        rest = self.log_rest.to(torch.promote_types(z.dtype, self.log_rest.dtype))
        return torch.logsumexp(z.to(rest.dtype), dim=-1) - _log1mexp(rest)

    def dense(self) -> Tensor:
        """(N, vocab_size) logits: the top k in place, :data:`DENSE_FILL` elsewhere (the renormalised top-k
        distribution of the older dense cache: the rest's mass is dropped)."""
        out = self.values.new_full((self.rows, self.vocab_size), DENSE_FILL)
        return out.scatter(-1, self.ids, self.values)

    def bucket_log_probs(self, temperature: float = 1.0) -> Tensor:
        """The teacher's (N, k + 1) log-probabilities at ``temperature``: the k classes, then the rest bucket.

        Exact at T = 1. At T != 1 the rest's tempered mass depends on how it splits over its classes, which is
        not stored: it is computed assuming the ``vocab_size - k`` other logits are all equal (each
        ``z_r = log(R / (V - k))``, R their summed ``exp``), so the bucket weighs ``(V - k) exp(z_r / T)`` against
        ``exp(z_i / T)`` for the top k. (Spread-out other logits would give a larger tempered bucket for T > 1.)"""
        z = upcast(self.values)
        rest = self.log_rest.to(torch.promote_types(z.dtype, self.log_rest.dtype))
        z = z.to(rest.dtype)
        log_rest_mass = self.log_normalizer() + rest  # log R: the other classes' summed exp(z)
        others = self.vocab_size - self.k
        if others == 0:
            bucket = torch.full_like(rest, -math.inf)
        elif temperature == 1.0:
            bucket = log_rest_mass
        else:  # log((V - k) exp(z_r / T)) with z_r = log R - log(V - k)
            bucket = log_rest_mass / temperature + (1.0 - 1.0 / temperature) * math.log(others)
        return torch.log_softmax(torch.cat([z / temperature, bucket[:, None]], dim=-1), dim=-1)

    def keep(self, k: int) -> TopKLogits:
        """The ``k`` largest of these entries (k <= self.k), the dropped ones' mass added to the rest."""
        if k == self.k:
            return self
        if not 1 <= k < self.k:
            raise ValueError(f"top_k={k} must be in 1..{self.k} for a top-{self.k} teacher")
        order = upcast(self.values).argsort(dim=-1, descending=True)
        values, ids = self.values.gather(-1, order), self.ids.gather(-1, order)
        dropped = upcast(values[:, k:]) - self.log_normalizer()[:, None]
        rest = torch.logsumexp(torch.cat([self.log_rest[:, None].to(dropped.dtype), dropped], dim=-1), dim=-1)
        return TopKLogits(ids[:, :k], values[:, :k], rest.to(self.log_rest.dtype), self.vocab_size)


def _bucket_rows(student_logits: Tensor, log_p: Tensor, ids: Tensor, temperature: float, divergence: str,
                 beta: float) -> Tensor:
    """Per row: the divergence between the teacher's bucket distribution ``log_p`` (rows, k + 1) and the student's
    probabilities of the same ``ids`` plus its own mass on every other class (a masked logsumexp)."""
    log_q = F.log_softmax(upcast(student_logits) / temperature, dim=-1)
    log_q_bucket = torch.cat([log_q.gather(-1, ids), _rest_logsumexp(log_q, ids)], dim=-1)
    return _divergence_rows(log_q_bucket, log_p.to(log_q.dtype), divergence, beta)


def bucket_divergence(student_logits: Tensor, topk: TopKLogits, temperature: float = 1.0,
                      divergence: str = "forward_kl", beta: float = 0.5, *, chunk_rows: int | None = None) -> Tensor:
    """The divergence between the teacher's (k + 1)-outcome distribution (:meth:`TopKLogits.bucket_log_probs`) and
    the student's over the same k classes plus the rest, batchmean over rows; <= the full divergence (data
    processing inequality), equal to it at k = V - 1. ``student_logits`` (N, V), V = ``topk.vocab_size``."""
    if divergence not in DIVERGENCES:
        raise ValueError(f"unknown divergence {divergence!r}; allowed: {', '.join(DIVERGENCES)}")
    if student_logits.dim() != 2 or tuple(student_logits.shape) != (topk.rows, topk.vocab_size):
        raise ValueError(f"bucket_divergence needs student logits (rows, vocab) = ({topk.rows}, {topk.vocab_size}) "
                         f"for a top-{topk.k} teacher; got {tuple(student_logits.shape)}")
    log_p = topk.bucket_log_probs(temperature).detach()
    ids = topk.ids.to(student_logits.device, torch.int64)
    plan = chunk_plan(topk.rows, topk.vocab_size, chunk_rows)
    fn = partial(_bucket_rows, temperature=temperature, divergence=divergence, beta=beta)
    if plan is None:
        return fn(student_logits, log_p, ids).mean()
    return chunked_row_mean(fn, student_logits, log_p, ids, chunk_rows=plan)


def logit_divergence(student_logits: Tensor, teacher_logits: Tensor | TopKLogits, temperature: float,
                     divergence: str = "forward_kl", beta: float = 0.5, top_k: int | None = None, *,
                     chunk_rows: int | None = None) -> Tensor:
    """The divergence named ``divergence`` (top-k forward KL when ``top_k`` is set), unscaled. A
    :class:`TopKLogits` teacher gives the bucketed form (:func:`bucket_divergence`; ``top_k`` keeps fewer)."""
    if top_k is not None and divergence != "forward_kl":
        raise ValueError(f"top_k applies to forward_kl only, not {divergence!r}")
    if isinstance(teacher_logits, TopKLogits):
        topk = teacher_logits if top_k is None else teacher_logits.keep(top_k)
        return bucket_divergence(student_logits, topk, temperature, divergence, beta, chunk_rows=chunk_rows)
    if top_k is not None:
        return top_k_forward_kl(student_logits, teacher_logits, top_k, temperature, chunk_rows=chunk_rows)
    if divergence not in DIVERGENCES:
        raise ValueError(f"unknown divergence {divergence!r}; allowed: {', '.join(DIVERGENCES)}")
    return _batchmean(student_logits, teacher_logits, temperature, divergence, beta, chunk_rows)
