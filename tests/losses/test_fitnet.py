import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.fitnet import FitNet, FitNetOptions
from teachkit.models import Tapped
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))


def stage_taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 2), stages=list(maps))


def test_fitnet_hand_computed_with_pooling_bn_and_relu():
    # student 1x2x2 maps pool to 1x1: sample 0 all ones -> 1, sample 1 [[2,4],[2,4]] -> 3
    f_s = torch.tensor([[[[1.0, 1.0], [1.0, 1.0]]], [[[2.0, 4.0], [2.0, 4.0]]]], requires_grad=True)
    f_t = torch.tensor([[[[0.0]]], [[[2.0]]]], requires_grad=True)
    loss = FitNet(stage_taps(f_s), stage_taps(f_t), FitNetOptions(stage=0))
    with torch.no_grad():
        loss.regressor[0].weight.fill_(1.0)
        loss.regressor[0].bias.zero_()
    out = loss(stage_taps(f_s), stage_taps(f_t), BATCH, P)
    # conv: [1, 3]; BN (train mode, batch mean 2, biased var 1, eps 1e-5): [-1, 1] / sqrt(1 + 1e-5);
    # ReLU: [0, 1 / sqrt(1.00001)]; MSE against [0, 2], mean over the 2 elements
    expected = (2.0 - 1.0 / math.sqrt(1.00001)) ** 2 / 2
    assert set(out) == {"hint"}
    assert out["hint"].item() == pytest.approx(expected, rel=1e-6)
    out["hint"].backward()
    assert f_s.grad is not None and f_s.grad.abs().sum() > 0
    assert f_t.grad is None  # the teacher map is a target, never a gradient path


def test_fitnet_regressor_sized_from_probes():
    for student_name, teacher_name, opts in (("resnet8", "resnet20", {"width": 2}), ("lenet", "resnet20", {})):
        student, teacher = make_pair(student_name, teacher_name, teacher_opts=opts)
        with Tapped(student, want=("stages",)) as s, Tapped(teacher, want=("stages",)) as t, torch.no_grad():
            x = torch.randn(2, 3, 32, 32)
            ps, pt = s(x), t(x)
        loss = FitNet(ps, pt, FitNetOptions(stage=1))
        conv = loss.regressor[0]
        assert conv.in_channels == ps.stages[1].shape[1]
        assert conv.out_channels == pt.stages[1].shape[1] == loss.regressor[1].num_features
        assert conv.in_channels != conv.out_channels  # 32 -> 64 and 50 -> 32: a real mapping


def test_fitnet_cross_family_step_trains_the_regressor():
    student, teacher = make_pair("lenet", "resnet20")
    terms, objective, teacher = one_step("fitnet", student, teacher)
    assert set(terms) == {"ce", "fitnet"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["fitnet"] == 100.0
    aux = list(objective.methods["fitnet"].parameters())
    assert aux and all(p.grad is not None and p.grad.abs().sum() > 0 for p in aux)


def test_fitnet_options_and_missing_taps():
    student, teacher = make_pair("resnet8", "resnet20")
    with pytest.raises(ConfigError, match=r"^kd.options.fitnet.stage=3 is out of range: the student has 3 stage"):
        one_step("fitnet", student, teacher, options={"fitnet": {"stage": 3}})
    with pytest.raises(ConfigError, match=r"kd.options.fitnet.teacher_stage=-4 is out of range: the teacher"):
        one_step("fitnet", student, teacher, options={"fitnet": {"teacher_stage": -4}})
    with pytest.raises(ConfigError, match=r"kd.options.fitnet.kernel_size=2 is not allowed; choose one of: 1, 3"):
        one_step("fitnet", student, teacher, options={"fitnet": {"kernel_size": 2}})
    terms, objective, _ = one_step("fitnet", student, teacher,
                                   options={"fitnet": {"stage": -1, "teacher_stage": 0, "kernel_size": 3}})
    assert torch.isfinite(terms["fitnet"]) and objective.methods["fitnet"].regressor[0].kernel_size == (3, 3)
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    with pytest.raises(ConfigError, match="'stages'"):
        one_step("fitnet", plain, teacher)
    with pytest.raises(ConfigError, match="'fitnet' needs the student's 'stages' tap"):
        FitNet(Taps(torch.zeros(2, 10)), stage_taps(torch.zeros(2, 4, 2, 2)))
