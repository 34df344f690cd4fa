import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.fsp import FSP, INIT_STAGE, FSPOptions, fsp_matrix, fsp_terms
from teachkit.losses.stage_eval import pretrain_optim
from teachkit.types import Batch, Taps

from . import helpers
from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)
IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 64, "n_test": 32}


def _reference_fsp(g_s, g_t):
    """TRANSCRIPTION of RepDistiller distiller_zoo/FSP.py (``FSP.forward``: compute_fsp, compute_loss),
    cross-check only."""
    s_c, t_c = [s.shape[1] for s in g_s], [t.shape[1] for t in g_t]
    if np.any(np.asarray(s_c) != np.asarray(t_c)):
        raise ValueError("num of channels not equal (error in FSP)")

    def compute_fsp(g):
        out = []
        for i in range(len(g) - 1):
            bot, top = g[i], g[i + 1]
            b_h, t_h = bot.shape[2], top.shape[2]
            if b_h > t_h:
                bot = F.adaptive_avg_pool2d(bot, (t_h, t_h))
            elif b_h < t_h:
                top = F.adaptive_avg_pool2d(top, (b_h, b_h))
            bot = bot.unsqueeze(1)
            top = top.unsqueeze(2)
            bot = bot.view(bot.shape[0], bot.shape[1], bot.shape[2], -1)
            top = top.view(top.shape[0], top.shape[1], top.shape[2], -1)
            out.append((bot * top).mean(-1))
        return out

    return [(s - t).pow(2).mean() for s, t in zip(compute_fsp(g_s), compute_fsp(g_t), strict=False)]


def taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 3, dtype=maps[0].dtype), stages=list(maps))


def test_flow_matrix_by_hand():
    # bottom: 1 channel [[1, 2], [3, 4]]; top: 2 channels, ones and [[1, 0], [0, 1]]. G = mean over the 4 positions:
    # [(1+2+3+4)/4, (1+4)/4] = [2.5, 1.25] as a (C_top=2, C_bottom=1) matrix.
    bottom = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=torch.float64)
    top = torch.stack([torch.ones(2, 2), torch.eye(2)]).unsqueeze(0).double()
    g = fsp_matrix(bottom, top)
    assert g.shape == (1, 2, 1) and g.flatten().tolist() == pytest.approx([2.5, 1.25])
    # the 4x4 bottom pools to 2x2 first: a constant 4x4 map of 3 gives G = [3, 1.5]
    assert fsp_matrix(torch.full((1, 1, 4, 4), 3.0), top.float()).flatten().tolist() == pytest.approx([3.0, 1.5])
    # loss: student G [2.5, 1.25] vs teacher G [3, 1.5] -> mean of (0.25, 0.0625) = 0.15625
    terms = fsp_terms([bottom, top], [torch.full((1, 1, 2, 2), 3.0, dtype=torch.float64), top])
    assert terms[0].item() == pytest.approx(0.15625)


def test_matches_repdistiller_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(4, c, h, h, dtype=torch.float64, generator=g, requires_grad=True) for c, h in ((4, 8), (6, 4),
                                                                                                     (8, 2))]
    g_s = [torch.relu(v * 1.5) for v in x]
    g_t = [torch.relu(torch.randn(4, c, h, h, dtype=torch.float64, generator=g)) for c, h in ((4, 8), (6, 8),
                                                                                             (8, 4))]
    ours, ref = sum(fsp_terms(g_s, g_t)), sum(_reference_fsp(g_s, g_t))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(ours, x, retain_graph=True), torch.autograd.grad(ref, x),
                               rtol=1e-8, atol=1e-14)


def test_loss_detaches_the_teacher():
    s = [torch.rand(2, 4, 4, 4, requires_grad=True), torch.rand(2, 4, 2, 2, requires_grad=True)]
    t = [torch.rand(2, 4, 4, 4, requires_grad=True), torch.rand(2, 4, 2, 2, requires_grad=True)]
    loss = FSP(taps(*s), taps(*t))
    out = loss(taps(*s), taps(*t), Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), None), P)["fsp"]
    out.backward()
    assert out.item() > 0 and s[0].grad.abs().sum() > 0 and t[0].grad is None


def test_plain_loss_one_training_step():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    terms, objective, _ = one_step("fsp", student, teacher, shape=SHAPE, batch_size=4, gamma={"fsp": 1.0})
    assert set(terms) == {"ce", "fsp"} and terms["fsp"].item() > 0
    assert FSP.default_weight == 0.0  # the reference's main stage is CE only


@pytest.mark.parametrize(("student", "teacher", "match"), [
    (Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 4, 2, 2)), "'fsp' needs the student's"),
    (taps(torch.zeros(2, 4, 2, 2)), taps(torch.zeros(2, 4, 2, 2)), "needs at least 2 stage maps"),
    (taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 8, 2, 2)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 6, 2, 2)),
     "student stage 1 has 8, the paired teacher stage 6"),
    (taps(torch.zeros(2, 4), torch.zeros(2, 4)), taps(torch.zeros(2, 4), torch.zeros(2, 4)), "spatial stage maps"),
])
def test_bad_models_are_one_line_config_errors(student, teacher, match):
    with pytest.raises(ConfigError, match=match) as info:
        FSP(student, teacher)
    assert "\n" not in str(info.value)


def test_training_stage_trains_the_student_body_only():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "fsp", shape=SHAPE)
    loss = FSP(s_probe, t_probe)
    stage = loss.training_stage(t_tap, s_tap)
    assert stage.name == INIT_STAGE and stage.epochs == 30 and stage.data == "student"
    assert stage.modules == {"model": student} and stage.optim == pretrain_optim(0.05)
    assert FSP(s_probe, t_probe, FSPOptions(init_epochs=0)).training_stage(t_tap, s_tap) is None
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    classifier_before = student.fc.weight.clone()
    x = torch.randn(4, *SHAPE)
    out = stage.step(Batch(x, torch.zeros(4, dtype=torch.long), None), P)
    out.terms["fsp"].backward()
    assert student.layer1[0].conv1.weight.grad.abs().sum() > 0 and student.fc.weight.grad is None
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    assert torch.equal(student.fc.weight, classifier_before)

    class Val:
        x = torch.randn(6, *SHAPE)

    metrics = stage.evaluator(type("S", (), {"val": Val})(), 4).evaluate(student)
    assert math.isfinite(metrics["val"]["loss"]) and metrics["val"]["loss"] > 0


def test_kd_recipe_runs_the_stage_then_ce_and_resume_loads_it(tiny, monkeypatch):
    from teachkit.recipes import distill

    cfg = tiny(name="fsp", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 1, "progress": False}, teacher={"model": {"name": "resnet8", "options": {}},
                                                                 "epochs": 1},
               kd={"method": "fsp", "options": {"fsp": {"init_epochs": 2}}})
    result = distill(cfg)
    stage_dir = result.run_dir / INIT_STAGE
    assert (stage_dir / "summary.json").is_file()
    stage_lines = [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(stage_lines) == 2 and all(math.isfinite(r["train"]["fsp"]) for r in stage_lines)
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["train"]) == {"ce", "loss"}  # main stage: CE only, as RepDistiller
    monkeypatch.setattr(FSP, "loss", lambda *a: pytest.fail("a finished FSP stage was retrained"))
    again = distill(cfg, resume=True)
    assert again.run_dir == result.run_dir
