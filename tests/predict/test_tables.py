"""Table predictors end to end: train on a raw CSV, load the run, predict raw rows with the run's accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import teachkit
from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.errors import DataError
from teachkit.predict.tables import TablePredictor
from tests.predict.helpers import accuracy, breast_cancer_csv, summary, train_run


@pytest.fixture(scope="module")
def bc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bc")
    df = breast_cancer_csv(folder / "bc.csv")
    run = train_run(folder, {"name": "csv", "root": str(folder / "bc.csv"), "batch_size": 64,
                             "options": {"label": "diagnosis"}}, {"name": "mlp", "options": {"hidden": [16]}})
    return folder, df, run


def test_raw_rows_score_the_runs_own_test_accuracy(bc) -> None:
    _, df, run = bc
    predictor = teachkit.load(run)
    assert isinstance(predictor, TablePredictor) and not predictor.model.training
    assert isinstance(predictor.model, torch.nn.Module) and predictor.class_names == ["benign", "malignant"]
    test = df[df.split == "test"]
    predicted = predictor.predict(test)
    assert set(predicted) <= {"benign", "malignant"}  # the CSV's own label strings
    assert len(test) == 114 and accuracy(predicted, test.diagnosis) == pytest.approx(
        summary(run)["test_acc_at_best"], abs=1e-4)
    last = teachkit.load(run, select="last").predict(test)
    assert accuracy(last, test.diagnosis) == pytest.approx(summary(run)["test_acc"], abs=1e-4)
    # the bare module on raw features is the bug this fixes: it needs normalised inputs
    features = torch.tensor(test[predictor.state["feature_names"]].to_numpy(np.float32))
    bare = predictor.model(features).argmax(1).numpy()
    assert accuracy(np.array(predictor.class_names)[bare], test.diagnosis) < 50.0


def test_rows_as_dicts_arrays_paths_and_probabilities(bc) -> None:
    folder, df, run = bc
    predictor = teachkit.load(run)
    rows = df[df.split == "test"].head(7)
    expected = predictor.predict(rows)
    columns = predictor.state["feature_names"]
    assert len(columns) == 30 and "patient" not in columns and "split" not in columns
    assert predictor.predict(rows[columns[::-1]]) == expected  # columns found by name, not position
    assert predictor.predict(rows.to_dict("records")) == expected
    assert predictor.predict(rows[columns].to_numpy()) == expected
    rows.to_csv(folder / "seven.csv", index=False)
    assert predictor.predict(folder / "seven.csv") == expected
    proba = predictor.predict_proba(rows)
    assert proba.shape == (7, 2) and np.allclose(proba.sum(1), 1.0, atol=1e-6)
    assert [predictor.class_names[i] for i in proba.argmax(1)] == expected


@pytest.mark.parametrize("change, match", [
    (lambda df: df.drop(columns=["mean_area"]), "input has no feature column 'mean_area'"),
    (lambda df: df.assign(mean_texture=["x1", *df.mean_texture[1:].tolist()]),
     "input feature column 'mean_texture' holds 'x1' in row 1"),
    (lambda df: df.assign(worst_area=[*df.worst_area[:2].tolist(), None, *df.worst_area[3:].tolist()]),
     "input feature column 'worst_area' holds a missing value in row 3"),
])
def test_bad_rows_are_one_line_errors(bc, change, match) -> None:
    _, df, run = bc
    predictor = teachkit.load(run)
    rows = df.head(5).reset_index(drop=True)
    with pytest.raises(DataError, match=match):
        predictor.predict(change(rows))


def test_wrong_width_array_is_an_error(bc) -> None:
    predictor = teachkit.load(bc[2])
    with pytest.raises(DataError, match=r"inputs have shape \(2, 29\); the model reads rows of 30 features"):
        predictor.predict(np.zeros((2, 29)))
    with pytest.raises(DataError, match="row 2, feature 4"):
        predictor.predict(np.array([[0.0] * 30, [0.0] * 3 + [np.inf] + [0.0] * 26]))


def test_old_checkpoint_without_names_gives_class_ids(bc, tmp_path: Path) -> None:
    """A checkpoint written before class_names / feature_names / task: columns rebuilt from the data section
    (numeric, not label or split), labels are integer class ids."""
    _, df, run = bc
    tensors, state = load_checkpoint(run / "checkpoints" / "best.safetensors")
    old = {k: v for k, v in state.items() if k not in ("class_names", "feature_names", "task")}
    save_checkpoint(tmp_path / "old.safetensors", tensors, old)
    predictor = teachkit.load(tmp_path / "old.safetensors")
    assert predictor.class_names is None and predictor.task == "classification"
    assert predictor.labels == ["0", "1"]
    test = df[df.split == "test"]
    ids = predictor.predict(test)
    assert all(isinstance(i, int) for i in ids)
    names = teachkit.load(run).predict(test)
    assert [["benign", "malignant"][i] for i in ids] == names
