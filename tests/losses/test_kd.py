import math

import pytest
import torch

from teachkit.data.base import Batch
from teachkit.losses import LOSSES, Progress
from teachkit.losses.kd import HintonKD, kd_kl
from teachkit.models.taps import Taps


def test_kd_kl_hand_computed():
    # T = 1: p_t = softmax([0, ln 3]) = [1/4, 3/4]; p_s = [1/2, 1/2]
    # KL = 1/4 ln(1/2) + 3/4 ln(3/2)
    zs = torch.zeros(1, 2)
    zt = torch.tensor([[0.0, math.log(3)]])
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert kd_kl(zs, zt, 1.0).item() == pytest.approx(expected, abs=1e-6)


def test_kd_temperature_scaling_and_batchmean():
    # T = 2 scales logits by 1/2 and multiplies by T^2 = 4; a batch of two identical rows keeps the value.
    zs = torch.zeros(2, 2)
    zt = torch.tensor([[0.0, 2 * math.log(3)]] * 2)
    expected = 4 * (0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    assert kd_kl(zs, zt, 2.0).item() == pytest.approx(expected, abs=1e-6)


def test_hinton_kd_terms_weighted():
    zs = torch.zeros(1, 2, requires_grad=True)
    zt = torch.tensor([[0.0, math.log(3)]])
    batch = Batch(torch.zeros(1, 1), torch.tensor([1]), torch.tensor([0]))
    loss = HintonKD(alpha=0.9, temperature=1.0)
    terms = loss(Taps(zs), Taps(zt), batch, Progress(0, 0, 1, 1))
    assert terms["ce"].item() == pytest.approx(0.1 * math.log(2), abs=1e-6)
    assert terms["kd"].item() == pytest.approx(0.9 * (0.25 * math.log(0.5) + 0.75 * math.log(1.5)), abs=1e-6)
    sum(terms.values()).backward()
    assert zs.grad is not None and zt.grad is None


def test_alpha_extremes_drop_terms():
    taps = Taps(torch.zeros(1, 3))
    batch = Batch(torch.zeros(1, 1), torch.tensor([0]), torch.tensor([0]))
    assert set(HintonKD(alpha=1.0)(taps, taps, batch, Progress(0, 0, 1, 1))) == {"kd"}
    assert set(HintonKD(alpha=0.0)(taps, taps, batch, Progress(0, 0, 1, 1))) == {"ce"}
    assert "kd" in LOSSES
