"""Objectives for one model (``OBJECTIVES``) and distillation losses (``LOSSES``)."""

from teachkit.losses import kd  # noqa: F401  (each distillation loss module registers itself)
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.distiller import Distiller, build_distiller
from teachkit.losses.objectives import OBJECTIVES, cross_entropy, logit_mse, softmax_mse
from teachkit.losses.registry import LOSSES

__all__ = ["DistillLoss", "Distiller", "build_distiller", "Progress", "OBJECTIVES", "LOSSES",
           "cross_entropy", "softmax_mse", "logit_mse"]
