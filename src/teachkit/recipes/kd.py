"""Two-stage KD: a frozen teacher (from a checkpoint or trained first in the same run), then a student.

The student's loss is the ``kd`` section's :class:`~teachkit.losses.DistillObjective` (CE plus weighted
distillation losses). Training stages a method needs first (HSAKD's teacher heads) run through the engine
in their own sub-folder, with exact resume, before the student starts.

After the first epoch, a distillation term whose mean is more than 100x the CE term's is a warning: the
paper gammas were tuned for CIFAR ResNets and break small students (FitNet's gamma 100 collapsed an MLP
to the majority class).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from teachkit.config import RunConfig
from teachkit.data import Splits
from teachkit.engine import Callback, OptimConfig, Trainer, load_checkpoint
from teachkit.engine.checkpoint import strip, write_json
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, DistillLoss, DistillObjective, build_objective, needs_of
from teachkit.models import Tapped
from teachkit.options import from_mapping
from teachkit.recipes.common import RunResult, folder_wall_time
from teachkit.recipes.context import RunContext
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TEACHER_DIR, TeacherSource, declare_teacher_use
from teachkit.recipes.teacher_cache import TeacherOutputs, run_teacher_outputs
from teachkit.types import StepOutput, TrainingStage

#: a distillation term this many times the CE term in the first epoch is warned about
DOMINANCE = 100.0


def dominant_terms(train: dict[str, float], methods: list[str], limit: float = DOMINANCE) -> list[str]:
    """Warnings for distillation methods whose (weighted) terms' epoch mean exceeds ``limit`` x the CE term's;
    ``train`` is an epoch record's per-term means (``ce``, ``fitnet``, ``crd.s``, ...)."""
    ce = train.get("ce")
    if not isinstance(ce, float) or not ce > 0:
        return []
    out = []
    for method in methods:
        value = sum(v for k, v in train.items() if k == method or k.startswith(f"{method}."))
        if value > limit * ce:
            out.append(f"in epoch 1 the {method} term (mean {value:.4g}) is {value / ce:,.0f}x the CE term "
                       f"({ce:.4g}): its weight may swamp the labels for this student (paper gammas break small "
                       f"students); consider a smaller kd.gamma.{method}")
    return out


class FirstEpochCheck(Callback):
    """Warns after epoch 1 when a distillation term dwarfs the CE term (:func:`dominant_terms`)."""

    def __init__(self, methods: list[str]) -> None:
        self.methods = methods

    def on_epoch_end(self, trainer: Trainer, record: dict) -> None:
        if record.get("epoch") == 1:
            for message in dominant_terms(record.get("train", {}), self.methods):
                trainer.warn(message)


def build_distill_objective(ctx: RunContext, student: nn.Module,
                            teacher: nn.Module) -> tuple[DistillObjective, Tapped, Tapped]:
    """The objective for ``kd.method``, built from probed taps of one dummy batch (2 samples, eval mode);
    each side is asked only for the taps the methods read of it."""
    student_needs, teacher_needs = needs_of(ctx.cfg.kd.methods)
    s_tap, t_tap = Tapped(student, want=student_needs), Tapped(teacher, want=teacher_needs)
    probe = ctx.splits.train.x[:2]
    with torch.no_grad():
        was = student.training
        student.eval()
        s_probe, t_probe = s_tap(probe), t_tap(probe)
        student.train(was)
    objective = build_objective(ctx.cfg.kd, s_probe, t_probe, num_classes=ctx.splits.num_classes,
                                num_samples=len(ctx.splits.train), teacher_model=t_tap)
    return objective.to(ctx.device), s_tap, t_tap


def check_tokenizers(ctx: RunContext) -> None:
    """Methods comparing token-level tensors (hidden states, attention maps) need one tokenizer for teacher and
    student: a one-line ConfigError when the data carries the teacher's own tokenisation."""
    options = ctx.cfg.data.options or {}
    if not options.get("teacher_tokenizer"):
        return
    token_level = [m for m in ctx.cfg.kd.methods if LOSSES.get(m).token_level]
    if token_level:
        raise ConfigError(f"kd.method={token_level[0]} compares token-level tensors, so teacher and student need one "
                          f"tokenizer, but data.options.teacher_tokenizer={options['teacher_tokenizer']!r} differs "
                          f"from data.options.tokenizer={options.get('tokenizer')!r}; use a logit method (kd, dkd, "
                          "...) or one tokenizer")


def cached_teacher(ctx: RunContext, t_tap: Tapped, objective: DistillObjective) -> TeacherOutputs:
    """The frozen teacher's outputs for the student's batches: cached once when ``teacher.cache`` and the run
    allow it, per epoch for augmented views (:mod:`teachkit.recipes.teacher_cache`; the trainer takes
    ``outputs.callbacks()``), else computed per batch."""
    transforms = any(type(m).transform_batch is not DistillLoss.transform_batch for m in objective.methods.values())
    return run_teacher_outputs(ctx, t_tap, needs_of(ctx.cfg.kd.methods)[1], transforms, views=True)


def teacher_forward_cost(outputs: TeacherOutputs, trainer: Trainer) -> dict[str, int]:
    """Teacher forwards done this session and saved by the cache (the per-batch forwards it replaced)."""
    return {"teacher_forward_images": outputs.forwards,
            "teacher_forwards_saved": outputs.forwards_saved(trainer.samples_seen)}


def run_stage(ctx: RunContext, stage: TrainingStage) -> None:
    """Train ``stage`` through the engine in ``run_dir/<stage.name>`` (resumed exactly after a crash), or
    load it when that folder holds a finished stage; then ``stage.finish()``."""
    folder = ctx.run_dir / stage.name
    last = folder / "checkpoints" / "last.safetensors"
    if (folder / "summary.json").is_file() and last.is_file():
        tensors, _ = load_checkpoint(last)
        for name, module in stage.modules.items():
            module.load_state_dict(strip(f"{name}/", tensors))
    else:
        splits = ctx.full_splits() if stage.data == "full" else ctx.splits
        optim = from_mapping(OptimConfig, stage.optim, f"{stage.name}.optim")
        evaluator = stage.evaluator(splits, ctx.cfg.data.eval_batch_size)
        trainer = Trainer(stage.modules, stage.step, ctx.batches(splits, stage.batch_size), optim, evaluator, folder,
                          loop=ctx.loop(epochs=stage.epochs, save_every=0, select_metric=None, select_mode="auto"),
                          meta={"stage": stage.name},
                          resume=ctx.resume, desc=f"{ctx.cfg.name} {stage.name}")
        while not trainer.done:
            trainer.run_epoch()
        trainer.finish()
    stage.finish()


@RECIPES.register("kd", "two-stage KD: frozen teacher (checkpoint or trained first), then the student")
def distill(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
            run_dir: Path | None = None) -> RunResult:
    """Distil ``cfg.model`` from the teacher with loss ``kd.method``; the teacher is never updated."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    check_tokenizers(ctx)
    source = TeacherSource(ctx, regression_ok=all(LOSSES.get(m).regression_ok for m in cfg.kd.methods))
    teacher, teacher_state = source.frozen()
    ctx.seed()
    student = ctx.model()
    objective, s_tap, t_tap = build_distill_objective(ctx, student, teacher)
    stages = objective.training_stages(t_tap, s_tap)
    for stage in stages:
        run_stage(ctx, stage)

    outputs = cached_teacher(ctx, t_tap, objective)

    def step(batch, progress):
        seen = objective.transform_batch(batch)  # keeps the original samples first
        t_out = outputs(seen)
        s_out = s_tap(seen.x)
        # the training metrics read the original samples' outputs (all rows: one per target token in translation)
        shown = s_out.logits if seen is batch else s_out.logits[:batch.size]
        return StepOutput(objective(s_out, t_out, seen, progress), shown)

    meta = ctx.meta("+".join(cfg.kd.methods))
    meta["teacher"] = {"epoch": teacher_state.get("epoch"), "loss": teacher_state.get("loss"),
                       **{k: v for k, v in teacher_state.items() if k.startswith(("val_", "test_"))}}
    trainer = ctx.trainer({"model": student, "objective": objective}, step, meta=meta,
                          callbacks=[FirstEpochCheck(cfg.kd.methods), *outputs.callbacks()],
                          frozen={"teacher": teacher})
    source.report(trainer)
    while not trainer.done:
        trainer.run_epoch()
    result = trainer.finish(teacher_cache=outputs.report(),
                            cost={"teacher_epochs_trained": source.epochs_trained, "student_epochs": cfg.train.epochs,
                                  **teacher_forward_cost(outputs, trainer),
                                  # every session of the student, its in-command teacher and training stages
                                  "wall_time_s": trainer.wall_time + sum(
                                      folder_wall_time(ctx.run_dir / name)
                                      for name in [*([] if source.given else [TEACHER_DIR]),
                                                   *(stage.name for stage in stages)])})
    write_json(ctx.run_dir / "teacher.json", meta["teacher"])
    return RunResult(ctx.run_dir, result.summary, student, result.history)


declare_teacher_use("kd", "frozen")
