"""Universal Logit Distillation (Boizard, El Haddad, Hudelot & Colombo 2024, "Towards Cross-Tokenizer Distillation:
the Universal Logit Distillation Loss for LLMs", arXiv 2402.12030).

Teacher and student may have different vocabularies (different tokenizers, even of different sizes). Per aligned
target position the loss is the closed-form Wasserstein-1 distance the paper derives for a uniform transport cost:
sort each model's probabilities (softmax at T) in decreasing order, pad the shorter vector with zeros to the longer
vocabulary, and sum the absolute differences,

    ULD_t = sum_i | p_s^(i) - p_t^(i) |        (p^(i): the i-th largest probability)

averaged over the aligned positions. The student's L = CE + lambda * ULD, lambda = 1.5: the authors' code
(github.com/Nicolas-BZRD/llm-recipes, ``configs/distillation.py``: ``cross_entropy_factor = 1``,
``distil_factor = 1.5``, the value of its README's example command) and the default weight here.

Alignment: each row's response targets in order, student target r of row i with teacher target r of row i for
r < min(student targets of row i, teacher targets of row i); the extra targets of the longer side are dropped (the
authors' ``size = min(student_answer_size, teacher_answer_size)``). The packed logits of each side are row-major
with per-row counts ``batch.x.tgt_lengths()`` (student) and ``batch.x.teacher_tgt_lengths()`` (teacher; the
student's counts when the data carries one tokenisation). Inputs without per-row counts (one logit row per sample,
a classifier) align rows one to one. The authors average per sequence, then over the batch; here every aligned
position weighs the same (teachkit's per-token convention), which differs only when responses differ in length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.losses.base import DistillLoss
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


@dataclass
class ULDOptions(Options):
    """``temperature``: T of both softmaxes (the authors' student and teacher temperatures, both 1)."""

    temperature: float = option(1.0, gt=0.0)


def aligned_pairs(student_counts: Tensor, teacher_counts: Tensor) -> tuple[Tensor, Tensor]:
    """(student rows, teacher rows) of the packed logits that pair up: per sample i the first
    ``min(student_counts[i], teacher_counts[i])`` targets of each side, in order; tensor ops only."""
    s_len = student_counts.to(torch.int64)
    t_len = teacher_counts.to(device=s_len.device, dtype=torch.int64)
    kept = torch.minimum(s_len, t_len)
    total = int(kept.sum())
    sample = torch.repeat_interleave(torch.arange(kept.shape[0], device=kept.device), kept, output_size=total)
    offset = torch.arange(total, device=kept.device) - (kept.cumsum(0) - kept)[sample]
    return (s_len.cumsum(0) - s_len)[sample] + offset, (t_len.cumsum(0) - t_len)[sample] + offset


def _counts(x: Any, name: str) -> Tensor | None:
    """``x.<name>()`` when the inputs have it (per-row target counts), else None."""
    method = getattr(x, name, None)
    return method() if callable(method) else None


def aligned_rows(x: Any, student_rows: int, teacher_rows: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The aligned (student, teacher) logit rows for inputs ``x``: by response position with per-row target
    counts (``tgt_lengths`` / ``teacher_tgt_lengths``), one to one without them."""
    s_len = _counts(x, "tgt_lengths")
    if s_len is None:
        if student_rows != teacher_rows:
            raise ValueError(f"uld aligns the student's and the teacher's logit rows one to one without per-row "
                             f"target counts, but they have {student_rows} and {teacher_rows} rows")
        index = torch.arange(student_rows, device=device)
        return index, index
    # an LMText without a teacher tokenisation says so (``has_teacher``); its teacher reads the student's targets
    t_len = _counts(x, "teacher_tgt_lengths") if getattr(x, "has_teacher", True) else None
    s_len = s_len.to(device)
    t_len = s_len if t_len is None else t_len.to(device)
    for side, counts, rows in (("student", s_len, student_rows), ("teacher", t_len, teacher_rows)):
        if int(counts.sum()) != rows:
            raise ValueError(f"uld: the {side}'s packed logits have {rows} rows but its per-row target counts sum "
                             f"to {int(counts.sum())}")
    return aligned_pairs(s_len, t_len)


def sorted_probability_l1(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Per row: ``sum_i |p_s^(i) - p_t^(i)|`` over the decreasingly sorted probabilities, the shorter vocabulary
    padded with zeros (the ULD distance; rows of the two inputs pair up)."""
    p_s = F.softmax(upcast(student_logits) / temperature, dim=-1).sort(dim=-1, descending=True).values
    p_t = F.softmax(upcast(teacher_logits) / temperature, dim=-1).sort(dim=-1, descending=True).values
    width = max(p_s.shape[-1], p_t.shape[-1])
    p_s, p_t = F.pad(p_s, (0, width - p_s.shape[-1])), F.pad(p_t, (0, width - p_t.shape[-1]))
    return (p_s - p_t.to(p_s.dtype)).abs().sum(dim=-1)


@LOSSES.register("uld", "Universal Logit Distillation: L1 between the sorted token probabilities of teacher and "
                        "student, any two vocabularies (Boizard et al. 2024); CE + 1.5 ULD", options=ULDOptions)
class ULD(DistillLoss):
    """Universal Logit Distillation (module docstring): the mean over aligned target positions of the L1 distance
    between the two models' sorted probability vectors. Compares no class identities, so teacher and student
    may use different tokenizers (``vocabulary_agnostic``)."""

    student_needs = teacher_needs = ("logits",)
    term_names = ("uld",)
    default_weight = 1.5
    vocabulary_agnostic = True

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: ULDOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or ULDOptions()

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        zs, zt = student.logits, teacher.logits.detach()
        s_rows, t_rows = aligned_rows(batch.x, zs.shape[0], zt.shape[0], zs.device)
        if s_rows.numel() == 0:  # no aligned position: 0, still connected to the student
            return {"uld": upcast(zs).sum() * 0.0}
        distance = sorted_probability_l1(zs[s_rows], zt[t_rows.to(zt.device)], self.options.temperature)
        return {"uld": distance.mean()}

    def extra_repr(self) -> str:
        return f"temperature={self.options.temperature}"
