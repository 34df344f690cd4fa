"""RunContext.open: everything validated before the folder is made, failed attempts do not block the corrected
command, runs may be extended, run names stay inside out_dir, I/O failures are one line; composed costs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import teachkit.recipes.context as context
from teachkit.cli import main
from teachkit.engine import ClassificationEvaluator
from teachkit.engine.checkpoint import WriteError, load_checkpoint, save_checkpoint
from teachkit.errors import CheckpointError, ConfigError
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import RunResult, composed_cost, load_model
from teachkit.recipes.context import RunContext, check_run_dir
from tests.conftest import tiny_config


class Interrupt(Exception):
    pass


def crash_in_first_epoch(monkeypatch) -> None:
    def boom(self, model):
        raise Interrupt

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", boom)


def write_cfg(tmp_path: Path, **sections) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, **sections)))
    return path


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main([*args, "--quiet"] if args[0] in ("train", "distill", "run") else list(args))
    return code, capsys.readouterr().err


# ----------------------------------------------------------------------------- run names


@pytest.mark.parametrize("name", ["", ".", "..", "../..", "a/../..", "a//b", "a/", "/abs", "a\\b", "  "])
def test_run_name_is_a_folder_path_inside_out_dir(tiny, tmp_path, name):
    with pytest.raises(ConfigError, match=r"is not allowed: a run name is a folder path inside out_dir") as e:
        RunContext.open(tiny(name=name))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_nested_run_name_makes_nested_folders(tiny, tmp_path):
    """The shipped configs name runs like ``prokd/cifar100/kd``: folders inside out_dir."""
    result = train_model(tiny(name="study/a/run", train={"epochs": 1, "progress": False}))
    assert result.run_dir == tmp_path / "runs" / "study" / "a" / "run"
    assert (result.run_dir / "summary.json").is_file()


# ----------------------------------------------------------------------------- a failed attempt does not block


def test_a_command_that_failed_before_its_first_epoch_does_not_block_the_corrected_one(tiny, tmp_path, monkeypatch):
    crash_in_first_epoch(monkeypatch)
    with pytest.raises(Interrupt):
        train_model(tiny(name="r", optim={"lr": 5.0}))
    folder = tmp_path / "runs" / "r"
    assert (folder / "config.yaml").is_file() and not list(folder.rglob("*.safetensors"))
    (folder / "metrics.jsonl").write_text('{"epoch": 1}\n')  # stale outputs of that attempt
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.json").write_text("{}")
    (folder / "checkpoints" / ".last.safetensors.x.tmp").write_text("")
    monkeypatch.undo()
    result = train_model(tiny(name="r", optim={"lr": 0.1}))  # corrected, no --resume
    assert yaml.safe_load((folder / "config.yaml").read_text())["optim"]["lr"] == 0.1
    assert [r["epoch"] for r in result.history] == [1, 2] and not list(folder.rglob("*.tmp"))
    assert json.loads((folder / "checkpoints" / "last.json").read_text())["epoch"] == 2


def test_a_composed_run_whose_teacher_failed_early_is_reusable(tiny, tmp_path, monkeypatch):
    crash_in_first_epoch(monkeypatch)
    with pytest.raises(Interrupt):
        distill(tiny(name="kd", teacher={"epochs": 1}))
    assert (tmp_path / "runs" / "kd" / "teacher" / "config.yaml").is_file()
    monkeypatch.undo()
    result = distill(tiny(name="kd", teacher={"epochs": 1}, train={"epochs": 1}))  # a changed config, no --resume
    assert result.summary["last_epoch"] == 1
    # once a sub-run finished an epoch the folder needs --resume
    real = ClassificationEvaluator.evaluate
    calls = {"n": 0}

    def crash_in_student(self, model):
        calls["n"] += 1
        if calls["n"] == 2:  # the teacher's epoch 1 was evaluated; the student's first is not
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", crash_in_student)
    with pytest.raises(Interrupt):
        distill(tiny(name="kd2", teacher={"epochs": 1}, train={"epochs": 1}))
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="kd2' already exists; pass --resume"):
        distill(tiny(name="kd2", teacher={"epochs": 1}, train={"epochs": 1}))


def test_check_run_dir_says_when_a_folder_starts_afresh(tiny, tmp_path):
    folder = tmp_path / "x"
    assert check_run_dir(tiny(), folder, resume=False)
    (folder / "teacher" / "trajectory").mkdir(parents=True)
    (folder / "teacher" / "trajectory" / "epoch_0000.safetensors").write_bytes(b"")  # the initialisation only
    assert check_run_dir(tiny(), folder, resume=False)
    (folder / "teacher" / "checkpoints").mkdir()
    (folder / "teacher" / "checkpoints" / "last.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="already exists"):
        check_run_dir(tiny(), folder, resume=False)
    assert not check_run_dir(tiny(), folder, resume=True)


# ----------------------------------------------------------------------------- extending a run


def test_resume_may_extend_train_epochs_but_not_shrink_it(tiny, tmp_path):
    train_model(tiny(name="e", train={"epochs": 2}))
    result = train_model(tiny(name="e", train={"epochs": 3}), resume=True)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    summary = json.loads((tmp_path / "runs" / "e" / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["last_epoch"] == 3 and summary["cost"]["student_epochs"] == 3
    assert yaml.safe_load((tmp_path / "runs" / "e" / "config.yaml").read_text())["train"]["epochs"] == 3
    with pytest.raises(ConfigError, match=r"cannot resume '.*e' with train.epochs=2: it was made with "
                                          r"train.epochs=3; --resume may only raise it"):
        train_model(tiny(name="e", train={"epochs": 2}), resume=True)
    with pytest.raises(ConfigError, match=r"it was made with optim.lr=0.05, not 0.1"):
        train_model(tiny(name="e", train={"epochs": 4}, optim={"lr": 0.1}), resume=True)


def test_a_folder_from_before_pad_mode_resumes_only_with_reflect_padding(tiny, tmp_path):
    """Crops padded by reflection before ``data.augment_options`` existed: resuming such a folder with today's
    default (zeros) would change the padding half-way; it is refused, and ``pad_mode=reflect`` resumes it."""
    train_model(tiny(name="old", data={"augment": "crop"}, train={"epochs": 1}))
    saved = tmp_path / "runs" / "old" / "config.yaml"
    data = yaml.safe_load(saved.read_text())
    assert data["data"].pop("augment_options") == {"pad_mode": "zeros"}
    saved.write_text(yaml.safe_dump(data))  # as an older version wrote it
    with pytest.raises(ConfigError, match=r"made with data.augment_options=\{'pad_mode': 'reflect'\}, not "
                                          r"\{'pad_mode': 'zeros'\}"):
        train_model(tiny(name="old", data={"augment": "crop"}, train={"epochs": 2}), resume=True)
    reflect = {"augment": "crop", "augment_options": {"pad_mode": "reflect"}}
    assert [r["epoch"] for r in train_model(tiny(name="old", data=reflect, train={"epochs": 2}),
                                            resume=True).history] == [1, 2]
    assert context.legacy_pad_mode({"data": {"name": "digits", "augment": "auto"}}) == \
        {"data": {"name": "digits", "augment": "auto"}}  # auto does not crop digits: nothing to pin
    assert context.legacy_pad_mode({"data": {"name": "cifar10"}})["data"]["augment_options"] == {"pad_mode": "reflect"}


# ----------------------------------------------------------------------------- where the folder goes


def test_out_dir_under_a_file_and_a_run_path_that_is_a_file(tiny, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"cannot create run folder '.*afile/runs/tiny': '.*afile' is a file, not "
                                          r"a folder \(check out_dir\)"):
        RunContext.open(tiny(out_dir=str(blocker / "runs")))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "taken").write_text("")
    with pytest.raises(ConfigError, match=r"run folder '.*taken' is a file, not a folder"):
        RunContext.open(tiny(name="taken"))


def test_read_only_out_dir_is_one_line(tiny, tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    monkeypatch.setattr(context.os, "access", lambda path, mode: False)  # root ignores file modes
    with pytest.raises(ConfigError, match=r"cannot write in folder '.*runs': Permission denied \(check out_dir\)"):
        RunContext.open(tiny())
    assert list((tmp_path / "runs").iterdir()) == []


def test_disk_full_at_start_leaves_no_folder(tiny, tmp_path, monkeypatch):
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".config.yaml."):
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(WriteError) as e:
        RunContext.open(tiny(name="full"))
    assert str(e.value) == f"cannot write {str(tmp_path / 'runs' / 'full' / 'config.yaml')!r}: No space left on device"
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- bad checkpoint fields


def _rewrite_state(path: Path, change) -> None:
    tensors, state = load_checkpoint(path)
    change(state)
    save_checkpoint(path, tensors, state)


BAD_MODEL_STATES = [
    ("num_classes='abc'", lambda s: s.update(num_classes="abc"), "has num_classes='abc', not a positive integer"),
    ("num_classes=0", lambda s: s.update(num_classes=0), "has num_classes=0, not a positive integer"),
    ("no input_shape", lambda s: s.pop("input_shape"), "has no 'input_shape' field"),
    ("input_shape='abc'", lambda s: s.update(input_shape="abc"), "has input_shape='abc', not a list of positive"),
    ("input_shape=[0, 8]", lambda s: s.update(input_shape=[0, 8]), "has input_shape=[0, 8], not a list"),
    ("no model", lambda s: s.pop("model"), "does not describe its model"),
    ("model=3", lambda s: s.update(model=3), "has model=3, not a model config"),
    ("unknown model", lambda s: s.update(model={"name": "nosuchnet"}), "records a model this version cannot build"),
]


@pytest.mark.parametrize("change, fragment", [r[1:] for r in BAD_MODEL_STATES], ids=[r[0] for r in BAD_MODEL_STATES])
def test_bad_model_fields_are_one_line_checkpoint_errors(tiny, tmp_path, change, fragment):
    result = train_model(tiny(name="m", train={"epochs": 1}))
    last = result.run_dir / "checkpoints" / "last.safetensors"
    _rewrite_state(last, change)
    with pytest.raises(CheckpointError) as e:
        load_model(result.run_dir)
    assert fragment in str(e.value) and f"checkpoint {str(last)!r}" in str(e.value) and "\n" not in str(e.value)


def test_teacher_of_other_classes_names_its_checkpoint(tiny, tmp_path):
    teacher = train_model(tiny(name="t", train={"epochs": 1}))
    other = {"options": {"shape": [1, 8, 8], "num_classes": 3, "n_train": 240, "n_test": 80}}
    with pytest.raises(ConfigError) as e:
        distill(tiny(name="s", data=other, teacher={"checkpoint": str(teacher.run_dir)}))
    assert "teacher has 4 classes but dataset 'synthetic'" in str(e.value)
    assert f"(checkpoint {str(teacher.run_dir / 'checkpoints' / 'last.safetensors')!r})" in str(e.value)


# ----------------------------------------------------------------------------- the command line, one line each


def test_bad_inputs_on_the_command_line_are_one_line_exit_2(tmp_path, capsys):
    cfg = write_cfg(tmp_path, train={"epochs": 1, "progress": False})
    assert main(["train", str(cfg), "name=done", "--quiet"]) == 0
    last = tmp_path / "runs" / "done" / "checkpoints" / "last.safetensors"
    (tmp_path / "afile").write_text("")
    (tmp_path / "runs" / "filerun").write_text("")
    rows = [
        (["train", str(cfg), "name=../.."], "name='../..' is not allowed"),
        (["train", str(cfg), "name=a/../.."], "name='a/../..' is not allowed"),
        (["train", str(cfg), "name="], "name='' is not allowed"),
        (["train", str(cfg), f"out_dir={tmp_path / 'afile' / 'runs'}"], "is a file, not a folder"),
        (["train", str(cfg), "name=filerun"], "run folder"),
        (["train", str(cfg), "name=done"], "already exists; pass --resume"),
        (["train", str(cfg), "name=done", "train.epochs=0", "--resume"], "train.epochs"),
        (["train", str(cfg), "name=done", "optim.lr=0.2", "--resume"], "it was made with optim.lr=0.05, not 0.2"),
    ]
    for argv, fragment in rows:
        code, err = cli(capsys, *argv)
        assert code == 2 and fragment in err and "Traceback" not in err, (argv, err)
        assert err.startswith("teachkit: error: ") and err.count("\n") == 1, (argv, err)
    assert not (tmp_path.parent / "config.yaml").exists()  # name=../.. wrote nothing outside out_dir
    state_rows = [
        (lambda s: s.update(epoch="abc"), "epoch='abc'"),
        (lambda s: s.update(best=None), "best=None"),
        (lambda s: s.pop("optimizer"), "no 'optimizer' field"),
    ]
    good = last.read_bytes(), last.with_suffix(".json").read_bytes()
    for change, fragment in state_rows:
        _rewrite_state(last, change)
        code, err = cli(capsys, "train", str(cfg), "name=done", "train.epochs=2", "--resume")
        assert code == 2 and fragment in err and str(last) in err and "Traceback" not in err, err
        last.write_bytes(good[0])
        last.with_suffix(".json").write_bytes(good[1])
    for change, fragment in [(lambda s: s.update(num_classes="abc"), "num_classes='abc'"),
                             (lambda s: s.pop("input_shape"), "no 'input_shape' field")]:
        _rewrite_state(last, change)
        code, err = cli(capsys, "eval", str(last))
        assert code == 2 and fragment in err and "Traceback" not in err, err
        last.write_bytes(good[0])
        last.with_suffix(".json").write_bytes(good[1])


@pytest.mark.skipif(not hasattr(os, "setrlimit") and sys.platform == "win32", reason="POSIX resource limits")
@pytest.mark.parametrize("limit, file", [(0, "config.yaml"), (4096, "best.safetensors")])
def test_file_size_limit_is_one_line_and_keeps_what_was_written(tmp_path, limit, file):
    """A real write failure (RLIMIT_FSIZE, SIGXFSZ ignored): EFBIG at the start or at the first checkpoint."""
    cfg = write_cfg(tmp_path, train={"epochs": 1, "progress": False})
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "from teachkit.cli import main\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
            f"sys.exit(main(['train', {str(cfg)!r}, 'name=big', '--quiet']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("teachkit: error: cannot write ") and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{file}': File too large" in proc.stderr and "Traceback" not in proc.stderr
    folder = tmp_path / "runs" / "big"
    assert not list(tmp_path.rglob("*.tmp"))
    if limit == 0:
        assert not folder.exists()
    else:
        assert yaml.safe_load((folder / "config.yaml").read_text())["name"] == "big"


# ----------------------------------------------------------------------------- composed cost


def test_composed_cost_is_the_total_of_its_runs(tmp_path):
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "summary.json").write_text(json.dumps({"wall_time_s": 5.0}))
    a = RunResult(tmp_path / "gen-1", {"epochs": 2, "wall_time_s": 3.0, "cost": {"wall_time_s": 3.5,
                                                                                 "teacher_forward_images": 10}}, None)
    b = RunResult(tmp_path / "gen-2", {"epochs": 2, "wall_time_s": 4.0}, None)
    cost = composed_cost([a, b], teacher_epochs=2, t0=time.perf_counter())
    assert cost["wall_time_s"] == pytest.approx(3.5 + 4.0 + 5.0) and cost["student_epochs"] == 4
    assert cost["teacher_forward_images"] == 10
    assert composed_cost([a, b], teacher_epochs=0, t0=time.perf_counter())["wall_time_s"] == pytest.approx(7.5)
    assert composed_cost([a], 0, t0=time.perf_counter() - 100)["wall_time_s"] >= 100  # this command took longer


def test_kd_summary_cost_is_not_less_than_its_wall_time(tiny):
    s = distill(tiny(name="kdcost", teacher={"epochs": 1}, train={"epochs": 1})).summary
    assert s["cost"]["wall_time_s"] >= s["wall_time_s"] > 0


def test_given_splits_record_the_real_dataset(tmp_path: Path) -> None:
    """A recipe given ``splits=`` records the data they were made from (not the config's default dataset),
    so the run folder can be evaluated later; its own batching is kept."""
    from teachkit.config import from_dict
    from teachkit.data import load_splits
    from teachkit.recipes.context import record_data

    splits = load_splits("synthetic", options={"shape": [4], "num_classes": 3, "n_train": 60, "n_test": 30},
                         split_seed=4)
    cfg = from_dict({"data": {"name": "digits", "batch_size": 7}})
    recorded = record_data(cfg, splits)
    assert recorded.data.name == "synthetic" and recorded.data.split_seed == 4
    assert recorded.data.options["num_classes"] == 3 and recorded.data.batch_size == 7
    by_hand = dataclasses.replace(splits, config=None)
    with pytest.raises(ConfigError, match="splits are of dataset 'synthetic' but data.name is 'digits'"):
        record_data(cfg, by_hand)


# ----------------------------------------------------------------------------- train.compile=auto, resolved


@pytest.mark.parametrize(("model", "epochs", "setting", "expected"), [
    ("resnet8", 300, "auto", True),  # 300 epochs x 7 batches >= 2,000 steps of a CPU conv net
    ("resnet8", 2, "auto", False),  # too short to pay back the compile time
    ("mlp", 300, "auto", False),  # no convolution
    ("resnet8", 2, True, True),
    ("resnet8", 300, False, False),
])
def test_the_context_resolves_compile_as_the_engine_does(tiny, model, epochs, setting, expected):
    data = {"options": {"shape": [3, 8, 8], "num_classes": 4, "n_train": 240, "n_test": 80}}
    options = {"hidden": [16]} if model == "mlp" else {}
    cfg = tiny(name=f"c-{model}-{epochs}-{setting}", model={"name": model, "options": options}, data=data,
               train={"epochs": epochs, "compile": setting})
    ctx = RunContext.open(cfg)
    assert ctx.compiles is expected
