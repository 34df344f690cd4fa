"""HSAKD (Yang et al., IJCAI 2021): rotations, joint labels, auxiliary heads, teacher-head step, loss values."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.data.base import Batch
from teachkit.errors import CheckpointError, ConfigError
from teachkit.losses import LOSSES, Progress, build_distiller
from teachkit.losses.hsakd import HEADS_FILE, HSAKD, joint_labels, rotate4
from teachkit.models import Tapped, build_model
from teachkit.models.taps import Taps
from teachkit.recipes.common import FrozenTeacher

from .helpers import make_pair, one_step

NEEDS = ("logits", "stages")


def probe(student: nn.Module, teacher: nn.Module, shape: tuple[int, ...], n: int = 2):
    """Tapped student / frozen teacher and their probes on a dummy batch, as the kd recipe builds them."""
    s_tap, t_tap = Tapped(student, want=NEEDS), Tapped(FrozenTeacher(teacher), want=NEEDS)
    x = torch.randn(n, *shape)
    with torch.no_grad():
        student.eval()
        s_probe, t_probe = s_tap(x), t_tap(x)
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
        build_distiller("hsakd", s_probe, t_probe, num_classes=4, num_samples=8,
                        options={"hsakd": {"teacher_head_data": "all"}})
    with pytest.raises(ConfigError, match="teacher_head_epochs"):
        HSAKD(s_probe, t_probe, num_classes=4, num_samples=8, teacher_head_epochs=0)
    with pytest.raises(ConfigError, match="not an option"):
        build_distiller("hsakd", s_probe, t_probe, num_classes=4, num_samples=8, options={"hsakd": {"T": 3}})


# ----------------------------------------------------------------------------- one training step


def rotated_step(student, teacher, shape, classes, batch_size=4, **options):
    """One SGD step through the recipe's path: transform_batch, taps on 4B rows, Distiller terms."""
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, shape)
    distiller = build_distiller("hsakd", s_probe, t_probe, num_classes=classes, num_samples=64,
                                  options={"hsakd": options})
    distiller.train()
    opt = torch.optim.SGD(list(student.parameters()) + list(distiller.parameters()), lr=0.01)
    batch = Batch(torch.randn(batch_size, *shape), torch.arange(batch_size) % classes, torch.arange(batch_size))
    batch = distiller.transform_batch(batch)
    s_out, t_out = s_tap(batch.x), t_tap(batch.x)
    assert s_out.logits.shape[0] == 4 * batch_size
    terms = distiller(s_out, t_out, batch, Progress(0, 0, 10, 10))
    opt.zero_grad()
    sum(terms.values()).backward()
    opt.step()
    return terms, distiller


@pytest.mark.parametrize("pair", [("resnet8", "resnet20"), ("lenet", "resnet20")])
def test_gradients_reach_student_and_its_heads_only(pair):
    student, teacher = make_pair(*pair)
    t_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    terms, distiller = rotated_step(student, teacher, (3, 32, 32), 10)
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd"}
    assert all(torch.isfinite(v) and v >= 0 for v in terms.values())
    loss = distiller.methods["hsakd"]
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
    terms, distiller, _ = one_step("hsakd", student, teacher)
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
    loss = HSAKD(Taps(logits_s, stages=[zs]), Taps(logits_t, stages=[zt]), num_classes=1, num_samples=2,
                 temperature=t)
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


# ----------------------------------------------------------------------------- teacher heads


def head_setup(tmp_path, epochs=10, **options):
    splits = load_splits("synthetic", options={"shape": [3, 8, 8], "num_classes": 4, "n_train": 64,
                                               "n_test": 16})
    torch.manual_seed(0)
    teacher = build_model("resnet8", (3, 8, 8), 4)
    student = build_model("resnet8", (3, 8, 8), 4)
    _, t_tap, s_probe, t_probe = probe(student, teacher, (3, 8, 8))
    loss = HSAKD(s_probe, t_probe, num_classes=4, num_samples=len(splits.train), teacher_head_epochs=epochs,
                 **options)
    cfg = from_dict({"data": {"name": "synthetic", "batch_size": 16, "augment": "none"},
                     "train": {"progress": False}})
    return loss, teacher, t_tap, splits, cfg


def test_prepare_teacher_trains_heads_keeps_backbone_and_resumes(tmp_path, monkeypatch):
    loss, teacher, t_tap, splits, cfg = head_setup(tmp_path)
    backbone = {k: v.clone() for k, v in teacher.state_dict().items()}  # weights and BN buffers
    heads_before = {k: v.clone() for k, v in loss.teacher_heads.state_dict().items()}
    loss.prepare_teacher(t_tap, splits, cfg, tmp_path)
    history = loss.teacher_head_history
    assert len(history) == 10 and not loss.teacher_heads_loaded
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["joint_acc"] > 1 / 16
    assert [h["lr"] for h in history][2:4] == pytest.approx([0.05, 0.005])  # x0.1 at 30 % of the epochs
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, backbone[k]), k
    assert any(not torch.equal(v, heads_before[k]) for k, v in loss.teacher_heads.state_dict().items())
    assert not any(p.requires_grad for p in loss.teacher_heads.parameters())
    assert not loss.teacher_heads.training
    path = tmp_path / HEADS_FILE
    assert path.is_file() and json.loads(path.with_suffix(".json").read_text())["history"] == history

    # a second call (resume) loads the file instead of retraining
    again, _, t_tap2, _, _ = head_setup(tmp_path)

    def boom(*args, **kwargs):
        raise AssertionError("retrained instead of loading")

    monkeypatch.setattr(again, "_train_teacher_heads", boom)
    again.prepare_teacher(t_tap2, splits, cfg, tmp_path)
    assert again.teacher_heads_loaded and again.teacher_head_history == history
    for k, v in loss.teacher_heads.state_dict().items():
        assert torch.equal(v, again.teacher_heads.state_dict()[k]), k
    assert not any(p.requires_grad for p in again.teacher_heads.parameters())

    # heads of another configuration are refused, not silently mixed
    other, _, t_tap3, _, _ = head_setup(tmp_path, head_blocks=2)
    with pytest.raises(CheckpointError, match="another teacher"):
        other.prepare_teacher(t_tap3, splits, cfg, tmp_path)


def test_distill_recipe_end_to_end(tiny):
    from teachkit.recipes import distill

    cfg = tiny(name="hsakd", kd={"method": "hsakd", "options": {"hsakd": {"teacher_head_epochs": 2}}},
               train={"epochs": 1, "progress": False}, teacher={"epochs": 1})
    result = distill(cfg)
    assert (result.run_dir / HEADS_FILE).is_file()
    terms = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"hsakd.ce", "hsakd.kd", "hsakd.aux_kd", "loss"}
    assert all(math.isfinite(v) for v in terms.values())


def test_teacher_heads_use_the_full_split_unless_asked_for_the_students(tiny, tmp_path):
    from teachkit.recipes.common import load_data

    cfg = tiny(data={"train_subset": 60})
    splits = load_data(cfg.data, torch.device("cpu"))
    loss, *_ = head_setup(tmp_path)
    assert len(splits.train) == 60
    assert len(loss._head_split(splits, cfg)) == 216  # 240 - 10 % val: the teacher's own training split
    loss.teacher_head_data = "student"
    assert len(loss._head_split(splits, cfg)) == 60
