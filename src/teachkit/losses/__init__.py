"""Objectives for one model (``OBJECTIVES``) and distillation losses (``LOSSES``)."""

from teachkit.losses import (  # each distillation loss module registers itself
    at,  # noqa: F401
    cc,  # noqa: F401
    crd,  # noqa: F401
    dkd,  # noqa: F401
    fitnet,  # noqa: F401
    hsakd,  # noqa: F401
    kd,  # noqa: F401
    pkt,  # noqa: F401
    reviewkd,  # noqa: F401
    rkd,  # noqa: F401
    sp,  # noqa: F401
    vid,  # noqa: F401
)
from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.distiller import Distiller, build_distiller
from teachkit.losses.objectives import OBJECTIVES, cross_entropy, logit_mse, softmax_mse
from teachkit.losses.registry import LOSSES

__all__ = ["DistillLoss", "Distiller", "build_distiller", "Progress", "OBJECTIVES", "LOSSES",
           "cross_entropy", "softmax_mse", "logit_mse"]
