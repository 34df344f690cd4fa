"""The Python API: teachkit.train / distill / run / load write normal run folders from Python objects."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import teachkit
from teachkit.api import data_section, dotted_tree, model_section
from teachkit.cli import main
from teachkit.config import read_yaml
from teachkit.errors import ConfigError


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return x[:600].astype(np.float32), y[:600]


def small(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], 16), nn.ReLU(), nn.Linear(16, num_classes))


def test_train_then_distill_from_arrays(tmp_path: Path, digits) -> None:
    """The ten-line route: arrays in, two run folders out, the data saved once and reused."""
    x, y = digits
    teacher = teachkit.train(small, (x, y), loss="mse", epochs=2, lr=0.1, out_dir=tmp_path, quiet=True)
    student = teachkit.distill(lambda: nn.Linear(64, 10), teacher, (x, y), method="kd", epochs=2,
                               out_dir=tmp_path, quiet=True)
    assert teacher.run_dir == tmp_path / "train-small" and student.run_dir == tmp_path / "kd-model"
    assert len(list((tmp_path / "_data").glob("*.npz"))) == 1  # the same arrays are stored once
    cfg = read_yaml(student.run_dir / "config.yaml")
    assert cfg["data"]["name"] == "arrays" and cfg["teacher"]["checkpoint"] == str(teacher.run_dir)
    assert cfg["train"]["loss"] == "ce" and cfg["kd"]["method"] == "kd"
    assert 0 <= student.summary["test_acc"] <= 100 and len(student.history) == 2
    assert isinstance(student.model, nn.Linear)
    assert "test acc" in repr(student)
    best = student.load("best")
    assert not best.training and isinstance(best, nn.Linear)
    again = teachkit.train(small, (x, y), epochs=1, out_dir=tmp_path, quiet=True)
    assert again.run_dir.name == "train-small-2"  # a taken name is numbered, never overwritten


def test_importable_factory_runs_are_evaluated_from_the_cli(tmp_path: Path, digits, monkeypatch, capsys) -> None:
    (tmp_path / "tk_api_nets.py").write_text(textwrap.dedent('''
        from torch import nn

        class Net(nn.Module):
            def __init__(self, input_shape, num_classes, hidden=8):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(input_shape[0], hidden), nn.ReLU())
                self.fc = nn.Linear(hidden, num_classes)

            def forward(self, x):
                return self.fc(self.body(x))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import tk_api_nets

        x, y = digits
        run = teachkit.train(tk_api_nets.Net, (x, y), epochs=1, out_dir=tmp_path / "runs", quiet=True)
        assert read_yaml(run.run_dir / "config.yaml")["model"]["name"] == "tk_api_nets:Net"
        capsys.readouterr()
        assert main(["eval", str(run.run_dir)]) == 0
        assert '"split": "test"' in capsys.readouterr().out
    finally:
        sys.modules.pop("tk_api_nets", None)


def test_given_splits_dataset_names_and_instances(tmp_path: Path, digits) -> None:
    x, y = digits
    section = data_section({"train": (x[:400], y[:400]), "test": (torch.tensor(x[400:]), torch.tensor(y[400:]))},
                           tmp_path)
    assert section["name"] == "arrays" and set(section["options"]) == {"train", "test"}
    assert data_section("digits", tmp_path) == {"name": "digits"}
    net = nn.Linear(64, 10)
    name = model_section(net)["name"]
    assert name.endswith("@python") and model_section(net)["name"] == name  # one name per object
    run = teachkit.train(net, {"train": (x[:400], y[:400]), "test": (x[400:], y[400:])}, epochs=1,
                         out_dir=tmp_path, quiet=True, overrides={"optim.weight_decay": 0.0, "train.seed": 3})
    cfg = read_yaml(run.run_dir / "config.yaml")
    assert cfg["optim"]["weight_decay"] == 0.0 and cfg["train"]["seed"] == 3
    assert not torch.equal(run.model.weight, net.weight)  # the given instance is copied, not trained in place


def test_run_prokd_on_a_recorded_teacher(tmp_path: Path, digits) -> None:
    x, y = digits
    teacher = teachkit.train(small, (x, y), epochs=2, out_dir=tmp_path, quiet=True,
                             overrides={"train.save_every": 1})
    student = teachkit.run("prokd", student=lambda: nn.Linear(64, 10), teacher_trajectory=teacher, data=(x, y),
                           epochs=3, out_dir=tmp_path, quiet=True, options={"mode": "replay", "stage_epochs": 1})
    assert student.summary["plan"]["mode"] == "replay" and student.run_dir.name == "prokd-model"


@pytest.mark.parametrize("call, match", [
    (lambda d, o: teachkit.train(nn.Linear(64, 10), 5, out_dir=o), "data must be"),
    (lambda d, o: teachkit.train(nn.Linear(64, 10), (d[0], d[1][:10]), out_dir=o), "same number of rows"),
    (lambda d, o: teachkit.train(nn.Linear(64, 10), {"val": d}, out_dir=o), "needs a 'train' split"),
    (lambda d, o: teachkit.train(3, d, out_dir=o), "model must be a model name"),
    (lambda d, o: teachkit.run("prokd", student="mlp", data=d, teacher="mlp", teacher_trajectory="mlp",
                               out_dir=o), "not both"),
    (lambda d, o: teachkit.train("mlp", d, out_dir=o, overrides={"optim..lr": 1}), "dotted names"),
    (lambda d, o: teachkit.train("mlp", d, out_dir=o, overrides={"optim.nope": 1}), "optim.nope"),
])
def test_bad_arguments_are_one_line_config_errors(tmp_path: Path, digits, call, match) -> None:
    with pytest.raises(ConfigError, match=match):
        call(digits, tmp_path)


def test_dotted_tree() -> None:
    assert dotted_tree({"optim.lr": 0.1, "model.options": {"hidden": [8]}}) == \
        {"optim": {"lr": 0.1}, "model": {"options": {"hidden": [8]}}}


def test_float_targets_train_a_regression(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    y = x @ torch.arange(1.0, 6.0)  # float targets: a regression
    run = teachkit.train(lambda: nn.Linear(5, 1), (x, y), loss="l2", epochs=3, lr=0.05, out_dir=tmp_path, quiet=True)
    # var(y) = 1 + 4 + ... + 25 = 55: three epochs of a linear model explain most of it
    assert run.summary["select_metric"] == "mse" and run.summary["best_val_mse"] < 20.0 and run.summary["val_r2"] > 0.6
    assert read_yaml(run.run_dir / "config.yaml")["data"]["options"]["task"] == "regression"


def test_a_trained_module_is_used_as_the_teacher_as_it_is(tmp_path: Path, digits) -> None:
    """A teacher given as an nn.Module instance is frozen as given (not retrained); its training data is
    unknown, so the run says so in its summary."""
    x, y = digits
    trained = teachkit.train(small, (x, y), epochs=2, out_dir=tmp_path, quiet=True)
    student = teachkit.distill(lambda: nn.Linear(64, 10), trained.model, (x, y), epochs=1, out_dir=tmp_path,
                               quiet=True)
    assert not (student.run_dir / "teacher").exists()  # nothing trained in the run
    assert "records no data settings" in student.summary["teacher_overlap_allowed"]
    assert any("records no data settings" in w for w in student.summary["warnings"])
    frozen = teachkit.load_model(read_yaml(student.run_dir / "config.yaml")["teacher"]["checkpoint"], "last")
    assert all(torch.equal(a, b) for a, b in zip(frozen.state_dict().values(), trained.model.state_dict().values(),
                                                 strict=True))
