"""A cached top-k teacher with its leftover mass (teachkit.losses.divergences.TopKLogits) and the bucketed
divergences: hand-computed values on vocabularies of 4-5 tokens (the numbers computed here with plain Python
formulas), the data processing inequality, exactness at k = V - 1, chunking."""

import math

import pytest
import torch

from teachkit.losses.divergences import (
    DIVERGENCES,
    TopKLogits,
    bucket_divergence,
    forward_kl,
    jensen_shannon,
    logit_divergence,
    reverse_kl,
    top_k_forward_kl,
    total_variation,
)

FULL = {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "tv": total_variation,
        "jsd": lambda zs, zt, t: jensen_shannon(zs, zt, t, 0.3)}


def kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0)


def reference(p, q, name, beta=0.3):
    """The divergence ``name`` of teacher ``p`` and student ``q`` (lists of probabilities), by its formula."""
    if name == "forward_kl":
        return kl(p, q)
    if name == "reverse_kl":
        return kl(q, p)
    if name == "tv":
        return 0.5 * sum(abs(x - y) for x, y in zip(p, q, strict=True))
    m = [beta * x + (1 - beta) * y for x, y in zip(p, q, strict=True)]
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


def softmax(z, t=1.0):
    e = [math.exp(v / t) for v in z]
    return [v / sum(e) for v in e]


def logits(probs):
    return torch.tensor([[math.log(v) for v in probs]], dtype=torch.float64)


def test_from_logits_dense_and_buckets_hand_computed():
    # p = [.4, .3, .2, .1] (logits log 4, log 3, log 2, 0 + any shift); k = 2 keeps tokens 0, 1; the rest is .3
    z = torch.tensor([[math.log(4.0) + 1, math.log(3.0) + 1, math.log(2.0) + 1, 1.0]], dtype=torch.float64)
    top = TopKLogits.from_logits(z, 2)
    assert top.ids.tolist() == [[0, 1]] and top.ids.dtype == torch.int64 and top.vocab_size == 4 and top.k == 2
    assert top.values.tolist() == z[:, :2].tolist()
    assert top.log_rest.item() == pytest.approx(math.log(0.3), abs=1e-12)
    assert top.log_normalizer().item() == pytest.approx(1 + math.log(10.0), abs=1e-12)
    assert top.bucket_log_probs().exp().tolist()[0] == pytest.approx([0.4, 0.3, 0.3], abs=1e-12)
    dense = top.dense()
    assert dense[0, 2:].tolist() == [-1e9, -1e9]  # the old renormalised dense form: 4/7, 3/7, 0, 0
    assert torch.softmax(dense, -1).tolist()[0] == pytest.approx([4 / 7, 3 / 7, 0, 0], abs=1e-12)
    one = top.keep(1)  # token 1's .3 joins the rest: .6
    assert one.ids.tolist() == [[0]] and one.log_rest.item() == pytest.approx(math.log(0.6), abs=1e-12)
    everything = TopKLogits.from_logits(z, 4)
    assert everything.log_rest.item() == -math.inf
    assert everything.bucket_log_probs(2.0).exp().tolist()[0] == pytest.approx(softmax(z[0].tolist(), 2.0) + [0.0])


def test_float32_logits_give_a_float32_log_rest():
    top = TopKLogits.from_logits(torch.randn(3, 7).bfloat16(), 2)
    assert top.log_rest.dtype == torch.float32 and top.values.dtype == torch.bfloat16
    assert TopKLogits.from_logits(torch.randn(3, 7), 2).log_rest.dtype == torch.float32


def test_tempered_bucket_assumes_equal_other_logits():
    # V = 5, teacher logits [3, 1, .5, 0, -1], k = 2, T = 2: the rest R = e^.5 + e^0 + e^-1 is taken as 3 equal
    # logits z_r = log(R / 3), whose tempered weight is 3 exp(z_r / 2)
    zt = [3.0, 1.0, 0.5, 0.0, -1.0]
    r = math.exp(0.5) + 1 + math.exp(-1)
    w = [math.exp(3.0 / 2), math.exp(1.0 / 2), 3 * math.exp(math.log(r / 3) / 2)]
    expected = [v / sum(w) for v in w]
    top = TopKLogits.from_logits(torch.tensor([zt], dtype=torch.float64), 2)
    assert top.bucket_log_probs(2.0).exp().tolist()[0] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_bucket_divergences_hand_computed_at_t1(name):
    # teacher p = [.4, .3, .2, .1], k = 2: [.4, .3 | .3]; student q = [.1, .2, .3, .4]: [.1, .2 | .7]
    top = TopKLogits.from_logits(logits([0.4, 0.3, 0.2, 0.1]), 2)
    value = bucket_divergence(logits([0.1, 0.2, 0.3, 0.4]), top, 1.0, name, 0.3)
    assert value.item() == pytest.approx(reference([0.4, 0.3, 0.3], [0.1, 0.2, 0.7], name), abs=1e-12)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_bucket_divergences_hand_computed_at_t2_on_two_rows(name):
    zt = [[3.0, 1.0, 0.5, 0.0, -1.0], [0.0, 2.0, -1.0, 1.0, 0.5]]
    zs = [[0.5, -1.0, 2.0, 0.0, 1.0], [1.0, 0.0, 0.0, -2.0, 1.5]]
    top = TopKLogits.from_logits(torch.tensor(zt, dtype=torch.float64), 2)
    expected = []
    for t_row, s_row in zip(zt, zs, strict=True):
        ids = sorted(range(5), key=lambda i: -t_row[i])[:2]
        others = [i for i in range(5) if i not in ids]
        r = sum(math.exp(t_row[i]) for i in others)
        w = [math.exp(t_row[i] / 2) for i in ids] + [3 * math.exp(math.log(r / 3) / 2)]
        p = [v / sum(w) for v in w]
        q_full = softmax(s_row, 2.0)
        q = [q_full[i] for i in ids] + [sum(q_full[i] for i in others)]
        expected.append(reference(p, q, name))
    value = bucket_divergence(torch.tensor(zs, dtype=torch.float64), top, 2.0, name, 0.3)
    assert value.item() == pytest.approx(sum(expected) / 2, abs=1e-12)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_data_processing_inequality_and_equality_when_nothing_is_merged(name):
    g = torch.Generator().manual_seed(4)
    zs, zt = torch.randn(8, 10, dtype=torch.float64, generator=g), 3 * torch.randn(8, 10, dtype=torch.float64,
                                                                                   generator=g)
    full = FULL[name](zs, zt, 1.0).item()
    values = [bucket_divergence(zs, TopKLogits.from_logits(zt, k), 1.0, name, 0.3).item() for k in range(1, 11)]
    assert all(v <= full + 1e-12 for v in values)
    assert values[-2] == pytest.approx(full, rel=1e-10)  # k = V - 1: the bucket is one token
    assert values[-1] == pytest.approx(full, rel=1e-10)  # k = V: nothing left
    # at T != 1 the equal-logit assumption is exact for one leftover token, and for equal leftover logits
    assert bucket_divergence(zs, TopKLogits.from_logits(zt, 9), 3.0, name, 0.3).item() == \
        pytest.approx(FULL[name](zs, zt, 3.0).item(), rel=1e-10)
    flat = zt.clone()
    flat[:, 4:] = -1.0
    flat[:, :4] += 5.0
    tempered = bucket_divergence(zs, TopKLogits.from_logits(flat, 4), 3.0, name, 0.3).item()
    assert tempered <= FULL[name](zs, flat, 3.0).item() + 1e-12


def test_forward_kl_at_k_v_minus_1_and_top_k_forward_kl_at_t1():
    g = torch.Generator().manual_seed(5)
    zs, zt = torch.randn(6, 5, dtype=torch.float64, generator=g), 2 * torch.randn(6, 5, dtype=torch.float64,
                                                                                  generator=g)
    assert bucket_divergence(zs, TopKLogits.from_logits(zt, 4), 2.0).item() == \
        pytest.approx(forward_kl(zs, zt, 2.0).item(), rel=1e-12)
    for k in (1, 2, 3):  # at T = 1 the cached form is exactly the dense top-k forward KL
        assert bucket_divergence(zs, TopKLogits.from_logits(zt, k)).item() == \
            pytest.approx(top_k_forward_kl(zs, zt, k).item(), rel=1e-12)


def test_logit_divergence_dispatches_a_top_k_teacher():
    g = torch.Generator().manual_seed(6)
    zs, zt = torch.randn(4, 6, dtype=torch.float64, generator=g), torch.randn(4, 6, dtype=torch.float64, generator=g)
    top = TopKLogits.from_logits(zt, 3)
    for name in DIVERGENCES:
        assert logit_divergence(zs, top, 2.0, name, 0.4).item() == \
            bucket_divergence(zs, top, 2.0, name, 0.4).item()
    # top_k keeps the k largest of the cached entries: the same as caching k directly
    assert logit_divergence(zs, top, 1.0, top_k=2).item() == \
        pytest.approx(bucket_divergence(zs, TopKLogits.from_logits(zt, 2)).item(), rel=1e-12)
    with pytest.raises(ValueError, match="top_k applies to forward_kl only"):
        logit_divergence(zs, top, 1.0, "tv", top_k=2)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_gradients_reach_the_student_finite_even_with_nothing_left(name):
    g = torch.Generator().manual_seed(7)
    zt = torch.randn(5, 6, generator=g)
    zt[0, 0] = 200.0  # row 0's rest mass underflows in float32
    for k in (2, 6):
        zs = torch.randn(5, 6, generator=g, requires_grad=True)
        value = bucket_divergence(zs, TopKLogits.from_logits(zt, k), 2.0, name, 0.3)
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(zs.grad).all() and zs.grad.abs().sum() > 0


@pytest.mark.parametrize("name", DIVERGENCES)
def test_chunked_bucket_divergence_matches(name):
    g = torch.Generator().manual_seed(8)
    zs, zt = torch.randn(9, 7, dtype=torch.float64, generator=g), torch.randn(9, 7, dtype=torch.float64, generator=g)
    top = TopKLogits.from_logits(zt, 3)
    grads = []
    values = []
    for chunk_rows in (None, 2):
        z = zs.clone().requires_grad_(True)
        values.append(bucket_divergence(z, top, 1.5, name, 0.3, chunk_rows=chunk_rows))
        values[-1].backward()
        grads.append(z.grad)
    torch.testing.assert_close(values[1], values[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-12)


def test_bad_inputs_are_one_line_errors():
    z = torch.randn(3, 5)
    top = TopKLogits.from_logits(z, 2)
    for call, match in [
        (lambda: TopKLogits.from_logits(z, 6), r"k in 1..V; got shape \(3, 5\) and k=6"),
        (lambda: TopKLogits.from_logits(z, 0), "k=0"),
        (lambda: TopKLogits(top.ids, top.values, top.log_rest[:2], 5), r"log_rest \(N,\)"),
        (lambda: TopKLogits(top.ids, top.values, top.log_rest, 1), "k=2 must be in 1..vocab_size=1"),
        (lambda: top.keep(3), "top_k=3 must be in 1..2"),
        (lambda: bucket_divergence(torch.randn(3, 6), top), r"\(rows, vocab\) = \(3, 5\)"),
        (lambda: bucket_divergence(z, top, divergence="kl2"), "unknown divergence 'kl2'"),
    ]:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_rows_and_device_helpers():
    top = TopKLogits.from_logits(torch.randn(4, 6), 2)
    part = top.rows_of(slice(1, 3))
    assert part.rows == 2 and torch.equal(part.ids, top.ids[1:3]) and part.vocab_size == 6
    assert top.to("cpu").values.device.type == "cpu"
