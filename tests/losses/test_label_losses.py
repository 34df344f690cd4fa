import math

import pytest
import torch

from teachkit.losses import OBJECTIVES, cross_entropy, logit_mse, softmax_mse


def test_softmax_mse_hand_computed():
    # z = [0, ln 3]: softmax = [1/4, 3/4]; label 0 -> (1 - 1/4)^2 + (0 - 3/4)^2 = 9/16 + 9/16 = 1.125
    # label 1 -> (0 - 1/4)^2 + (1 - 3/4)^2 = 1/16 + 1/16 = 0.125; batch mean = 0.625
    z = torch.tensor([[0.0, math.log(3)], [0.0, math.log(3)]])
    y = torch.tensor([0, 1])
    assert softmax_mse(z, y).item() == pytest.approx(0.625, abs=1e-6)


def test_softmax_mse_sums_over_classes_not_mean():
    z = torch.zeros(1, 4)  # uniform 1/4 each
    y = torch.tensor([2])
    # (3/4)^2 + 3 * (1/4)^2 = 9/16 + 3/16 = 0.75 (F.mse_loss would give 0.75 / 4)
    assert softmax_mse(z, y).item() == pytest.approx(0.75, abs=1e-6)


def test_logit_mse_and_ce_hand_computed():
    z = torch.tensor([[2.0, -1.0, 0.0]])
    y = torch.tensor([0])
    assert logit_mse(z, y).item() == pytest.approx((2 - 1) ** 2 + 1 + 0, abs=1e-6)
    expected = -(2.0 - math.log(math.exp(2) + math.exp(-1) + 1))
    assert cross_entropy(z, y).item() == pytest.approx(expected, abs=1e-6)


def test_label_smoothing_changes_targets():
    z = torch.zeros(1, 2)
    y = torch.tensor([0])
    # smoothed target [0.95, 0.05] vs p = [0.5, 0.5]: 0.45^2 + 0.45^2 = 0.405
    assert softmax_mse(z, y, label_smoothing=0.1).item() == pytest.approx(0.405, abs=1e-6)


def test_mse_minimiser_is_the_class_probability():
    """ECCV 2024 Thm 1: the expected MSE is minimised by p = P(y|x). One x with labels 0 (70%) / 1 (30%)."""
    z = torch.zeros(1, 2, requires_grad=True)
    opt = torch.optim.SGD([z], lr=1.0)
    ys = torch.tensor([0] * 7 + [1] * 3)
    for _ in range(2000):
        opt.zero_grad()
        softmax_mse(z.expand(10, 2), ys).backward()
        opt.step()
    assert z.softmax(1)[0, 0].item() == pytest.approx(0.7, abs=1e-3)


def test_registry_has_the_label_objectives():
    assert set(OBJECTIVES.names()) == {"ce", "mse", "mse-logits", "l2"}


def test_dtypes_at_least_float32_and_float64_kept():
    y = torch.tensor([0, 2])
    for fn in (cross_entropy, softmax_mse, logit_mse):
        z = torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.0, 1.0]])
        assert fn(z.bfloat16(), y).dtype == torch.float32
        value64 = fn(z.double(), y)
        assert value64.dtype == torch.float64
        assert value64.item() == pytest.approx(fn(z, y).item(), rel=1e-6)
