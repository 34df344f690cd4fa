"""Students that follow a teacher over time: Pro-KD, Annealing-KD and RCO (METHODS.md sections 3-4).

All three are one student run whose per-epoch plan says what the student fits:

- Pro-KD (seed ``pro-kd.txt``): phase I, stage i: ``||z_s - z_t(theta_i) / T_i||^2`` for n_i epochs,
  theta_i the teacher after its epoch i, T_i = max(1, tau_max - floor((i - 1) / stage_epochs)); no CE.
  Phase II: CE on labels for the remaining epochs.
- Annealing-KD (Jafari et al. 2021): the same temperature schedule, but the fully trained, frozen
  teacher and ``||z_s - z_t * Phi(T)||^2`` with Phi(T) = 1 - (T - 1) / tau_max (not z_t / T: the two
  agree only at T = 1); then CE.
- RCO (Jin et al. 2019): anchors = teacher checkpoints at equal epoch intervals ending on the final
  teacher; the student follows them in order with Hinton KD, an equal share of epochs each.

The squared error is summed over classes and averaged over the batch (``prokd.reduction=sum``, the
paper's ||.||^2) or averaged over all elements (``mean``, i.e. ``F.mse_loss``: C times smaller
gradients at the same lr). The recipe code never looks inside ``x``: any model pair works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from teachkit.config import RunConfig
from teachkit.data.base import Splits
from teachkit.engine.trainer import Trainer
from teachkit.errors import ConfigError
from teachkit.losses.kd import kd_kl
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
from teachkit.recipes.trajectory import TeacherTrajectory


@dataclass(frozen=True)
class Stage:
    """What the student fits in one epoch: ``kind`` in {prokd, anneal, kd, ce}, the teacher epoch, T."""

    kind: str
    teacher_epoch: int | None = None
    temperature: float = 1.0


def temperature(teacher_epoch: int, tau_max: float, stage_epochs: int) -> float:
    """T_i = max(1, tau_max - floor((i - 1) / stage_epochs)) for teacher epoch i >= 1."""
    return max(1.0, tau_max - (teacher_epoch - 1) // stage_epochs)


def student_epochs_per_stage(n: int | list[int], teacher_epochs: int) -> list[int]:
    counts = [n] * teacher_epochs if isinstance(n, int) else list(n)
    if len(counts) != teacher_epochs:
        raise ConfigError(f"prokd.student_epochs lists {len(counts)} entries but the teacher trains "
                          f"{teacher_epochs} epochs: give one n_i per teacher epoch or a single integer")
    if any(c < 0 for c in counts):
        raise ConfigError(f"prokd.student_epochs={n!r} is not allowed: every n_i must be >= 0")
    return counts


def prokd_plan(cfg: RunConfig, teacher_epochs: int, kind: str = "prokd") -> list[Stage]:
    """Per student epoch: phase I stages (teacher epoch and T), then CE to ``train.epochs``."""
    p = cfg.prokd
    counts = student_epochs_per_stage(p.student_epochs, teacher_epochs)
    if sum(counts) > cfg.train.epochs:
        raise ConfigError(f"prokd.student_epochs sum to {sum(counts)} phase-I epochs, more than train.epochs="
                          f"{cfg.train.epochs} (phase I + phase II = the student's budget)")
    plan = []
    for i, n in enumerate(counts, start=1):
        theta = i if p.checkpoint_at == "end" else i - 1
        for _ in range(n):
            plan.append(Stage(kind, theta if kind == "prokd" else teacher_epochs, temperature(i, p.tau_max,
                                                                                             p.stage_epochs)))
    return plan + [Stage("ce")] * (cfg.train.epochs - len(plan))


def rco_plan(cfg: RunConfig, teacher_epochs: int) -> list[Stage]:
    """Anchors at teacher epochs round(j E / A), j = 1..A; each gets an equal share of student epochs."""
    a = min(cfg.rco.anchors, teacher_epochs)
    anchors = [round(j * teacher_epochs / a) for j in range(1, a + 1)]
    e = cfg.train.epochs
    return [Stage("kd", anchors[min(a - 1, k * a // e)], cfg.kd.temperature) for k in range(e)]


def squared_error(zs: Tensor, target: Tensor, reduction: str) -> Tensor:
    """||z_s - target||^2 summed over classes, mean over batch (``sum``) or ``F.mse_loss`` (``mean``)."""
    if reduction == "mean":
        return F.mse_loss(zs.float(), target.float())
    return (zs.float() - target.float()).pow(2).sum(dim=1).mean()


def follow_teacher(cfg: RunConfig, resume: bool, splits: Splits | None, run_dir: Path | None, recipe: str,
                   make_plan: Callable[[RunConfig, int], list[Stage]], mode: str) -> RunResult:
    """Train the student by ``make_plan``'s per-epoch stages against a :class:`TeacherTrajectory`."""
    t0 = time.perf_counter()
    device = device_of(cfg)
    run_dir = prepare_run_dir(cfg, resume, run_dir)
    splits = splits if splits is not None else load_data(cfg.data, device)
    teacher_splits = load_data(cfg.data, device, subset=False) if mode == "online" else splits
    teachers = TeacherTrajectory(cfg, mode, teacher_splits, splits, run_dir, resume)
    plan = make_plan(cfg, teachers.total_epochs)
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    student = make_model(cfg.model, splits, device)
    tau_max, reduction, alpha = cfg.prokd.tau_max, cfg.prokd.reduction, cfg.kd.alpha
    state = {"teacher": None, "forwards": 0}

    def on_epoch_start(epoch: int) -> None:
        stage = plan[epoch]
        state["teacher"] = teachers.at(stage.teacher_epoch) if stage.teacher_epoch is not None else None

    def step(batch, progress):
        stage = plan[progress.epoch]
        zs = student(batch.x)
        if stage.kind == "ce":
            return {"ce": F.cross_entropy(zs.float(), batch.y)}, zs
        zt = state["teacher"](batch.x)
        state["forwards"] += batch.y.shape[0]
        if stage.kind == "prokd":
            return {"prokd": squared_error(zs, zt / stage.temperature, reduction)}, zs
        if stage.kind == "anneal":
            phi = 1.0 - (stage.temperature - 1.0) / tau_max
            return {"anneal": squared_error(zs, zt * phi, reduction)}, zs
        return {"ce": (1 - alpha) * F.cross_entropy(zs.float(), batch.y),
                "kd": alpha * kd_kl(zs, zt, stage.temperature)}, zs

    meta = model_meta(cfg, splits, recipe)
    trainer = Trainer(student, step, splits, cfg, run_dir, meta=meta, resume=resume,
                      on_epoch_start=on_epoch_start, desc=cfg.name)
    trainer.keep_checkpoint_at({i + 1 for i in range(len(plan) - 1) if plan[i].kind != plan[i + 1].kind})
    while not trainer.done:
        trainer.run_epoch()
    teachers.finish()
    phase1 = sum(1 for s in plan if s.kind != "ce")
    cost = {"teacher_epochs_trained": teachers.epochs_trained_here, "teacher_epochs": teachers.total_epochs,
            "student_epochs": cfg.train.epochs, "teacher_forward_images": state["forwards"],
            "wall_time_s": time.perf_counter() - t0}
    result = trainer.finish(cost=cost, plan={"phase1_epochs": phase1, "phase2_epochs": cfg.train.epochs - phase1,
                                             "stages": [[s.kind, s.teacher_epoch, s.temperature] for s in plan]})
    return RunResult(run_dir, result.summary, student, result.history)


@RECIPES.register("prokd", "Pro-KD: the student follows the teacher's trajectory with annealed T, then CE")
def prokd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Pro-KD in ``prokd.mode`` online (teacher trained in the same run) or replay (recorded trajectory)."""
    return follow_teacher(cfg, resume, splits, run_dir, "prokd", prokd_plan, cfg.prokd.mode)


@RECIPES.register("annealing", "Annealing-KD: frozen final teacher, ||z_s - z_t Phi(T)||^2 with T annealed, then CE")
def annealing(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
              run_dir: Path | None = None) -> RunResult:
    """Annealing-KD with the temperature schedule of Pro-KD (same phase-I length), frozen final teacher."""
    return follow_teacher(cfg, resume, splits, run_dir, "annealing",
                          lambda c, e: prokd_plan(c, e, kind="anneal"), trajectory_mode(cfg))


@RECIPES.register("rco", "RCO: Hinton KD from teacher checkpoints at equal intervals, in order")
def rco(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Route-constrained optimisation: ``rco.anchors`` teacher checkpoints, the last one the final teacher."""
    return follow_teacher(cfg, resume, splits, run_dir, "rco", rco_plan, trajectory_mode(cfg))


def trajectory_mode(cfg: RunConfig) -> str:
    """Replay a recorded teacher when ``teacher.checkpoint`` is set, else train it in this run."""
    return "replay" if cfg.teacher.checkpoint else "online"


__all__ = ["prokd", "annealing", "rco", "prokd_plan", "rco_plan", "temperature", "squared_error"]
