"""The one training loop, its options, evaluators, checkpoints and run logging."""

from teachkit.engine.checkpoint import Trajectory, load_checkpoint, save_checkpoint
from teachkit.engine.evaluate import EVALUATORS, ClassificationEvaluator, evaluate, predict
from teachkit.engine.optim import OptimConfig, build_optimizer
from teachkit.engine.trainer import (
    Callback,
    EpochHooks,
    FitResult,
    LoopConfig,
    StepFn,
    Trainer,
    fit,
    resolve_device,
)

__all__ = ["EVALUATORS", "Callback", "ClassificationEvaluator", "EpochHooks", "FitResult", "LoopConfig",
           "OptimConfig", "StepFn", "Trainer", "Trajectory", "build_optimizer", "evaluate", "fit", "load_checkpoint",
           "predict", "resolve_device", "save_checkpoint"]
