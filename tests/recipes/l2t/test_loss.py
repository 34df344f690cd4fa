"""L2T-DLF dynamic loss, dev objectives and Phi statistics against hand-computed values."""

import math

import pytest
import torch

from teachkit.recipes.l2t.loss import (
    dev_cross_entropy,
    dynamic_loss,
    l2t_loss_terms,
    l2t_student_loss,
    phi_stats,
    smooth_error,
)

# two samples, three classes: logits = log p so softmax(logits) = p exactly
P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)
LOGITS = P.log()
Y = torch.tensor([0, 2])
EYE, ZERO = torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)


def test_identity_phi_is_minus_p_over_one_plus_p():
    # -sigmoid(log p_y) = -p_y / (1 + p_y): -(0.5/1.5 + 0.3/1.3) / 2 = -11/39
    assert float(dynamic_loss(LOGITS, Y, EYE, ZERO)) == pytest.approx(-11 / 39, rel=1e-12)


def test_w_rows_and_per_class_bias():
    W = 2 * EYE.clone()
    b = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    # sample 1 (y=0): sigmoid(2 log 0.5) = 0.25 / 1.25 = 0.2
    # sample 2 (y=2): sigmoid(2 log 0.3 + 1) = 0.09 / (0.09 + e^-1)
    want = -(0.2 + 0.09 / (0.09 + math.exp(-1))) / 2
    assert float(dynamic_loss(LOGITS, Y, W, b)) == pytest.approx(want, rel=1e-12)
    # an off-diagonal entry in row y mixes in other classes: y^T W log p = log 0.5 + log 0.3 = log 0.15
    W = EYE.clone()
    W[0, 1] = 1.0
    want = -(0.15 / 1.15 + 0.3 / 1.3) / 2
    assert float(dynamic_loss(LOGITS, Y, W, ZERO)) == pytest.approx(want, rel=1e-12)


def test_ce_alpha_mixing_and_terms():
    ce = -(math.log(0.5) + math.log(0.3)) / 2
    want = 0.25 * ce + 0.75 * (-11 / 39)
    assert float(l2t_student_loss(LOGITS, Y, EYE, ZERO, ce_alpha=0.25)) == pytest.approx(want, rel=1e-12)
    assert float(l2t_student_loss(LOGITS, Y, EYE, ZERO, ce_alpha=1.0)) == pytest.approx(ce, rel=1e-12)
    terms = l2t_loss_terms(LOGITS, Y, EYE, ZERO, ce_alpha=0.25)
    assert set(terms) == {"dlf", "ce"}
    assert float(sum(terms.values())) == pytest.approx(want, rel=1e-12)
    assert set(l2t_loss_terms(LOGITS, Y, EYE, ZERO)) == {"dlf"}


def test_smooth_error_counts_only_misclassified_samples():
    # sample 1 is correct (max_j p_j = p_y): 0; sample 2: 2 sigmoid(50 (0.6 - 0.3)) - 1 = tanh(7.5)
    assert float(smooth_error(LOGITS, Y, 50.0)) == pytest.approx(math.tanh(7.5) / 2, rel=1e-12)
    assert float(smooth_error(LOGITS, Y, 2.0)) == pytest.approx(math.tanh(0.3) / 2, rel=1e-12)
    assert float(dev_cross_entropy(LOGITS, Y)) == pytest.approx(-(math.log(0.5) + math.log(0.3)) / 2, rel=1e-12)


def test_phi_stats():
    W = torch.tensor([[2.0, 1.0], [0.0, 4.0]])
    s = phi_stats(W, torch.tensor([1.0, -3.0]))
    assert s["W_diag_mean"] == 3.0 and s["W_offdiag_mean"] == 0.5
    assert s["W_dist_identity"] == pytest.approx(math.sqrt(1 + 1 + 9))
    assert (s["b_mean"], s["b_min"], s["b_max"]) == (-1.0, -3.0, 1.0)
    stacked = phi_stats(torch.stack([W, torch.eye(2)]), torch.zeros(2, 2))
    assert stacked["W_diag_mean"] == 2.0
