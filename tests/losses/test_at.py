import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.at import AttentionTransfer
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))


def stage_taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 2), stages=list(maps))


def test_at_hand_computed_two_stages_with_pooling():
    # stage A, 1-channel 2x2 maps. Sample 0: student [[1,0],[0,0]] -> Q = (1,0,0,0); teacher all ones ->
    # Q = (.5,.5,.5,.5); squared differences .25 x 4. Sample 1: identical maps -> 0. Mean over 2*4 -> 1/8.
    s_a = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]], [[[2.0, 0.0], [0.0, 2.0]]]])
    t_a = torch.tensor([[[[1.0, 1.0], [1.0, 1.0]]], [[[2.0, 0.0], [0.0, 2.0]]]])
    # stage B: the student's 4x4 map is average-pooled to the teacher's 2x2 before the attention map.
    # Sample 0: ones in the top-left 2x2 block pools to [[1,0],[0,0]]; sample 1: all 2s pools to all 2s;
    # teacher all ones in both: again 1/8.
    s_b = torch.zeros(2, 1, 4, 4)
    s_b[0, 0, :2, :2] = 1.0
    s_b[1] = 2.0
    t_b = torch.ones(2, 1, 2, 2)
    s_a.requires_grad_(True)
    t_a.requires_grad_(True)
    loss = AttentionTransfer(stage_taps(s_a, s_b), stage_taps(t_a, t_b))
    out = loss(stage_taps(s_a, s_b), stage_taps(t_a, t_b), BATCH, P)
    assert set(out) == {"at"}
    assert out["at"].item() == pytest.approx(0.125 + 0.125, abs=1e-7)
    out["at"].backward()
    assert s_a.grad is not None and t_a.grad is None  # (zero here: one-hot attention maps are stationary)


def test_at_invariant_to_positive_scaling_of_a_map():
    torch.manual_seed(0)
    s = [torch.relu(torch.randn(4, 8, 8, 8)), torch.relu(torch.randn(4, 16, 4, 4))]
    t = [torch.relu(torch.randn(4, 6, 8, 8)), torch.relu(torch.randn(4, 12, 2, 2))]
    loss = AttentionTransfer(stage_taps(*s), stage_taps(*t))
    base = loss(stage_taps(*s), stage_taps(*t), BATCH, P)["at"].item()
    assert base > 0
    scaled_s = loss(stage_taps(3.7 * s[0], s[1]), stage_taps(*t), BATCH, P)["at"].item()
    scaled_t = loss(stage_taps(*s), stage_taps(t[0], 0.05 * t[1]), BATCH, P)["at"].item()
    assert scaled_s == pytest.approx(base, rel=1e-5) and scaled_t == pytest.approx(base, rel=1e-5)
    s[1].requires_grad_(True)
    t[1].requires_grad_(True)
    loss(stage_taps(*s), stage_taps(*t), BATCH, P)["at"].backward()
    assert s[1].grad.abs().sum() > 0 and t[1].grad is None


def test_at_pairs_the_last_stages_when_counts_differ():
    s = [torch.ones(2, 1, 2, 2)]
    t = [torch.rand(2, 1, 2, 2), torch.ones(2, 3, 2, 2)]  # only the teacher's last stage pairs with s[0]
    loss = AttentionTransfer(stage_taps(*s), stage_taps(*t))
    assert loss.pairs == 1
    assert loss(stage_taps(*s), stage_taps(*t), BATCH, P)["at"].item() == pytest.approx(0.0, abs=1e-7)


def test_at_cross_family_step():
    student, teacher = make_pair("lenet", "resnet20")
    terms, objective, teacher = one_step("at", student, teacher)
    assert set(terms) == {"ce", "at"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["at"] == 1000.0 and terms["at"].item() > 0
    assert list(objective.methods["at"].parameters()) == []  # no auxiliary modules


def test_at_missing_or_flat_stages_are_config_errors():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    with pytest.raises(ConfigError, match="'stages'"):
        one_step("at", plain, teacher)
    with pytest.raises(ConfigError, match="'at' needs the student's 'stages' tap"):
        AttentionTransfer(Taps(torch.zeros(2, 10)), stage_taps(torch.zeros(2, 4, 2, 2)))
    mlp, _ = make_pair("mlp", "resnet20", student_opts={"hidden": [16]})
    with pytest.raises(ConfigError, match="'at' needs spatial stage maps"):
        one_step("at", mlp, teacher)
