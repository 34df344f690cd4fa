"""Objectives for one model (``OBJECTIVES``) and distillation losses (``LOSSES``).

Every distillation loss implements :class:`DistillLoss` and registers itself with its typed options;
:func:`build_objective` combines the configured ones into a :class:`DistillObjective` (the student's
full loss), and :func:`needs_of` says which taps of the student and the teacher they read.
"""

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
from teachkit.losses.label_losses import OBJECTIVES, cross_entropy, logit_mse, softmax_mse
from teachkit.losses.objective import DistillObjective, KDConfig, build_objective, needs_of
from teachkit.losses.registry import LOSSES

__all__ = ["DistillLoss", "DistillObjective", "KDConfig", "build_objective", "needs_of", "Progress", "OBJECTIVES",
           "LOSSES", "cross_entropy", "softmax_mse", "logit_mse"]
