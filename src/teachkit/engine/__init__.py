"""The one training loop, evaluation, checkpoints and run logging."""

from teachkit.engine.checkpoint import Trajectory, load_checkpoint, save_checkpoint
from teachkit.engine.evaluate import evaluate, predict
from teachkit.engine.trainer import FitResult, fit

__all__ = ["fit", "FitResult", "evaluate", "predict", "Trajectory", "load_checkpoint", "save_checkpoint"]
