"""AB (Heo et al. AAAI 2019): boundary loss, connectors, pre-training stage, recipe run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from teachkit.data.base import TensorSplit
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress
from teachkit.losses.ab import (
    INIT_STAGE,
    SCALE,
    ABOptions,
    ActivationBoundaries,
    Connector,
    boundary_loss,
    stage_weights,
)
from teachkit.losses.stage_eval import StageLossEvaluator, pretrain_optim
from teachkit.types import Batch, Taps

from . import helpers
from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)
IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 64, "n_test": 32}


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)


# ----------------------------------------------------------------------------- reference transcriptions
# THE REFERENCE'S CODE, transcribed from RepDistiller (HobbitLong/RepDistiller): distiller_zoo/AB.py (ABLoss) and
# models/util.py (Connector, ConvReg). Written inline here only as a cross-check of teachkit's implementation.


class _ReferenceABLoss(nn.Module):
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
    def __init__(self, s_shape, t_shape, use_relu=True):
        super().__init__()
        self.use_relu = use_relu
        s_N, s_C, s_H, s_W = s_shape
        t_N, t_C, t_H, t_W = t_shape
        if s_H == 2 * t_H:
            self.conv = nn.Conv2d(s_C, t_C, kernel_size=3, stride=2, padding=1)
        elif s_H * 2 == t_H:
            self.conv = nn.ConvTranspose2d(s_C, t_C, kernel_size=4, stride=2, padding=1)
        elif s_H >= t_H:
            self.conv = nn.Conv2d(s_C, t_C, kernel_size=(1 + s_H - t_H, 1 + s_W - t_W))
        else:
            raise NotImplementedError(f"student size {s_H}, teacher size {t_H}")
        self.bn = nn.BatchNorm2d(t_C)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.conv(x)
        if self.use_relu:
            return self.relu(self.bn(x))
        return self.bn(x)


class _ReferenceConnector(nn.Module):
    def __init__(self, s_shapes, t_shapes):
        super().__init__()
        self.connectors = nn.ModuleList(self._make_conenctors(s_shapes, t_shapes))

    @staticmethod
    def _make_conenctors(s_shapes, t_shapes):
        assert len(s_shapes) == len(t_shapes), "unequal length of feat list"
        connectors = []
        for s, t in zip(s_shapes, t_shapes, strict=False):
            if s[1] == t[1] and s[2] == t[2]:
                connectors.append(nn.Sequential())
            else:
                connectors.append(_ReferenceConvReg(s, t, use_relu=False))
        return connectors

    def forward(self, g_s):
        return [self.connectors[i](g_s[i]) for i in range(len(g_s))]


# ----------------------------------------------------------------------------- helpers


def taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 3, dtype=maps[0].dtype), stages_pre=list(maps))


def batch_of(n):
    return Batch(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), None)


def state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


# ----------------------------------------------------------------------------- the loss


def test_boundary_loss_by_hand():
    # margin 1. Teacher on (t > 0): student 0.5 <= 1 -> (0.5 - 1)^2 = 0.25; student 2 is past the margin -> 0.
    # Teacher off (t <= 0): student 0.5 > -1 -> (0.5 + 1)^2 = 2.25; student -3 is past -1 -> 0. Sum 2.5.
    s = torch.tensor([0.5, 2.0, 0.5, -3.0])
    t = torch.tensor([1.0, 1.0, 0.0, -2.0])
    assert boundary_loss(s, t, 1.0).item() == pytest.approx(2.5)
    # margin 0.5: (0.5 - 0.5)^2 = 0 (on the margin: 0.5 <= 0.5 counts, adds 0), (0.5 + 0.5)^2 = 1 -> 1
    assert boundary_loss(s, t, 0.5).item() == pytest.approx(1.0)
    assert stage_weights(3) == [0.25, 0.5, 1.0] and stage_weights(1) == [1.0]


def test_term_by_hand_weights_batch_and_scale():
    # two stages, batch 2, identity connectors (equal shapes), margin 1:
    # stage 0 (weight 1/2): student all 0, teacher all > 0 -> (0 - 1)^2 = 1 per element, 2 x 1 x 2 x 2 = 8 elements
    #   -> 8; stage 1 (weight 1): student all 0, teacher all <= 0 -> (0 + 1)^2 = 1 per element, 2 x 2 x 1 x 1 = 4 -> 4.
    # term = (1/2 * 8 + 1 * 4) / 2 * 3 / 1000 = 4 * 0.003 = 0.012
    s = [torch.zeros(2, 1, 2, 2), torch.zeros(2, 2, 1, 1)]
    t = [torch.ones(2, 1, 2, 2), -torch.ones(2, 2, 1, 1)]
    loss = ActivationBoundaries(taps(*s), taps(*t))
    assert [c.identity for c in loss.connectors] == [True, True] and not list(loss.parameters())
    assert loss(taps(*s), taps(*t), batch_of(2), P)["ab"].item() == pytest.approx(0.012)
    assert SCALE == pytest.approx(0.003)


# (student C, H, W), (teacher C, H, W) per stage: identity, 1x1 conv, stride-2 conv, transposed conv, valid conv
CASES = {
    "identity+1x1": [((4, 8, 8), (4, 8, 8)), ((6, 4, 4), (5, 4, 4)), ((8, 2, 2), (8, 2, 2))],
    "stride2+transposed": [((3, 8, 8), (4, 4, 4)), ((5, 2, 2), (6, 4, 4))],
    "valid+channels": [((3, 6, 6), (4, 4, 4)), ((5, 3, 3), (5, 3, 3)), ((4, 4, 4), (7, 4, 4))],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("margin", [1.0, 0.3])
def test_matches_repdistiller_values_and_gradients(case, margin):
    """``sum(ABLoss(n, margin)(Connector(s_shapes, t_shapes)(g_s), g_t))`` in train mode, float64: values and
    gradients w.r.t. the student maps and the connectors' parameters."""
    torch.manual_seed(0)
    shapes = CASES[case]
    s_maps = [torch.randn(4, *s, dtype=torch.float64, requires_grad=True) for s, _ in shapes]
    t_maps = [torch.randn(4, *t, dtype=torch.float64) for _, t in shapes]
    loss = ActivationBoundaries(taps(*s_maps), taps(*t_maps), ABOptions(margin=margin)).double().train()
    ref_conn = _ReferenceConnector([m.shape for m in s_maps], [m.shape for m in t_maps]).double().train()
    ref_conn.connectors.load_state_dict(loss.connectors.state_dict())
    out = loss(taps(*s_maps), taps(*t_maps), batch_of(4), P)
    assert set(out) == {"ab"} and out["ab"].dtype == torch.float64
    ref = sum(_ReferenceABLoss(len(shapes), margin)(ref_conn(s_maps), t_maps))
    close(out["ab"], ref)
    ours_grads = torch.autograd.grad(out["ab"], [*s_maps, *loss.connectors.parameters()])
    ref_grads = torch.autograd.grad(ref, [*s_maps, *ref_conn.parameters()])
    close(ours_grads, ref_grads)
    assert all(g.abs().sum() > 0 for g in ours_grads[:len(s_maps)])


def test_connector_forms():
    def conv_of(s, t):
        c = Connector((2, *s), (2, *t))
        return None if c.identity else c.conv

    assert conv_of((4, 8, 8), (4, 8, 8)) is None
    one = conv_of((4, 8, 8), (6, 8, 8))
    assert isinstance(one, nn.Conv2d) and one.kernel_size == (1, 1) and one.bias is not None
    down = conv_of((4, 8, 8), (6, 4, 4))
    assert isinstance(down, nn.Conv2d) and (down.kernel_size, down.stride, down.padding) == ((3, 3), (2, 2), (1, 1))
    up = conv_of((4, 4, 4), (6, 8, 8))
    assert isinstance(up, nn.ConvTranspose2d) and (up.kernel_size, up.stride, up.padding) == ((4, 4), (2, 2), (1, 1))
    valid = conv_of((4, 6, 5), (6, 4, 4))
    assert isinstance(valid, nn.Conv2d) and valid.kernel_size == (3, 2)
    c = Connector((2, 4, 6, 5), (2, 6, 4, 4))
    assert isinstance(c.bn, nn.BatchNorm2d) and c.bn.num_features == 6
    assert c(torch.randn(3, 4, 6, 5)).shape == (3, 6, 4, 4)


def test_registered_defaults():
    assert LOSSES.get("ab") is ActivationBoundaries and ActivationBoundaries.default_weight == 0.0
    o = ABOptions()
    assert (o.margin, o.init_epochs, o.init_lr) == (1.0, 30, 0.05)
    assert ActivationBoundaries.student_needs == ActivationBoundaries.teacher_needs == ("stages_pre",)


# ----------------------------------------------------------------------------- bad inputs

BAD = [
    ("missing student stages_pre", Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2)),
     "'ab' needs the student's 'stages_pre' tap"),
    ("missing teacher stages_pre", taps(torch.zeros(2, 4, 2, 2)), Taps(torch.zeros(2, 3)),
     "'ab' needs the teacher's 'stages_pre' tap"),
    ("flat student map", taps(torch.zeros(2, 4)), taps(torch.zeros(2, 4, 2, 2)),
     r"spatial pre-activation maps .* student stage 0 / teacher stage 0 have shapes \(2, 4\)"),
    ("student map too small", taps(torch.zeros(2, 4, 8, 8), torch.zeros(2, 4, 3, 3)),
     taps(torch.zeros(2, 4, 8, 8), torch.zeros(2, 4, 4, 4)),
     r"cannot connect student stage 1 / teacher stage 1 \(student map \(4, 3, 3\), teacher map \(4, 4, 4\)\)"),
    ("student map narrower", taps(torch.zeros(2, 4, 4, 2)), taps(torch.zeros(2, 4, 3, 3)),
     r"student map \(4, 4, 2\), teacher map \(4, 3, 3\)"),
]


@pytest.mark.parametrize(("case", "student", "teacher", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_models_are_one_line_config_errors(case, student, teacher, match):
    with pytest.raises(ConfigError, match=match) as info:
        ActivationBoundaries(student, teacher)
    assert "\n" not in str(info.value)


def test_option_errors():
    for bad in ({"margin": 0.0}, {"init_epochs": -1}, {"init_lr": 0.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ABOptions(**bad)


# ----------------------------------------------------------------------------- one step, training stage


def test_plain_loss_one_training_step_trains_student_and_connectors():
    student, teacher = make_pair("resnet8", "wrn_16_2", shape=SHAPE)
    before = state(teacher)
    torch.manual_seed(1)
    terms, objective, teacher = one_step("ab", student, teacher, shape=SHAPE, batch_size=4, gamma={"ab": 1.0},
                                         options={"ab": {"margin": 0.5}})
    assert set(terms) == {"ce", "ab"} and terms["ab"].item() > 0 and all(torch.isfinite(v) for v in terms.values())
    ab = objective.methods["ab"]
    assert ab.margin == 0.5 and objective.weights["ab"] == 1.0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ab.connectors.parameters())
    assert student.layer1[0].conv1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_default_weight_zero_leaves_ce_only():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    terms, objective, _ = one_step("ab", student, teacher, shape=SHAPE, batch_size=4)
    assert set(terms) == {"ce"}  # RepDistiller's main stage: loss_kd = 0 for abound


def test_training_stage_trains_body_and_connectors_only():
    student, teacher = make_pair("resnet8", "wrn_16_2", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "ab", shape=SHAPE)
    loss = ActivationBoundaries(s_probe, t_probe)
    stage = loss.training_stage(t_tap, s_tap)
    assert stage.name == INIT_STAGE == "ab_init" and stage.epochs == 30 and stage.data == "student"
    assert list(stage.modules) == ["model", "connectors"]
    assert stage.modules["model"] is student and stage.modules["connectors"] is loss.connectors
    assert stage.optim == pretrain_optim(0.05) and stage.optim["momentum"] == 0.9
    assert ActivationBoundaries(s_probe, t_probe, ABOptions(init_epochs=0)).training_stage(t_tap, s_tap) is None
    other = ActivationBoundaries(s_probe, t_probe, ABOptions(init_epochs=3, init_lr=0.01)).training_stage(t_tap, s_tap)
    assert (other.epochs, other.optim["lr"]) == (3, 0.01)

    teacher_before, student_before, conn_before = state(teacher), state(student), state(loss.connectors)
    for m in stage.modules.values():
        m.train()
    o = stage.optim
    params = [p for m in stage.modules.values() for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])
    torch.manual_seed(2)
    batch = Batch(torch.randn(4, *SHAPE), torch.zeros(4, dtype=torch.long), None)
    out = stage.step(batch, P)
    assert set(out.terms) == {"ab"} and out.terms["ab"].item() > 0
    # the stage's term is the loss itself on the student's and the teacher's pre-activation maps
    with torch.no_grad():
        expected = loss.loss(s_tap(batch.x), t_tap(batch.x))
    assert out.terms["ab"].item() == pytest.approx(expected.item(), rel=1e-5)
    opt.zero_grad()
    out.terms["ab"].backward()
    opt.step()
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    # the classifier reads no stage map: no gradient, so weight decay / momentum leave it as initialised
    assert student.fc.weight.grad is None and torch.equal(student.fc.weight, student_before["fc.weight"])
    assert not torch.equal(student.layer1[0].conv1.weight, student_before["layer1.0.conv1.weight"])
    assert all(not torch.equal(v, conn_before[k]) for k, v in loss.connectors.state_dict().items()
               if k.endswith("weight"))

    splits = SimpleNamespace(val=TensorSplit(torch.randn(6, *SHAPE), torch.zeros(6, dtype=torch.long)))
    evaluator = stage.evaluator(splits, 4)
    assert isinstance(evaluator, StageLossEvaluator) and evaluator.direction("loss") == "min"
    value = evaluator.evaluate(student)["val"]["loss"]
    assert math.isfinite(value) and value > 0
    assert student.training and loss.connectors.training  # modes restored


def test_training_stage_needs_the_student():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "ab", shape=SHAPE)
    with pytest.raises(ConfigError, match="'ab''s pre-training stage needs the student"):
        ActivationBoundaries(s_probe, t_probe).training_stage(t_tap)


# ----------------------------------------------------------------------------- through the kd recipe


def test_kd_recipe_runs_the_stage_then_ce_and_resume_loads_it(tiny, monkeypatch):
    from teachkit.engine import load_checkpoint
    from teachkit.recipes import distill

    cfg = tiny(name="ab", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 1, "progress": False}, teacher={"model": {"name": "wrn_16_2", "options": {}},
                                                                 "epochs": 1},
               kd={"method": "ab", "options": {"ab": {"init_epochs": 1}}})
    result = distill(cfg)
    stage_dir = result.run_dir / INIT_STAGE
    assert (stage_dir / "summary.json").is_file() and (result.run_dir / "summary.json").is_file()
    stage_record = json.loads((stage_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(stage_record["train"]["ab"]) and math.isfinite(stage_record["val"]["loss"])
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["train"]) == {"ce", "loss"}  # main stage: CE only, as RepDistiller
    # the connectors trained in the stage are the objective's (unused with weight 0, so unchanged since)
    stage_tensors, _ = load_checkpoint(stage_dir / "checkpoints" / "last.safetensors")
    student_tensors, _ = load_checkpoint(result.run_dir / "checkpoints" / "last.safetensors")
    prefix = "objective/methods.ab.connectors."
    copied = {k[len(prefix):]: v for k, v in student_tensors.items() if k.startswith(prefix)}
    stage_conn = {k[len("connectors/"):]: v for k, v in stage_tensors.items() if k.startswith("connectors/")}
    assert copied and copied.keys() == stage_conn.keys()
    assert all(torch.equal(copied[k], stage_conn[k]) for k in copied)
    # a resumed rerun loads the finished stage instead of training it again
    monkeypatch.setattr(ActivationBoundaries, "loss", lambda *a: pytest.fail("a finished AB stage was retrained"))
    assert distill(cfg, resume=True).run_dir == result.run_dir
