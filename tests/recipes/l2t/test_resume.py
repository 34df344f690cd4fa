"""Exact resume of ``teachkit run l2t`` (L2T-DLF, Wu et al. 2018): a run interrupted at any instant of the
teacher phase or of the student phase and resumed ends bit-identical to an uninterrupted one (student and
teacher weights, optimiser and RNG state, the student-state tracker), and its logs (``teacher_log.jsonl``,
``phi_log.jsonl``, ``metrics.jsonl``) hold the same records, none lost or repeated.

An interruption is simulated in-process by raising :class:`Killed` (a BaseException, like a signal, that
nothing in the package catches) at a chosen instant: before or after a checkpoint write, between a
checkpoint and its log line, in the middle of a log line, in the middle of an epoch or of an episode.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import teachkit.engine.trainer as engine_trainer
import teachkit.recipes.l2t.recipe as l2t
from teachkit.config import RunConfig, from_dict
from teachkit.engine.checkpoint import load_checkpoint
from teachkit.engine.runlog import RunLog
from teachkit.engine.trainer import Trainer
from teachkit.recipes.l2t.state import StudentStateTracker, TrackerModule
from tests.conftest import tiny_config, untimed

# 2 warm-start steps + 5 episodes of 3 inner steps and 1 plain step: more than the 3-epoch schedule, so
# the teacher-training student also restarts from its warm start once
L2T = {"teacher_steps": 5, "inner_steps": 3, "episode_gap": 1, "warm_start_steps": 2, "dev_batch_size": 16,
       "teacher_lr": 0.01}
EPOCHS = 3


class Killed(BaseException):
    """Stands in for kill -9 at one instant (nothing catches it; ``finally`` blocks do run, which a real kill
    would skip: the subprocess soak in tests/test_kill_resume.py covers that)."""


def config(root: Path, name: str, **l2t_options) -> RunConfig:
    return from_dict(tiny_config(root, name=name, data={"batch_size": 64},
                                 train={"epochs": EPOCHS, "progress": False}, l2t={**L2T, **l2t_options}))


def records(path: Path) -> list[dict]:
    """The JSONL records without timing fields."""
    if not path.is_file():
        return []
    return [untimed(json.loads(line)) for line in path.read_text().splitlines()]


def assert_same_run(a: Path, b: Path, metrics: bool = True) -> None:
    """Bit-identical final checkpoint and teacher, identical logs (timing fields aside)."""
    ta, sa = load_checkpoint(a / "checkpoints" / "last.safetensors")
    tb, sb = load_checkpoint(b / "checkpoints" / "last.safetensors")
    assert ta.keys() == tb.keys() and any(k.startswith("l2t_state/") for k in ta)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert untimed(sa) == untimed(sb)
    xa, ia = load_checkpoint(a / l2t.TEACHER_FILE)
    xb, ib = load_checkpoint(b / l2t.TEACHER_FILE)
    assert ia == ib and "resume" not in ia and xa.keys() == xb.keys()
    assert all(torch.equal(xa[k], xb[k]) for k in xa)
    assert (a / l2t.PHI_LOG).read_text() == (b / l2t.PHI_LOG).read_text()
    assert records(a / l2t.TEACHER_LOG) == records(b / l2t.TEACHER_LOG)
    if metrics:
        assert records(a / "metrics.jsonl") == records(b / "metrics.jsonl")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("straight")
    result = l2t.l2t_dlf(config(root, "straight"))
    phi = records(result.run_dir / l2t.PHI_LOG)
    assert [p["epoch"] for p in phi] == list(range(1, EPOCHS + 1))
    assert [r["step"] for r in records(result.run_dir / l2t.TEACHER_LOG)] == list(range(1, L2T["teacher_steps"] + 1))
    return result.run_dir


def nth_call(m: pytest.MonkeyPatch, owner: object, name: str, n: int, when: str = "before",
             only: Callable[..., bool] | None = None) -> None:
    """Raise :class:`Killed` ``before`` or ``after`` the ``n``-th call (1-based) of ``owner.name`` whose
    arguments pass ``only``."""
    real = getattr(owner, name)
    calls = [0]

    def wrapped(*args, **kwargs):
        if only is None or only(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n and when == "before":
                raise Killed
            out = real(*args, **kwargs)
            if calls[0] == n:
                raise Killed
            return out
        return real(*args, **kwargs)

    m.setattr(owner, name, wrapped)


def torn_line(m: pytest.MonkeyPatch, log: str, n: int) -> None:
    """The ``n``-th line appended to ``log`` is cut in half by the kill."""
    real = l2t._append_jsonl
    calls = [0]

    def wrapped(path: Path, record: dict) -> None:
        if path.name == log:
            calls[0] += 1
            if calls[0] == n:
                with open(path, "a") as f:
                    f.write(json.dumps(record)[:40])
                raise Killed
        real(path, record)

    m.setattr(l2t, "_append_jsonl", wrapped)


def last_ckpt(path, *args, **kwargs) -> bool:
    return Path(path).name == "last.safetensors"


# where the kill lands; the student phase has EPOCHS epochs, the teacher phase L2T["teacher_steps"] episodes
KILLS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    # teacher phase
    "teacher: before the first save": lambda m: nth_call(m, l2t, "save_teacher", 1),
    "teacher: inside episode 3 (hypergradient)": lambda m: nth_call(m, l2t, "hypergradient", 3),
    "teacher: after episode 2's log line, before its save": lambda m: nth_call(m, l2t, "save_teacher", 3),
    "teacher: after episode 2's save": lambda m: nth_call(m, l2t, "save_teacher", 3, "after"),
    "teacher: episode 4's log line torn": lambda m: torn_line(m, l2t.TEACHER_LOG, 4),
    "teacher: after the final save": lambda m: nth_call(m, l2t, "save_teacher", 6, "after"),
    # student phase
    "student: mid epoch 2": lambda m: nth_call(m, StudentStateTracker, "observe_train", 6),
    "student: phi line of epoch 2 torn": lambda m: torn_line(m, l2t.PHI_LOG, 2),
    "student: inside epoch 2's checkpoint write": lambda m: nth_call(m, engine_trainer, "save_checkpoint", 2,
                                                                      only=last_ckpt),
    "student: after epoch 1's checkpoint, before its metrics line": lambda m: nth_call(m, RunLog, "log", 1),
    "student: after epoch 2": lambda m: nth_call(m, Trainer, "run_epoch", 2, "after"),
    "student: before the summary": lambda m: nth_call(m, Trainer, "finish", 1),
}
# a kill between a checkpoint and its metrics line needs the engine's repair of metrics.jsonl from the
# checkpoint (engine/trainer.py + runlog.py, another change); without it only that comparison fails
NEEDS_ENGINE_REPAIR = {"student: after epoch 1's checkpoint, before its metrics line"}


def engine_repairs_metrics() -> bool:
    return hasattr(RunLog, "repair")


@pytest.mark.parametrize("kill", KILLS)
def test_interrupted_then_resumed_run_is_bit_identical(tmp_path, straight, kill, monkeypatch):
    cfg = config(tmp_path, "killed")
    with monkeypatch.context() as m:
        KILLS[kill](m)
        with pytest.raises(Killed):
            l2t.l2t_dlf(cfg)
    run_dir = Path(cfg.out_dir) / "killed"
    teacher = l2t.load_teacher(run_dir / l2t.TEACHER_FILE)[1] if (run_dir / l2t.TEACHER_FILE).is_file() else {}
    if kill.startswith("teacher") and kill != "teacher: after the final save":
        assert teacher.get("teacher_steps_done", 0) < L2T["teacher_steps"]  # the kill hit the teacher phase
    resumed = l2t.l2t_dlf(cfg, resume=True)
    check_metrics = kill not in NEEDS_ENGINE_REPAIR or engine_repairs_metrics()
    assert_same_run(straight, resumed.run_dir, metrics=check_metrics)


def test_two_interruptions_in_a_row(tmp_path, straight, monkeypatch):
    cfg = config(tmp_path, "twice")
    for kill in ("teacher: after episode 2's save", "student: after epoch 2"):
        with monkeypatch.context() as m:
            KILLS[kill](m)
            with pytest.raises(Killed):
                l2t.l2t_dlf(cfg, resume=True)
    assert_same_run(straight, l2t.l2t_dlf(cfg, resume=True).run_dir)


def test_unfinished_teacher_file_carries_resume_state_and_the_finished_one_does_not(tmp_path, monkeypatch):
    cfg = config(tmp_path, "state")
    with monkeypatch.context() as m:
        KILLS["teacher: after episode 2's save"](m)
        with pytest.raises(Killed):
            l2t.l2t_dlf(cfg)
    path = Path(cfg.out_dir) / "state" / l2t.TEACHER_FILE
    tensors, state = load_checkpoint(path)
    assert state["teacher_steps_done"] == 2 and set(state["resume"]) >= {"stream", "tracker", "adam"}
    assert any(k.startswith("resume/student/") for k in tensors) and any(k.startswith("resume/optim/") for k in tensors)
    assert l2t.finished_teacher(path, torch.device("cpu"), 4) is None  # not usable by another run yet
    l2t.l2t_dlf(cfg, resume=True)
    tensors, state = load_checkpoint(path)
    assert "resume" not in state and all(k.startswith("teacher/") for k in tensors)


def test_tracker_module_round_trips_exactly():
    a = StudentStateTracker(10)
    for i in range(7):
        a.observe_train(2.0 / (i + 1), i / 7)
    a.observe_dev(0.123456789, 0.3)
    sd = TrackerModule(a).state_dict()
    assert all(t.dtype == torch.float64 for t in sd.values())
    b = StudentStateTracker(10)
    TrackerModule(b).load_state_dict({k: v.clone() for k, v in sd.items()})
    assert b.state_dict() == a.state_dict()


def test_epoch_line_names_the_phi_columns(tmp_path, capsys):
    cfg = from_dict(tiny_config(tmp_path, name="lines", train={"epochs": 1, "progress": True},
                                l2t={**L2T, "teacher_steps": 1}))
    result = l2t.l2t_dlf(cfg)
    out = capsys.readouterr()
    text = out.out + out.err
    info = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])["info"]
    phi = json.loads((result.run_dir / l2t.PHI_LOG).read_text().splitlines()[0])
    want = f"phi mean diag(W) {phi['W_diag_mean']:.4f}, mean b {phi['b_mean']:+.4f}"
    assert info == {"phi": want[len("phi "):]}
    assert "teacher step 1/1  dev smooth_error " in text and "  |grad theta| " in text
    assert f"lines epoch 1/1  {want}  loss " in text
