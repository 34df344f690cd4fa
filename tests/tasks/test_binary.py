"""The binary task: F1 / MCC / accuracy / CE by hand and against scikit-learn, the breast-cancer source, and
training, selection, distillation and the CLI on it through the unchanged engine and recipes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from teachkit.cli import main
from teachkit.data import DATASETS, load_raw, load_splits, splits_for
from teachkit.engine import EVALUATORS
from teachkit.engine.syncs import HostSyncCounter
from teachkit.errors import ConfigError
from teachkit.recipes import distill, load_model, train_model
from teachkit.tasks.binary import BinaryEvaluator, binary_metrics, confusion_counts
from teachkit.types import Batch
from tests.conftest import tiny_config

LN3 = math.log(3.0)
BREAST_CANCER = {"name": "breast_cancer", "options": {}, "batch_size": 32}


def logits_for(pred: list[int]) -> torch.Tensor:
    """Two logits per sample with softmax 3/4 on the predicted class: [ln 3, 0] for 0, [0, ln 3] for 1."""
    return torch.tensor([[0.0, LN3] if p == 1 else [LN3, 0.0] for p in pred])


# ---------------------------------------------------------------- metrics by hand


def test_metrics_from_a_hand_computed_confusion_matrix():
    y = [1, 1, 1, 0, 0, 0, 0, 1]
    pred = [1, 1, 0, 0, 0, 1, 0, 1]
    # TP = 3 (0, 1, 7), FN = 1 (2), FP = 1 (5), TN = 3 (3, 4, 6)
    tp, fp, fn, tn = (int(c) for c in confusion_counts(torch.tensor(pred), torch.tensor(y)))
    assert (tp, fp, fn, tn) == (3, 1, 1, 3)
    m = binary_metrics(logits_for(pred), torch.tensor(y))
    assert m["f1"] == pytest.approx(100 * 6 / 8)  # 2TP / (2TP + FP + FN) = 6 / 8
    assert m["mcc"] == pytest.approx(0.5)  # (3*3 - 1*1) / sqrt(4*4*4*4) = 8 / 16
    assert m["acc"] == pytest.approx(75.0)
    # right: -ln(3/4), wrong: -ln(1/4); 6 right, 2 wrong
    assert m["loss"] == pytest.approx((6 * math.log(4 / 3) + 2 * math.log(4)) / 8)


def test_unbalanced_hand_case():
    y = [1, 0, 0, 0, 0, 1]
    pred = [1, 1, 1, 0, 0, 0]
    # TP 1, FP 2, FN 1, TN 2: F1 = 2/5, MCC = (2 - 2) / sqrt(3*2*4*3) = 0, acc 3/6
    m = binary_metrics(logits_for(pred), torch.tensor(y))
    assert m["f1"] == pytest.approx(40.0)
    assert m["mcc"] == pytest.approx(0.0, abs=1e-12)
    assert m["acc"] == pytest.approx(50.0)
    y, pred = [1, 1, 0, 1], [1, 0, 1, 1]
    # TP 2, FP 1, FN 1, TN 0: F1 = 4/6, MCC = (0 - 1) / sqrt(3*3*1*1) = -1/3
    m = binary_metrics(logits_for(pred), torch.tensor(y))
    assert m["f1"] == pytest.approx(200 / 3)
    assert m["mcc"] == pytest.approx(-1 / 3)


@pytest.mark.parametrize("y, pred, f1, mcc, acc", [
    ([1, 0, 1, 0], [0, 0, 0, 0], 0.0, 0.0, 50.0),  # no predicted positive: F1 = 0 / 2, MCC undefined -> 0
    ([0, 0, 0], [0, 0, 0], 0.0, 0.0, 100.0),  # no true and no predicted positive: F1 0/0 -> 0, MCC -> 0
    ([0, 0, 0], [1, 0, 1], 0.0, 0.0, 100 / 3),  # no true positive: F1 = 0 / 2, MCC undefined -> 0
    ([1, 1, 1], [1, 1, 1], 100.0, 0.0, 100.0),  # one class only: perfect F1, MCC undefined -> 0
    ([1, 0, 1, 0], [1, 0, 1, 0], 100.0, 1.0, 100.0),
    ([1, 0, 1, 0], [0, 1, 0, 1], 0.0, -1.0, 0.0),
])
def test_degenerate_and_extreme_cases(y, pred, f1, mcc, acc):
    m = binary_metrics(logits_for(pred), torch.tensor(y))
    assert m["f1"] == pytest.approx(f1, abs=1e-12)
    assert m["mcc"] == pytest.approx(mcc, abs=1e-12)
    assert m["acc"] == pytest.approx(acc)
    assert all(math.isfinite(v) for v in m.values())


def test_metrics_match_scikit_learn_on_random_predictions():
    from sklearn.metrics import accuracy_score, f1_score, log_loss, matthews_corrcoef

    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        n = int(torch.randint(1, 300, (1,), generator=g))
        p_pos = float(torch.rand(1, generator=g))  # class balance from all-0 to all-1
        y = (torch.rand(n, generator=g) < p_pos).long()
        logits = torch.randn(n, 2, generator=g, dtype=torch.float64) * 2 + torch.stack([0 * y, y], 1) * trial / 20
        pred = logits.argmax(1)
        m = binary_metrics(logits, y)
        yn, pn = y.numpy(), pred.numpy()
        assert m["mcc"] == pytest.approx(matthews_corrcoef(yn, pn), abs=1e-9)
        assert m["f1"] == pytest.approx(100 * f1_score(yn, pn, zero_division=0), abs=1e-9)
        assert m["acc"] == pytest.approx(100 * accuracy_score(yn, pn), abs=1e-9)
        probs = torch.softmax(logits, 1).numpy()
        assert m["loss"] == pytest.approx(log_loss(yn, probs, labels=[0, 1]), rel=1e-6)


def test_logits_must_be_two_columns():
    with pytest.raises(ValueError, match=r"shape \(N, 2\)"):
        binary_metrics(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------- the evaluator


def test_evaluator_contract_one_host_read_per_split():
    splits = load_splits("breast_cancer")
    evaluator = EVALUATORS.get("binary")(splits, 50)
    assert isinstance(evaluator, BinaryEvaluator)
    assert evaluator.primary == "f1" and evaluator.metric_names() == ("f1", "mcc", "acc", "loss")
    assert [evaluator.direction(m) for m in ("f1", "mcc", "acc", "loss")] == ["max", "max", "max", "min"]
    model = torch.nn.Linear(30, 2)
    model.train()
    with HostSyncCounter() as counter:
        results = evaluator.evaluate(model)
    assert counter.total == 2, counter.counts  # one .tolist() per split
    assert model.training  # predict evaluates in eval mode and restores the mode
    assert set(results) == {"val", "test"} and set(results["val"]) == {"f1", "mcc", "acc", "loss"}
    # the same numbers as the metrics of the whole split's logits
    with torch.no_grad():
        expected = binary_metrics(model(splits.test.x), splits.test.y)
    assert results["test"] == pytest.approx(expected)

    batch = Batch(splits.train.x[:10], splits.train.y[:10], torch.arange(10))
    with HostSyncCounter() as counter:
        train = evaluator.train_metrics(model(batch.x), batch)
    assert counter.total == 0
    correct = int((model(batch.x).argmax(1) == batch.y).sum())
    assert float(train["train_acc"]) == pytest.approx(100.0 * correct)


def test_binary_evaluator_refuses_more_than_two_classes():
    splits = load_splits("synthetic", options={"shape": [4], "num_classes": 3, "n_train": 60, "n_test": 30})
    with pytest.raises(ConfigError, match="has task 'binary' but 3 classes"):
        EVALUATORS.get("binary")(dataclasses.replace(splits, task="binary"), 100)


# ---------------------------------------------------------------- the source


def test_breast_cancer_source():
    from sklearn.datasets import load_breast_cancer

    assert "breast_cancer" in DATASETS
    raw = load_raw("breast_cancer")
    assert raw.train_x.shape == (569, 30) and raw.train_x.dtype == torch.float32
    assert raw.train_y.dtype == torch.int64
    assert raw.test_x is None and raw.test_y is None  # teachkit carves the test split
    assert raw.num_classes == 2 and raw.task == "binary" and raw.name == "breast_cancer"
    original = np.asarray(load_breast_cancer().target)
    assert np.bincount(original).tolist() == [212, 357]  # scikit-learn: 0 = malignant, 1 = benign
    # relabelled so that the positive class (1) is malignant, the minority class
    assert torch.equal(raw.train_y, torch.tensor(1 - original))
    assert torch.bincount(raw.train_y).tolist() == [357, 212]


def test_breast_cancer_splits_are_stratified_seeded_and_standardised():
    splits = load_splits("breast_cancer")
    assert splits.task == "binary" and splits.num_classes == 2 and splits.input_shape == (30,)
    sizes = {name: len(getattr(splits, name)) for name in ("train", "val", "test")}
    assert sizes == {"train": 409, "val": 46, "test": 114}  # 20% of 569 for test, 10% of the rest for val
    for name, n in sizes.items():
        counts = torch.bincount(getattr(splits, name).y, minlength=2).tolist()
        for c, total in enumerate((357, 212)):
            assert abs(counts[c] - n * total / 569) <= 1, (name, counts)
    again = load_splits("breast_cancer")
    assert torch.equal(again.test.x, splits.test.x) and torch.equal(again.val.y, splits.val.y)
    other = load_splits("breast_cancer", split_seed=1)
    assert not torch.equal(other.test.x, splits.test.x)
    # every feature standardised with the train split's statistics
    assert splits.train.x.mean(0).abs().max() < 1e-4
    assert (splits.train.x.std(0, unbiased=False) - 1).abs().max() < 1e-4


# ---------------------------------------------------------------- engine and recipes, unchanged


def history(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def first_best(values: list[float], maximise: bool) -> int:
    """1-based epoch of the first best value (the engine keeps the earlier epoch on ties)."""
    best = max(values) if maximise else min(values)
    return values.index(best) + 1


def test_train_selects_on_validation_f1(tiny):
    cfg = tiny(name="bc", data=BREAST_CANCER, model={"name": "mlp", "options": {"hidden": [4]}},
               optim={"name": "sgd", "lr": 0.01, "schedule": "cosine"}, train={"epochs": 5, "progress": False})
    result = train_model(cfg)
    s = result.summary
    assert s["select_metric"] == "f1"
    for key in ("val_f1", "test_f1", "best_val_f1", "test_f1_at_best", "val_mcc", "test_mcc", "val_acc", "test_loss"):
        assert math.isfinite(s[key]), key
    records = history(result.run_dir)
    f1s = [r["val"]["f1"] for r in records]
    assert s["best_epoch"] == first_best(f1s, maximise=True)
    assert s["best_val_f1"] == max(f1s)
    assert s["test_f1_at_best"] == records[s["best_epoch"] - 1]["test"]["f1"]
    assert all(0 <= r["train_acc"] <= 100 for r in records)
    # best.safetensors holds that epoch's weights
    model, state = load_model(result.run_dir, "best")
    assert state["epoch"] == s["best_epoch"]
    again = EVALUATORS.get("binary")(splits_for(cfg.data), 1000).evaluate(model)
    assert again["val"]["f1"] == pytest.approx(s["best_val_f1"], abs=1e-9)


def test_select_metric_mcc_and_loss(tiny):
    base = {"data": BREAST_CANCER, "model": {"name": "mlp", "options": {"hidden": [4]}},
            "optim": {"name": "sgd", "lr": 0.01, "schedule": "cosine"}}
    mcc = train_model(tiny(name="mcc", train={"epochs": 4, "progress": False, "select_metric": "mcc"}, **base))
    mccs = [r["val"]["mcc"] for r in history(mcc.run_dir)]
    assert mcc.summary["select_metric"] == "mcc" and mcc.summary["best_val_mcc"] == max(mccs)
    assert mcc.summary["best_epoch"] == first_best(mccs, maximise=True)
    assert -1 <= mcc.summary["test_mcc_at_best"] <= 1

    loss = train_model(tiny(name="loss", train={"epochs": 4, "progress": False, "select_metric": "loss"}, **base))
    losses = [r["val"]["loss"] for r in history(loss.run_dir)]
    assert loss.summary["select_metric"] == "loss" and loss.summary["best_val_loss"] == min(losses)
    assert loss.summary["best_epoch"] == first_best(losses, maximise=False)


def test_unknown_select_metric_is_one_line_error(tiny):
    cfg = tiny(name="bleu", data=BREAST_CANCER, train={"epochs": 1, "progress": False, "select_metric": "bleu"})
    with pytest.raises(ConfigError) as e:
        train_model(cfg)
    message = str(e.value)
    assert "\n" not in message
    assert "'bleu'" in message and "f1, mcc, acc, loss" in message


def test_distill_mlp_from_mlp(tiny):
    cfg = tiny(name="bc-kd", data=BREAST_CANCER, train={"epochs": 2, "progress": False},
               teacher={"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2})
    result = distill(cfg)
    s = result.summary
    assert s["select_metric"] == "f1" and math.isfinite(s["best_val_f1"]) and math.isfinite(s["test_f1_at_best"])
    assert set(history(result.run_dir)[-1]["train"]) == {"ce", "kd", "loss"}
    teacher = json.loads((result.run_dir / "teacher" / "summary.json").read_text())
    assert teacher["select_metric"] == "f1"


# ---------------------------------------------------------------- command line


def test_cli_train_prints_f1_and_eval_reads_it(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "teachkit.cli", *args], capture_output=True, text=True,
                              env=env, timeout=300)

    proc = cli("train", str(path), "name=bc", "data.name=breast_cancer", "data.options={}", "train.epochs=3",
               "--quiet")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("train finished") and "val f1 " in line and "test f1 " in line, line
    run = tmp_path / "runs" / "bc"
    summary = json.loads((run / "summary.json").read_text())
    assert f"val f1 {summary['val_f1']:.4g}" in line
    proc = cli("eval", str(run))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["dataset"] == "breast_cancer" and out["f1"] == pytest.approx(summary["test_f1"], abs=0.005)


def test_cli_lists_the_task(capsys):
    assert main(["list", "evaluators"]) == 0
    assert "binary" in capsys.readouterr().out
    assert main(["list", "datasets"]) == 0
    assert "breast_cancer" in capsys.readouterr().out
