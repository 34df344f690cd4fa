"""``teachkit.load`` returns a predictor (``load_model`` / ``Run.load`` the bare module) for array runs; the
generic predictor for checkpoints that record no data; regression values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import teachkit
from teachkit.predict.generic import ArrayPredictor
from teachkit.predict.tables import TablePredictor

FP32 = {"train.precision": "fp32"}


def test_array_run_predictor_and_bare_module(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    data = {"train": (x[:1400], y[:1400]), "test": (x[1400:], y[1400:])}
    run = teachkit.train(lambda: nn.Linear(64, 10), data, epochs=2, out_dir=tmp_path, quiet=True, overrides=FP32)
    predictor = run.predictor()
    assert isinstance(predictor, TablePredictor) and predictor.class_names is None
    predicted = predictor.predict(x[1400:])  # raw pixel counts 0..16, as given to train
    assert all(isinstance(p, int) for p in predicted)  # integer labels: class ids back
    acc = 100.0 * float(np.mean(np.asarray(predicted) == y[1400:]))
    assert acc == pytest.approx(run.summary["test_acc_at_best"], abs=1e-4) and acc > 50
    assert isinstance(run.load(), nn.Linear) and isinstance(teachkit.load_model(run.run_dir), nn.Linear)
    assert torch.equal(teachkit.load(run).model.weight, run.load().weight)


def test_regression_predicts_values(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g) * 10 + 5
    y = (x[:, 0] - 2 * x[:, 1]).float()
    data = {"train": (x[:150], y[:150]), "val": (x[150:175], y[150:175]), "test": (x[175:], y[175:])}
    run = teachkit.train(lambda: nn.Linear(3, 1), data, loss="l2", epochs=3, lr=0.01, out_dir=tmp_path, quiet=True,
                         overrides=FP32)
    predictor = teachkit.load(run, select="last")
    values = predictor.predict(x[:4])
    assert predictor.task == "regression" and predictor.labels is None and all(isinstance(v, float) for v in values)
    mean, std = x[:150].mean(0), x[:150].std(0, unbiased=False)
    expected = predictor.model((x[:4] - mean) / std).flatten().tolist()  # hand-normalised with the train statistics
    assert values == pytest.approx(expected, abs=1e-4)
    with pytest.raises(teachkit.errors.CheckpointError, match="regression model has no class probabilities"):
        predictor.predict_proba(x[:2])


def test_a_checkpoint_without_data_gets_the_generic_predictor(tmp_path: Path) -> None:
    from teachkit.api import save_trained_module

    x, y = torch.randn(40, 5), torch.arange(40) % 2
    module = nn.Linear(5, 2)
    path = save_trained_module(module, {"name": "arrays", "root": str(tmp_path / "_data"),
                                        "options": {"train": _save(tmp_path, x, y)}}, tmp_path)
    predictor = teachkit.load(path)
    assert isinstance(predictor, ArrayPredictor) and predictor.labels == ["0", "1"]
    assert predictor.predict(x[:3]) == module(x[:3]).argmax(1).tolist()  # nothing recorded: inputs as given


def _save(tmp_path: Path, x: torch.Tensor, y: torch.Tensor) -> str:
    (tmp_path / "_data").mkdir()
    np.savez(tmp_path / "_data" / "d.npz", x=x.numpy(), y=y.numpy())
    return "d.npz"
