"""TeacherSource: checkpoint or trained here (reused on resume), recorded and live trajectories, learned teachers."""

from __future__ import annotations

import pytest
import torch

from teachkit.config import with_changes
from teachkit.engine import load_checkpoint
from teachkit.engine.checkpoint import strip
from teachkit.errors import CheckpointError, ConfigError
from teachkit.recipes import RunContext, TeacherSource, train_model


def test_trained_here_once_then_reused_on_resume(tiny, monkeypatch):
    import teachkit.recipes.teacher as teacher_module

    calls = []
    real = teacher_module.train_model
    monkeypatch.setattr(teacher_module, "train_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = tiny(name="src", data={"train_subset": 60})
    frozen, state = TeacherSource(RunContext.open(cfg)).frozen()
    assert calls == [1] and not frozen.training and all(not p.requires_grad for p in frozen.parameters())
    assert state["epoch"] == cfg.teacher.epochs
    teacher_cfg = RunContext.open(cfg, resume=True).run_dir / "teacher" / "config.yaml"
    assert "train_subset: null" in teacher_cfg.read_text()  # the teacher saw the full training split
    again, _ = TeacherSource(RunContext.open(cfg, resume=True)).frozen()
    assert calls == [1]  # a finished teacher run is reused
    for a, b in zip(frozen.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    source = TeacherSource(RunContext.open(with_changes(cfg, name="given", teacher={"checkpoint": str(
        RunContext.open(cfg, resume=True).run_dir / "teacher")})))
    assert source.given and source.epochs_trained == 0 and source.frozen()[1]["epoch"] == cfg.teacher.epochs


def test_recorded_trajectory_and_replay_hand_out_the_recorded_weights(tiny):
    teacher = train_model(tiny(name="t", train={"epochs": 3, "save_every": 1, "progress": False}))
    cfg = tiny(name="s", teacher={"checkpoint": str(teacher.run_dir)})
    ctx = RunContext.open(cfg)
    recorded = TeacherSource(ctx).recorded()
    assert recorded.epochs == [1, 2, 3] and recorded.path(2).name == "epoch_0002.safetensors"
    trajectory = TeacherSource(ctx).trajectory("replay")
    assert trajectory.epochs == [1, 2, 3] and trajectory.total_epochs == 3
    tensors, _ = load_checkpoint(teacher.run_dir / "trajectory" / "epoch_0002.safetensors")
    for key, value in strip("model/", tensors).items():
        assert torch.equal(trajectory.at(2).module.state_dict()[key], value), key


def test_live_trajectory_equals_the_recorded_one(tiny):
    """Online: the teacher trained epoch by epoch in this run hands out what a recorded run would."""
    cfg = tiny(name="live", teacher={"epochs": 2})
    live = TeacherSource(RunContext.open(cfg)).trajectory("online")
    assert live.epochs == [0, 1, 2]
    after_one = {k: v.clone() for k, v in live.at(1).module.state_dict().items()}
    live.finish()
    recorded = TeacherSource(RunContext.open(with_changes(cfg, name="replayed", teacher={
        "checkpoint": str(live.trainer.run_dir)}))).trajectory("replay")
    for key, value in after_one.items():
        assert torch.equal(recorded.at(1).module.state_dict()[key], value), key
    assert recorded.epochs == [0, 1, 2] and live.epochs_trained == 2 and recorded.epochs_trained == 0


def test_source_errors(tiny, tmp_path):
    plain = train_model(tiny(name="plain"))  # no trajectory recorded
    with pytest.raises(CheckpointError, match="no trajectory manifest .*train.save_every=1"):
        TeacherSource(RunContext.open(tiny(name="a", teacher={"checkpoint": str(plain.run_dir)}))).recorded()
    with pytest.raises(ConfigError, match="online mode trains the teacher itself"):
        TeacherSource(RunContext.open(tiny(name="b", teacher={"checkpoint": str(plain.run_dir)}))).trajectory("online")
    with pytest.raises(ConfigError, match="replay mode needs teacher.checkpoint"):
        TeacherSource(RunContext.open(tiny(name="c"))).trajectory("replay")


def test_learned_teacher_from_checkpoint_file_or_folder_or_resume(tiny, tmp_path):
    ctx = RunContext.open(tiny(name="l"))
    trained = []
    assert TeacherSource(ctx).learned("t.bin", lambda p: "loaded", lambda: trained.append(1) or "new") == "new"
    (ctx.run_dir / "t.bin").write_text("x")
    resumed = RunContext.open(tiny(name="l"), resume=True)
    assert TeacherSource(resumed).learned("t.bin", lambda p: f"loaded {p.name}", lambda: "new") == "loaded t.bin"
    assert TeacherSource(resumed).learned("t.bin", lambda p: None, lambda: "retrained") == "retrained"  # unfinished
    given = RunContext.open(tiny(name="g", teacher={"checkpoint": str(ctx.run_dir)}))
    assert TeacherSource(given).learned("t.bin", lambda p: p.parent.name, lambda: "new") == "l"
    with pytest.raises(CheckpointError, match="holds an unfinished teacher"):
        TeacherSource(given).learned("t.bin", lambda p: None, lambda: "new")
    missing = RunContext.open(tiny(name="m", teacher={"checkpoint": str(tmp_path / "nope.bin")}))
    with pytest.raises(CheckpointError, match="nope.bin' does not exist"):
        TeacherSource(missing).learned("t.bin", lambda p: "x", lambda: "new")
