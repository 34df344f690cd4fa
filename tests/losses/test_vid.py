import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.vid import VID, VIDOptions
from teachkit.models import Tapped
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))


def stage_taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 2), stages=list(maps))


def test_vid_hand_computed_with_initial_variance_5():
    # one stage, 1 channel, 1x1 maps; all three 1x1 convs weight 1 (mid = teacher channels = 1) so
    # mu(x) = relu(relu(x)) = x for x >= 0: mu = [1, 2] against teacher [0, 4], variance 5:
    # mean(0.5 * (1/5 + ln 5), 0.5 * (4/5 + ln 5)) = 0.25 + 0.5 ln 5
    s = torch.tensor([1.0, 2.0]).view(2, 1, 1, 1).requires_grad_(True)
    t = torch.tensor([0.0, 4.0]).view(2, 1, 1, 1).requires_grad_(True)
    loss = VID(stage_taps(s), stage_taps(t))
    stage = loss.stages[0]
    assert stage.variance().tolist() == pytest.approx([5.0], abs=1e-6)
    with torch.no_grad():
        for conv in stage.regressor:
            if isinstance(conv, nn.Conv2d):
                conv.weight.fill_(1.0)
    out = loss(stage_taps(s), stage_taps(t), BATCH, P)
    assert set(out) == {"vid"}
    assert out["vid"].item() == pytest.approx(0.25 + 0.5 * math.log(5), rel=1e-6)
    out["vid"].backward()
    assert s.grad.abs().sum() > 0 and t.grad is None and stage.log_scale.grad.abs().sum() > 0


def test_vid_stages_sized_from_probes():
    student, teacher = make_pair("lenet", "resnet20")
    with Tapped(student, want=("stages",)) as s, Tapped(teacher, want=("stages",)) as t, torch.no_grad():
        x = torch.randn(2, 3, 32, 32)
        ps, pt = s(x), t(x)
    loss = VID(ps, pt)
    assert len(loss.stages) == 2  # lenet's 2 stages pair with resnet20's last 2
    for stage, f_s, f_t in zip(loss.stages, ps.stages, pt.stages[1:], strict=True):
        first, last = stage.regressor[0], stage.regressor[-1]
        assert first.in_channels == f_s.shape[1]
        assert first.out_channels == last.out_channels == f_t.shape[1] == stage.log_scale.numel()
    assert VID(ps, pt, VIDOptions(mid_channels=7)).stages[0].regressor[0].out_channels == 7


def test_vid_cross_family_step_trains_every_stage():
    student, teacher = make_pair("lenet", "resnet20")
    terms, objective, teacher = one_step("vid", student, teacher)
    assert set(terms) == {"ce", "vid"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["vid"] == 1.0
    aux = list(objective.methods["vid"].parameters())
    assert aux and all(p.grad is not None and p.grad.abs().sum() > 0 for p in aux)


def test_vid_missing_stages_and_bad_options():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    with pytest.raises(ConfigError, match="'stages'"):
        one_step("vid", plain, teacher)
    with pytest.raises(ConfigError, match="'vid' needs the student's 'stages' tap"):
        VID(Taps(torch.zeros(2, 10)), stage_taps(torch.zeros(2, 4, 2, 2)))
    with pytest.raises(ConfigError, match="init_pred_var"):
        VIDOptions(init_pred_var=0.0)
    with pytest.raises(ConfigError, match=r"kd.options.vid.init_pred_var=1e-06 is not allowed: must be > "
                                          r"kd.options.vid.eps=1e-05"):
        one_step("vid", *make_pair("resnet8", "resnet20"), options={"vid": {"init_pred_var": 1e-6}})
    with pytest.raises(ConfigError, match="mid_channels"):
        VIDOptions(mid_channels=0)
