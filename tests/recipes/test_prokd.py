import json

import pytest
import torch

from teachkit.config import from_dict
from teachkit.errors import CheckpointError, ConfigError
from teachkit.recipes import RECIPES, train_model
from teachkit.recipes.prokd import prokd_plan, rco_plan, squared_error, temperature


def cfg_dict(**prokd):
    return from_dict({"train": {"epochs": 8}, "teacher": {"epochs": 6}, "prokd": {"tau_max": 4, **prokd}})


def test_temperature_schedule_and_phases():
    plan = prokd_plan(cfg_dict(stage_epochs=2), 6)
    assert [s.temperature for s in plan[:6]] == [4, 4, 3, 3, 2, 2]
    assert [s.teacher_epoch for s in plan[:6]] == [1, 2, 3, 4, 5, 6]  # checkpoint after teacher epoch i
    assert [s.kind for s in plan] == ["prokd"] * 6 + ["ce"] * 2
    start = prokd_plan(cfg_dict(stage_epochs=2, checkpoint_at="start"), 6)
    assert [s.teacher_epoch for s in start[:6]] == [0, 1, 2, 3, 4, 5]
    assert temperature(30, 10.0, 1) == 1.0  # floored at 1
    two = prokd_plan(cfg_dict(student_epochs=[2, 0, 1, 1, 1, 1]), 6)
    assert [s.teacher_epoch for s in two[:6]] == [1, 1, 3, 4, 5, 6]
    anneal = prokd_plan(cfg_dict(stage_epochs=2), 6, kind="anneal")
    assert {s.teacher_epoch for s in anneal[:6]} == {6}  # the final teacher throughout


@pytest.mark.parametrize("prokd, match", [
    ({"student_epochs": [1, 1]}, "lists 2 entries but the teacher trains 6 epochs"),
    ({"student_epochs": 2}, "sum to 12 phase-I epochs, more than train.epochs=8"),
])
def test_bad_schedules(prokd, match):
    with pytest.raises(ConfigError, match=match):
        prokd_plan(cfg_dict(**prokd), 6)
    with pytest.raises(ConfigError, match=r"prokd.tau_max=0.5 is out of range: must be >= 1.0"):
        cfg_dict(tau_max=0.5)


def test_rco_anchors_equal_intervals():
    plan = rco_plan(from_dict({"train": {"epochs": 8}, "rco": {"anchors": 4}}), 10)
    assert [s.teacher_epoch for s in plan] == [2, 2, 5, 5, 8, 8, 10, 10]


def test_squared_error_reductions_by_hand():
    zs, zt = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.0, 0.0, 0.0]])
    assert squared_error(zs, zt, "sum").item() == pytest.approx(14.0)
    assert squared_error(zs, zt, "mean").item() == pytest.approx(14.0 / 3)


def prokd_cfg(tiny, name, **extra):
    teacher = {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 3, **extra.pop("teacher", {})}
    return tiny(name=name, train={"epochs": 4, "progress": False}, teacher=teacher,
                prokd={"tau_max": 3, **extra.pop("prokd", {})}, **extra)


def test_online_and_replay_give_identical_students(tiny, tmp_path):
    dropout = {"name": "mlp", "options": {"hidden": [16], "dropout": 0.2}}  # RNG use on the student side
    online = RECIPES.get("prokd")(prokd_cfg(tiny, "online", model=dropout))
    teacher_dir = online.run_dir / "teacher"
    manifest = json.loads((teacher_dir / "trajectory" / "trajectory.json").read_text())["checkpoints"]
    assert [e["epoch"] for e in manifest] == [0, 1, 2, 3]
    replay = RECIPES.get("prokd")(prokd_cfg(tiny, "replay", model=dropout, prokd={"mode": "replay"},
                                            teacher={"checkpoint": str(teacher_dir)}))
    for (k, a), (_, b) in zip(online.model.state_dict().items(), replay.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    s = online.summary
    assert s["plan"]["phase1_epochs"] == 3 and s["plan"]["phase2_epochs"] == 1
    assert s["cost"]["teacher_epochs_trained"] == 3 and replay.summary["cost"]["teacher_epochs_trained"] == 0
    # online: each of the 3 teacher checkpoints' logits computed once for the 216 training samples (cached);
    # replay reads the very same cache entries (same weights, same transfer set) and runs no teacher forward
    assert s["cost"]["teacher_forward_images"] == 3 * 216 and s["teacher_cache"] == {"computed": 3}
    assert replay.summary["cost"]["teacher_forward_images"] == 0 and replay.summary["teacher_cache"] == {"loaded": 3}
    assert s["cost"]["teacher_forwards_saved"] == replay.summary["cost"]["teacher_forwards_saved"] == 3 * 216
    uncached = RECIPES.get("prokd")(prokd_cfg(tiny, "nocache", model=dropout, prokd={"mode": "replay"},
                                              teacher={"checkpoint": str(teacher_dir), "cache": "off"}))
    for (k, a), (_, b) in zip(online.model.state_dict().items(), uncached.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert uncached.summary["cost"]["teacher_forward_images"] == 3 * 216
    assert {"best_epoch", "best_val_acc", "val_acc", "test_acc"} <= set(s)
    terms = [set(json.loads(line)["train"]) for line in (online.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert terms[0] == {"prokd", "loss"} and terms[-1] == {"ce", "loss"}
    # a checkpoint at the phase boundary is kept
    assert (online.run_dir / "trajectory" / "epoch_0003.safetensors").is_file()


def test_replay_errors(tiny, tmp_path):
    with pytest.raises(ConfigError, match="replay mode needs teacher.checkpoint"):
        RECIPES.get("prokd")(prokd_cfg(tiny, "r0", prokd={"mode": "replay"}))
    plain = train_model(tiny(name="plain-teacher"))  # no trajectory recorded
    with pytest.raises(CheckpointError, match="no trajectory manifest"):
        RECIPES.get("prokd")(prokd_cfg(tiny, "r1", prokd={"mode": "replay"},
                                       teacher={"checkpoint": str(plain.run_dir)}))
    rec = train_model(tiny(name="rec-teacher", train={"epochs": 2, "save_every": 1, "progress": False}))
    (rec.run_dir / "trajectory" / "epoch_0002.safetensors").write_bytes(b"tampered")
    with pytest.raises(CheckpointError, match="sha256"):
        RECIPES.get("prokd")(prokd_cfg(tiny, "r2", prokd={"mode": "replay"}, teacher={"checkpoint": str(rec.run_dir)}))
    other = tiny(name="three-class", data={"options": {"shape": [1, 8, 8], "num_classes": 3, "n_train": 90,
                                                       "n_test": 30}}, train={"epochs": 1, "save_every": 1,
                                                                              "progress": False})
    three = train_model(other)
    with pytest.raises(ConfigError, match="teacher has 3 classes"):
        RECIPES.get("prokd")(prokd_cfg(tiny, "r3", prokd={"mode": "replay"},
                                       teacher={"checkpoint": str(three.run_dir)}))
    with pytest.raises(ConfigError, match="online mode trains the teacher itself"):
        RECIPES.get("prokd")(prokd_cfg(tiny, "r4", prokd={"mode": "online"}, teacher={"checkpoint": str(rec.run_dir)}))


@pytest.mark.parametrize("recipe", ["annealing", "rco"])
def test_annealing_and_rco_run_and_report_cost(tiny, recipe):
    result = RECIPES.get(recipe)(prokd_cfg(tiny, recipe, rco={"anchors": 3}))
    assert result.summary["cost"]["teacher_epochs_trained"] == 3
    first = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])["train"]
    assert ("anneal" if recipe == "annealing" else "kd") in first
