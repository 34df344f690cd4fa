import json
import math

import numpy as np
import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, KDConfig, Progress, build_objective
from teachkit.losses.dist import (
    DIST,
    DISTOptions,
    dist_terms,
    inter_class_relation,
    intra_class_relation,
    pearson_correlation,
)
from teachkit.options import from_mapping
from teachkit.recipes import distill
from teachkit.types import Batch, Taps

P = Progress(0, 0, 1, 1)
EPS = 1e-8
SQRT3_2 = math.sqrt(3) / 2

# A 2-sample, 3-class case with tau = 1. Logits are log-probabilities, so softmax returns:
#   Y_s = [[1/6, 1/3, 1/2], [1/4, 1/4, 1/2]]      (student)
#   Y_t = [[1/4, 1/4, 1/2], [1/6, 1/3, 1/2]]      (teacher)
# Rows (inter-class). Centred, [1/6, 1/3, 1/2] is [-1/6, 0, 1/6] with norm sqrt(2)/6, and
# [1/4, 1/4, 1/2] is [-1/12, -1/12, 1/6] with norm sqrt(6)/12. Their dot product is 1/72 + 1/36 = 1/24
# and the norm product sqrt(3)/36, so rho = (1/24) / (sqrt(3)/36) = sqrt(3)/2 for both rows.
# L_inter = 1 - sqrt(3)/2.
# Columns (intra-class). Class 0: student [1/6, 1/4] rises, centred [-1/24, 1/24]; teacher [1/4, 1/6]
# falls, centred [1/24, -1/24]. The dot product is -1/288 and the norm product 1/288, so rho = -1.
# Class 1: student [1/3, 1/4] falls, teacher [1/4, 1/3] rises: rho = -1 the same way. Class 2 is
# [1/2, 1/2] on both sides, constant, so rho = 0 / (0 + eps) = 0. L_intra = 1 - (-1 - 1 + 0) / 3 = 5/3.
# The authors' eps = 1e-8 in the denominator moves these by ~1e-6 (the column norms are small), so the
# exact values keep it: rho_row = (1/24) / (sqrt(3)/36 + eps), rho_col = -(1/288) / (1/288 + eps).
PS = [[1 / 6, 1 / 3, 1 / 2], [1 / 4, 1 / 4, 1 / 2]]
PT = [[1 / 4, 1 / 4, 1 / 2], [1 / 6, 1 / 3, 1 / 2]]
RHO_ROW = (1 / 24) / (math.sqrt(3) / 36 + EPS)
RHO_COL = -(1 / 288) / (1 / 288 + EPS)
INTER = 1 - RHO_ROW  # 1 - sqrt(3)/2 to 1e-6
INTRA = 1 - 2 * RHO_COL / 3  # 5/3 to 1e-5


def _logits(p):
    return torch.tensor(p, dtype=torch.float64).log()


def _pearson_by_hand(u, v, eps=EPS):
    """Plain-Python float64 Pearson correlation, with eps in the denominator like the authors' code."""
    mu, mv = sum(u) / len(u), sum(v) / len(v)
    du, dv = [x - mu for x in u], [x - mv for x in v]
    dot = sum(a * b for a, b in zip(du, dv, strict=True))
    return dot / (math.sqrt(sum(a * a for a in du)) * math.sqrt(sum(b * b for b in dv)) + eps)


def _relations_by_hand(ys, yt):
    """(1 - mean row correlation, 1 - mean column correlation) of two lists of rows, in plain Python."""
    rows = [_pearson_by_hand(a, b) for a, b in zip(ys, yt, strict=True)]
    cols = [_pearson_by_hand(a, b) for a, b in zip(zip(*ys, strict=True), zip(*yt, strict=True), strict=True)]
    return 1 - sum(rows) / len(rows), 1 - sum(cols) / len(cols)


def _reference_dist(z_s, z_t, beta, gamma, tau):
    """THE REFERENCE'S FORMULA, transcribed verbatim from the authors' DIST
    (hunto/image_classification_sota, lib/models/losses/dist_kd.py; the `classification` submodule of
    hunto/DIST_KD). It is written inline here only as a cross-check."""
    def cosine_similarity(a, b, eps=1e-8):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1) + eps)

    def pearson(a, b, eps=1e-8):
        return cosine_similarity(a - a.mean(1).unsqueeze(1), b - b.mean(1).unsqueeze(1), eps)

    def inter(y_s, y_t):
        return 1 - pearson(y_s, y_t).mean()

    def intra(y_s, y_t):
        return inter(y_s.transpose(0, 1), y_t.transpose(0, 1))

    y_s = (z_s / tau).softmax(dim=1)
    y_t = (z_t / tau).softmax(dim=1)
    return beta * tau**2 * inter(y_s, y_t) + gamma * tau**2 * intra(y_s, y_t)


# --- the relations, by hand -------------------------------------------------------------------------------------


def test_pearson_hand_computed():
    ys, yt = torch.tensor(PS, dtype=torch.float64), torch.tensor(PT, dtype=torch.float64)
    rho = pearson_correlation(ys, yt)
    assert rho.dtype == torch.float64 and rho.shape == (2,)
    assert rho.tolist() == pytest.approx([RHO_ROW, RHO_ROW], abs=1e-12)
    assert RHO_ROW == pytest.approx(SQRT3_2, abs=1e-6) and INTER == pytest.approx(1 - SQRT3_2, abs=1e-6)
    assert INTRA == pytest.approx(5 / 3, abs=1e-5)
    assert rho.tolist() == pytest.approx([_pearson_by_hand(PS[0], PT[0]), _pearson_by_hand(PS[1], PT[1])], abs=1e-12)
    # a perfectly anti-correlated pair, and a constant row (correlation 0, not NaN)
    a = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([[3.0, 2.0, 1.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    assert pearson_correlation(a, b).tolist() == pytest.approx([-1.0, 0.0], abs=1e-8)


def test_relations_hand_computed():
    ys, yt = torch.tensor(PS, dtype=torch.float64), torch.tensor(PT, dtype=torch.float64)
    assert inter_class_relation(ys, yt).item() == pytest.approx(INTER, abs=1e-12)
    assert intra_class_relation(ys, yt).item() == pytest.approx(INTRA, abs=1e-12)
    by_hand = _relations_by_hand(PS, PT)
    assert inter_class_relation(ys, yt).item() == pytest.approx(by_hand[0], abs=1e-12)
    assert intra_class_relation(ys, yt).item() == pytest.approx(by_hand[1], abs=1e-12)


def test_terms_from_logits_hand_computed_and_tau_scaling():
    inter, intra = dist_terms(_logits(PS), _logits(PT), 1.0)
    assert inter.item() == pytest.approx(INTER, abs=1e-12) and intra.item() == pytest.approx(INTRA, abs=1e-12)
    # tau = 2 on doubled logits gives the same probabilities, and each term is multiplied by tau^2 = 4
    inter2, intra2 = dist_terms(2 * _logits(PS), 2 * _logits(PT), 2.0)
    assert inter2.item() == pytest.approx(4 * INTER, abs=1e-12)
    assert intra2.item() == pytest.approx(4 * INTRA, abs=1e-12)


def test_random_matrices_match_plain_python_and_numpy():
    g = torch.Generator().manual_seed(3)
    zs, zt = 3 * torch.randn(7, 5, generator=g, dtype=torch.float64), 3 * torch.randn(7, 5, generator=g,
                                                                                       dtype=torch.float64)
    tau = 2.5
    ys = np.exp(zs.numpy() / tau)
    ys /= ys.sum(axis=1, keepdims=True)
    yt = np.exp(zt.numpy() / tau)
    yt /= yt.sum(axis=1, keepdims=True)
    inter_hand, intra_hand = _relations_by_hand(ys.tolist(), yt.tolist())
    # numpy's corrcoef has no eps: it agrees with the eps-regularised value to ~eps / (|u_c| |v_c|)
    rows = [np.corrcoef(ys[i], yt[i])[0, 1] for i in range(7)]
    cols = [np.corrcoef(ys[:, j], yt[:, j])[0, 1] for j in range(5)]
    inter, intra = dist_terms(zs, zt, tau)
    assert inter.dtype == intra.dtype == torch.float64
    assert inter.item() == pytest.approx(tau**2 * inter_hand, abs=1e-10)
    assert intra.item() == pytest.approx(tau**2 * intra_hand, abs=1e-10)
    assert inter.item() == pytest.approx(tau**2 * (1 - np.mean(rows)), abs=1e-4)
    assert intra.item() == pytest.approx(tau**2 * (1 - np.mean(cols)), abs=1e-4)


@pytest.mark.parametrize(("beta", "gamma", "tau"), [(1.0, 1.0, 1.0), (2.0, 2.0, 4.0), (0.5, 3.0, 2.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_the_reference_formula(beta, gamma, tau, dtype):
    torch.manual_seed(0)
    zs, zt = 4 * torch.randn(16, 10, dtype=dtype), 6 * torch.randn(16, 10, dtype=dtype)
    inter, intra = dist_terms(zs, zt, tau)
    ours = beta * inter + gamma * intra
    ref = _reference_dist(zs, zt, beta, gamma, tau)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, ref, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


# --- what the relations are invariant to ------------------------------------------------------------------------


def test_inter_is_invariant_to_positive_affine_maps_of_each_row():
    torch.manual_seed(1)
    ys = torch.rand(6, 5, dtype=torch.float64).softmax(dim=1)
    yt = torch.rand(6, 5, dtype=torch.float64).softmax(dim=1)
    scale = torch.rand(6, 1, dtype=torch.float64) * 5 + 0.5  # per row, > 0
    shift = torch.randn(6, 1, dtype=torch.float64)
    base = inter_class_relation(ys, yt)
    assert inter_class_relation(scale * ys + shift, yt).item() == pytest.approx(base.item(), abs=1e-6)
    assert inter_class_relation(ys, scale * yt + shift).item() == pytest.approx(base.item(), abs=1e-6)
    # intra is the same on columns: a positive affine map of each class's column leaves it unchanged
    col_scale = torch.rand(1, 5, dtype=torch.float64) * 5 + 0.5  # per class, > 0
    col_shift = torch.randn(1, 5, dtype=torch.float64)
    assert intra_class_relation(col_scale * ys + col_shift, yt).item() == pytest.approx(
        intra_class_relation(ys, yt).item(), abs=1e-6)
    # a negative scale flips each correlation: d_p = 1 - rho becomes 1 + rho
    assert inter_class_relation(-ys, yt).item() == pytest.approx(2 - base.item(), abs=1e-6)


def test_perfect_match_is_zero_and_anti_match_is_two():
    torch.manual_seed(2)
    z = 3 * torch.randn(8, 6, dtype=torch.float64)
    inter, intra = dist_terms(z, z.clone(), 4.0)
    # exactly 0 without eps; with eps 1e-8 it is at most tau^2 * eps / |centred row|^2, tiny for these logits
    assert 0 <= inter.item() < 1e-4 and 0 <= intra.item() < 1e-4
    y = z.softmax(dim=1)
    assert inter_class_relation(y, 2 * y.mean() - y).item() == pytest.approx(2.0, abs=1e-6)
    # shifting the teacher's logits per sample does not change its softmax, so the loss stays 0
    shifted = dist_terms(z, z + torch.randn(8, 1, dtype=torch.float64), 4.0)
    assert all(0 <= t.item() < 1e-4 for t in shifted)


def test_permutation_invariance_over_batch_and_classes():
    torch.manual_seed(4)
    zs, zt = 3 * torch.randn(9, 7, dtype=torch.float64), 3 * torch.randn(9, 7, dtype=torch.float64)
    inter, intra = dist_terms(zs, zt, 4.0)
    rows, cols = torch.randperm(9), torch.randperm(7)
    # the same samples in another order: inter is a mean over samples, and each class's correlation
    # sees its entries permuted alike on both sides
    b_inter, b_intra = dist_terms(zs[rows], zt[rows], 4.0)
    # the classes in another order: softmax permutes with them; intra is a mean over classes, and
    # each sample's correlation sees its entries permuted alike
    c_inter, c_intra = dist_terms(zs[:, cols], zt[:, cols], 4.0)
    for a, b in ((b_inter, inter), (c_inter, inter), (b_intra, intra), (c_intra, intra)):
        assert a.item() == pytest.approx(b.item(), abs=1e-12)
    # student and teacher permuted differently: the relation changes
    assert dist_terms(zs[rows], zt, 4.0)[1].item() != pytest.approx(intra.item(), abs=1e-6)


def test_a_batch_of_one_has_constant_intra_relation():
    zs = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    inter, intra = dist_terms(zs, torch.tensor([[0.0, 1.0, 3.0]]), 4.0)
    assert intra.item() == pytest.approx(16.0)  # tau^2 * (1 - 0)
    (grad,) = torch.autograd.grad(intra, zs)
    assert torch.count_nonzero(grad) == 0


# --- the loss and the objective ---------------------------------------------------------------------------------


def _objective(**kd):
    taps = Taps(torch.zeros(2, 3))
    return build_objective("dist", taps, taps, num_classes=3, num_samples=2, **kd)


def test_registry_entry_and_defaults_are_the_cifar100_setting():
    cls = LOSSES.get("dist")
    assert cls is DIST and LOSSES.options_of("dist") is DISTOptions
    assert cls.student_needs == cls.teacher_needs == ("logits",) and cls.term_names == ("inter", "intra")
    assert cls.default_weight == 1.0 and not cls.replaces_ce
    assert DISTOptions() == DISTOptions(beta=2.0, gamma=2.0, tau=4.0)
    d = _objective()
    m = d.methods["dist"]
    assert (m.beta, m.gamma, m.tau) == (2.0, 2.0, 4.0) and m.term_weights == {"inter": 2.0, "intra": 2.0}
    assert d.weights == {"dist": 1.0} and d.ce_weight == 1.0
    assert "beta=2.0, gamma=2.0, tau=4.0" in repr(m)


def test_objective_weights_terms_as_the_paper():
    beta, gamma, tau = 0.5, 3.0, 2.0
    d = _objective(options={"dist": {"beta": beta, "gamma": gamma, "tau": tau}})
    zs = (2 * _logits(PS)).float().requires_grad_(True)
    zt = (2 * _logits(PT)).float()
    batch = Batch(torch.zeros(2, 1), torch.tensor([2, 2]), torch.arange(2))
    terms = d(Taps(zs), Taps(zt), batch, P)
    assert set(terms) == {"ce", "dist.inter", "dist.intra"}
    assert terms["dist.inter"].item() == pytest.approx(beta * tau**2 * INTER, abs=1e-5)
    assert terms["dist.intra"].item() == pytest.approx(gamma * tau**2 * INTRA, abs=1e-5)
    distill_total = terms["dist.inter"] + terms["dist.intra"]
    assert distill_total.item() == pytest.approx(tau**2 * (beta * INTER + gamma * INTRA), abs=1e-5)
    assert terms["ce"].item() == pytest.approx(torch.nn.functional.cross_entropy(zs, batch.y).item(), abs=1e-6)
    # the loss itself returns the unweighted tau^2-scaled terms
    raw = d.methods["dist"](Taps(zs), Taps(zt), batch, P)
    assert raw["inter"].item() == pytest.approx(tau**2 * INTER, abs=1e-5)
    assert raw["intra"].item() == pytest.approx(tau**2 * INTRA, abs=1e-5)
    # kd.gamma.dist scales the whole method; the teacher gets no gradient
    doubled = _objective(gamma={"dist": 2.0}, options={"dist": {"beta": beta, "gamma": gamma, "tau": tau}})
    out = doubled(Taps(zs), Taps(zt.requires_grad_(True)), batch, P)
    assert out["dist.intra"].item() == pytest.approx(2 * gamma * tau**2 * INTRA, abs=1e-5)
    sum(out.values()).backward()
    assert zs.grad is not None and torch.isfinite(zs.grad).all() and zt.grad is None


def test_defaults_reproduce_the_authors_cifar100_total():
    # dist_cifar.yaml: CE * 1 + 2 * DIST(beta=1, gamma=1, tau=4)
    torch.manual_seed(5)
    zs, zt = 3 * torch.randn(8, 10), 5 * torch.randn(8, 10)
    y = torch.arange(8) % 10
    terms = _objective()(Taps(zs), Taps(zt), Batch(torch.zeros(8, 1), y, torch.arange(8)), P)
    reference = torch.nn.functional.cross_entropy(zs, y) + 2 * _reference_dist(zs, zt, 1.0, 1.0, 4.0)
    torch.testing.assert_close(sum(terms.values()), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("beta", -1, "kd.options.dist.beta=-1.0 is out of range: must be >= 0.0"),
    ("gamma", -0.5, "kd.options.dist.gamma=-0.5 is out of range: must be >= 0.0"),
    ("tau", 0, "kd.options.dist.tau=0.0 is out of range: must be > 0.0"),
    ("tau", "4", "kd.options.dist.tau='4' is not allowed: expected a number"),
    ("tau", float("nan"), "kd.options.dist.tau=nan is not allowed: expected a finite number"),
])
def test_bad_options_are_one_line_errors_naming_the_key(field, value, message):
    with pytest.raises(ConfigError) as info:
        _objective(options={"dist": {field: value}})
    assert str(info.value) == message
    with pytest.raises(ConfigError) as again:
        from_mapping(KDConfig, {"method": "dist", "options": {"dist": {field: value}}}, "kd")
    assert str(again.value) == message and "\n" not in message


def test_unknown_option_names_the_key_with_a_hint():
    with pytest.raises(ConfigError, match=r"'kd.options.dist.temperature'.*allowed under kd.options.dist: beta, gamma"):
        _objective(options={"dist": {"temperature": 4}})
    with pytest.raises(ConfigError, match=r"'kd.options.dist.bta' \(did you mean 'beta'"):
        _objective(options={"dist": {"bta": 1}})


# --- end to end -------------------------------------------------------------------------------------------------


def test_distils_through_the_kd_recipe(tiny):
    cfg = tiny(name="dist", train={"epochs": 1, "progress": False}, teacher={"epochs": 1},
               kd={"method": "dist", "options": {"dist": {"tau": 2.0}}})
    result = distill(cfg)
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    train = record["train"]
    assert {"ce", "dist.inter", "dist.intra", "loss"} <= set(train), train
    assert all(math.isfinite(v) for v in train.values())
    assert 0 <= train["dist.inter"] <= 2 * 2 * 4 and 0 <= train["dist.intra"] <= 2 * 2 * 4  # gamma * tau^2 * 2
