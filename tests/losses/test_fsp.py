"""FSP (Yim et al. CVPR 2017): flow matrices, loss, pre-training stage, recipe run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from teachkit.data.base import TensorSplit
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress
from teachkit.losses.fsp import FSP, INIT_STAGE, FSPOptions, fsp_matrix, fsp_terms
from teachkit.losses.stage_eval import StageLossEvaluator, pretrain_optim
from teachkit.models import Tapped, TapSpec
from teachkit.types import Batch, Taps

from . import helpers
from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)
IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 64, "n_test": 32}


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)


# ----------------------------------------------------------------------------- reference transcription
# THE REFERENCE'S CODE, transcribed from RepDistiller (HobbitLong/RepDistiller) distiller_zoo/FSP.py (FSP: the
# channel check of __init__, forward, compute_fsp, compute_loss). Written inline here only as a cross-check of
# teachkit's implementation.


def _reference_fsp(g_s, g_t):
    s_c, t_c = [s.shape[1] for s in g_s], [t.shape[1] for t in g_t]
    if np.any(np.asarray(s_c) != np.asarray(t_c)):
        raise ValueError("num of channels not equal (error in FSP)")

    def compute_fsp(g):
        fsp_list = []
        for i in range(len(g) - 1):
            bot, top = g[i], g[i + 1]
            b_H, t_H = bot.shape[2], top.shape[2]
            if b_H > t_H:
                bot = F.adaptive_avg_pool2d(bot, (t_H, t_H))
            elif b_H < t_H:
                top = F.adaptive_avg_pool2d(top, (b_H, b_H))
            bot = bot.unsqueeze(1)
            top = top.unsqueeze(2)
            bot = bot.view(bot.shape[0], bot.shape[1], bot.shape[2], -1)
            top = top.view(top.shape[0], top.shape[1], top.shape[2], -1)
            fsp_list.append((bot * top).mean(-1))
        return fsp_list

    return [(s - t).pow(2).mean() for s, t in zip(compute_fsp(g_s), compute_fsp(g_t), strict=False)]


# ----------------------------------------------------------------------------- helpers


def taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 3, dtype=maps[0].dtype), stages=list(maps))


def batch_of(n):
    return Batch(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), None)


def state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


# ----------------------------------------------------------------------------- the loss


def test_flow_matrix_by_hand():
    # bottom: 1 channel [[1, 2], [3, 4]]; top: 2 channels, ones and [[1, 0], [0, 1]]. G = mean over the 4 positions
    # of top[j] * bottom[0]: [(1+2+3+4)/4, (1+4)/4] = [2.5, 1.25] as a (C_top=2, C_bottom=1) matrix.
    bottom = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=torch.float64)
    top = torch.stack([torch.ones(2, 2), torch.eye(2)]).unsqueeze(0).double()
    g = fsp_matrix(bottom, top)
    assert g.shape == (1, 2, 1) and g.flatten().tolist() == pytest.approx([2.5, 1.25])
    # a 4x4 bottom is average-pooled to 2x2 first: a constant 4x4 map of 3 gives G = [3, 1.5]
    assert fsp_matrix(torch.full((1, 1, 4, 4), 3.0), top.float()).flatten().tolist() == pytest.approx([3.0, 1.5])
    # and so is a larger top: [[1, 2], [3, 4]] upsampled to 4x4 (each value a 2x2 block) pools back to itself
    top4 = top.repeat_interleave(2, 2).repeat_interleave(2, 3)
    assert fsp_matrix(bottom, top4).flatten().tolist() == pytest.approx([2.5, 1.25])
    # loss: student G [2.5, 1.25] vs teacher G [3, 1.5] -> mean of (0.5^2, 0.25^2) = (0.25 + 0.0625) / 2 = 0.15625
    terms = fsp_terms([bottom, top], [torch.full((1, 1, 2, 2), 3.0, dtype=torch.float64), top])
    assert len(terms) == 1 and terms[0].item() == pytest.approx(0.15625)


def test_term_sums_the_pairs_by_hand():
    # three 1-channel 1x1 maps: G of a pair is the product of its two values. Student 1, 2, 3 -> G = 2, 6;
    # teacher 1, 1, 1 -> G = 1, 1; term = (2 - 1)^2 + (6 - 1)^2 = 1 + 25 = 26
    s = [torch.full((1, 1, 1, 1), v) for v in (1.0, 2.0, 3.0)]
    t = [torch.ones(1, 1, 1, 1) for _ in range(3)]
    assert FSP(taps(*s), taps(*t))(taps(*s), taps(*t), batch_of(1), P)["fsp"].item() == pytest.approx(26.0)


@pytest.mark.parametrize("sizes", [((8, 4, 2), (8, 8, 4)), ((4, 4, 4), (4, 2, 2)), ((2, 4, 8), (8, 4, 2))])
def test_matches_repdistiller_values_and_gradients(sizes):
    """``sum(FSP(...)(g_s, g_t))`` in float64: values and gradients w.r.t. the student maps."""
    g = torch.Generator().manual_seed(0)
    channels = (4, 6, 8)
    x = [torch.randn(4, c, h, h, dtype=torch.float64, generator=g, requires_grad=True)
         for c, h in zip(channels, sizes[0], strict=True)]
    g_s = [torch.relu(v * 1.5) for v in x]
    g_t = [torch.relu(torch.randn(4, c, h, h, dtype=torch.float64, generator=g))
           for c, h in zip(channels, sizes[1], strict=True)]
    loss = FSP(taps(*g_s), taps(*g_t))
    ours = loss(taps(*g_s), taps(*g_t), batch_of(4), P)["fsp"]
    ref = sum(_reference_fsp(g_s, g_t))
    assert ours.dtype == torch.float64
    close(ours, ref)
    ours_grads = torch.autograd.grad(ours, x, retain_graph=True)  # the ReLUs are shared with ref
    close(ours_grads, torch.autograd.grad(ref, x))
    assert all(gr.abs().sum() > 0 for gr in ours_grads)


def test_loss_detaches_the_teacher():
    s = [torch.rand(2, 4, 4, 4, requires_grad=True), torch.rand(2, 4, 2, 2, requires_grad=True)]
    t = [torch.rand(2, 4, 4, 4, requires_grad=True), torch.rand(2, 4, 2, 2, requires_grad=True)]
    out = FSP(taps(*s), taps(*t))(taps(*s), taps(*t), batch_of(2), P)["fsp"]
    out.backward()
    assert out.item() > 0 and s[0].grad.abs().sum() > 0 and t[0].grad is None and t[1].grad is None


def test_stage_pairs_on_zoo_models():
    # teachkit's stages exclude the stem: a CIFAR ResNet gives (stage 1, stage 2) and (stage 2, stage 3)
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    _, _, s_probe, t_probe = helpers.probe(student, teacher, "fsp", shape=SHAPE)
    assert len(s_probe.stages) == len(t_probe.stages) == 3
    out = FSP(s_probe, t_probe)(s_probe, t_probe, batch_of(2), P)["fsp"]
    expected = sum(fsp_terms(s_probe.stages, t_probe.stages))
    assert out.item() == pytest.approx(expected.item()) and len(fsp_terms(s_probe.stages, t_probe.stages)) == 2


def _repdistiller_feats(model, x):
    """RepDistiller ResNet ``forward(is_feat=True)``'s ``feat[:-1]``: the stem's ReLU output, then each stage's."""
    f = model.relu(model.bn1(model.conv1(x)))
    feats = [f]
    for name in model.stage_names:
        f = getattr(model, name)(f)
        feats.append(f)
    return feats


def test_stem_in_the_taps_gives_repdistillers_three_pairs():
    # naming the stem in both tap specs (model.taps / teacher.model.taps) reproduces feat[:-1] exactly
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    student, teacher = student.double().eval(), teacher.double().eval()
    spec = TapSpec.from_dict({"stages": ["relu", "layer1", "layer2", "layer3"]})
    s_tap, t_tap = Tapped(student, spec, want=("stages",)), Tapped(teacher, spec, want=("stages",))
    x = torch.randn(4, *SHAPE, dtype=torch.float64, requires_grad=True)
    s_taps, t_taps = s_tap(x), t_tap(x)
    assert len(s_taps.stages) == len(t_taps.stages) == 4
    loss = FSP(s_taps, t_taps)
    ours = loss(s_taps, t_taps, batch_of(4), P)["fsp"]
    with torch.no_grad():
        g_t = _repdistiller_feats(teacher, x)
    ref_groups = _reference_fsp(_repdistiller_feats(student, x), g_t)
    assert len(ref_groups) == 3
    ref = sum(ref_groups)
    close(ours, ref)
    close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0])


def test_registered_defaults():
    assert LOSSES.get("fsp") is FSP and FSP.default_weight == 0.0
    o = FSPOptions()
    assert (o.init_epochs, o.init_lr) == (30, 0.05)
    for bad in ({"init_epochs": -1}, {"init_lr": 0.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            FSPOptions(**bad)


# ----------------------------------------------------------------------------- bad inputs

BAD = [
    ("missing student stages", Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 4, 2, 2)),
     "'fsp' needs the student's 'stages' tap"),
    ("missing teacher stages", taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 4, 2, 2)), Taps(torch.zeros(2, 3)),
     "'fsp' needs the teacher's 'stages' tap"),
    ("one stage", taps(torch.zeros(2, 4, 2, 2)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 4, 2, 2)),
     "needs at least 2 stage maps on each side; the probed models pair 1"),
    ("channel mismatch", taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 8, 2, 2)),
     taps(torch.zeros(2, 2, 4, 4), torch.zeros(2, 4, 2, 2), torch.zeros(2, 6, 2, 2)),
     "equal channel counts: student stage 1 / teacher stage 2 have 8 and 6 channels"),
    ("flat maps", taps(torch.zeros(2, 4), torch.zeros(2, 4)), taps(torch.zeros(2, 4), torch.zeros(2, 4)),
     r"spatial stage maps .* student stage 0 / teacher stage 0 have shapes \(2, 4\) and \(2, 4\)"),
]


@pytest.mark.parametrize(("case", "student", "teacher", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_models_are_one_line_config_errors(case, student, teacher, match):
    with pytest.raises(ConfigError, match=match) as info:
        FSP(student, teacher)
    assert "\n" not in str(info.value)


def test_zoo_pair_of_different_widths_is_refused():
    student, teacher = make_pair("resnet8", "wrn_16_2", shape=SHAPE)
    _, _, s_probe, t_probe = helpers.probe(student, teacher, "fsp", shape=SHAPE)
    with pytest.raises(ConfigError, match="student stage 0 / teacher stage 0 have 16 and 32 channels"):
        FSP(s_probe, t_probe)


# ----------------------------------------------------------------------------- one step, training stage


def test_plain_loss_one_training_step():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    before = state(teacher)
    torch.manual_seed(1)
    terms, objective, teacher = one_step("fsp", student, teacher, shape=SHAPE, batch_size=4, gamma={"fsp": 1.0})
    assert set(terms) == {"ce", "fsp"} and terms["fsp"].item() > 0 and objective.weights["fsp"] == 1.0
    assert student.layer1[0].conv1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_default_weight_zero_leaves_ce_only():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    terms, _, _ = one_step("fsp", student, teacher, shape=SHAPE, batch_size=4)
    assert set(terms) == {"ce"}  # RepDistiller's main stage: loss_kd = 0 for fsp


def test_training_stage_trains_the_student_body_only():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "fsp", shape=SHAPE)
    loss = FSP(s_probe, t_probe)
    stage = loss.training_stage(t_tap, s_tap)
    assert stage.name == INIT_STAGE == "fsp_init" and stage.epochs == 30 and stage.data == "student"
    assert stage.modules == {"model": student} and stage.optim == pretrain_optim(0.05)
    assert stage.optim["schedule"] == "constant" and stage.optim["weight_decay"] == 5e-4
    assert FSP(s_probe, t_probe, FSPOptions(init_epochs=0)).training_stage(t_tap, s_tap) is None
    other = FSP(s_probe, t_probe, FSPOptions(init_epochs=2, init_lr=0.01)).training_stage(t_tap, s_tap)
    assert (other.epochs, other.optim["lr"]) == (2, 0.01)
    with pytest.raises(ConfigError, match="'fsp''s pre-training stage needs the student"):
        loss.training_stage(t_tap)

    teacher_before, student_before = state(teacher), state(student)
    student.train()
    o = stage.optim
    opt = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=o["lr"], momentum=o["momentum"],
                          weight_decay=o["weight_decay"])
    torch.manual_seed(2)
    batch = Batch(torch.randn(4, *SHAPE), torch.zeros(4, dtype=torch.long), None)
    out = stage.step(batch, P)
    assert set(out.terms) == {"fsp"} and out.terms["fsp"].item() > 0
    with torch.no_grad():
        expected = loss.loss(s_tap(batch.x), t_tap(batch.x))
    assert out.terms["fsp"].item() == pytest.approx(expected.item(), rel=1e-5)
    opt.zero_grad()
    out.terms["fsp"].backward()
    opt.step()
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    # the classifier reads no stage map: no gradient, so weight decay / momentum leave it as initialised
    assert student.fc.weight.grad is None and torch.equal(student.fc.weight, student_before["fc.weight"])
    assert torch.equal(student.fc.bias, student_before["fc.bias"])
    assert not torch.equal(student.layer1[0].conv1.weight, student_before["layer1.0.conv1.weight"])

    splits = SimpleNamespace(val=TensorSplit(torch.randn(6, *SHAPE), torch.zeros(6, dtype=torch.long)))
    evaluator = stage.evaluator(splits, 4)
    assert isinstance(evaluator, StageLossEvaluator) and evaluator.direction("loss") == "min"
    value = evaluator.evaluate(student)["val"]["loss"]
    assert math.isfinite(value) and value > 0 and student.training


# ----------------------------------------------------------------------------- through the kd recipe


def test_kd_recipe_runs_the_stage_then_ce_and_resume_loads_it(tiny, monkeypatch):
    from teachkit.engine import load_checkpoint
    from teachkit.recipes import distill

    cfg = tiny(name="fsp", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 1, "progress": False}, teacher={"model": {"name": "resnet14", "options": {}},
                                                                 "epochs": 1},
               kd={"method": "fsp", "options": {"fsp": {"init_epochs": 2}}})
    result = distill(cfg)
    stage_dir = result.run_dir / INIT_STAGE
    assert (stage_dir / "summary.json").is_file() and (result.run_dir / "summary.json").is_file()
    stage_lines = [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(stage_lines) == 2 and all(math.isfinite(r["train"]["fsp"]) for r in stage_lines)
    assert all(math.isfinite(r["val"]["loss"]) for r in stage_lines)
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["train"]) == {"ce", "loss"}  # main stage: CE only, as RepDistiller
    # the stage checkpoint holds the whole student; the main training then went on from it (CE moves the classifier,
    # which the stage left as initialised: test_training_stage_trains_the_student_body_only)
    stage_tensors, _ = load_checkpoint(stage_dir / "checkpoints" / "last.safetensors")
    student_tensors, _ = load_checkpoint(result.run_dir / "checkpoints" / "last.safetensors")
    assert {k for k in stage_tensors if k.startswith("model/")} == \
        {k for k in student_tensors if k.startswith("model/")}
    assert not torch.equal(stage_tensors["model/fc.weight"], student_tensors["model/fc.weight"])
    # a resumed rerun loads the finished stage instead of training it again
    monkeypatch.setattr(FSP, "loss", lambda *a: pytest.fail("a finished FSP stage was retrained"))
    assert distill(cfg, resume=True).run_dir == result.run_dir
