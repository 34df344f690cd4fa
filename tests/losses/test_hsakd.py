"""HSAKD (Yang et al., IJCAI 2021): rotations, joint labels, auxiliary heads, teacher-head stage, loss values."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from teachkit.data.base import TensorSplit
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.hsakd import HEADS_STAGE, HSAKD, HSAKDOptions, joint_labels, rotate4
from teachkit.models import build_model
from teachkit.types import Batch, Evaluator, Taps

from . import helpers
from .helpers import make_pair, one_step


def probe(student: nn.Module, teacher: nn.Module, shape: tuple[int, ...], n: int = 2):
    """Tapped student / frozen teacher and their probes on a dummy batch, as the kd recipe builds them."""
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "hsakd", shape, n)
    student.train()
    return s_tap, t_tap, s_probe, t_probe


def first_conv(head: nn.Module) -> nn.Conv2d:
    return next(m for m in head.modules() if isinstance(m, nn.Conv2d))


# ----------------------------------------------------------------------------- rotations and labels


def test_transform_batch_rotates_square_images_originals_first():
    loss = HSAKD.__new__(HSAKD)  # transform_batch reads no state
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    out = HSAKD.transform_batch(loss, Batch(x, torch.tensor([3]), torch.tensor([7])))
    assert out.x.shape == (4, 1, 2, 2)
    expected = [[[1, 2], [3, 4]],   # original
                [[2, 4], [1, 3]],   # rot90 (counter-clockwise)
                [[4, 3], [2, 1]],   # rot180
                [[3, 1], [4, 2]]]   # rot270
    assert torch.equal(out.x[:, 0], torch.tensor(expected, dtype=torch.float32))
    assert out.y.tolist() == [3] and out.index.tolist() == [7]

    x = torch.randn(5, 3, 6, 6)
    out = HSAKD.transform_batch(loss, Batch(x, torch.arange(5), torch.arange(5)))
    assert out.x.shape == (20, 3, 6, 6) and torch.equal(out.x[:5], x)
    assert torch.equal(out.x[5:10], torch.rot90(x, 1, (2, 3)))
    assert torch.equal(out.x[15:], torch.rot90(x, 3, (2, 3)))
    assert out.y.shape == (5,) and out.index.shape == (5,)


@pytest.mark.parametrize("shape", [(2, 3, 4, 6), (2, 3, 8)])
def test_rotation_refuses_non_square_or_non_image_inputs(shape):
    with pytest.raises(ConfigError, match="square|rotates images"):
        rotate4(torch.randn(*shape))


def test_joint_labels_are_class_times_4_plus_rotation():
    y = torch.tensor([1, 2])
    assert joint_labels(y).tolist() == [4, 8, 5, 9, 6, 10, 7, 11]
    assert joint_labels(y, 1).tolist() == [4, 8]


# ----------------------------------------------------------------------------- heads from probes


def test_heads_are_sized_from_probed_stages_resnet_pair():
    student, teacher = make_pair("resnet8", "resnet20")
    _, _, s_probe, t_probe = probe(student, teacher, (3, 32, 32))
    loss = HSAKD(s_probe, t_probe, num_classes=10, num_samples=64)
    assert len(loss.student_heads) == len(loss.teacher_heads) == 3
    for heads, stages in ((loss.student_heads, s_probe.stages), (loss.teacher_heads, t_probe.stages)):
        for head, stage in zip(heads, stages, strict=True):
            assert first_conv(head).in_channels == stage.shape[1]
            head.eval()
            assert head(stage).shape == (2, 40)  # 4 * C joint (class, rotation) logits
    # official design: the head on stage 1 rebuilds stages 2 and 3 (widths 32, 64); the last keeps 64
    convs = [m for m in loss.student_heads[0].modules() if isinstance(m, nn.Conv2d)]
    assert {c.out_channels for c in convs} == {32, 64}
    assert all(p.requires_grad for p in loss.student_heads.parameters())
    assert not any(p.requires_grad for p in loss.teacher_heads.parameters())


def test_heads_for_cross_family_pair_pair_the_deepest_stages():
    student, teacher = make_pair("lenet", "resnet20")
    _, _, s_probe, t_probe = probe(student, teacher, (3, 32, 32))
    loss = HSAKD(s_probe, t_probe, num_classes=10, num_samples=64)
    assert len(s_probe.stages) == 2 and len(t_probe.stages) == 3
    assert loss.student_stages == [0, 1] and loss.teacher_stages == [1, 2]
    assert [first_conv(h).in_channels for h in loss.student_heads] == [20, 50]
    assert [first_conv(h).in_channels for h in loss.teacher_heads] == [32, 64]
    loss.eval()
    for head, i in zip(loss.student_heads, loss.student_stages, strict=True):
        assert head(s_probe.stages[i]).shape == (2, 40)


def test_mlp_stages_get_linear_heads():
    student, teacher = make_pair("mlp", "resnet8", shape=(1, 8, 8), classes=4)
    _, _, s_probe, t_probe = probe(student, teacher, (1, 8, 8))
    loss = HSAKD(s_probe, t_probe, num_classes=4, num_samples=8)
    assert len(loss.student_heads) == 1 and isinstance(loss.student_heads[0][0], nn.Linear)
    assert loss.teacher_stages == [2]


def test_bad_options_are_config_errors():
    student, teacher = make_pair("resnet8", "resnet8", shape=(3, 8, 8), classes=4)
    _, _, s_probe, t_probe = probe(student, teacher, (3, 8, 8))
    with pytest.raises(ConfigError, match="teacher_head_data"):
        build_objective("hsakd", s_probe, t_probe, num_classes=4, num_samples=8,
                        options={"hsakd": {"teacher_head_data": "all"}})
    with pytest.raises(ConfigError, match="teacher_head_epochs"):
        HSAKD(s_probe, t_probe, HSAKDOptions(teacher_head_epochs=0), num_classes=4, num_samples=8)
    with pytest.raises(ConfigError, match=r"unknown config key 'kd.options.hsakd.T'"):
        build_objective("hsakd", s_probe, t_probe, num_classes=4, num_samples=8, options={"hsakd": {"T": 3}})
    with pytest.raises(ConfigError, match="hsakd needs the number of classes"):
        HSAKD(s_probe, t_probe, num_classes=0, num_samples=8)


# ----------------------------------------------------------------------------- one training step


def rotated_step(student, teacher, shape, classes, batch_size=4, **options):
    """One SGD step through the recipe's path: transform_batch, taps on 4B rows, objective terms."""
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, shape)
    objective = build_objective("hsakd", s_probe, t_probe, num_classes=classes, num_samples=64,
                                options={"hsakd": options})
    objective.train()
    opt = torch.optim.SGD(list(student.parameters()) + list(objective.parameters()), lr=0.01)
    batch = Batch(torch.randn(batch_size, *shape), torch.arange(batch_size) % classes, torch.arange(batch_size))
    batch = objective.transform_batch(batch)
    s_out, t_out = s_tap(batch.x), t_tap(batch.x)
    assert s_out.logits.shape[0] == 4 * batch_size
    terms = objective(s_out, t_out, batch, Progress(0, 0, 10, 10))
    opt.zero_grad()
    sum(terms.values()).backward()
    opt.step()
    return terms, objective


@pytest.mark.parametrize("pair", [("resnet8", "resnet20"), ("lenet", "resnet20")])
def test_gradients_reach_student_and_its_heads_only(pair):
    student, teacher = make_pair(*pair)
    t_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    terms, objective = rotated_step(student, teacher, (3, 32, 32), 10)
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd"}
    assert all(torch.isfinite(v) and v >= 0 for v in terms.values())
    loss = objective.methods["hsakd"]
    assert all(p.grad is not None for p in student.parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in loss.student_heads.parameters())
    assert any(p.grad.abs().sum() > 0 for p in loss.student_heads.parameters())
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is None for p in loss.teacher_heads.parameters())
    assert not loss.teacher_heads.training and loss.student_heads.training
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, t_before[k]), k


def test_aux_ce_option_adds_the_joint_label_term():
    student, teacher = make_pair("resnet8", "resnet8", shape=(3, 8, 8), classes=4)
    terms, _ = rotated_step(student, teacher, (3, 8, 8), 4, aux_ce=True)
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd", "hsakd.aux_ce"}
    # three heads (resnet8 stages), CE over 16 joint classes with near-random heads: each about ln 16
    assert 0.5 * 3 * math.log(16) < float(terms["hsakd.aux_ce"].detach()) < 2 * 3 * math.log(16)


def test_generic_one_step_without_rotation_works():
    student, teacher = make_pair("resnet8", "resnet20")
    terms, objective, _ = one_step("hsakd", student, teacher)
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd"}
    assert all(torch.isfinite(v) for v in terms.values())
    assert LOSSES.get("hsakd").replaces_ce and "ce" not in terms


# ----------------------------------------------------------------------------- loss values by hand


def test_aux_kd_matches_a_hand_computed_kl():
    """Identity heads on (4,)-wide stage maps: aux_kd = T^2 * mean_rows KL(p_t^T || p_s^T)."""
    t = 3.0
    zs = torch.tensor([[3 * math.log(3), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    zt = torch.zeros(2, 4)
    logits_s, logits_t = torch.tensor([[0.5], [0.0]]), torch.tensor([[0.1], [0.2]])
    loss = HSAKD(Taps(logits_s, stages=[zs]), Taps(logits_t, stages=[zt]), HSAKDOptions(temperature=t),
                 num_classes=1, num_samples=2)
    loss.student_heads = nn.ModuleList([nn.Identity()])
    loss.teacher_heads = nn.ModuleList([nn.Identity()])
    batch = Batch(torch.zeros(2, 1), torch.tensor([0, 0]), torch.tensor([0, 1]))
    terms = loss(Taps(logits_s, stages=[zs]), Taps(logits_t, stages=[zt]), batch, Progress(0, 0, 1, 1))
    # row 1: p_s^T = softmax([ln 3, 0, 0, 0]) = (1/2, 1/6, 1/6, 1/6), p_t^T uniform 1/4
    #   KL = 1/4 * (ln((1/4)/(1/2)) + 3 ln((1/4)/(1/6))) = (3 ln 1.5 - ln 2) / 4;  row 2: KL = 0
    expected = t**2 * ((3 * math.log(1.5) - math.log(2)) / 4 + 0.0) / 2
    assert float(terms["aux_kd"]) == pytest.approx(expected, rel=1e-5)
    assert float(terms["aux_kd"]) == pytest.approx(0.588654, abs=1e-5)
    assert float(terms["ce"]) == pytest.approx(0.0, abs=1e-7)  # one class
    assert float(terms["kd"]) == pytest.approx(0.0, abs=1e-7)


# ----------------------------------------------------------------------------- teacher-head stage


def stage_setup(epochs=10, **options):
    torch.manual_seed(0)
    teacher = build_model("resnet8", (3, 8, 8), 4)
    student = build_model("resnet8", (3, 8, 8), 4)
    _, t_tap, s_probe, t_probe = probe(student, teacher, (3, 8, 8))
    loss = HSAKD(s_probe, t_probe, HSAKDOptions(teacher_head_epochs=epochs, **options), num_classes=4, num_samples=64)
    return loss, student, teacher, t_tap


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}  # weights and BN buffers


def test_training_stage_describes_the_official_frozen_backbone_run():
    loss, _, _, t_tap = stage_setup()
    assert not any(p.requires_grad for p in loss.teacher_heads.parameters())
    stage = loss.training_stage(t_tap)
    assert stage.name == HEADS_STAGE == "hsakd_teacher_heads"
    assert list(stage.modules) == ["model"] and stage.modules["model"] is loss.teacher_heads
    assert all(p.requires_grad for p in loss.teacher_heads.parameters())  # unfrozen for the stage
    assert stage.epochs == 10 and stage.batch_size is None and stage.data == "full"
    assert stage.optim == {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
                           "schedule": "multistep", "milestones": [3, 6, 9], "gamma": 0.1, "warmup_epochs": 0.0}
    # the lr per epoch: x0.1 at 30 % of the epochs, as the official schedule (100 epochs, 30/60/90)
    lrs = [stage.optim["lr"] * 0.1 ** sum(e >= m for m in stage.optim["milestones"]) for e in range(10)]
    assert lrs[2:4] == pytest.approx([0.05, 0.005])
    other, _, _, t_tap = stage_setup(epochs=20, teacher_head_batch_size=16, teacher_head_data="student",
                                     teacher_head_lr=0.1, teacher_head_weight_decay=0.0)
    stage = other.training_stage(t_tap)
    assert (stage.epochs, stage.batch_size, stage.data) == (20, 16, "student")
    assert (stage.optim["lr"], stage.optim["weight_decay"], stage.optim["milestones"]) == (0.1, 0.0, [6, 12, 18])


def test_training_stage_step_trains_the_heads_only():
    loss, student, teacher, t_tap = stage_setup()
    stage = loss.training_stage(t_tap)
    backbone, student_before = state(teacher), state(student)
    heads_before, student_heads_before = state(loss.teacher_heads), state(loss.student_heads)
    model = stage.modules["model"]
    model.train()
    o = stage.optim
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=o["lr"], momentum=o["momentum"],
                          nesterov=o["nesterov"], weight_decay=o["weight_decay"])
    torch.manual_seed(1)
    batch = Batch(torch.randn(16, 3, 8, 8), torch.arange(16) % 4, torch.arange(16))
    history = []
    for step in range(12):
        out = stage.step(batch, Progress(0, step, 10, 12))
        assert set(out.terms) == {"ce"} and set(out.metrics) == {"joint_acc"}
        acc = out.metrics["joint_acc"]
        assert acc.dim() == 0 and 0 <= acc.item() <= 100 * batch.size  # a sum over the 16 originals
        opt.zero_grad()
        out.terms["ce"].backward()
        opt.step()
        history.append((out.terms["ce"].item(), acc.item() / batch.size))
    assert history[-1][0] < history[0][0]
    assert history[-1][1] > 100 / 16  # joint accuracy (%) above chance over 16 joint classes
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, backbone[k]), k
    for k, v in student.state_dict().items():
        assert torch.equal(v, student_before[k]), k
    for k, v in loss.student_heads.state_dict().items():
        assert torch.equal(v, student_heads_before[k]), k
    assert any(not torch.equal(v, heads_before[k]) for k, v in loss.teacher_heads.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is None for p in student.parameters())


def test_training_stage_joint_acc_metric_by_hand():
    loss, _, _, t_tap = stage_setup()
    stage = loss.training_stage(t_tap)
    model = stage.modules["model"].eval()  # eval: the same logits for the step and the check
    torch.manual_seed(2)
    batch = Batch(torch.randn(6, 3, 8, 8), torch.arange(6) % 4, torch.arange(6))
    out = stage.step(batch, Progress(0, 0, 1, 1))
    labels = joint_labels(batch.y)
    with torch.no_grad():
        maps = t_tap(rotate4(batch.x)).stages
        logits = [head(maps[i]) for head, i in zip(model, loss.teacher_stages, strict=True)]
    correct = sum(float((z.argmax(1) == labels).sum()) for z in logits) / len(logits)  # rows, mean over heads
    assert out.metrics["joint_acc"].item() == pytest.approx(100 * correct / 4, abs=1e-4)
    ce = sum(F.cross_entropy(z, labels) for z in logits)
    assert out.terms["ce"].item() == pytest.approx(ce.item(), rel=1e-6)


def test_training_stage_evaluator_and_finish():
    loss, _, _, t_tap = stage_setup()
    stage = loss.training_stage(t_tap)
    torch.manual_seed(3)
    splits = SimpleNamespace(val=TensorSplit(torch.randn(10, 3, 8, 8), torch.arange(10) % 4))
    evaluator = stage.evaluator(splits, 1000)
    assert isinstance(evaluator, Evaluator) and evaluator.primary == "joint_acc"
    assert evaluator.direction("joint_acc") == "max" and set(evaluator.metric_names()) == {"joint_acc", "loss"}
    model = stage.modules["model"]
    model.train()
    result = evaluator.evaluate(model)
    assert set(result) == {"val"} and set(result["val"]) == {"joint_acc", "loss"}
    acc, ce = result["val"]["joint_acc"], result["val"]["loss"]
    assert 0 <= acc <= 100 and math.isfinite(ce) and ce > 0
    assert all(m.training for m in model.modules())  # train/eval flags restored
    # eval mode, no grad, by hand on all 40 rotated rows at once; batches of 3 give the same numbers
    model.eval()
    labels = joint_labels(splits.val.y)
    with torch.no_grad():
        maps = t_tap(rotate4(splits.val.x)).stages
        logits = [head(maps[i]) for head, i in zip(model, loss.teacher_stages, strict=True)]
    assert acc == pytest.approx(100 * sum(float((z.argmax(1) == labels).float().mean()) for z in logits)
                                / len(logits), abs=1e-4)
    assert ce == pytest.approx(sum(float(F.cross_entropy(z, labels)) for z in logits), rel=1e-5)
    evaluator.batch_size = 3
    again = evaluator.evaluate(model)["val"]
    assert again["joint_acc"] == pytest.approx(acc, abs=1e-4) and again["loss"] == pytest.approx(ce, rel=1e-5)
    assert not any(m.training for m in model.modules())
    # finish: the heads are frozen again, and stay in eval mode when the objective trains
    model.train()
    stage.finish()
    assert not any(p.requires_grad for p in loss.teacher_heads.parameters())
    assert not loss.teacher_heads.training
    loss.train()
    assert not loss.teacher_heads.training and loss.student_heads.training


def test_distill_recipe_end_to_end(tiny):
    from teachkit.recipes import distill

    cfg = tiny(name="hsakd", kd={"method": "hsakd", "options": {"hsakd": {"teacher_head_epochs": 2}}},
               train={"epochs": 1, "progress": False}, teacher={"epochs": 1})
    result = distill(cfg)
    assert (result.run_dir / HEADS_STAGE).is_dir()
    terms = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd", "loss"}
    assert all(math.isfinite(v) for v in terms.values())


def test_teacher_heads_use_the_full_split_unless_asked_for_the_students(tiny, monkeypatch):
    """The recipe feeds the stage the teacher's full training split (216 = 240 - 10 % val) unless
    ``teacher_head_data="student"`` asks for the student's transfer set (``data.train_subset`` = 60)."""
    from teachkit.recipes import distill

    seen: dict[str, int] = {}
    make_stage = HSAKD.training_stage

    def counting(self, teacher, student=None):
        stage = make_stage(self, teacher, student)

        def step(batch, progress):
            if progress.epoch == 0:
                seen[stage.data] = seen.get(stage.data, 0) + batch.size
            return stage.step(batch, progress)

        return dataclasses.replace(stage, step=step)

    monkeypatch.setattr(HSAKD, "training_stage", counting)
    for data in ("full", "student"):
        cfg = tiny(name=f"hsakd-{data}", data={"train_subset": 60}, train={"epochs": 1, "progress": False},
                   teacher={"epochs": 1},
                   kd={"method": "hsakd", "options": {"hsakd": {"teacher_head_epochs": 1, "teacher_head_data": data}}})
        result = distill(cfg)
        assert (result.run_dir / HEADS_STAGE).is_dir()
    assert seen == {"full": 216, "student": 60}
