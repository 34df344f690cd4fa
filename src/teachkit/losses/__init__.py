"""Objectives for one model (``OBJECTIVES``) and distillation losses (``LOSSES``).

Every distillation loss implements :class:`DistillLoss` and registers itself with its typed options;
:func:`build_objective` combines the configured ones into a :class:`DistillObjective` (the student's
full loss), and :func:`needs_of` says which taps of the student and the teacher they read.
"""

from teachkit.losses.base import DistillLoss, Progress
from teachkit.losses.label_losses import OBJECTIVES, cross_entropy, logit_mse, softmax_mse
from teachkit.losses.objective import DistillObjective, KDConfig, build_objective, needs_of
from teachkit.losses.registry import LOSSES
from teachkit.registry import import_all

import_all(__name__, __path__)  # every loss module registers itself

__all__ = ["DistillLoss", "DistillObjective", "KDConfig", "build_objective", "needs_of", "Progress", "OBJECTIVES",
           "LOSSES", "cross_entropy", "softmax_mse", "logit_mse"]
