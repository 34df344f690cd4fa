"""Row-chunked divergences (teachkit.losses.chunked): the same values and student gradients as the unchunked
computation, only the inputs saved for backward, no gradient into the teacher, automatic above the threshold only."""

import pytest
import torch

from teachkit.losses import chunked
from teachkit.losses.chunked import CHUNK_ELEMENTS, CHUNK_THRESHOLD, ChunkedRowSum, chunk_plan
from teachkit.losses.divergences import (
    TopKLogits,
    bucket_divergence,
    forward_kl,
    jensen_shannon,
    logit_divergence,
    reverse_kl,
    top_k_forward_kl,
    total_variation,
)
from teachkit.losses.kd import kd_kl

G = torch.Generator().manual_seed(0)
ZS = 3 * torch.randn(13, 11, dtype=torch.float64, generator=G)
ZT = 3 * torch.randn(13, 11, dtype=torch.float64, generator=G)
TOPK = TopKLogits.from_logits(ZT, 4)

#: every chunkable loss, as a function of the student logits and chunk_rows (None: as the caller would call it)
LOSSES = {
    "forward_kl": lambda z, c: forward_kl(z, ZT, 2.0, chunk_rows=c),
    "reverse_kl": lambda z, c: reverse_kl(z, ZT, 2.0, chunk_rows=c),
    "jsd": lambda z, c: jensen_shannon(z, ZT, 2.0, 0.3, chunk_rows=c),
    "jsd_beta0": lambda z, c: jensen_shannon(z, ZT, 2.0, 0.0, chunk_rows=c),
    "tv": lambda z, c: total_variation(z, ZT, 2.0, chunk_rows=c),
    "top_k": lambda z, c: top_k_forward_kl(z, ZT, 3, 2.0, chunk_rows=c),
    "logit_divergence": lambda z, c: logit_divergence(z, ZT, 2.0, "reverse_kl", chunk_rows=c),
    "kd_kl": lambda z, c: kd_kl(z, ZT, 2.0, chunk_rows=c),
    **{f"bucket_{name}": (lambda z, c, name=name: bucket_divergence(z, TOPK, 2.0, name, 0.3, chunk_rows=c))
       for name in ("forward_kl", "reverse_kl", "jsd", "tv")},
}


def value_and_grad(fn, z, chunk_rows):
    z = z.clone().requires_grad_(True)
    value = fn(z, chunk_rows)
    (grad,) = torch.autograd.grad(value, z)
    return value.detach(), grad


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("chunk_rows", [1, 3, 5, 13, 100])
def test_chunked_values_and_gradients_match_unchunked(name, chunk_rows):
    value, grad = value_and_grad(LOSSES[name], ZS, None)
    c_value, c_grad = value_and_grad(LOSSES[name], ZS, chunk_rows)
    assert c_value.dtype == torch.float64
    torch.testing.assert_close(c_value, value, rtol=1e-6, atol=0)
    torch.testing.assert_close(c_grad, grad, rtol=1e-6, atol=1e-12)


def test_positions_axes_are_rows_when_chunked():
    # (B, C, positions) for kd_kl (classes on axis 1) and (B, positions, C) for the divergences
    zs, zt = torch.randn(4, 6, 3, dtype=torch.float64, generator=G), torch.randn(4, 6, 3, dtype=torch.float64,
                                                                                 generator=G)
    for fn in (lambda a, c: kd_kl(a, zt, 3.0, chunk_rows=c), lambda a, c: forward_kl(a, zt, 3.0, chunk_rows=c)):
        value, grad = value_and_grad(fn, zs, None)
        c_value, c_grad = value_and_grad(fn, zs, 5)
        torch.testing.assert_close(c_value, value, rtol=1e-6, atol=0)
        torch.testing.assert_close(c_grad, grad, rtol=1e-6, atol=1e-12)


def saved(fn) -> list[torch.Tensor]:
    """Every tensor autograd saves for backward while ``fn`` runs."""
    out = []

    def pack(t):
        out.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return out


def test_only_the_inputs_are_saved_for_backward():
    zs = torch.randn(64, 500, requires_grad=True)
    zt = torch.randn(64, 500)
    inputs = {zs.data_ptr(), zt.data_ptr()}
    for fn in (lambda c: forward_kl(zs, zt, 2.0, chunk_rows=c), lambda c: kd_kl(zs, zt, 2.0, chunk_rows=c),
               lambda c: jensen_shannon(zs, zt, 2.0, 0.5, chunk_rows=c)):
        chunked_saves = saved(lambda fn=fn: fn(8))
        assert {t.data_ptr() for t in chunked_saves} == inputs  # the two logit tensors themselves, nothing else
        assert sum(t.numel() for t in chunked_saves) == 2 * zs.numel()
        assert {t.data_ptr() for t in saved(lambda fn=fn: fn(None))} - inputs  # unchunked: log-probabilities


def test_no_gradient_reaches_the_teacher_and_a_frozen_student_is_fine():
    zs = torch.randn(6, 5, requires_grad=True)
    zt = torch.randn(6, 5, requires_grad=True)  # the teacher is always detached: chunking treats it so
    forward_kl(zs, zt, chunk_rows=2).backward()
    assert zt.grad is None and zs.grad is not None and torch.isfinite(zs.grad).all()
    value = forward_kl(zs.detach(), zt.detach(), chunk_rows=2)
    assert not value.requires_grad
    torch.testing.assert_close(value, forward_kl(zs.detach(), zt.detach()))


def test_low_precision_student_gets_a_gradient_of_its_own_dtype():
    zs = torch.randn(10, 7, generator=G).bfloat16().requires_grad_(True)
    zt = torch.randn(10, 7, generator=G).bfloat16()
    value = reverse_kl(zs, zt, 2.0, chunk_rows=3)
    value.backward()
    assert value.dtype == torch.float32 and zs.grad.dtype == torch.bfloat16
    ref = zs.detach().clone().requires_grad_(True)
    reverse_kl(ref, zt, 2.0).backward()
    torch.testing.assert_close(zs.grad.float(), ref.grad.float(), rtol=1e-2, atol=1e-3)


def test_chunk_plan_threshold_and_forcing():
    assert chunk_plan(1024, 4096) is None  # exactly the threshold: unchunked
    assert CHUNK_THRESHOLD == 2**22 and chunk_plan(1025, 4096) == CHUNK_ELEMENTS // 4096
    assert chunk_plan(1_000_000, 128_256) == CHUNK_ELEMENTS // 128_256  # a 128k vocabulary: 32 rows a chunk
    assert chunk_plan(3, 5, chunk_rows=2) == 2
    with pytest.raises(ValueError, match="chunk_rows=0 must be >= 1"):
        chunk_plan(3, 5, chunk_rows=0)


def test_small_inputs_never_chunk(monkeypatch):
    def refuse(*args):
        raise AssertionError("chunked below the threshold")

    monkeypatch.setattr(ChunkedRowSum, "apply", refuse)
    for fn in LOSSES.values():
        value_and_grad(fn, ZS, None)  # would raise if any chunked


def test_large_inputs_chunk_automatically(monkeypatch):
    calls = []
    apply = ChunkedRowSum.apply
    monkeypatch.setattr(ChunkedRowSum, "apply", lambda *a: calls.append(a[1]) or apply(*a))
    zs = torch.randn(1025, 4096, dtype=torch.float64, generator=G)  # just above 2**22 elements
    zt = torch.randn(1025, 4096, dtype=torch.float64, generator=G)
    for fn in (lambda z, c: forward_kl(z, zt, 2.0, chunk_rows=c), lambda z, c: kd_kl(z, zt, 2.0, chunk_rows=c)):
        value, grad = value_and_grad(fn, zs, None)
        assert calls.pop() == 1024  # CHUNK_ELEMENTS // 4096 rows: two chunks
        monkeypatch.setattr(chunked, "CHUNK_THRESHOLD", 2**40)  # now unchunked
        ref, ref_grad = value_and_grad(fn, zs, None)
        assert not calls
        monkeypatch.setattr(chunked, "CHUNK_THRESHOLD", 2**22)
        torch.testing.assert_close(value, ref, rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-15)
