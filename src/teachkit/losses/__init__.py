"""Objectives for one model (``OBJECTIVES``) and distillation losses (``LOSSES``)."""

from teachkit.losses import kd  # noqa: F401  (registers itself)
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.objectives import OBJECTIVES, cross_entropy, logit_mse, softmax_mse
from teachkit.losses.registry import LOSSES

__all__ = ["DistillLoss", "Progress", "OBJECTIVES", "LOSSES", "cross_entropy", "softmax_mse", "logit_mse"]
