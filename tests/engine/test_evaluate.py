"""The classification evaluator: metrics against hand-computed values, training metrics, directions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from teachkit.data.base import TensorSplit
from teachkit.engine import EVALUATORS, ClassificationEvaluator
from teachkit.engine.evaluate import metrics_from_logits, predict
from teachkit.types import Batch, Evaluator


def test_accuracy_loss_and_omitted_classes_by_hand():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 1, 2])  # rows 0 and 1 correct
    m = metrics_from_logits(logits, y, omitted=(1,))
    assert m["acc"] == pytest.approx(50.0)
    ce = [math.log(sum(math.exp(v) for v in row)) - row[t] for row, t in zip(logits.tolist(), y.tolist(), strict=True)]
    assert m["loss"] == pytest.approx(sum(ce) / 4, rel=1e-6)
    assert m["acc_omitted"] == pytest.approx(50.0) and m["acc_kept"] == pytest.approx(50.0)  # class 1: rows 1, 2
    assert "top5" not in m  # fewer than 20 classes
    none_omitted = metrics_from_logits(logits, torch.tensor([0, 0, 0, 0]), omitted=(1,))
    assert math.isnan(none_omitted["acc_omitted"]) and none_omitted["acc_kept"] == pytest.approx(50.0)  # rows 0, 3


def test_top5_from_20_classes():
    logits = torch.arange(20.0).repeat(2, 1)  # ranking 19, 18, 17, 16, 15, ...
    m = metrics_from_logits(logits, torch.tensor([15, 14]))
    assert m["top5"] == pytest.approx(50.0) and m["acc"] == 0.0


class Fixed(nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[x[:, 0].long()] + 0 * self.dummy


def test_evaluator_batches_every_split_and_restores_the_mode():
    logits = torch.randn(10, 4)
    y = torch.randint(0, 4, (10,))
    x = torch.arange(10.0)[:, None]
    split = TensorSplit(x, y)
    ev = ClassificationEvaluator({"val": split, "test": split}, num_classes=4, batch_size=3)
    model = Fixed(logits).train()
    out = ev.evaluate(model)
    assert model.training and set(out) == {"val", "test"}
    assert out["val"] == out["test"] == metrics_from_logits(logits, y)
    assert ev.metric_names() == ("acc", "loss") and ev.primary == "acc"
    assert ev.direction("acc") == "max" and ev.direction("loss") == "min"
    wide = ClassificationEvaluator({"val": split}, num_classes=100, omitted=(3,))
    assert wide.metric_names() == ("acc", "loss", "acc_omitted", "acc_kept", "top5")


def test_train_metrics_are_device_sums():
    ev = ClassificationEvaluator({}, num_classes=3)
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    stats = ev.train_metrics(logits, Batch(torch.zeros(3, 1), torch.tensor([0, 1, 2]), torch.arange(3)))
    assert set(stats) == {"train_acc"} and isinstance(stats["train_acc"], torch.Tensor)
    assert stats["train_acc"].item() == pytest.approx(200.0)  # 2 correct x 100; the engine divides by samples


def test_registry_and_default_directions():
    assert "classification" in EVALUATORS
    base = Evaluator()
    assert [base.direction(m) for m in ("acc", "f1", "bleu", "loss", "val_loss", "error", "rmse")] == \
        ["max", "max", "max", "min", "min", "min", "min"]


@pytest.mark.parametrize(("rows", "world"), [(10, 3), (2, 3), (7, 2)])
def test_each_process_predicts_its_shard_and_the_gathered_metrics_equal_one_process(monkeypatch, rows, world):
    """``world`` processes simulated one after the other: each model call sees only the process's shard, and the
    gather (every process's rows in rank order) scores exactly as one process does."""
    from teachkit import distributed

    logits, y = torch.randn(rows, 4), torch.randint(0, 4, (rows,))
    split = TensorSplit(torch.arange(float(rows))[:, None], y)
    one = ClassificationEvaluator({"val": split}, num_classes=4, batch_size=2).evaluate(Fixed(logits))
    model = Fixed(logits)
    seen: list[int] = []
    model.register_forward_hook(lambda m, args, out: seen.extend(args[0][:, 0].long().tolist()))
    shards: dict[int, torch.Tensor] = {}
    monkeypatch.setattr(distributed, "world_size", lambda: world)
    for rank in range(world):  # first pass: what each process predicts for itself
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        monkeypatch.setattr(distributed, "all_gather_cat", lambda t, rank=rank: shards.setdefault(rank, t))
        seen.clear()
        predict(model, split, batch_size=2)
        start, stop = distributed.shard_bounds(rows, world, rank)
        assert seen == list(range(start, stop)) or (start == stop and len(seen) == 1)  # an empty shard: a shape probe
        assert shards[rank].shape == (stop - start, 4)
    monkeypatch.setattr(distributed, "all_gather_cat", lambda t: torch.cat([shards[r] for r in range(world)]))
    for rank in range(world):  # second pass: the gathered outputs, scored on every process
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        assert ClassificationEvaluator({"val": split}, num_classes=4, batch_size=2).evaluate(model) == one
