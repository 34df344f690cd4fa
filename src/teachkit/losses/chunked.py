"""Row-chunked logit losses with bounded memory (the torchtune / Liger idea, for per-token LM logits).

A causal LM's packed logits are (N_tokens, V) with V up to 128k: the log-probabilities of both models in float32
are then two more (N, V) tensors, and autograd keeps them (and their exponentials) until backward. The
:class:`ChunkedRowSum` autograd function computes ``sum_i f(student_i, teacher_i)`` a block of rows at a time
under ``no_grad`` and saves only its inputs; backward recomputes each block under ``torch.enable_grad()`` and
writes that block's gradient into one (N, V) buffer. Peak memory is the two logit tensors, the student's gradient
and one block's float32 temporaries, never a full (N, V) float32 copy of either model's log-probabilities.

The gradient w.r.t. the teacher's tensors is never computed: the teacher is frozen (every caller detaches it), so
backward returns None for it, as if it were detached. Double backward is not supported (``once_differentiable``).

The divergences chunk only when rows x classes exceeds :data:`CHUNK_THRESHOLD` (or when asked with ``chunk_rows``),
so every smaller input is computed exactly as before, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

#: rows x classes above which the divergences chunk automatically (2**22 = 4M elements: 16 MiB per float32 copy)
CHUNK_THRESHOLD = 2**22
#: the element budget of one chunk when the rows per chunk are chosen automatically
CHUNK_ELEMENTS = 2**22

RowFn = Callable[..., Tensor]


def chunk_plan(rows: int, classes: int, chunk_rows: int | None = None) -> int | None:
    """Rows per chunk, or None to compute unchunked: ``chunk_rows`` when given (forcing chunks even on a small
    input), else ``CHUNK_ELEMENTS // classes`` rows once ``rows * classes`` exceeds :data:`CHUNK_THRESHOLD`."""
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
        return int(chunk_rows)
    if rows * classes <= CHUNK_THRESHOLD:
        return None
    return max(1, CHUNK_ELEMENTS // max(1, classes))


class ChunkedRowSum(torch.autograd.Function):
    """``sum over rows of fn(student[rows], *(t[rows] for t in others))``, ``chunk`` rows at a time.

    ``fn`` returns one value per row of its chunk; ``student`` is the only input gradients flow to (``others``:
    the teacher's tensors, treated as detached). Saves only the inputs; backward recomputes each chunk."""

    @staticmethod
    def forward(ctx: Any, fn: RowFn, chunk: int, student: Tensor, *others: Tensor) -> Tensor:
        ctx.fn, ctx.chunk = fn, chunk
        ctx.save_for_backward(student, *others)
        total = None
        for start in range(0, student.shape[0], chunk):
            stop = start + chunk
            part = fn(student[start:stop], *(t[start:stop] for t in others)).sum()
            total = part if total is None else total + part
        if total is None:  # no rows: the empty sum, in the dtype fn would give
            total = fn(student[:0], *(t[:0] for t in others)).sum()
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        student, *others = ctx.saved_tensors
        grad = None
        if ctx.needs_input_grad[2]:
            grad = torch.empty_like(student)
            for start in range(0, student.shape[0], ctx.chunk):
                stop = start + ctx.chunk
                with torch.enable_grad():
                    rows = student[start:stop].detach().requires_grad_(True)
                    value = ctx.fn(rows, *(t[start:stop] for t in others)).sum()
                    (part,) = torch.autograd.grad(value, rows, grad_outputs=grad_output.to(value.dtype))
                grad[start:stop] = part
        return (None, None, grad, *(None for _ in others))


def chunked_row_sum(fn: RowFn, student: Tensor, *others: Tensor, chunk_rows: int) -> Tensor:
    """The sum over rows of ``fn`` on row blocks of ``chunk_rows`` (:class:`ChunkedRowSum`); the teacher's tensors
    ``others`` are detached (no gradient reaches them)."""
    return ChunkedRowSum.apply(fn, int(chunk_rows), student, *(t.detach() for t in others))


def chunked_row_mean(fn: RowFn, student: Tensor, *others: Tensor, chunk_rows: int) -> Tensor:
    """``chunked_row_sum / rows``: the batchmean of a per-row value (NaN for 0 rows, as ``Tensor.mean``)."""
    return chunked_row_sum(fn, student, *others, chunk_rows=chunk_rows) / student.shape[0]
