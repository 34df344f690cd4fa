"""Paths that travel: a path written in a config or sweep file is relative to that file's folder, one typed on the
command line to the working directory; the run's config.yaml records them absolute, so eval and sweeps work from any
working directory, and a sweep checks its data and teacher files before any job starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from teachkit.cli import main
from teachkit.config import load_config, read_yaml, resolve_path, resolve_paths
from teachkit.errors import ConfigError
from teachkit.experiments.sweep import run_sweep


def write_table(path: Path, rows: int = 90) -> None:
    """A 3-class CSV table: two informative features and a label column."""
    rng = np.random.default_rng(0)
    label = np.arange(rows) % 3
    x = rng.normal(size=(rows, 2)) + label[:, None] * 2.0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a,b,label\n" + "".join(f"{p:.4f},{q:.4f},{c}\n" for (p, q), c in zip(x, label, strict=True)))


def config(root: str, **more) -> dict:
    """A config on the table at ``root`` (as written in the file): a small MLP, 2 quick epochs."""
    return {"name": "wine", "data": {"name": "csv", "root": root, "batch_size": 16, "options": {"label": "label"}},
            "model": {"name": "mlp", "options": {"hidden": [8]}}, "optim": {"lr": 0.1},
            "train": {"epochs": 2, "progress": False}, **more}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """``project/data/x.csv`` and ``project/configs/c.yaml`` naming it as ``../data/x.csv``."""
    write_table(tmp_path / "project" / "data" / "x.csv")
    (tmp_path / "project" / "configs").mkdir()
    (tmp_path / "project" / "configs" / "c.yaml").write_text(yaml.safe_dump(config("../data/x.csv")))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "third").mkdir()
    return tmp_path / "project"


def test_train_from_another_cwd_then_eval_from_a_third(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path / "elsewhere")
    out_dir = tmp_path / "runs"
    assert main(["train", str(project / "configs" / "c.yaml"), f"out_dir={out_dir}", "--quiet"]) == 0
    run = out_dir / "wine"
    recorded = read_yaml(run / "config.yaml")
    assert recorded["data"]["root"] == str(project / "data" / "x.csv")  # absolute, the file's folder's ../data
    monkeypatch.chdir(tmp_path / "third")
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    shown = json.loads(capsys.readouterr().out)
    summary = json.loads((run / "summary.json").read_text())
    assert shown["acc"] == pytest.approx(summary["test_acc"], abs=0.006)


def test_file_options_without_a_root_are_relative_to_the_file(project, tmp_path, monkeypatch, capsys):
    """``data.options.train`` with no ``data.root`` (a dataset's declared file options) resolves like data.root."""
    written = config(None)
    written["data"] = {"name": "csv", "batch_size": 16, "options": {"label": "label", "train": "../data/x.csv"}}
    (project / "configs" / "opts.yaml").write_text(yaml.safe_dump(written))
    cfg = load_config(project / "configs" / "opts.yaml")
    assert cfg.data.root is None and cfg.data.options["train"] == str(project / "data" / "x.csv")
    assert cfg.data.options["label"] == "label"  # not a declared file option: untouched
    with_root = {**written["data"], "root": "../data"}  # with a root the options stay relative to it
    (project / "configs" / "root.yaml").write_text(yaml.safe_dump({**written, "data": with_root}))
    assert load_config(project / "configs" / "root.yaml").data.options["train"] == "../data/x.csv"
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", str(project / "configs" / "opts.yaml"), f"out_dir={tmp_path / 'runs'}", "--quiet"]) == 0
    recorded = read_yaml(tmp_path / "runs" / "wine" / "config.yaml")
    assert recorded["data"]["options"]["train"] == str(project / "data" / "x.csv")


def test_override_paths_are_relative_to_the_working_directory(project, monkeypatch):
    monkeypatch.chdir(project)  # the override names data/x.csv from here; the file's own value is replaced
    cfg = load_config(project / "configs" / "c.yaml", ["data.root=data/x.csv"])
    assert cfg.data.root == "data/x.csv"  # as typed: the run records it absolute (test above), read from here


@pytest.mark.parametrize("written, expected", [
    ("../data/x.csv", "{project}/data/x.csv"),   # a separator: under the file's folder
    ("./c.yaml", "{project}/configs/c.yaml"),     # starts with '.'
    ("c.yaml", "{project}/configs/c.yaml"),       # no separator, but exists next to the file
    ("minilm-l6", "minilm-l6"),                   # a name: untouched
    ("mylab.nets:Tiny", "mylab.nets:Tiny"),       # an import path: untouched
    ("/abs/x.csv", "/abs/x.csv"),                 # absolute: untouched
    ("~/x.csv", "{home}/x.csv"),                  # ~ expands
    ("missing/x.csv", "{project}/configs/missing/x.csv"),  # missing everywhere: where it was looked for
])
def test_resolve_path_rule(project, tmp_path, monkeypatch, written, expected):
    monkeypatch.chdir(tmp_path / "elsewhere")
    got = resolve_path(written, project / "configs")
    assert got == expected.format(project=project, home=os.path.expanduser("~"))


def test_only_declared_path_fields_are_resolved(project):
    tree = {"data": {"root": "../data/x.csv", "options": {"train": "train/x.csv", "label": "label"}},
            "model": {"name": "mylab.nets:Tiny", "options": {"path": "minilm-l6"}},
            "teacher": {"checkpoint": "../runs/t", "model": {"name": "resnet20"}},
            "takd": {"assistant_checkpoint": "./a"}, "name": "x/y", "out_dir": "runs"}
    out = resolve_paths(tree, project / "configs")
    assert out["data"]["root"] == str(project / "data" / "x.csv")
    assert out["data"]["options"] == tree["data"]["options"]  # relative to data.root, as before
    assert out["model"] == tree["model"] and out["name"] == "x/y" and out["out_dir"] == "runs"
    assert out["teacher"]["checkpoint"] == str(project / "runs" / "t")
    assert out["takd"]["assistant_checkpoint"] == str(project / "configs" / "a")


def sweep_file(project: Path, root: str) -> Path:
    """A two-run sweep (no KD on two seeds) in ``project/sweeps``, its base config in ``project/configs``."""
    path = project / "sweeps" / "s.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"sweep": "paths", "base": "../configs/c.yaml", "recipe": "train",
                                    "config": {"data": {"root": root}}, "grid": {"train.seed": [0, 1]}}))
    return path


def test_sweep_from_another_cwd(project, tmp_path, monkeypatch):
    file = sweep_file(project, "../data/x.csv")  # relative to the sweep file's folder
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = run_sweep(file, out_dir=str(tmp_path / "sweeps"), quiet=True, report=False)
    assert result.ok and [j.state for j in result.plan.jobs] == ["done", "done"]
    for job in result.plan.jobs:
        assert read_yaml(job.run_dir / "config.yaml")["data"]["root"] == str(project / "data" / "x.csv")


def test_sweep_with_a_missing_file_starts_no_job(project, tmp_path, monkeypatch, capsys):
    file = sweep_file(project, "../data/nope.csv")
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as e:
        run_sweep(file, out_dir=str(tmp_path / "sweeps"), quiet=True, report=False)
    message = str(e.value)
    assert "\n" not in message and f"data.root={str(project / 'data' / 'nope.csv')!r}" in message
    assert "no run was started" in message and "(run seed=0, +1 more)" in message
    assert not (tmp_path / "sweeps" / "paths").exists()  # nothing written, nothing started
    code = main(["sweep", str(file), "--out-dir", str(tmp_path / "sweeps")])
    assert code == 2 and "nope.csv" in capsys.readouterr().err
