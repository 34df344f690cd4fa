"""``teachkit predict`` and ``teachkit export`` (with ONNX parity where onnx is installed), and their bad inputs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import teachkit
from teachkit.cli import main
from tests.predict.helpers import accuracy, breast_cancer_csv, summary, train_run, write_images


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmd")
    df = breast_cancer_csv(folder / "bc.csv")
    df[df.split == "test"].to_csv(folder / "test.csv", index=False)
    table = train_run(folder, {"name": "csv", "root": str(folder / "bc.csv"), "batch_size": 64,
                               "options": {"label": "diagnosis"}}, {"name": "mlp", "options": {"hidden": [16]}},
                      name="table")
    write_images(folder / "images", per_class=12)
    image = train_run(folder, {"name": "image_folder", "root": str(folder / "images"), "batch_size": 8,
                               "options": {"size": 8, "channels": 1}}, {"name": "lenet"}, name="image")
    return folder, df, table, image


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_predict_writes_one_row_per_input(runs, capsys) -> None:
    folder, df, table, _ = runs
    assert main(["predict", str(table), str(folder / "test.csv"), "--out", str(folder / "p.csv"), "--proba"]) == 0
    rows = read_csv(folder / "p.csv")
    test = df[df.split == "test"]
    assert list(rows[0]) == ["row", "prediction", "benign", "malignant"] and len(rows) == len(test)
    assert rows[0]["row"] == "1" and rows[-1]["row"] == str(len(test))
    assert accuracy([r["prediction"] for r in rows], test.diagnosis) == pytest.approx(
        summary(table)["test_acc_at_best"], abs=1e-4)
    assert all(abs(float(r["benign"]) + float(r["malignant"]) - 1) < 1e-5 for r in rows)
    capsys.readouterr()
    assert main(["predict", str(table), str(folder / "test.csv"), "--select", "last"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "row,prediction" and len(lines) == len(test) + 1


def test_predict_an_image_folder(runs, capsys) -> None:
    folder, _, _, image = runs
    assert main(["predict", str(image), str(folder / "images" / "test")]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert list(rows[0]) == ["file", "prediction"] and len(rows) == 6
    truth = [r["file"].split("/")[0] for r in rows]
    assert accuracy([r["prediction"] for r in rows], truth) == pytest.approx(
        summary(image)["test_acc_at_best"], abs=1e-4)


@pytest.mark.parametrize("args, match", [
    (["{table}", "{folder}/missing.csv"], "input '.*missing.csv' does not exist"),
    (["{table}", "{folder}/test.csv", "--out", "{folder}/no/such/p.csv"], "--out .*: its folder .* does not exist"),
    (["{table}", "{folder}/test.csv", "--out", "{folder}"], "is a folder; give a file name"),
    (["{folder}/nothing", "{folder}/test.csv"], "does not exist \\(expected a run folder"),
    (["{table}", "{folder}/images"], "is a folder; expected one of"),
    (["{table}", "{folder}/bad.csv"], "input has no feature column 'mean_radius'"),
    (["{image}", "{folder}/bad.png"], "cannot decode image"),
    (["{image}", "{folder}/test.csv"], "is not an image"),
])
def test_bad_predict_inputs_are_one_line(runs, capsys, args, match) -> None:
    folder, _, table, image = runs
    (folder / "bad.csv").write_text("a,b\n1,2\n")
    (folder / "bad.png").write_bytes(b"\x89PNG broken")
    argv = [a.format(folder=folder, table=table, image=image) for a in args]
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    import re

    assert re.search(match, err), err


def test_export_is_loadable_without_the_run_folder(runs, tmp_path: Path, capsys) -> None:
    folder, df, table, _ = runs
    copy = tmp_path / "copy"
    shutil.copytree(table, copy)
    assert main(["export", str(copy), str(tmp_path / "exp")]) == 0
    exp = tmp_path / "exp"
    assert sorted(p.name for p in exp.iterdir()) == ["README.md", "config.json", "model.json", "model.safetensors"]
    config = json.loads((exp / "config.json").read_text())
    assert config["model"]["name"] == "mlp" and config["preprocessing"]["labels"] == ["benign", "malignant"]
    assert config["preprocessing"]["feature_names"][0] == "mean_radius" and "normalisation" in config["preprocessing"]
    card = (exp / "README.md").read_text()
    assert "task: classification" in card and "teachkit.load" in card and "no teacher recorded" in card
    assert f"{summary(table)['test_acc_at_best']:.2f}%" in card
    shutil.rmtree(copy)
    test = df[df.split == "test"]
    predicted = teachkit.load(exp).predict(test)
    assert accuracy(predicted, test.diagnosis) == pytest.approx(summary(table)["test_acc_at_best"], abs=1e-4)
    assert main(["predict", str(exp), str(folder / "test.csv")]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert [r["prediction"] for r in rows] == predicted


def test_export_refuses_a_non_empty_folder_unless_forced(runs, tmp_path: Path, capsys) -> None:
    _, _, table, _ = runs
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "keep.txt").write_text("x")
    assert main(["export", str(table), str(tmp_path / "exp")]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "exp" / "keep.txt").is_file()
    assert main(["export", str(table), str(tmp_path / "exp"), "--force"]) == 0
    assert not (tmp_path / "exp" / "keep.txt").exists() and (tmp_path / "exp" / "model.safetensors").is_file()
    assert main(["export", str(table), str(table / "checkpoints" / ".."), "--force"]) == 2
    assert "holds the run being exported" in capsys.readouterr().err
    assert not list(tmp_path.glob(".exp.*"))  # no temporary folder left behind


@pytest.mark.parametrize("which", ["table", "image"])
def test_onnx_parity(runs, tmp_path: Path, which: str) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    folder, df, table, image = runs
    run = table if which == "table" else image
    assert main(["export", str(run), str(tmp_path / "exp"), "--onnx"]) == 0
    predictor = teachkit.load(tmp_path / "exp")
    if which == "table":
        raw = df[predictor.state["feature_names"]].to_numpy(np.float32)[:50]
    else:
        files, _ = predictor.read_inputs(folder / "images" / "test")
        raw = predictor.decode_all(files).numpy()
    session = ort.InferenceSession(str(tmp_path / "exp" / "model.onnx"))
    (logits,) = session.run(["logits"], {"input": raw})
    assert logits.shape == (len(raw), 2)
    np.testing.assert_allclose(logits, predictor.scores(raw if which == "table" else files), atol=1e-5, rtol=0)


def test_onnx_missing_is_one_line(runs, tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", str(runs[2]), str(tmp_path / "exp"), "--onnx"]) == 2
    err = capsys.readouterr().err
    assert "--onnx needs the packages onnx, onnxscript (onnxscript missing): pip install 'teachkit[onnx]'" in err
    assert not (tmp_path / "exp").exists()
