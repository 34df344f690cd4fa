import math

import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.kd import HintonKD, KDOptions, kd_kl
from teachkit.types import Batch, Taps

P = Progress(0, 0, 1, 1)
KL_QUARTER = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # KL([1/4, 3/4] || [1/2, 1/2])


def test_kd_kl_hand_computed():
    zs = torch.zeros(1, 2)
    zt = torch.tensor([[0.0, math.log(3)]])
    assert kd_kl(zs, zt, 1.0).item() == pytest.approx(KL_QUARTER, abs=1e-6)


def test_kd_temperature_scaling_and_batchmean():
    # T = 2 divides the logits by 2 and multiplies by T^2 = 4; two identical rows keep the value (batchmean)
    zs = torch.zeros(2, 2)
    zt = torch.tensor([[0.0, 2 * math.log(3)]] * 2)
    assert kd_kl(zs, zt, 2.0).item() == pytest.approx(4 * KL_QUARTER, abs=1e-6)


def test_objective_hinton_weights_ce_and_kd():
    zs = torch.zeros(1, 2, requires_grad=True)
    zt = torch.tensor([[0.0, math.log(3)]])
    batch = Batch(torch.zeros(1, 1), torch.tensor([1]), torch.tensor([0]))
    d = build_objective("kd", Taps(zs), Taps(zt), num_classes=2, num_samples=1, alpha=0.9, temperature=1.0)
    terms = d(Taps(zs), Taps(zt), batch, P)
    assert terms["ce"].item() == pytest.approx(0.1 * math.log(2), abs=1e-6)
    assert terms["kd"].item() == pytest.approx(0.9 * KL_QUARTER, abs=1e-6)
    sum(terms.values()).backward()
    assert zs.grad is not None and zt.grad is None


def test_alpha_extremes_and_ce_weight_override():
    taps = Taps(torch.zeros(1, 3))
    batch = Batch(torch.zeros(1, 1), torch.tensor([0]), torch.tensor([0]))
    only_kd = build_objective("kd", taps, taps, num_classes=3, num_samples=1, alpha=1.0)
    assert set(only_kd(taps, taps, batch, P)) == {"kd"}
    only_ce = build_objective("kd", taps, taps, num_classes=3, num_samples=1, alpha=0.0)
    assert set(only_ce(taps, taps, batch, P)) == {"ce"}
    custom = build_objective("kd", taps, taps, num_classes=3, num_samples=1, ce_weight=1.0)
    assert custom.ce_weight == 1.0 and custom.weights == {"kd": 0.9}


def test_gamma_validation_and_options():
    taps = Taps(torch.zeros(1, 3))
    kw = {"num_classes": 3, "num_samples": 1}
    with pytest.raises(ConfigError, match=r"kd.gamma.kd=-1 is not allowed: must be a finite number >= 0"):
        build_objective("kd", taps, taps, gamma={"kd": -1}, **kw)
    with pytest.raises(ConfigError, match="kd.gamma.kd=inf"):
        build_objective("kd", taps, taps, gamma={"kd": float("inf")}, **kw)
    with pytest.raises(ConfigError, match="kd.gamma.at names a method that is not in"):
        build_objective("kd", taps, taps, gamma={"at": 1}, **kw)
    with pytest.raises(ConfigError, match=r"'kd.options.kd.temp' \(did you mean 'temperature'"):
        build_objective("kd", taps, taps, options={"kd": {"temp": 2}}, **kw)
    with pytest.raises(ConfigError, match="unknown distillation loss 'kdd'"):
        build_objective(["kdd"], taps, taps, **kw)
    d = build_objective("kd", taps, taps, options={"kd": {"temperature": 2.0}}, **kw)
    assert isinstance(d.methods["kd"], HintonKD) and d.methods["kd"].temperature == 2.0
    assert "kd" in LOSSES


def test_temperature_defaults_to_kd_temperature_and_to_4_when_built_directly():
    taps = Taps(torch.zeros(1, 3))
    kw = {"num_classes": 3, "num_samples": 1}
    assert build_objective("kd", taps, taps, **kw).methods["kd"].temperature == 4.0
    assert build_objective("kd", taps, taps, temperature=2.5, **kw).methods["kd"].temperature == 2.5
    # an explicit kd.options.kd.temperature wins over kd.temperature
    both = build_objective("kd", taps, taps, temperature=2.5, options={"kd": {"temperature": 3.0}}, **kw)
    assert both.methods["kd"].temperature == 3.0
    assert HintonKD(taps, taps).temperature == 4.0
    assert HintonKD(taps, taps, KDOptions(temperature=1.5)).temperature == 1.5
    assert KDOptions().temperature is None


class _Untouchable:
    """Stands in for the dense teacher logits a top-k cache would have to build: any use fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"teacher.logits.{name} read although the teacher is a cached top-k")


@pytest.mark.parametrize("options", [{}, {"divergence": "reverse_kl"}, {"divergence": "jsd", "jsd_beta": 0.2},
                                     {"divergence": "tv", "scale_t2": False}, {"top_k": 2}])
def test_hinton_kd_reads_a_cached_top_k_teacher_through_the_buckets(options):
    from teachkit.losses.divergences import TopKLogits, bucket_divergence

    g = torch.Generator().manual_seed(2)
    zs = torch.randn(5, 7, dtype=torch.float64, generator=g, requires_grad=True)
    zt = 2 * torch.randn(5, 7, dtype=torch.float64, generator=g)
    top = TopKLogits.from_logits(zt, 3)
    batch = Batch(torch.zeros(5, 1), torch.zeros(5, dtype=torch.long), torch.arange(5))
    loss = HintonKD(Taps(zs.detach()), Taps(zt), KDOptions(temperature=2.0, **options), num_classes=7)
    value = loss(Taps(zs), Taps(_Untouchable(), extra={"topk": top}), batch, P)["kl"]
    kept = TopKLogits.from_logits(zt, options.get("top_k", 3))
    expected = bucket_divergence(zs, kept, 2.0, options.get("divergence", "forward_kl"), options.get("jsd_beta", 0.5))
    scale = 1.0 if options.get("scale_t2") is False else 4.0
    assert value.item() == pytest.approx(scale * expected.item(), rel=1e-12)
    value.backward()
    assert torch.isfinite(zs.grad).all() and zs.grad.abs().sum() > 0
    # without the cache the same loss reads the dense logits as before (the default: exactly kd_kl)
    dense = loss(Taps(zs), Taps(zt), batch, P)["kl"]
    if not options:
        assert dense.item() == kd_kl(zs, zt, 2.0).item()
        assert value.item() <= dense.item() + 1e-12  # the bucketed KL never exceeds the full one


def test_hinton_kd_top_k_cache_refuses_what_needs_full_logits():
    from teachkit.losses.divergences import TopKLogits

    z = torch.randn(3, 6)
    cached = Taps(_Untouchable(), extra={"topk": TopKLogits.from_logits(z, 2)})
    batch = Batch(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), torch.arange(3))
    for options, match in [({"logit_standardize": True}, "logit_standardize=true needs the teacher's full logits"),
                           ({"top_k": 4}, r"top_k=4 is more than the cached teacher's top-2: allowed 1..2")]:
        loss = HintonKD(Taps(z), Taps(z), KDOptions(**options), num_classes=6)
        with pytest.raises(ConfigError, match=match) as info:
            loss(Taps(z), cached, batch, P)
        assert "\n" not in str(info.value)
