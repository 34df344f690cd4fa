"""Objectives for training one model on labels (the teacher or a student without KD).

ECCV 2024 "How to Train the Teacher Model for Effective Knowledge Distillation" (Hamidi et al.):
a teacher trained with MSE between its softmax output and the one-hot label estimates the Bayes
class-probability vector p*(y|x), which is what bounds the student's error (their Eq. 3/Theorem 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.registry import Registry
from teachkit.types import upcast

Objective = Callable[..., Tensor]
OBJECTIVES: Registry[Objective] = Registry("loss")


def _class_labels(loss: str, y: Tensor) -> None:
    """ConfigError when ``y`` holds real values (a regression dataset) instead of class ids."""
    if y.is_floating_point():
        raise ConfigError(f"loss {loss!r} needs class labels, but the dataset's targets are real-valued "
                          "(task regression); use train.loss=l2")


def _targets(y: Tensor, num_classes: int, label_smoothing: float, dtype: torch.dtype = torch.float32) -> Tensor:
    onehot = F.one_hot(y, num_classes).to(dtype)
    if label_smoothing > 0:
        onehot = onehot * (1 - label_smoothing) + label_smoothing / num_classes
    return onehot


@OBJECTIVES.register("ce", "cross-entropy on labels (optionally label-smoothed)")
def cross_entropy(logits: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean over the batch of -log softmax(z)_y."""
    _class_labels("ce", y)
    return F.cross_entropy(upcast(logits), y, label_smoothing=label_smoothing)


@OBJECTIVES.register("mse", "ECCV 2024 MSE teacher: sum_c (onehot - softmax)^2, mean over batch")
def softmax_mse(logits: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """sum_i (onehot(y)_i - softmax(z)_i)^2 summed over classes, averaged over the batch.

    Note ``F.mse_loss`` would also average over the C classes (C times smaller gradients).
    """
    _class_labels("mse", y)
    p = upcast(logits).softmax(dim=1)
    return (p - _targets(y, logits.shape[1], label_smoothing, p.dtype)).pow(2).sum(dim=1).mean()


@OBJECTIVES.register("mse-logits", "ablation: sum_c (onehot - logits)^2 on raw logits, mean over batch")
def logit_mse(logits: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Squared error of raw logits against the one-hot vector (summed over classes, batch mean)."""
    _class_labels("mse-logits", y)
    z = upcast(logits)
    return (z - _targets(y, logits.shape[1], label_smoothing, z.dtype)).pow(2).sum(dim=1).mean()


@OBJECTIVES.register("l2", "squared error on real-valued targets (task regression), mean over batch and outputs")
def squared_error(outputs: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """mean_{i,j} (outputs_ij - y_ij)^2 for targets ``y`` (N,) (one output) or (N, d), as the ``mse`` metric
    of the regression evaluator."""
    if not y.is_floating_point():
        raise ConfigError("loss 'l2' needs real-valued targets (a dataset with task regression); for class labels "
                          "use ce or mse")
    if label_smoothing:
        raise ConfigError(f"train.label_smoothing={label_smoothing} applies to class labels, not to loss 'l2'")
    z = upcast(outputs)
    target = y.to(z.dtype).reshape(len(y), -1)
    if z.reshape(len(z), -1).shape != target.shape:
        raise ConfigError(f"loss 'l2': model outputs {tuple(outputs.shape[1:])} per sample do not match targets "
                          f"{tuple(y.shape[1:]) or (1,)}")
    return F.mse_loss(z.reshape(len(z), -1), target)
