import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective
from teachkit.losses.rkd import RKD, RKDOptions
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), torch.arange(3))


def emb(e):
    return Taps(torch.zeros(e.shape[0], 2), embedding=e)


def huber(x):
    return 0.5 * x * x if abs(x) < 1 else abs(x) - 0.5


def test_rkd_hand_computed_distance_and_angle():
    # student: right triangle (0,0), (1,0), (0,1); teacher: collinear (0,0), (1,0), (2,0)
    s = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    t = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]], requires_grad=True)
    # distances / mean of the 6 off-diagonal ones: student (1, 1, sqrt2) / ((2 + sqrt2) / 3),
    # teacher (1, 2, 1) / (4 / 3) = (.75, 1.5, .75); each pair twice, diagonal 0, mean over 9 entries
    m_s = (2 + math.sqrt(2)) / 3
    diffs = [1 / m_s - 0.75, 1 / m_s - 1.5, math.sqrt(2) / m_s - 0.75]
    distance = sum(2 * huber(d) for d in diffs) / 9
    # angles: per anchor i the two entries (j, k), (k, j) with j != k, both != i, hold cos(angle at i);
    # (j, j) entries are 1 on both sides and entries touching i are 0. Student cosines at vertices 0, 1, 2:
    # 0, 1/sqrt2, 1/sqrt2; teacher: 1, -1, 1. Mean over 27 entries.
    cos_s, cos_t = [0.0, 1 / math.sqrt(2), 1 / math.sqrt(2)], [1.0, -1.0, 1.0]
    angle = sum(2 * huber(a - b) for a, b in zip(cos_s, cos_t, strict=True)) / 27
    assert angle == pytest.approx(3.5 / 27)
    loss = RKD(emb(s), emb(t))
    out = loss(emb(s), emb(t), BATCH, P)
    assert set(out) == {"distance", "angle"}  # unweighted; the lambdas are term weights
    w = loss.term_weights
    assert w == {"distance": 25.0, "angle": 50.0}
    assert (w["distance"] * out["distance"]).item() == pytest.approx(25 * distance, rel=1e-5)
    assert (w["angle"] * out["angle"]).item() == pytest.approx(50 * angle, rel=1e-5)
    (out["distance"] + out["angle"]).backward()
    assert s.grad.abs().sum() > 0 and t.grad is None
    # the objective applies them (gamma 1): the logged terms are the weighted ones
    kw = {"num_classes": 2, "num_samples": 3}
    terms = build_objective("rkd", emb(s), emb(t), **kw)(emb(s), emb(t), BATCH, P)
    assert terms["rkd.distance"].item() == pytest.approx(25 * distance, rel=1e-5)
    assert terms["rkd.angle"].item() == pytest.approx(50 * angle, rel=1e-5)
    custom = build_objective("rkd", emb(s), emb(t), options={"rkd": {"distance_weight": 1.0, "angle_weight": 0.0}},
                             **kw)(emb(s), emb(t), BATCH, P)
    assert custom["rkd.distance"].item() == pytest.approx(distance, rel=1e-5) and custom["rkd.angle"].item() == 0.0


def test_rkd_invariances():
    torch.manual_seed(0)
    s, t = torch.randn(6, 10), torch.randn(6, 4)
    loss = RKD(emb(s), emb(t))
    base = loss(emb(s), emb(t), BATCH, P)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = loss(emb(s[perm]), emb(t[perm]), BATCH, P)
    for key in ("distance", "angle"):
        assert base[key].item() > 0
        assert permuted[key].item() == pytest.approx(base[key].item(), rel=1e-5)
    # a scaled, shifted copy of the teacher has the same normalised distances and angles
    same = loss(emb(3.0 * t + 1.0), emb(t), BATCH, P)
    assert same["distance"].item() == pytest.approx(0.0, abs=1e-6)
    assert same["angle"].item() == pytest.approx(0.0, abs=1e-6)


def test_rkd_cross_family_step():
    student, teacher = make_pair("mlp", "resnet20", student_opts={"hidden": [32]})
    terms, objective, teacher = one_step("rkd", student, teacher)
    assert set(terms) == {"ce", "rkd.distance", "rkd.angle"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["rkd"] == 1.0
    assert list(objective.methods["rkd"].parameters()) == []


def test_rkd_missing_embedding_tap_and_bad_option():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Conv2d(3, 10, 32), nn.Flatten())  # no nn.Linear: no embedding tap to infer
    with pytest.raises(ConfigError, match="'embedding'"):
        one_step("rkd", plain, teacher)
    with pytest.raises(ConfigError, match="'rkd' needs the student's 'embedding' tap"):
        RKD(Taps(torch.zeros(2, 10)), emb(torch.zeros(2, 3)))
    with pytest.raises(ConfigError, match="angle_weight"):
        RKD(emb(torch.zeros(2, 3)), emb(torch.zeros(2, 3)), RKDOptions(angle_weight=-1))
