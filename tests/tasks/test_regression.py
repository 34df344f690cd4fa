"""The regression task: mse / mae / r2 by hand and against scikit-learn, the l2 objective, and training and
evaluating through the CLI on a CSV with real-valued targets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from teachkit.cli import main
from teachkit.data import TensorSplit
from teachkit.engine import EVALUATORS
from teachkit.errors import ConfigError
from teachkit.losses import OBJECTIVES
from teachkit.tasks.regression import RegressionEvaluator, regression_metrics
from teachkit.types import Batch
from tests.conftest import tiny_config


def test_metrics_hand_computed() -> None:
    pred = torch.tensor([[1.0], [2.0], [4.0]])
    y = torch.tensor([1.0, 3.0, 2.0])  # errors 0, -1, 2; mean of y = 2, SS_tot = 1 + 1 + 0 = 2
    m = regression_metrics(pred, y)
    assert m["mse"] == pytest.approx(5 / 3) and m["mae"] == pytest.approx(1.0)
    assert m["r2"] == pytest.approx(1 - 5 / 2)


def test_metrics_match_scikit_learn_with_two_outputs() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    y, pred = torch.randn(50, 2, generator=g), torch.randn(50, 2, generator=g)
    m = regression_metrics(pred, y)
    assert m["mse"] == pytest.approx(metrics.mean_squared_error(y.numpy(), pred.numpy()), rel=1e-5)
    assert m["mae"] == pytest.approx(metrics.mean_absolute_error(y.numpy(), pred.numpy()), rel=1e-5)
    assert m["r2"] == pytest.approx(metrics.r2_score(y.numpy(), pred.numpy()), rel=1e-5)
    constant = torch.ones(4)
    assert regression_metrics(constant[:, None], constant)["r2"] == 1.0
    assert regression_metrics(constant[:, None] * 2, constant)["r2"] == 0.0


def test_evaluator_directions_and_train_metric() -> None:
    split = TensorSplit(torch.randn(8, 3), torch.randn(8))
    ev = RegressionEvaluator({"val": split, "test": split})
    assert ev.primary == "mse" and ev.metric_names() == ("mse", "mae", "r2")
    assert [ev.direction(m) for m in ("mse", "mae", "r2")] == ["min", "min", "max"]
    assert not ev.is_percent("mse") and not ev.is_percent("r2")
    out = ev.evaluate(nn.Linear(3, 1))
    assert set(out) == {"val", "test"} and set(out["val"]) == {"mse", "mae", "r2"}
    batch = Batch(torch.zeros(2, 3), torch.tensor([1.0, 3.0]), torch.arange(2))
    assert ev.train_metrics(torch.tensor([[0.0], [1.0]]), batch)["train_mse"].item() == pytest.approx(1 + 4)
    assert "regression" in EVALUATORS


def test_l2_objective() -> None:
    l2 = OBJECTIVES.get("l2")
    z = torch.tensor([[1.0, 0.0], [2.0, 2.0]], requires_grad=True)
    assert l2(z, torch.tensor([[0.0, 0.0], [2.0, 0.0]])).item() == pytest.approx((1 + 4) / 4)
    assert l2(z[:, :1], torch.tensor([0.0, 0.0])).item() == pytest.approx((1 + 4) / 2)
    with pytest.raises(ConfigError, match="loss 'l2' needs real-valued targets"):
        l2(z, torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="do not match targets"):
        l2(z, torch.tensor([0.0, 1.0]))
    with pytest.raises(ConfigError, match="loss 'ce' needs class labels"):
        OBJECTIVES.get("ce")(z, torch.tensor([0.0, 1.0]))


def write_regression_csv(path: Path, n: int = 120) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.05 * rng.normal(size=n)
    rows = "".join(f"{a:.5f},{b:.5f},{c:.5f},{t:.5f},{'train' if i % 5 else 'test'}\n"
                   for i, ((a, b, c), t) in enumerate(zip(x, y, strict=True)))
    path.write_text("a,b,c,target,split\n" + rows)


def test_cli_train_and_eval_on_a_regression_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_regression_csv(tmp_path / "houses.csv")
    data = {"name": "csv", "root": str(tmp_path / "houses.csv"), "batch_size": 16,
            "options": {"label": "target", "task": "regression"}}
    cfg = tiny_config(tmp_path, data=data, optim={"name": "adamw", "lr": 0.02, "schedule": "constant"},
                      train={"epochs": 8, "progress": False, "loss": "l2"})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "name=reg", "--quiet"]) == 0, capsys.readouterr().err
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("train finished") and "val mse " in line and "test mse " in line, line
    summary = json.loads((tmp_path / "runs" / "reg" / "summary.json").read_text())
    assert summary["test_r2"] > 0.7 and summary["test_mse"] < 1.5, summary  # var(y) ~ 5.25
    assert main(["eval", str(tmp_path / "runs" / "reg")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mse"] == pytest.approx(summary["test_mse"], rel=1e-3)  # printed to 4 significant digits


@pytest.mark.parametrize("command, overrides, fragment", [
    (["train"], ["train.loss=ce"], "train.loss=ce does not fit dataset 'csv' (task regression): real-valued targets "
                                   "need train.loss=l2"),
    (["distill"], [], "distillation needs class scores, but dataset 'csv' has real-valued targets"),
    (["train"], ["data.name=digits", "data.root=null", "data.options={}"],
     "l2 is for real-valued targets (task regression); use ce, mse or mse-logits"),
])
def test_objective_must_fit_the_task(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
                                     overrides: list[str], fragment: str) -> None:
    write_regression_csv(tmp_path / "houses.csv")
    data = {"name": "csv", "root": str(tmp_path / "houses.csv"), "options": {"label": "target", "task": "regression"}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, data=data, train={"epochs": 1, "loss": "l2"})))
    assert main([*command, str(path), *overrides, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
