import math

import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.dkd import DKD, dkd_terms
from teachkit.types import Batch, Taps

# 3 classes, target 0, T = 1. Teacher logits [ln 2, ln 2, 0] -> p_t = [2/5, 2/5, 1/5]; student logits 0 -> 1/3 each.
#   TCKD: binary [p_target, 1 - p_target]: teacher [2/5, 3/5], student [1/3, 2/3]
#         KL = 2/5 ln((2/5)/(1/3)) + 3/5 ln((3/5)/(2/3)) = 0.4 ln 1.2 + 0.6 ln 0.9
#   NCKD: non-target classes renormalised: teacher [2/3, 1/3], student [1/2, 1/2]
#         KL = 2/3 ln((2/3)/(1/2)) + 1/3 ln((1/3)/(1/2)) = 2/3 ln(4/3) + 1/3 ln(2/3)
TCKD = 0.4 * math.log(1.2) + 0.6 * math.log(0.9)
NCKD = 2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3)
ZT = [math.log(2), math.log(2), 0.0]


def _dkd(**opts):
    """The objective with DKD alone (gamma 1; its alpha / beta / warm-up applied there), student and
    teacher taps and a batch of one sample of class 0."""
    logits = torch.zeros(1, 3)
    objective = build_objective("dkd", Taps(logits), Taps(logits), num_classes=3, num_samples=1,
                                options={"dkd": opts})
    return objective, Taps(torch.zeros(1, 3)), Taps(torch.tensor([ZT])), Batch(torch.zeros(1, 1), torch.tensor([0]),
                                                                                None)


def test_terms_hand_computed_t1():
    tckd, nckd = dkd_terms(torch.zeros(1, 3), torch.tensor([ZT]), torch.tensor([0]), 1.0)
    assert tckd.item() == pytest.approx(TCKD, abs=1e-6)
    assert nckd.item() == pytest.approx(NCKD, abs=1e-6)


def test_loss_with_temperature_alpha_beta_batchmean():
    # T = 2 with teacher logits doubled gives the same distributions, times T^2 = 4; two identical rows
    # keep the value (sum / batch); alpha 1, beta 8 weight the terms.
    objective, s, _, _ = _dkd(temperature=2.0)
    zs, zt = torch.zeros(2, 3), 2 * torch.tensor([ZT] * 2)
    batch = Batch(torch.zeros(2, 1), torch.tensor([0, 0]), None)
    out = objective(Taps(zs), Taps(zt), batch, Progress(20, 0, 240, 10))
    assert set(out) == {"ce", "dkd.tckd", "dkd.nckd"}
    assert out["dkd.tckd"].item() == pytest.approx(4 * 1.0 * TCKD, abs=1e-5)
    assert out["dkd.nckd"].item() == pytest.approx(4 * 8.0 * NCKD, abs=1e-5)
    # the loss itself returns the unweighted terms; alpha and beta are its term weights
    loss = objective.methods["dkd"]
    raw = loss(Taps(zs), Taps(zt), batch, Progress(20, 0, 240, 10))
    assert loss.term_weights == {"tckd": 1.0, "nckd": 8.0}
    assert raw["tckd"].item() == pytest.approx(4 * TCKD, abs=1e-5) and raw["nckd"].item() == pytest.approx(4 * NCKD,
                                                                                                          abs=1e-5)


@pytest.mark.parametrize(("epoch", "step", "factor"), [(0, 0, 0.0), (10, 0, 0.5), (19, 5, 0.975), (20, 0, 1.0),
                                                       (100, 3, 1.0)])
def test_warmup_factor(epoch, step, factor):
    objective, s, t, batch = _dkd(temperature=1.0, beta=1.0)
    out = objective(s, t, batch, Progress(epoch, step, 240, 10))
    assert out["dkd.tckd"].item() == pytest.approx(factor * TCKD, abs=1e-6)
    assert out["dkd.nckd"].item() == pytest.approx(factor * NCKD, abs=1e-6)
    assert objective.methods["dkd"].ramp(Progress(epoch, step, 240, 10)) == pytest.approx(factor)


def test_zero_warmup_is_full_weight():
    objective, s, t, batch = _dkd(temperature=1.0, beta=1.0, warmup=0)
    out = objective(s, t, batch, Progress(0, 0, 1, 1))
    assert out["dkd.tckd"].item() == pytest.approx(TCKD, abs=1e-6)


def test_teacher_equal_to_student_is_zero():
    z = torch.randn(5, 7)
    y = torch.arange(5)
    tckd, nckd = dkd_terms(z, z.clone(), y, 4.0)
    assert tckd.item() == pytest.approx(0.0, abs=1e-6) and nckd.item() == pytest.approx(0.0, abs=1e-6)


def test_confident_logits_stay_finite():
    # p_target rounds to 1 in float32: a naive log(1 - p_target) is -inf; the log-space form stays finite.
    zs = torch.tensor([[200.0, 0.0, 0.0]], requires_grad=True)
    tckd, nckd = dkd_terms(zs, torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([0]), 1.0)
    (tckd + nckd).backward()
    assert torch.isfinite(tckd) and torch.isfinite(nckd) and torch.isfinite(zs.grad).all()


def test_registry_defaults_and_option_errors():
    cls = LOSSES.get("dkd")
    assert cls is DKD and cls.default_weight == 1.0
    assert cls.student_needs == cls.teacher_needs == ("logits",) and cls.term_names == ("tckd", "nckd")
    taps = Taps(torch.zeros(1, 3))
    d = build_objective("dkd", taps, taps, num_classes=3, num_samples=1)
    m = d.methods["dkd"]
    assert (m.alpha, m.beta, m.temperature, m.warmup) == (1.0, 8.0, 4.0, 20.0) and d.weights == {"dkd": 1.0}
    with pytest.raises(ConfigError, match=r"kd.options.dkd.temperature=0.0 is out of range: must be > 0"):
        build_objective("dkd", taps, taps, num_classes=3, num_samples=1, options={"dkd": {"temperature": 0}})
    with pytest.raises(ConfigError, match=r"kd.options.dkd.beta=-1"):
        build_objective("dkd", taps, taps, num_classes=3, num_samples=1, options={"dkd": {"beta": -1}})
