"""Two-stage KD: a frozen teacher (from a checkpoint or trained first in the same run), then a student."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from teachkit.config import RunConfig
from teachkit.data.base import Splits
from teachkit.engine.trainer import Trainer, to_memory_format
from teachkit.losses import LOSSES
from teachkit.losses.distiller import Distiller, as_method_list, build_distiller
from teachkit.models import Tapped
from teachkit.recipes.common import (
    FrozenTeacher,
    RunResult,
    check_compatible,
    device_of,
    load_data,
    load_model,
    make_model,
    model_meta,
    prepare_run_dir,
    seed_everything,
)
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model
from teachkit.recipes.trajectory import teacher_run_config


def obtain_teacher(cfg: RunConfig, run_dir: Path, resume: bool, device: torch.device) -> tuple[nn.Module, dict]:
    """Load ``teacher.checkpoint``, or train the teacher into ``run_dir/teacher`` (reused on resume)."""
    if cfg.teacher.checkpoint:
        return load_model(cfg.teacher.checkpoint, cfg.teacher.select, device)
    teacher_dir = run_dir / "teacher"
    if not (teacher_dir / "summary.json").is_file():
        train_model(teacher_run_config(cfg, save_every=0), resume=resume, run_dir=teacher_dir)
    return load_model(teacher_dir, cfg.teacher.select, device)


def build_distill_loss(cfg: RunConfig, student: nn.Module, teacher: nn.Module,
                       splits: Splits) -> tuple[Distiller, Tapped, Tapped]:
    """The Distiller for ``kd.method``, built from probed taps of one dummy batch (2 samples, eval mode)."""
    names = as_method_list(cfg.kd.method)
    needs = {"logits"}
    for name in names:
        needs.update(LOSSES.get(name).needs)
    s_tap, t_tap = Tapped(student, want=needs), Tapped(teacher, want=needs)
    probe = splits.train.x[:2]
    with torch.no_grad():
        was = student.training
        student.eval()
        s_probe, t_probe = s_tap(probe), t_tap(probe)
        student.train(was)
    k = cfg.kd
    distiller = build_distiller(names, s_probe, t_probe, num_classes=splits.num_classes,
                                num_samples=len(splits.train), alpha=k.alpha, temperature=k.temperature,
                                gamma=k.gamma, options=k.options, ce_weight=k.ce_weight)
    return distiller.to(probe.device), s_tap, t_tap


@RECIPES.register("kd", "two-stage KD: frozen teacher (checkpoint or trained first), then the student")
def distill(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
            run_dir: Path | None = None) -> RunResult:
    """Distil ``cfg.model`` from the teacher with loss ``kd.method``; the teacher is never updated."""
    t0 = time.perf_counter()
    device = device_of(cfg)
    run_dir = prepare_run_dir(cfg, resume, run_dir)
    splits = splits if splits is not None else load_data(cfg.data, device)
    teacher_model, teacher_state = obtain_teacher(cfg, run_dir, resume, device)
    check_compatible(teacher_state, splits)
    teacher = FrozenTeacher(to_memory_format(teacher_model, cfg, splits))
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    student = make_model(cfg.model, splits, device)
    loss, s_tap, t_tap = build_distill_loss(cfg, student, teacher, splits)
    loss.prepare_teacher(t_tap, splits, cfg, run_dir)

    forwards = [0]

    def step(batch, progress):
        n = batch.y.shape[0]
        batch = loss.transform_batch(batch)  # keeps the original samples first
        forwards[0] += batch.x.shape[0]
        t_out = t_tap(batch.x)
        s_out = s_tap(batch.x)
        return loss(s_out, t_out, batch, progress), s_out.logits[:n]

    meta = model_meta(cfg, splits, "+".join(as_method_list(cfg.kd.method)))
    meta["teacher"] = {"epoch": teacher_state.get("epoch"), "val_acc": teacher_state.get("val_acc"),
                       "test_acc": teacher_state.get("test_acc"), "loss": teacher_state.get("loss")}
    trainer = Trainer(student, step, splits, cfg, run_dir, extra=loss, meta=meta, resume=resume, desc=cfg.name)
    while not trainer.done:
        trainer.run_epoch()
    trained_here = 0 if cfg.teacher.checkpoint else cfg.teacher.epochs
    result = trainer.finish(cost={"teacher_epochs_trained": trained_here, "student_epochs": cfg.train.epochs,
                                  "teacher_forward_images": forwards[0],
                                  "wall_time_s": time.perf_counter() - t0})
    (run_dir / "teacher.json").write_text(json.dumps(meta["teacher"], indent=2) + "\n")
    return RunResult(run_dir, result.summary, student, result.history)
