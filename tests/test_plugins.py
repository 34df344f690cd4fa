"""Plugins: modules outside teachkit that register models and datasets, named by ``plugins:``, ``--plugin`` or
``TEACHKIT_PLUGINS``, imported before the config is validated and recorded in the run's config.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from teachkit.cli import main

PLUGIN = '''"""A tiny teachkit plugin: one model, one dataset."""
import torch
from torch import nn

from teachkit.data.raw import DATASETS, RawDataset
from teachkit.models import MODELS


@MODELS.register("{prefix}_linear", "a linear classifier from a plugin")
def linear(input_shape, num_classes, scale: float = 1.0):
    n = 1
    for d in input_shape:
        n *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(n, num_classes))


@DATASETS.register("{prefix}_blobs", "two Gaussian blobs in 6 dimensions, from a plugin")
def blobs(root=None, n: int = 120):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 1, 6, generator=g) + 2.0 * y.view(-1, 1, 1).float()
    yt = torch.arange(40) % 2
    xt = torch.randn(40, 1, 6, generator=g) + 2.0 * yt.view(-1, 1, 1).float()
    return RawDataset(x, y, xt, yt, num_classes=2)
'''


def write_plugin(folder: Path, module: str) -> None:
    (folder / f"{module}.py").write_text(PLUGIN.format(prefix=module))


def plugin_config(tmp_path: Path, module: str, **top) -> Path:
    cfg = {"name": "p", "out_dir": str(tmp_path / "runs"), **top,
           "data": {"name": f"{module}_blobs", "batch_size": 32, "options": {"n": 100}},
           "model": {"name": f"{module}_linear"}, "optim": {"lr": 0.05}, "train": {"epochs": 2, "progress": False}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(*args: str, pythonpath: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(pythonpath), os.getcwd()]),
            **env}
    full.pop("TEACHKIT_PLUGINS", None) if "TEACHKIT_PLUGINS" not in env else None
    return subprocess.run([sys.executable, "-m", "teachkit.cli", *args], capture_output=True, text=True, env=full,
                          timeout=300)


def test_train_with_plugin_then_eval_and_resume_find_it_in_the_run_folder(tmp_path):
    module = "tkplug_cli"
    write_plugin(tmp_path, module)
    cfg = plugin_config(tmp_path, module)
    proc = run_cli("train", str(cfg), "--plugin", module, "--quiet", pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("train finished: ") and proc.stdout.count("\n") == 1, proc.stdout
    run = tmp_path / "runs" / "p"
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == [module]
    summary = json.loads((run / "summary.json").read_text())
    # eval names no plugin: the run's config.yaml does, and is imported only with --trust-code (code read from disk)
    for target in (run, run / "checkpoints" / "last.safetensors"):
        proc = run_cli("eval", str(target), pythonpath=tmp_path)
        assert proc.returncode == 2 and f"names plugin '{module}'" in proc.stderr and "--trust-code" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        proc = run_cli("eval", str(target), "--trust-code", pythonpath=tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["checkpoint"] == str(run / "checkpoints" / "last.safetensors") and out["epoch"] == 2
        assert out["acc"] == pytest.approx(summary["test_acc"], abs=0.006) and out["acc"] == round(out["acc"], 2)
        assert "evaluating the model: " in proc.stderr and "(epoch 2)" in proc.stderr
        assert "teacher" not in proc.stderr + proc.stdout
    # --resume without --plugin: the recorded plugins are imported again when trusted, and the config matches
    proc = run_cli("train", str(cfg), "--resume", "--quiet", pythonpath=tmp_path)
    assert proc.returncode == 2 and f"names plugin '{module}'" in proc.stderr, proc.stderr
    proc = run_cli("train", str(cfg), "--resume", "--quiet", "--trust-code", pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # without the recorded config the model name is unknown: one line naming it
    (run / "config.yaml").unlink()
    proc = run_cli("eval", str(run), pythonpath=tmp_path)
    assert proc.returncode == 2 and f"unknown model '{module}_linear'" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = run_cli("eval", str(run), "--quiet", "--plugin", module, pythonpath=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.count("\n") == 1, proc.stderr


def test_plugins_from_the_environment_and_list(tmp_path):
    module = "tkplug_env"
    write_plugin(tmp_path, module)
    proc = run_cli("list", "models", pythonpath=tmp_path, TEACHKIT_PLUGINS=f" {module} ,")
    assert proc.returncode == 0 and f"  {module}_linear " in proc.stdout, proc.stderr
    proc = run_cli("list", "datasets", "--plugin", module, pythonpath=tmp_path)
    assert proc.returncode == 0 and f"  {module}_blobs " in proc.stdout, proc.stderr
    proc = run_cli("list", pythonpath=tmp_path, TEACHKIT_PLUGINS="tkplug_missing")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "plugin 'tkplug_missing' cannot be imported: ModuleNotFoundError" in proc.stderr


def test_plugins_key_in_the_config_in_process(tmp_path, monkeypatch, capsys):
    module = "tkplug_inproc"
    write_plugin(tmp_path, module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TEACHKIT_PLUGINS", raising=False)
    cfg = plugin_config(tmp_path, module, plugins=[module])
    assert main(["train", str(cfg), "--quiet"]) == 0
    assert yaml.safe_load((tmp_path / "runs" / "p" / "config.yaml").read_text())["plugins"] == [module]
    monkeypatch.setenv("TEACHKIT_PLUGINS", "json")  # an extra plugin on top of the config's: recorded too
    assert main(["train", str(cfg), "name=q", "--plugin", "json", "--quiet"]) == 0
    assert yaml.safe_load((tmp_path / "runs" / "q" / "config.yaml").read_text())["plugins"] == [module, "json"]
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "q"), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and json.loads(out.out)["dataset"] == f"{module}_blobs"
