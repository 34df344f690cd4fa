"""Run folders after any interruption: metrics agree with the checkpoint, orphan temporary files go, a run may
be extended, bad checkpoint state is one line, a full disk is one line and loses nothing, quiet logs."""

from __future__ import annotations

import errno
import io
import json
from pathlib import Path

import pytest
import torch

import teachkit.engine.checkpoint as ck
import teachkit.engine.runlog as runlog
from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import LoopConfig, OptimConfig, Trainer, fit
from teachkit.engine.checkpoint import WriteError, atomic_write, load_checkpoint, save_checkpoint
from teachkit.engine.runlog import RunLog
from teachkit.errors import CheckpointError, ConfigError, TeachkitError
from teachkit.types import Evaluator, StepOutput


class Interrupt(Exception):
    pass


class Rising(Evaluator):
    """val acc = 10 x the call number (every epoch is the best so far)."""

    primary = "acc"

    def __init__(self) -> None:
        self.calls = 0

    def metric_names(self) -> tuple[str, ...]:
        return ("acc", "loss")

    def evaluate(self, model):
        self.calls += 1
        return {"val": {"acc": 10.0 * self.calls, "loss": 1.0 / self.calls}, "test": {"acc": 5.0 * self.calls}}


def make(folder: Path, epochs: int, resume: bool = False, progress: bool = False, save_every: int = 0,
         callbacks=()) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, generator=g), torch.randint(0, 2, (32,), generator=g)

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": torch.nn.functional.cross_entropy(logits, batch.y)}, logits)

    ev = Rising()
    trainer = Trainer(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0), OptimConfig(lr=0.1), ev,
                      folder, loop=LoopConfig(epochs=epochs, progress=progress, save_every=save_every),
                      resume=resume, callbacks=callbacks)
    ev.calls = trainer.epoch  # the scripted metrics continue where the run stopped
    return trainer


def run(folder: Path, epochs: int, **kw) -> Trainer:
    trainer = make(folder, epochs, **kw)
    while not trainer.done:
        trainer.run_epoch()
    trainer.finish()
    return trainer


def logged(folder: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def stable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("epoch_time_s", "images_per_s")}


# ----------------------------------------------------------------------------- metrics agree with checkpoints


def test_kill_between_checkpoint_and_metrics_line_is_repaired(tmp_path, monkeypatch):
    straight = run(tmp_path / "straight", 3)
    real_log = RunLog.log

    def killed_at_epoch_two(self, record):
        if record["epoch"] == 2:
            raise Interrupt  # the checkpoint of epoch 2 is written, its line is not
        real_log(self, record)

    monkeypatch.setattr(RunLog, "log", killed_at_epoch_two)
    with pytest.raises(Interrupt):
        run(tmp_path / "killed", 3)
    monkeypatch.setattr(RunLog, "log", real_log)
    folder = tmp_path / "killed"
    assert logged(folder) == [1] and load_checkpoint(folder / "checkpoints" / "last.safetensors")[1]["epoch"] == 2
    resumed = run(folder, 3, resume=True)
    assert logged(folder) == [1, 2, 3]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [stable(r) for r in records] == [stable(r) for r in straight.history]
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]


def test_extra_duplicate_and_cut_lines_are_rewritten_from_the_checkpoint(tmp_path):
    folder = tmp_path / "run"
    run(folder, 2)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    with open(folder / "metrics.jsonl", "w") as f:  # epoch 1 twice, a line of an epoch the checkpoint never saw
        f.write("\n".join([lines[0], lines[0], lines[1], lines[1].replace('"epoch": 2', '"epoch": 3')]) + "\n")
        f.write('{"epoch": 4, "tr')  # and one cut short
    trainer = make(folder, 2, resume=True)
    assert [r["epoch"] for r in trainer.history] == [1, 2] and logged(folder) == [1, 2]
    assert (folder / "metrics.jsonl").read_text().splitlines() == lines


def test_runlog_repair_puts_back_the_checkpoints_record(tmp_path):
    log = RunLog(tmp_path)
    log.log({"epoch": 1, "val": {"acc": 1.0}})
    kept = log.repair(2, {"epoch": 2, "val": {"acc": 2.0}})
    assert [r["epoch"] for r in kept] == [1, 2] and [r["epoch"] for r in RunLog(tmp_path).records()] == [1, 2]
    assert log.repair(0) == [] and (tmp_path / "metrics.jsonl").read_text() == ""
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n["not", "a record"]\n')
    with pytest.raises(CheckpointError, match="metrics.jsonl' is corrupt at line 2"):
        log.records()


def test_a_fresh_start_forgets_an_earlier_attempts_lines(tmp_path):
    folder = tmp_path / "run"
    run(folder, 2)
    run(folder, 1)  # not resumed: starts over
    assert logged(folder) == [1]


# ----------------------------------------------------------------------------- orphan temporary files


def test_orphan_temporary_files_are_removed_on_resume(tmp_path):
    folder = tmp_path / "run"
    run(folder, 2, save_every=1)
    orphans = [folder / "checkpoints" / ".last.safetensors.k1x2.tmp", folder / "trajectory" / ".epoch_0002.ab.tmp",
               folder / ".metrics.jsonl.zz.tmp", folder / "teacher" / "checkpoints" / ".best.safetensors.q.tmp"]
    for orphan in orphans:
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"half a checkpoint")
    make(folder, 2, resume=True, save_every=1)
    assert not [o for o in orphans if o.exists()]
    assert not list(folder.rglob("*.tmp"))


# ----------------------------------------------------------------------------- extending a finished run


def test_resume_with_more_epochs_extends_a_finished_run(tmp_path):
    folder = tmp_path / "run"
    first = run(folder, 2)
    extended = run(folder, 4, resume=True)
    assert [r["epoch"] for r in extended.history] == [1, 2, 3, 4] and logged(folder) == [1, 2, 3, 4]
    assert extended.history[:2] == first.history
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["epochs"] == 4 and summary["last_epoch"] == 4 and summary["best_epoch"] == 4
    assert summary["val_acc"] == 40.0 and summary["wall_time_s"] >= first.wall_before
    assert summary["images_per_s"] > 0
    assert load_checkpoint(folder / "checkpoints" / "last.safetensors")[1]["epoch"] == 4


def test_resume_with_fewer_epochs_than_done_is_one_line(tmp_path):
    folder = tmp_path / "run"
    run(folder, 3)
    with pytest.raises(ConfigError, match=r"it finished 3 epochs, more than the 2 asked for") as e:
        make(folder, 2, resume=True)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- bad checkpoint state


def _rewrite_state(path: Path, change) -> None:
    tensors, state = load_checkpoint(path)
    change(state)
    save_checkpoint(path, tensors, state)  # a valid file (digest and sidecar) holding a bad state


BAD_STATES = [
    ("epoch='abc'", lambda s: s.update(epoch="abc"), "state field epoch='abc' is not a whole number"),
    ("epoch=-1", lambda s: s.update(epoch=-1), "state field epoch=-1 is not"),
    ("epoch=true", lambda s: s.update(epoch=True), "state field epoch=True is not"),
    ("best=null", lambda s: s.update(best=None), "state field best=None is not a mapping"),
    ("best without epoch", lambda s: s.update(best={}), "state field best={} is not"),
    ("no optimizer", lambda s: s.pop("optimizer"), "has no 'optimizer' field"),
    ("optimizer=3", lambda s: s.update(optimizer=3), "state field optimizer=3 is not an optimiser state"),
    ("wall_time_s='x'", lambda s: s.update(wall_time_s="x"), "state field wall_time_s='x' is not a number"),
    ("warnings='x'", lambda s: s.update(warnings="x"), "state field warnings='x' is not a list"),
    ("record of another epoch", lambda s: s.update(record={"epoch": 9}), "is not the metrics record of epoch 1"),
]


@pytest.mark.parametrize("change, fragment", [row[1:] for row in BAD_STATES], ids=[row[0] for row in BAD_STATES])
def test_bad_state_fields_are_one_line_checkpoint_errors(tmp_path, change, fragment):
    folder = tmp_path / "run"
    run(folder, 1)
    last = folder / "checkpoints" / "last.safetensors"
    _rewrite_state(last, change)
    with pytest.raises(CheckpointError) as e:
        make(folder, 2, resume=True)
    message = str(e.value)
    assert fragment in message and f"cannot resume from {str(last)!r}" in message and "\n" not in message


def test_a_checkpoint_without_random_state_is_refused(tmp_path):
    folder = tmp_path / "run"
    run(folder, 1)
    last = folder / "checkpoints" / "last.safetensors"
    tensors, state = load_checkpoint(last)
    save_checkpoint(last, {k: v for k, v in tensors.items() if not k.startswith("rng/")}, state)
    with pytest.raises(CheckpointError, match="holds no random state"):
        make(folder, 2, resume=True)


def test_resuming_a_checkpoint_of_another_model_names_the_mismatch_in_whole_words(tmp_path):
    folder = tmp_path / "run"
    run(folder, 1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.Linear(7, 2))
    batches = BatchLoader(TensorSplit(torch.zeros(8, 3), torch.zeros(8).long()), 8, shuffle=False, seed=0)
    with pytest.raises(CheckpointError) as e:
        fit(model, lambda b, p: None, batches, OptimConfig(), Rising(), folder, loop=LoopConfig(epochs=2),
            resume=True)
    message = str(e.value)
    assert message.startswith(f"cannot resume from {str(folder / 'checkpoints' / 'last.safetensors')!r}")
    assert "does not fit this run's model (missing 0.weight, 0.bias, 1.weight and 1 more; unexpected bias, weight)" \
           in message and "\n" not in message and message.endswith(")")


def test_a_state_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    ck.save_file({"w": torch.ones(2)}, str(path), metadata={ck.STATE_KEY: "[1, 2]"})
    with pytest.raises(CheckpointError, match=r"c.safetensors' is not a teachkit checkpoint \(its state is a list"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------- a full disk


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_turns_os_errors_into_one_line_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(WriteError) as e:
        atomic_write(path, lambda tmp: enospc())
    assert str(e.value) == f"cannot write {str(path)!r}: No space left on device"
    assert isinstance(e.value, TeachkitError) and path.read_text() == "old" and not list(tmp_path.glob("*.tmp"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WriteError, match=r"cannot write '.*file/x.json': Not a directory"):
        ck.write_json(blocker / "x.json", {})


def test_disk_full_while_saving_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    real_save = ck.save_file
    calls = {"last": 0}

    def full_on_second_last(tensors, tmp, metadata=None):
        if Path(tmp).name.startswith(".last.safetensors."):
            calls["last"] += 1
            if calls["last"] == 2:
                enospc()
        real_save(tensors, tmp, metadata=metadata)

    monkeypatch.setattr(ck, "save_file", full_on_second_last)
    folder = tmp_path / "run"
    last = folder / "checkpoints" / "last.safetensors"
    with pytest.raises(WriteError) as e:
        run(folder, 3)
    assert str(e.value) == f"cannot write {str(last)!r}: No space left on device"
    monkeypatch.setattr(ck, "save_file", real_save)
    assert load_checkpoint(last)[1]["epoch"] == 1 and logged(folder) == [1]
    assert not list(folder.rglob("*.tmp"))
    run(folder, 3, resume=True)
    assert logged(folder) == [1, 2, 3]


def test_disk_full_while_appending_the_metrics_line_is_repaired_on_resume(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    calls = {"n": 0}

    def full_on_second(path, mode="r", *args, **kwargs):
        if mode == "a":
            calls["n"] += 1
            if calls["n"] == 2:
                enospc()
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(runlog, "open", full_on_second, raising=False)
    with pytest.raises(WriteError, match=r"cannot write '.*metrics.jsonl': No space left on device$"):
        run(folder, 3)
    monkeypatch.undo()
    assert logged(folder) == [1]
    run(folder, 3, resume=True)
    assert logged(folder) == [1, 2, 3]


def test_a_safetensors_io_failure_is_a_write_error(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    def too_large(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: File too large (os error 27)")

    monkeypatch.setattr(ck, "save_file", too_large)
    with pytest.raises(WriteError, match=r"cannot write '.*c.safetensors': File too large$"):
        save_checkpoint(tmp_path / "c.safetensors", {"w": torch.ones(2)}, {})


# ----------------------------------------------------------------------------- progress output


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_redraws_outside_a_terminal_but_the_epoch_lines_stay(tmp_path, capsys):
    trainer = run(tmp_path / "run", 3, progress=True)
    out = capsys.readouterr()
    assert out.err == ""  # stderr is not a terminal here: no bars
    lines = out.out.splitlines()
    assert [line.split("  ")[0] for line in lines] == [f"train epoch {e}/3" for e in (1, 2, 3)]
    assert "\r" not in out.out and len(out.out) < 600
    trainer.warn("something odd")
    assert capsys.readouterr().err == "warning: train: something odd\n"  # warnings still print


def test_bars_are_drawn_in_a_terminal(tmp_path, monkeypatch, capsys):
    tty = TTY()
    monkeypatch.setattr("sys.stderr", tty)
    run(tmp_path / "run", 1, progress=True)
    assert "train 1/1" in tty.getvalue() and "\r" in tty.getvalue()
    assert "train epoch 1/1" in capsys.readouterr().out


def test_progress_false_is_silent_but_keeps_warnings(tmp_path, monkeypatch, capsys):
    """``--quiet``: nothing printed, warnings kept for the summary (the CLI's final line counts them)."""
    tty = TTY()
    monkeypatch.setattr("sys.stderr", tty)
    trainer = run(tmp_path / "run", 2, progress=False)
    trainer.warn("kept, not shown")
    assert tty.getvalue() == "" and capsys.readouterr().out == ""
    assert trainer.finish().summary["warnings"] == ["kept, not shown"]


# ----------------------------------------------------------------------------- cost and wall time


def test_a_cost_wall_time_is_never_less_than_the_runs_own(tmp_path):
    trainer = make(tmp_path / "run", 1)
    trainer.run_epoch()
    s = trainer.finish(cost={"student_epochs": 1, "wall_time_s": 0.0}).summary
    assert s["cost"]["wall_time_s"] == s["wall_time_s"] > 0
    trainer = make(tmp_path / "run2", 1)
    trainer.run_epoch()
    s = trainer.finish(cost={"student_epochs": 1}).summary
    assert s["cost"]["wall_time_s"] == s["wall_time_s"]
