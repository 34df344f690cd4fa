"""The one training loop, its options, evaluators, checkpoints and run logging."""

from teachkit.engine.callbacks import CALLBACKS, StepInfo, register_callback
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

__all__ = ["CALLBACKS", "EVALUATORS", "Callback", "ClassificationEvaluator", "EpochHooks", "FitResult", "LoopConfig",
           "OptimConfig", "StepFn", "StepInfo", "Trainer", "Trajectory", "build_optimizer", "evaluate", "fit",
           "load_checkpoint", "predict", "register_callback", "resolve_device", "save_checkpoint"]
