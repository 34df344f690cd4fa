"""Binary classification, measured as GLUE measures its two-class tasks: F1 of the positive class and
accuracy (MRPC, QQP), Matthews correlation (CoLA); plus the Wisconsin breast-cancer data as a source.

Metrics of a split, from the confusion counts of the argmax predictions (positive class = label 1):

- ``f1``: 100 * 2 TP / (2 TP + FP + FN), the positive class's F1 in %; 0 when there is no true and no
  predicted positive (the denominator is 0), as ``sklearn.metrics.f1_score(zero_division=0)``;
- ``mcc``: (TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN)), in [-1, 1]; 0 when a factor of
  the denominator is 0 (all predictions or all labels in one class), as ``sklearn.metrics.matthews_corrcoef``;
- ``acc``: 100 * (TP + TN) / N;
- ``loss``: mean cross-entropy of the two logits.

``f1`` is the primary metric (the checkpoint is selected on validation F1 unless ``train.select_metric``
says otherwise); ``loss`` is minimised, every other metric maximised. A model for this task outputs two
logits (``num_classes=2``). Everything is computed on the logits' device and read back with one host
transfer per split.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.data.base import Splits
from teachkit.data.raw import DATASETS, RawDataset, require
from teachkit.engine.evaluate import EVALUATORS, SplitScoreEvaluator
from teachkit.errors import ConfigError
from teachkit.types import Batch, Evaluator

METRICS = ("f1", "mcc", "acc", "loss")


def confusion_counts(pred: Tensor, y: Tensor, dtype: torch.dtype = torch.float64) -> tuple[Tensor, ...]:
    """(TP, FP, FN, TN) of predictions ``pred`` against labels ``y`` (both 0/1), as 0-dim ``dtype``
    tensors on their device (no host sync)."""
    pred, y = pred.bool(), y.bool()
    tp = (pred & y).sum()
    fp = (pred & ~y).sum()
    fn = (~pred & y).sum()
    tn = (~pred & ~y).sum()
    return tuple(c.to(dtype) for c in (tp, fp, fn, tn))


def binary_metrics(logits: Tensor, y: Tensor) -> dict[str, float]:
    """{"f1": %, "mcc": [-1, 1], "acc": %, "loss": mean CE} of two-class ``logits`` (N, 2) against labels
    ``y`` (N,) in {0, 1} (see the module docstring); one host transfer."""
    if logits.dim() != 2 or logits.shape[1] != 2:
        raise ValueError(f"binary metrics need logits of shape (N, 2), got {tuple(logits.shape)}")
    # float64 counts keep TP*TN - FP*FN exact for any realistic split; MPS has no float64
    dtype = torch.float32 if logits.device.type == "mps" else torch.float64
    tp, fp, fn, tn = confusion_counts(logits.argmax(1), y, dtype)
    zero = torch.zeros((), dtype=dtype, device=logits.device)
    f1_den = 2 * tp + fp + fn
    f1 = torch.where(f1_den > 0, 2 * tp / f1_den.clamp(min=1), zero)
    # the product of four square roots, not the root of the product: no overflow for large counts
    mcc_den = (tp + fp).sqrt() * (tp + fn).sqrt() * (tn + fp).sqrt() * (tn + fn).sqrt()
    mcc = torch.where(mcc_den > 0, (tp * tn - fp * fn) / mcc_den.clamp(min=1), zero)
    acc = (tp + tn) / (tp + fp + fn + tn)
    loss = F.cross_entropy(logits.float(), y).to(dtype)
    f1_v, mcc_v, acc_v, loss_v = torch.stack([f1, mcc, acc, loss]).tolist()
    return {"f1": f1_v * 100, "mcc": mcc_v, "acc": acc_v * 100, "loss": loss_v}


class BinaryEvaluator(SplitScoreEvaluator):
    """F1 of class 1 (%, primary), Matthews correlation, accuracy (%) and mean CE on each named split."""

    primary = "f1"

    metrics = METRICS

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "min" if metric == "loss" else "max"

    def score(self, outputs: Tensor, y: Tensor) -> dict[str, float]:
        return binary_metrics(outputs, y)

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: 100 x the number of correct predictions (the engine divides by the samples)."""
        return {"train_acc": (outputs.detach().argmax(1) == batch.y).sum() * 100.0}


@EVALUATORS.register("binary", "two classes: F1 of class 1 (primary), Matthews correlation, accuracy, CE on val and "
                               "test")
def binary(splits: Splits, batch_size: int) -> Evaluator:
    if splits.num_classes != 2:
        raise ConfigError(f"dataset {splits.name!r} has task 'binary' but {splits.num_classes} classes; "
                          "binary tasks have exactly 2")
    return BinaryEvaluator({"val": splits.val, "test": splits.test}, batch_size)


@DATASETS.register("breast_cancer", "Wisconsin diagnostic breast cancer (scikit-learn): 569 x 30 features, "
                                    "1 = malignant; binary task, offline, 20% test carved")
def breast_cancer(root: str | None = None) -> RawDataset:
    """UCI Wisconsin diagnostic breast cancer as shipped by scikit-learn (``load_breast_cancer``): 569
    samples, 30 real-valued features (raw scales; teachkit standardises each feature on the train split).

    Relabelled: 1 = malignant (212), 0 = benign (357). scikit-learn codes malignant as 0, but F1 scores
    the positive class, and the positive class here is the one a diagnosis looks for, the malignant one,
    which is also the minority class (37%); F1 of the benign majority would mostly restate accuracy.
    """
    datasets = require("sklearn.datasets", "breast_cancer", "scikit-learn")
    bunch = datasets.load_breast_cancer()
    x = torch.tensor(np.asarray(bunch.data, dtype=np.float32))
    y = torch.tensor(1 - np.asarray(bunch.target, dtype=np.int64))  # sklearn: 0 = malignant, 1 = benign
    return RawDataset(x, y, None, None, num_classes=2, default_augment="none", task="binary", name="breast_cancer")
