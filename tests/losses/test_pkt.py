import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.pkt import PKT
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))


def emb(e):
    return Taps(torch.zeros(e.shape[0], 2), embedding=e)


def test_pkt_hand_computed():
    # student (1,0), (0,1): cosines [[1,0],[0,1]] -> (c+1)/2 = [[1,.5],[.5,1]] -> rows [[2/3,1/3],[1/3,2/3]]
    # teacher (1,0), (3,0): cosines all 1 -> rows [[1/2,1/2],[1/2,1/2]]
    # each row: 1/2 log((1/2)/(2/3)) + 1/2 log((1/2)/(1/3)) = 1/2 log(9/8); two rows, mean over 4 entries
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    t = torch.tensor([[1.0, 0.0], [3.0, 0.0]], requires_grad=True)
    loss = PKT(emb(s), emb(t))
    out = loss(emb(s), emb(t), BATCH, P)
    assert set(out) == {"pkt"}
    assert out["pkt"].item() == pytest.approx(math.log(9 / 8) / 4, abs=1e-6)
    out["pkt"].backward()
    assert s.grad.abs().sum() > 0 and t.grad is None


def test_pkt_batch_permutation_invariance_and_zero_at_match():
    torch.manual_seed(0)
    s, t = torch.randn(6, 10), torch.randn(6, 4)
    loss = PKT(emb(s), emb(t))
    base = loss(emb(s), emb(t), BATCH, P)["pkt"].item()
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert base > 0
    assert loss(emb(s[perm]), emb(t[perm]), BATCH, P)["pkt"].item() == pytest.approx(base, rel=1e-5)
    assert loss(emb(2.0 * t), emb(t), BATCH, P)["pkt"].item() == pytest.approx(0.0, abs=1e-6)


def test_pkt_cross_family_step():
    student, teacher = make_pair("mlp", "resnet20", student_opts={"hidden": [32]})
    terms, objective, teacher = one_step("pkt", student, teacher)
    assert set(terms) == {"ce", "pkt"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["pkt"] == 30000.0
    assert list(objective.methods["pkt"].parameters()) == []


def test_pkt_missing_embedding_tap():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Conv2d(3, 10, 32), nn.Flatten())  # no nn.Linear: no embedding tap to infer
    with pytest.raises(ConfigError, match="'embedding'"):
        one_step("pkt", plain, teacher)
    with pytest.raises(ConfigError, match="'pkt' needs the teacher's 'embedding' tap"):
        PKT(emb(torch.zeros(2, 3)), Taps(torch.zeros(2, 10)))
