"""Evaluators: how a task measures a model. Classification (top-1, top-5, CE, omitted/kept classes) here.

A task registers an evaluator factory ``(splits, batch_size) -> Evaluator`` in :data:`EVALUATORS` under
its name; a recipe picks the one named by ``splits.task``. The engine only sees the
:class:`~teachkit.types.Evaluator` interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit import distributed
from teachkit.data.base import Splits, TensorSplit
from teachkit.registry import Registry
from teachkit.types import Batch, Evaluator

EvaluatorFactory = Callable[[Splits, int], Evaluator]
EVALUATORS: Registry[EvaluatorFactory] = Registry("evaluator")


@torch.no_grad()
def predict(model: nn.Module, split: TensorSplit, batch_size: int = 1000) -> Tensor:
    """Logits of ``model`` (in eval mode) for every sample of ``split``, in order.

    Under ``torchrun`` every process must call it: each predicts its contiguous 1/world of the rows
    (:func:`~teachkit.distributed.shard_bounds`) and every process gets all of them back, gathered in rank order."""
    start, stop = distributed.shard_bounds(len(split), distributed.world_size(), distributed.rank())
    was_training = model.training
    model.eval()
    try:
        outs = [model(split.x[i:min(i + batch_size, stop)]).float() for i in range(start, stop, batch_size)]
        if not outs and len(split) and distributed.world_size() > 1:  # fewer rows than processes: none here
            outs = [model(split.x[:1]).float()[:0]]  # the gather needs the output's shape
    finally:
        model.train(was_training)
    local = torch.cat(outs) if outs else torch.empty(0)
    return distributed.all_gather_cat(local) if len(split) else local


def metrics_from_logits(logits: Tensor, y: Tensor, omitted: tuple[int, ...] = ()) -> dict[str, float]:
    """Top-1 % and CE; top-5 % for C >= 20; with ``omitted`` classes also ``acc_omitted`` / ``acc_kept``.

    Computed on the logits' device and read back with one host transfer (percentages are scaled on the host)."""
    hit = (logits.argmax(1) == y).float()
    names, values = ["acc", "loss"], [hit.mean(), F.cross_entropy(logits, y)]
    if omitted:
        mask = torch.zeros(logits.shape[1], dtype=torch.bool, device=y.device)
        mask[list(omitted)] = True
        is_omitted = mask[y].float()
        nan = torch.tensor(float("nan"), device=y.device)
        for name, sel in (("acc_omitted", is_omitted), ("acc_kept", 1 - is_omitted)):
            count = sel.sum()
            names.append(name)
            values.append(torch.where(count > 0, (hit * sel).sum() / count.clamp(min=1), nan))
    if logits.shape[1] >= 20:
        top5 = logits.topk(5, dim=1).indices
        names.append("top5")
        values.append((top5 == y[:, None]).any(1).float().mean())
    host = torch.stack([v.float() for v in values]).tolist()
    return {name: v if name == "loss" else v * 100 for name, v in zip(names, host, strict=True)}


def evaluate(model: nn.Module, split: TensorSplit, batch_size: int = 1000,
             omitted: tuple[int, ...] = ()) -> dict[str, float]:
    """{"acc": top-1 %, "loss": mean CE, "top5": % (C >= 20 only), "acc_omitted"/"acc_kept" (zero-/few-shot
    runs)} of ``model`` on ``split``."""
    return metrics_from_logits(predict(model, split, batch_size), split.y, omitted)


class SplitScoreEvaluator(Evaluator):
    """An evaluator that predicts each named split and scores the outputs with :meth:`score`: a task adds
    its metric names (``metrics``), ``primary`` metric, directions and ``score(outputs, y) -> metrics``."""

    metrics: tuple[str, ...] = ()

    def __init__(self, splits: dict[str, TensorSplit], batch_size: int = 1000) -> None:
        self.splits = dict(splits)
        self.batch_size = batch_size

    def metric_names(self) -> tuple[str, ...]:
        return self.metrics

    def score(self, outputs: Tensor, y: Tensor) -> dict[str, float]:
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {name: self.score(predict(model, split, self.batch_size), split.y)
                for name, split in self.splits.items()}


class ClassificationEvaluator(Evaluator):
    """Top-1 accuracy (%, the primary metric), mean CE, top-5 (%) for >= 20 classes and, for zero-/few-shot
    runs, the accuracy on the omitted and the kept classes, on each named split (``val``, ``test``)."""

    primary = "acc"

    def __init__(self, splits: Mapping[str, TensorSplit], num_classes: int, batch_size: int = 1000,
                 omitted: tuple[int, ...] = ()) -> None:
        self.splits = dict(splits)
        self.num_classes = num_classes
        self.batch_size = batch_size
        self.omitted = tuple(omitted)

    def metric_names(self) -> tuple[str, ...]:
        names = ("acc", "loss") + (("acc_omitted", "acc_kept") if self.omitted else ())
        return names + (("top5",) if self.num_classes >= 20 else ())

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {name: evaluate(model, split, self.batch_size, self.omitted) for name, split in self.splits.items()}

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: 100 x the number of correct top-1 predictions (the engine divides by the samples)."""
        return {"train_acc": (outputs.detach().argmax(1) == batch.y).sum() * 100.0}


@EVALUATORS.register("classification", "top-1 / top-5 accuracy and CE on val and test")
def classification(splits: Splits, batch_size: int) -> Evaluator:
    return ClassificationEvaluator({"val": splits.val, "test": splits.test}, splits.num_classes, batch_size,
                                   splits.omitted)
