"""Train one model on labels with a single objective (``ce``, ``mse`` or ``mse-logits``)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from teachkit.config import RunConfig
from teachkit.data.base import Splits
from teachkit.engine.trainer import StepFn, Trainer
from teachkit.losses import OBJECTIVES
from teachkit.recipes.common import (
    RunResult,
    device_of,
    load_data,
    make_model,
    model_meta,
    prepare_run_dir,
    seed_everything,
)
from teachkit.recipes.registry import RECIPES


def label_step(model: nn.Module, cfg: RunConfig) -> StepFn:
    """The engine step of training ``model`` on labels with objective ``cfg.train.loss``."""
    objective = OBJECTIVES.get(cfg.train.loss)
    loss_name, smoothing = cfg.train.loss, cfg.train.label_smoothing

    def step(batch, progress):
        logits = model(batch.x)
        return {loss_name: objective(logits, batch.y, smoothing)}, logits

    return step


@RECIPES.register("train", "one model on labels with ce / mse / mse-logits (the teacher stage)")
def train_model(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
                run_dir: Path | None = None) -> RunResult:
    """Train ``cfg.model`` on ``cfg.data`` with objective ``cfg.train.loss``."""
    OBJECTIVES.get(cfg.train.loss)  # an unknown objective fails before any folder is made
    device = device_of(cfg)
    splits = splits if splits is not None else load_data(cfg.data, device)
    run_dir = prepare_run_dir(cfg, resume, run_dir)
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    model = make_model(cfg.model, splits, device)
    trainer = Trainer(model, label_step(model, cfg), splits, cfg, run_dir, meta=model_meta(cfg, splits, cfg.train.loss),
                      resume=resume, desc=cfg.name)
    while not trainer.done:
        trainer.run_epoch()
    result = trainer.finish(cost={"teacher_epochs_trained": 0, "student_epochs": cfg.train.epochs,
                                  "teacher_forward_images": 0})
    return RunResult(run_dir, result.summary, model, result.history)
