import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.sp import SimilarityPreserving
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))


def stage_taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 2), stages=list(maps))


def test_sp_hand_computed_on_the_last_stage():
    # last stage, flattened: student (1,0), (0,1) -> G = I (rows already unit); teacher (1,0), (1,0) ->
    # F F^T all ones -> rows (1/sqrt2, 1/sqrt2). ||G_t - G_s||_F^2 = 2 (1 - 1/sqrt2)^2 + 2 (1/2) = 4 - 2 sqrt2;
    # divided by B^2 = 4: 1 - sqrt2 / 2. The first stage (random) must not matter.
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(2, 1, 1, 2).requires_grad_(True)
    t = torch.tensor([[1.0, 0.0], [1.0, 0.0]]).view(2, 2, 1, 1).requires_grad_(True)
    first = torch.randn(2, 3, 4, 4)
    loss = SimilarityPreserving(stage_taps(first, s), stage_taps(t))
    out = loss(stage_taps(first, s), stage_taps(t), BATCH, P)
    assert set(out) == {"sp"}
    assert out["sp"].item() == pytest.approx(1 - math.sqrt(2) / 2, abs=1e-6)
    out["sp"].backward()
    assert s.grad is not None and t.grad is None


def test_sp_batch_permutation_invariance():
    torch.manual_seed(0)
    s, t = torch.relu(torch.randn(6, 8, 4, 4)), torch.relu(torch.randn(6, 16, 2, 2))
    s.requires_grad_(True)
    loss = SimilarityPreserving(stage_taps(s), stage_taps(t))
    base = loss(stage_taps(s), stage_taps(t), BATCH, P)["sp"]
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert base.item() > 0
    assert loss(stage_taps(s[perm]), stage_taps(t[perm]), BATCH, P)["sp"].item() == pytest.approx(base.item(), rel=1e-5)
    base.backward()
    assert s.grad.abs().sum() > 0


def test_sp_cross_family_step():
    student, teacher = make_pair("lenet", "resnet20")
    terms, objective, teacher = one_step("sp", student, teacher)
    assert set(terms) == {"ce", "sp"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["sp"] == 3000.0
    assert list(objective.methods["sp"].parameters()) == []


def test_sp_missing_stages_tap():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    with pytest.raises(ConfigError, match="'stages'"):
        one_step("sp", plain, teacher)
    with pytest.raises(ConfigError, match="'sp' needs the student's 'stages' tap"):
        SimilarityPreserving(Taps(torch.zeros(2, 10)), stage_taps(torch.zeros(2, 4, 2, 2)))
