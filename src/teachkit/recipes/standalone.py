"""Train one model on labels with a single objective (``ce``, ``mse`` or ``mse-logits``)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from teachkit.config import RunConfig, TrainConfig
from teachkit.data import Splits
from teachkit.engine import StepFn
from teachkit.losses import OBJECTIVES
from teachkit.recipes.common import RunResult
from teachkit.recipes.context import RunContext
from teachkit.recipes.registry import RECIPES
from teachkit.types import StepOutput


def label_step(model: nn.Module, train: TrainConfig) -> StepFn:
    """The engine step of training ``model`` on labels with objective ``train.loss``."""
    objective = OBJECTIVES.get(train.loss)
    loss_name, smoothing = train.loss, train.label_smoothing

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({loss_name: objective(logits, batch.y, smoothing)}, logits)

    return step


@RECIPES.register("train", "one model on labels with ce / mse / mse-logits (the teacher stage)")
def train_model(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
                run_dir: Path | None = None) -> RunResult:
    """Train ``cfg.model`` on ``cfg.data`` with objective ``cfg.train.loss``."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    ctx.seed()
    model = ctx.model()
    trainer = ctx.trainer(model, label_step(model, cfg.train), meta=ctx.meta(cfg.train.loss))
    while not trainer.done:
        trainer.run_epoch()
    result = trainer.finish(cost={"teacher_epochs_trained": 0, "student_epochs": cfg.train.epochs,
                                  "teacher_forward_images": 0})
    return RunResult(ctx.run_dir, result.summary, model, result.history)
