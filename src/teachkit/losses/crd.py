"""Tian, Krishnan & Isola 2020, "Contrastive Representation Distillation" (ICLR 2020).

Student and teacher pooled features are embedded (linear -> L2 normalise, dim ``feat_dim``) and
contrasted against a memory bank of past embeddings of the *other* side: for each sample, its own
bank row is the positive and ``nce_k`` random rows are negatives. The critic of the paper's Sec. 3.1,
h(T, S) = exp(g_T(t)' g_S(s) / tau) / (exp(...) + N/M), is implemented as its NCE approximation
P = exp(v . v' / tau) / Z with noise Pn = 1/M, and the critic loss (the paper's L_critic; "Eq. 18" in
RepDistiller's numbering) is applied in both directions (student-anchored and teacher-anchored), as
RepDistiller computes it (HobbitLong/RepDistiller ``crd/criterion.py``, ``crd/memory.py``):

- Z is estimated once, on the first batch: ``mean(exp(v . m / tau)) * num_samples``, stored as a
  buffer (-1 while unset) so a resumed run keeps it;
- P(D=1 | pos) = P_pos / (P_pos + K Pn), P(D=0 | neg) = K Pn / (P_neg + K Pn), Pn = 1 / num_samples;
  loss = -(sum log P(D=1|pos) + sum log P(D=0|neg)) / batch size;
- after the loss, each sample's bank row becomes normalise(m * row + (1 - m) * embedding) (no grad).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit import distributed
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


class Embed(nn.Module):
    """Linear map of a flattened feature to ``dim_out``, L2-normalised (RepDistiller's ``Embed``)."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.linear(x.flatten(1)), p=2, dim=1)


def nce_loss(log_p: Tensor, num_samples: int) -> Tensor:
    """RepDistiller's ``ContrastLoss`` (its "Eq. 18") from log P = log h, shape (B, 1 + K), positive first.

    With c = K Pn = K / num_samples:  log P(D=1|pos) = log(P / (P + c)) = -softplus(log c - log P) and
    log P(D=0|neg) = log(c / (P + c)) = -softplus(log P - log c). The log-space form is the same value
    without RepDistiller's ``eps = 1e-7`` (which only guards a division by ~0) and never overflows.
    """
    batch, k = log_p.shape[0], log_p.shape[1] - 1
    log_c = math.log(k / num_samples)
    pos = -F.softplus(log_c - log_p[:, 0])
    neg = -F.softplus(log_p[:, 1:] - log_c)
    return -(pos.sum() + neg.sum()) / batch


@dataclass
class CRDOptions(Options):
    """``feat_dim``: the embedding width (128); ``nce_k``: negatives per anchor (16384, capped at the other
    samples); ``nce_t``: the temperature tau (0.07); ``nce_m``: the memory bank's momentum (0.5). All as
    RepDistiller's ``train_student.py`` defaults."""

    feat_dim: int = option(128, ge=1)
    nce_k: int = option(16384, ge=1)
    nce_t: float = option(0.07, gt=0.0)
    nce_m: float = option(0.5, ge=0.0, le=1.0)


@LOSSES.register("crd", "Contrastive Representation Distillation: NCE vs a memory bank, 16384 negatives, tau 0.07",
                 options=CRDOptions)
class CRD(DistillLoss):
    """CRD (Tian et al. 2020, Sec. 3.1 critic and NCE objective, both directions; see the module docstring).

    Returns ``{"student": L_s, "teacher": L_t}``: ``student`` anchors the student embedding against
    the teacher bank (it trains the student and ``embed_s``), ``teacher`` anchors the teacher embedding
    against the student bank (it trains ``embed_t`` only; the teacher is frozen). Their sum is
    RepDistiller's ``CRDLoss``; the objective's gamma (0.8, the paper's beta) multiplies each.

    Options: :class:`CRDOptions` (``feat_dim`` 128, ``nce_k`` negatives per anchor 16384, ``nce_t``
    temperature tau 0.07, ``nce_m`` bank momentum 0.5). Auxiliary state: ``embed_s``/``embed_t``
    (trainable) and the buffers ``memory_s``/``memory_t`` (num_samples x feat_dim), ``z_s``/``z_t``
    (normalisation constants), all in the state dict so they are checkpointed and resumed with the
    student. The buffers follow the module's dtype (``.double()`` makes the whole loss float64).

    No host synchronisation per step: Z is set on the device (``torch.where`` on the buffer's sign), and
    ``batch.index`` is checked for shape and dtype (metadata) on every call but for its value range only
    on the first call of this module (the first batch after construction or resume), where one sync is
    paid; later out-of-range indices are the data pipeline's bug and fail inside the indexing instead.

    Choices where this differs from RepDistiller:

    - negatives are drawn uniformly over the *other* num_samples - 1 samples (``torch.randint`` on the
      batch's device with the global RNG, which checkpoints restore, so resume is exact). RepDistiller's
      memory module draws uniformly over all samples (AliasMethod with equal weights; each draw is
      the anchor's own row with probability 1 / N), and its CIFAR loader (``mode='exact'``) instead draws them
      from samples of other classes; the loss sees no labels of other samples, so class-aware
      sampling is not offered;
    - ``nce_k`` is capped at num_samples - 1 (no more negatives than other samples, which keeps the
      noise-to-data ratio K Pn = K / N below 1; a 16384-negative default would otherwise dwarf a small
      training split);
    - the scores and the loss are computed in at least float32 with autocast off (exp(1 / 0.07) = 1.6e6
      overflows float16 and loses most digits in bfloat16), in log space (see :func:`nce_loss`).
    """

    student_needs = teacher_needs = ("embedding",)
    term_names = ("student", "teacher")
    default_weight = 0.8

    def __init__(self, student: Taps, teacher: Taps, options: CRDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or CRDOptions()
        opts = self.options
        for side, taps in (("student", student), ("teacher", teacher)):
            if taps.embedding is None:
                raise ConfigError(f"crd needs the {side}'s 'embedding' tap (pooled penultimate feature); "
                                  f"name its classifier module in model.taps.embedding")
        if num_samples < 2:
            raise ConfigError(f"crd needs a training split of at least 2 samples; got num_samples={num_samples}")
        self.num_samples = int(num_samples)
        self.nce_k = min(opts.nce_k, self.num_samples - 1)
        self.nce_t = opts.nce_t
        self.nce_m = opts.nce_m
        self.feat_dim = feat_dim = opts.feat_dim
        self.embed_s = Embed(student.embedding.flatten(1).shape[1], feat_dim)
        self.embed_t = Embed(teacher.embedding.flatten(1).shape[1], feat_dim)
        stdv = 1.0 / math.sqrt(feat_dim / 3)
        self.register_buffer("memory_s", torch.rand(num_samples, feat_dim).mul_(2 * stdv).add_(-stdv))
        self.register_buffer("memory_t", torch.rand(num_samples, feat_dim).mul_(2 * stdv).add_(-stdv))
        self.register_buffer("z_s", torch.tensor(-1.0))
        self.register_buffer("z_t", torch.tensor(-1.0))
        #: Score every bank row with one matmul (B x N, cheap for N up to (K+1) * feat_dim) rather than
        #: gathering B x (K+1) x feat_dim rows as RepDistiller does; the values are the same.
        self.full_scores = self.num_samples <= (self.nce_k + 1) * self.feat_dim
        #: whether batch.index's values were checked against the bank's size (done once, on the first call)
        self._index_range_checked = False

    def sample_indices(self, index: Tensor) -> Tensor:
        """(B, 1 + K) bank rows per sample: its own index first, then K uniform draws from the others."""
        neg = torch.randint(0, self.num_samples - 1, (index.shape[0], self.nce_k), device=index.device)
        neg += (neg >= index.unsqueeze(1)).long()  # skip the sample's own row: uniform over the other N - 1
        return torch.cat([index.unsqueeze(1), neg], dim=1)

    def _check_index(self, batch: Batch, rows: int) -> Tensor:
        """``batch.index`` as int64 rows of the bank. Shape and dtype are checked on every call (no sync);
        the value range only on this module's first call (one host sync), see the class docstring."""
        index = batch.index
        if index is None:
            raise ConfigError("crd needs the dataset index of every sample (batch.index), but the batch has none")
        if index.dim() != 1 or index.shape[0] != rows or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ConfigError(f"crd needs the dataset index of every sample: batch.index must be {rows} integers; "
                              f"got shape {tuple(index.shape)} ({index.dtype})")
        if not self._index_range_checked:
            low, high = index.aminmax() if index.numel() else (index.new_zeros(()), index.new_zeros(()))
            low, high = int(low), int(high)
            if low < 0 or high >= self.num_samples:
                raise ConfigError(f"crd needs the dataset index of every sample in [0, {self.num_samples}) "
                                  f"(the bank's size); got values {low} .. {high}")
            self._index_range_checked = True
        return index.long()

    def _log_scores(self, anchor: Tensor, memory: Tensor, idx: Tensor) -> Tensor:
        """v . m_j / tau for the bank rows ``idx`` (B, 1 + K) of each anchor v (B, D)."""
        if self.full_scores:
            return (anchor @ memory.t()).gather(1, idx) / self.nce_t
        rows = memory[idx]  # (B, 1 + K, D), a copy
        return torch.bmm(rows, anchor.unsqueeze(2)).squeeze(2) / self.nce_t

    def _log_z(self, name: str, log_scores: Tensor) -> Tensor:
        """log Z; on the first batch (Z < 0, unset) set Z = mean(exp(scores)) * num_samples (RepDistiller's
        rule), on the device: the estimate is computed every step and kept only while Z is unset."""
        z = getattr(self, name)
        with torch.no_grad():
            log_mean = torch.logsumexp(log_scores.detach().flatten(), 0) - math.log(log_scores.numel())
            estimate = (log_mean + math.log(self.num_samples)).exp().to(z.dtype)
            z.copy_(torch.where(z < 0, estimate, z))
        return z.log()

    def _update(self, name: str, index: Tensor, v: Tensor) -> None:
        """Bank rows at ``index`` <- normalise(m * row + (1 - m) * v), out of place when a full-score
        matmul saved the bank for backward (an in-place write would corrupt that graph). Under torchrun every
        process gathers all processes' ``index`` and ``v`` first, so the banks stay identical across processes."""
        memory = getattr(self, name)
        if distributed.active():  # every process applies the global batch's rows, in rank order: one bank
            index, v = distributed.all_gather_cat(index), distributed.all_gather_cat(v.detach())
        rows = F.normalize(memory[index] * self.nce_m + v.detach() * (1 - self.nce_m), p=2, dim=1)
        if self.full_scores:
            setattr(self, name, memory.index_copy(0, index, rows))
        else:
            memory.index_copy_(0, index, rows)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        if student.embedding is None or teacher.embedding is None:
            raise ConfigError("crd needs the 'embedding' tap of student and teacher")
        index = self._check_index(batch, student.embedding.shape[0])
        with torch.autocast(student.embedding.device.type, enabled=False):
            v_s = self.embed_s(upcast(student.embedding))
            v_t = self.embed_t(upcast(teacher.embedding.detach()))
            idx = self.sample_indices(index)
            scores_s = self._log_scores(v_s, self.memory_t, idx)  # student anchor, teacher bank
            scores_t = self._log_scores(v_t, self.memory_s, idx)  # teacher anchor, student bank
            loss_s = nce_loss(scores_s - self._log_z("z_s", scores_s), self.num_samples)
            loss_t = nce_loss(scores_t - self._log_z("z_t", scores_t), self.num_samples)
            with torch.no_grad():
                self._update("memory_s", index, v_s)
                self._update("memory_t", index, v_t)
        return {"student": loss_s, "teacher": loss_t}

    def extra_repr(self) -> str:
        return (f"num_samples={self.num_samples}, feat_dim={self.feat_dim}, nce_k={self.nce_k}, "
                f"nce_t={self.nce_t}, nce_m={self.nce_m}")
