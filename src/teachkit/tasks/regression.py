"""Regression: real-valued targets (task ``regression``), measured by squared and absolute error and R^2.

A regression dataset (``arrays``, ``csv`` or ``parquet`` with ``task: regression``) has float32 targets
(N,) or (N, d); its ``num_classes`` is the model's output width d (1 for (N,) targets). Train on them
with ``train.loss=l2``. Metrics of a split, from the model's outputs ``p`` (N, d) and targets ``t``:

- ``mse``: mean over samples and outputs of (p - t)^2 (primary, minimised);
- ``mae``: mean of |p - t| (minimised);
- ``r2``: coefficient of determination 1 - SS_res / SS_tot per output, averaged over outputs (as
  ``sklearn.metrics.r2_score``'s ``uniform_average``); an output with constant targets scores 1 when
  predicted exactly and 0 otherwise (sklearn's ``force_finite``). Maximised.

Targets are not rescaled: errors are in the units of the data. Computed on the outputs' device with one
host transfer per split.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from teachkit.data.base import Splits
from teachkit.engine.evaluate import EVALUATORS, SplitScoreEvaluator
from teachkit.errors import ConfigError
from teachkit.types import Batch, Evaluator

METRICS = ("mse", "mae", "r2")


def as_columns(outputs: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Outputs (N, d) and targets as float (N, d): (N,) targets are one column; ValueError when widths differ."""
    target = y.float().reshape(len(y), -1)
    pred = outputs.float().reshape(len(outputs), -1)
    if pred.shape != target.shape:
        raise ValueError(f"regression outputs {tuple(outputs.shape)} do not match targets {tuple(y.shape)}")
    return pred, target


def regression_metrics(outputs: Tensor, y: Tensor) -> dict[str, float]:
    """{"mse", "mae", "r2"} of ``outputs`` (N, d) against targets ``y`` (N,) or (N, d) (module docstring)."""
    pred, target = as_columns(outputs, y)
    err = pred - target
    ss_res = err.pow(2).sum(0)
    ss_tot = (target - target.mean(0)).pow(2).sum(0)
    exact = (ss_res == 0).float()
    r2 = torch.where(ss_tot > 0, 1 - ss_res / ss_tot.clamp(min=1e-30), exact).mean()
    mse, mae, r2_v = torch.stack([err.pow(2).mean(), err.abs().mean(), r2]).tolist()
    return {"mse": mse, "mae": mae, "r2": r2_v}


class RegressionEvaluator(SplitScoreEvaluator):
    """Mean squared error (primary, minimised), mean absolute error and R^2 on each named split."""

    primary = "mse"

    metrics = METRICS

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "max" if metric == "r2" else "min"

    def score(self, outputs: Tensor, y: Tensor) -> dict[str, float]:
        return regression_metrics(outputs, y)

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_mse``: the batch's summed per-sample squared error (the engine divides by the samples)."""
        pred, target = as_columns(outputs.detach(), batch.y)
        return {"train_mse": (pred - target).pow(2).mean(1).sum()}


@EVALUATORS.register("regression", "real-valued targets: mean squared error (primary), mean absolute error, R^2 on "
                                   "val and test")
def regression(splits: Splits, batch_size: int) -> Evaluator:
    if not splits.train.y.is_floating_point():
        raise ConfigError(f"dataset {splits.name!r} has task 'regression' but integer labels; regression needs "
                          "real-valued targets")
    return RegressionEvaluator({"val": splits.val, "test": splits.test}, batch_size)
