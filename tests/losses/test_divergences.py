"""kd's divergences (teachkit.losses.divergences): hand-computed cases, the GKD / TRL generalised JSD,
top-k bucketing, and the options' bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective
from teachkit.losses.divergences import (
    forward_kl,
    jensen_shannon,
    logit_divergence,
    reverse_kl,
    top_k_forward_kl,
    total_variation,
)
from teachkit.losses.kd import HintonKD, KDOptions, kd_kl
from teachkit.types import Batch, Taps

# Two classes. Teacher logits [ln 3, 0] -> p = [3/4, 1/4]; student logits 0 -> q = [1/2, 1/2].
P, Q = [0.75, 0.25], [0.5, 0.5]
ZT = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)
ZS = torch.zeros(1, 2, dtype=torch.float64)


def _kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0)


def test_hand_computed_two_classes():
    assert forward_kl(ZS, ZT).item() == pytest.approx(_kl(P, Q), abs=1e-12)  # 0.75 ln 1.5 + 0.25 ln 0.5
    assert reverse_kl(ZS, ZT).item() == pytest.approx(_kl(Q, P), abs=1e-12)  # 0.5 ln(2/3) + 0.5 ln 2
    assert total_variation(ZS, ZT).item() == pytest.approx(0.25, abs=1e-12)  # 1/2 (|.25| + |-.25|)
    m = [0.5 * (a + b) for a, b in zip(P, Q, strict=True)]
    assert jensen_shannon(ZS, ZT, beta=0.5).item() == pytest.approx(0.5 * _kl(P, m) + 0.5 * _kl(Q, m), abs=1e-12)
    m3 = [0.3 * a + 0.7 * b for a, b in zip(P, Q, strict=True)]
    assert jensen_shannon(ZS, ZT, beta=0.3).item() == pytest.approx(0.3 * _kl(P, m3) + 0.7 * _kl(Q, m3), abs=1e-12)


def _reference_generalized_jsd(student_logits, teacher_logits, beta, temperature):
    """TRANSCRIPTION of Hugging Face TRL's ``GKDTrainer.generalized_jsd_loss`` (trl/trainer/gkd_trainer.py),
    reduction "batchmean", used only as a cross-check."""
    student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=student_log_probs.dtype)
        mixture = torch.logsumexp(torch.stack([student_log_probs + torch.log(1 - b), teacher_log_probs + torch.log(b)]),
                                  dim=0)
        kl_teacher = F.kl_div(mixture, teacher_log_probs, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture, student_log_probs, reduction="none", log_target=True)
        jsd = b * kl_teacher + (1 - b) * kl_student
    return jsd.sum() / student_logits.shape[0]


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jsd_matches_trl_values_and_input_gradients(beta):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 7, dtype=torch.float64, generator=g)
    zt = 3 * torch.randn(6, 7, dtype=torch.float64, generator=g)
    ours = jensen_shannon(x @ w, zt, 2.0, beta)
    ref = _reference_generalized_jsd(x @ w, zt, beta, 2.0)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0], rtol=1e-8, atol=1e-12)


def test_jsd_endpoints_are_forward_and_reverse_kl():
    zs, zt = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    assert jensen_shannon(zs, zt, 3.0, 0.0).item() == pytest.approx(forward_kl(zs, zt, 3.0).item(), rel=1e-12)
    assert jensen_shannon(zs, zt, 3.0, 1.0).item() == pytest.approx(reverse_kl(zs, zt, 3.0).item(), rel=1e-12)


def test_top_k_hand_computed_and_bounds():
    # p = [.5, .3, .2], q = [.2, .2, .6]; k = 1 keeps class 0 and buckets {1, 2}: [.5, .5] vs [.2, .8]
    p, q = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64), torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64)
    value = top_k_forward_kl(q.log(), p.log(), 1)
    assert value.item() == pytest.approx(0.5 * math.log(0.5 / 0.2) + 0.5 * math.log(0.5 / 0.8), abs=1e-12)
    zs, zt = torch.randn(8, 10, dtype=torch.float64), 3 * torch.randn(8, 10, dtype=torch.float64)
    full = forward_kl(zs, zt, 2.0).item()
    values = [top_k_forward_kl(zs, zt, k, 2.0).item() for k in range(1, 10)]
    assert all(v <= full + 1e-12 for v in values)  # data processing inequality
    assert values[-1] == pytest.approx(full, rel=1e-12)  # k = C - 1: the bucket is one class
    with pytest.raises(ValueError, match="top_k=10 must be in 1..9"):
        top_k_forward_kl(zs, zt, 10)


def test_top_k_gradient_flows_to_the_student_only_and_is_finite_when_the_rest_underflows():
    zs = torch.randn(3, 5, dtype=torch.float32, requires_grad=True)
    zt = torch.tensor([[200.0, 0, 0, 0, 0]] * 3)  # the bucket's teacher mass is exp(-200): 0 in float32
    value = top_k_forward_kl(zs, zt, 1)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(zs.grad).all()


def test_identical_distributions_give_zero():
    z = torch.randn(5, 4, dtype=torch.float64)
    for name in ("forward_kl", "reverse_kl", "jsd", "tv"):
        assert logit_divergence(z, z.clone(), 4.0, name).item() == pytest.approx(0.0, abs=1e-12)
    assert logit_divergence(z, z.clone(), 4.0, top_k=2).item() == pytest.approx(0.0, abs=1e-12)


def test_hinton_kd_options_switch_the_divergence_and_t2():
    zs, zt = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    batch = Batch(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), None)
    p = Progress(0, 0, 1, 1)

    def value(**opts):
        loss = HintonKD(Taps(zs), Taps(zt), KDOptions(temperature=3.0, **opts), num_classes=6)
        return loss(Taps(zs), Taps(zt), batch, p)["kl"].item()

    assert value() == pytest.approx(kd_kl(zs, zt, 3.0).item(), rel=1e-12)
    assert value(divergence="reverse_kl") == pytest.approx(9 * reverse_kl(zs, zt, 3.0).item(), rel=1e-12)
    assert value(divergence="tv", scale_t2=False) == pytest.approx(total_variation(zs, zt, 3.0).item(), rel=1e-12)
    assert value(divergence="jsd", jsd_beta=0.2) == pytest.approx(9 * jensen_shannon(zs, zt, 3.0, 0.2).item(),
                                                                   rel=1e-12)
    assert value(top_k=3) == pytest.approx(9 * top_k_forward_kl(zs, zt, 3, 3.0).item(), rel=1e-12)
    assert value(scale_t2=False) == pytest.approx(kd_kl(zs, zt, 3.0).item() / 9, rel=1e-12)


@pytest.mark.parametrize(("options", "match"), [
    ({"divergence": "kl2"}, "divergence"),
    ({"jsd_beta": 1.5}, "jsd_beta"),
    ({"jsd_beta": -0.1}, "jsd_beta"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 3, "divergence": "tv"}, "top_k=3 applies to divergence forward_kl only"),
    ({"top_k": 6}, r"top_k=6 must be below the number of classes \(6\): allowed 1..5"),
])
def test_bad_options_are_one_line_config_errors(options, match):
    z = torch.zeros(2, 6)
    with pytest.raises(ConfigError, match=match) as info:
        build_objective("kd", Taps(z), Taps(z), num_classes=6, num_samples=2, options={"kd": options})
    assert "\n" not in str(info.value)
