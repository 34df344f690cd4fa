import json
import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.ab import INIT_STAGE, SCALE, ABOptions, ActivationBoundaries, boundary_loss, stage_weights
from teachkit.types import Batch, Taps

from . import helpers
from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)
IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 64, "n_test": 32}


class _ReferenceABLoss(nn.Module):
    """TRANSCRIPTION of RepDistiller distiller_zoo/AB.py ``ABLoss`` (cross-check only)."""

    def __init__(self, feat_num, margin=1.0):
        super().__init__()
        self.w = [2 ** (i - feat_num + 1) for i in range(feat_num)]
        self.margin = margin

    def forward(self, g_s, g_t):
        bsz = g_s[0].shape[0]
        losses = [self.criterion_alternative_l2(s, t) for s, t in zip(g_s, g_t, strict=False)]
        losses = [w * loss for w, loss in zip(self.w, losses, strict=False)]
        losses = [loss / bsz for loss in losses]
        return [loss / 1000 * 3 for loss in losses]

    def criterion_alternative_l2(self, source, target):
        loss = ((source + self.margin) ** 2 * ((source > -self.margin) & (target <= 0)).float()
                + (source - self.margin) ** 2 * ((source <= self.margin) & (target > 0)).float())
        return torch.abs(loss).sum()


class _ReferenceConvReg(nn.Module):
    """TRANSCRIPTION of RepDistiller models/util.py ``ConvReg(use_relu=False)`` for equal sizes (a 1x1 conv)."""

    def __init__(self, s_c, t_c):
        super().__init__()
        self.conv = nn.Conv2d(s_c, t_c, kernel_size=(1, 1))
        self.bn = nn.BatchNorm2d(t_c)

    def forward(self, x):
        return self.bn(self.conv(x))


def taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 3, dtype=maps[0].dtype), stages_pre=list(maps))


def test_boundary_loss_by_hand():
    # margin 1. Teacher on (t > 0): student 0.5 <= 1 -> (0.5 - 1)^2 = 0.25; student 2 is past the margin -> 0.
    # Teacher off (t <= 0): student 0.5 > -1 -> (0.5 + 1)^2 = 2.25; student -3 is past -1 -> 0. Sum 2.5.
    s = torch.tensor([0.5, 2.0, 0.5, -3.0])
    t = torch.tensor([1.0, 1.0, 0.0, -2.0])
    assert boundary_loss(s, t, 1.0).item() == pytest.approx(2.5)
    assert stage_weights(3) == [0.25, 0.5, 1.0]


def test_matches_repdistiller_values_and_gradients_with_connectors():
    torch.manual_seed(0)
    s_maps = [torch.randn(4, c, h, h, dtype=torch.float64, requires_grad=True) for c, h in ((4, 8), (6, 4), (8, 2))]
    t_maps = [torch.randn(4, c, h, h, dtype=torch.float64) for c, h in ((4, 8), (5, 4), (8, 2))]
    loss = ActivationBoundaries(taps(*s_maps), taps(*t_maps)).double().train()
    assert [c.identity for c in loss.connectors] == [True, False, True]
    ref_conn = _ReferenceConvReg(6, 5).double().train()
    ref_conn.conv.load_state_dict(loss.connectors[1].body[0].state_dict())
    ref_conn.bn.load_state_dict(loss.connectors[1].body[1].state_dict())
    ours = loss(taps(*s_maps), taps(*t_maps), Batch(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), None), P)
    ref = sum(_ReferenceABLoss(3)([s_maps[0], ref_conn(s_maps[1]), s_maps[2]], t_maps))
    torch.testing.assert_close(ours["ab"], ref, rtol=1e-10, atol=1e-14)
    params = [*s_maps, *loss.connectors[1].parameters()]
    ref_params = [*s_maps, *ref_conn.parameters()]
    torch.testing.assert_close(torch.autograd.grad(ours["ab"], params, retain_graph=True),
                               torch.autograd.grad(ref, ref_params), rtol=1e-8, atol=1e-14)
    assert SCALE == pytest.approx(0.003)


def test_plain_loss_one_training_step_and_margin_option():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    terms, objective, _ = one_step("ab", student, teacher, shape=SHAPE, batch_size=4, gamma={"ab": 1.0},
                                   options={"ab": {"margin": 0.5}})
    assert set(terms) == {"ce", "ab"} and terms["ab"].item() > 0 and objective.methods["ab"].margin == 0.5
    assert ActivationBoundaries.default_weight == 0.0


@pytest.mark.parametrize(("student", "teacher", "match"), [
    (Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2)), "'ab' needs the student's 'stages_pre' tap"),
    (taps(torch.zeros(2, 4, 2, 2)), Taps(torch.zeros(2, 3)), "'ab' needs the teacher's 'stages_pre' tap"),
    (taps(torch.zeros(2, 4)), taps(torch.zeros(2, 4, 2, 2)), "spatial pre-activation maps"),
])
def test_bad_models_are_one_line_config_errors(student, teacher, match):
    with pytest.raises(ConfigError, match=match):
        ActivationBoundaries(student, teacher)


def test_training_stage_trains_body_and_connectors_not_the_teacher():
    student, teacher = make_pair("resnet8", "wrn_16_2", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "ab", shape=SHAPE)
    loss = ActivationBoundaries(s_probe, t_probe)
    stage = loss.training_stage(t_tap, s_tap)
    assert stage.name == INIT_STAGE and stage.epochs == 30 and stage.data == "student"
    assert stage.modules["model"] is student and stage.modules["connectors"] is loss.connectors
    assert ActivationBoundaries(s_probe, t_probe, ABOptions(init_epochs=0)).training_stage(t_tap, s_tap) is None
    out = stage.step(Batch(torch.randn(4, *SHAPE), torch.zeros(4, dtype=torch.long), None), P)
    out.terms["ab"].backward()
    assert student.layer1[0].conv1.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.connectors.parameters())
    assert all(p.grad is None for p in teacher.parameters())


def test_kd_recipe_runs_the_stage_then_ce_and_resume_loads_it(tiny, monkeypatch):
    from teachkit.recipes import distill

    cfg = tiny(name="ab", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 1, "progress": False}, teacher={"model": {"name": "resnet14", "options": {}},
                                                                 "epochs": 1},
               kd={"method": "ab", "options": {"ab": {"init_epochs": 1}}})
    result = distill(cfg)
    stage_dir = result.run_dir / INIT_STAGE
    assert (stage_dir / "summary.json").is_file()
    stage_record = json.loads((stage_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(stage_record["train"]["ab"]) and math.isfinite(stage_record["val"]["loss"])
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["train"]) == {"ce", "loss"}
    monkeypatch.setattr(ActivationBoundaries, "loss", lambda *a: pytest.fail("a finished AB stage was retrained"))
    assert distill(cfg, resume=True).run_dir == result.run_dir
