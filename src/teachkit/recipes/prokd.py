"""Students that follow a teacher over time: Pro-KD, Annealing-KD and RCO.

All three are one student run whose per-epoch plan says what the student fits:

- Pro-KD (Rezagholizadeh et al. 2022, "Pro-KD: Progressive Distillation by Following the Footsteps of the
  Teacher"): phase I, stage i: ``||z_s - z_t(theta_i) / T_i||^2`` for n_i epochs, theta_i the teacher
  after its epoch i, T_i = max(1, tau_max - floor((i - 1) / stage_epochs)); no CE. Phase II: CE on labels
  for the remaining epochs.
- Annealing-KD (Jafari et al. 2021): the same temperature schedule, but the fully trained, frozen
  teacher and ``||z_s - z_t * Phi(T)||^2`` with Phi(T) = 1 - (T - 1) / tau_max (not z_t / T: the two
  agree only at T = 1); then CE.
- RCO (Jin et al. 2019): anchors = teacher checkpoints at equal epoch intervals ending on the final
  teacher; the student follows them in order with Hinton KD, an equal share of epochs each.

The squared error is summed over classes and averaged over the batch (``prokd.reduction=sum``, the
paper's ||.||^2) or averaged over all elements (``mean``, i.e. ``F.mse_loss``: C times smaller
gradients at the same lr). The recipe code never looks inside ``x``: any model pair works. The teacher
comes from :class:`~teachkit.recipes.teacher.TeacherSource` (online or replayed trajectory); one rule picks
the mode for all three recipes (``prokd.mode``: ``auto`` replays ``teacher.checkpoint`` when given, else
trains online; an explicit mode that contradicts ``teacher.checkpoint`` is refused).

Each epoch line shows the phase, the teacher epoch followed and T. Warnings (one line, kept in the summary):
a temperature schedule that never reaches T = 1 in phase I, RCO anchors that repeat a checkpoint or are
skipped for lack of student epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit import distributed
from teachkit.config import RunConfig
from teachkit.data import Splits
from teachkit.data.raw import is_regression
from teachkit.engine import Callback, Trainer
from teachkit.errors import CheckpointError, ConfigError
from teachkit.losses.kd import kd_kl
from teachkit.losses.label_losses import squared_error as label_squared_error
from teachkit.losses.logit_standardization import standardize_logits
from teachkit.models import Tapped
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult
from teachkit.recipes.context import RunContext
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TeacherSource, TeacherTrajectory, declare_teacher_use, trajectory_mode
from teachkit.recipes.teacher_cache import TeacherOutputs, run_teacher_outputs
from teachkit.types import StepOutput, upcast


@dataclass
class ProKDOptions(Options):
    """Pro-KD (student follows the teacher's trajectory) and Annealing-KD schedules (the ``prokd`` section).

    Phase I: after teacher epoch i the student trains ``student_epochs`` (n_i; an int for every i, or
    one entry per teacher epoch) epochs on ||z_s - z_t(theta_i) / T_i||^2; T starts at ``tau_max`` and
    drops by 1 every ``stage_epochs`` teacher epochs, floored at 1. Phase II: CE for the remaining
    ``train.epochs``. ``mode``: ``online`` trains the teacher (``teacher.model``, ``teacher.epochs``) in
    the same run, interleaved epoch by epoch; ``replay`` follows the trajectory recorded in the run
    folder ``teacher.checkpoint`` (a teacher trained with ``train.save_every=1``); ``auto`` replays when
    ``teacher.checkpoint`` is set and trains online otherwise (the same rule for Annealing-KD and RCO,
    which read this key too). ``checkpoint_at``:
    student stage i distils from the teacher after its epoch i (``end``) or before it (``start``).
    ``reduction``: ``sum`` over classes then batch mean (the paper's ||.||^2), or ``mean`` over all
    elements (``F.mse_loss``: C times smaller gradients at the same lr). ``loss``: phase I fits the paper's
    logit regression (``mse``), or the teacher checkpoint's softened distribution, T_i^2 KL(p_t^T_i || p_s^T_i)
    (``kl``: word-level distillation that follows the trajectory; on translation both apply per target token).
    ``logit_standardize``: z-score the student's and the teacher's logits (over classes, per sample or
    token) before every teacher-following term of prokd, annealing and rco (Sun et al. CVPR 2024,
    :mod:`teachkit.losses.logit_standardization`); phase II's CE reads the raw logits.
    """

    mode: Literal["auto", "online", "replay"] = "auto"
    tau_max: float = option(10.0, ge=1.0)
    stage_epochs: int = option(1, ge=1)
    student_epochs: int | list[int] = 1
    checkpoint_at: Literal["end", "start"] = "end"
    reduction: Literal["sum", "mean"] = "sum"
    loss: Literal["mse", "kl"] = "mse"
    logit_standardize: bool = False


@dataclass
class RCOOptions(Options):
    """Route-constrained optimisation (Jin et al. 2019): anchors = teacher checkpoints at equal intervals."""

    anchors: int = option(4, ge=1)


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


def rco_anchors(cfg: RunConfig, teacher_epochs: int, available: list[int] | None = None) -> list[int]:
    """``rco.anchors`` teacher epochs round(j E / A), j = 1..A (at least 1), each moved to the nearest recorded
    epoch in ``available`` when given (ties: the later one); may repeat an epoch (see :func:`rco_warnings`)."""
    a = cfg.rco.anchors
    anchors = [max(1, round(j * teacher_epochs / a)) for j in range(1, a + 1)]
    if available:
        pool = [e for e in available if e > 0] or list(available)
        anchors = [min(pool, key=lambda e, k=k: (abs(e - k), -e)) for k in anchors]
    return anchors


def rco_plan(cfg: RunConfig, teacher_epochs: int, available: list[int] | None = None) -> list[Stage]:
    """The distinct anchors of :func:`rco_anchors` in order, each with an equal share of student epochs."""
    anchors = list(dict.fromkeys(rco_anchors(cfg, teacher_epochs, available)))
    a, e = len(anchors), cfg.train.epochs
    return [Stage("kd", anchors[min(a - 1, k * a // e)], cfg.kd.temperature) for k in range(e)]


def rco_warnings(cfg: RunConfig, teacher_epochs: int, available: list[int] | None = None) -> list[str]:
    """RCO anchors that repeat a teacher checkpoint, or that no student epoch follows."""
    anchors = rco_anchors(cfg, teacher_epochs, available)
    distinct = list(dict.fromkeys(anchors))
    out = []
    if len(distinct) < len(anchors):
        out.append(f"rco.anchors={cfg.rco.anchors} repeats teacher checkpoints (anchors at teacher epochs {anchors}; "
                   f"the teacher has {teacher_epochs} epochs"
                   + (f", recorded {len(available)}" if available is not None else "")
                   + f"): the student follows {len(distinct)} distinct anchors")
    used = {s.teacher_epoch for s in rco_plan(cfg, teacher_epochs, available)}
    skipped = [k for k in distinct if k not in used]
    if skipped:
        out.append(f"train.epochs={cfg.train.epochs} is fewer than the {len(distinct)} RCO anchors: no student "
                   f"epoch follows the teacher after epochs {skipped}")
    return out


def temperature_warnings(cfg: RunConfig, plan: list[Stage]) -> list[str]:
    """Pro-KD / Annealing-KD: phase I whose temperature schedule never reaches T = 1."""
    phase1 = [s for s in plan if s.kind in ("prokd", "anneal")]
    if not phase1 or min(s.temperature for s in phase1) <= 1.0:
        return []
    p = cfg.prokd
    return [f"the temperature never reaches 1: phase I ends at T={min(s.temperature for s in phase1):g} "
            f"(prokd.tau_max={p.tau_max:g}, prokd.stage_epochs={p.stage_epochs}, {len(phase1)} phase-I epochs), so "
            f"the student never fits the teacher's unsoftened logits; lower prokd.tau_max or prokd.stage_epochs"]


class PlanInfo(Callback):
    """Puts each epoch's phase, teacher epoch and temperature on its epoch line (``trainer.epoch_info``)."""

    def __init__(self, plan: list[Stage], recipe: str) -> None:
        self.plan, self.recipe = plan, recipe
        self.anchors = list(dict.fromkeys(s.teacher_epoch for s in plan if s.kind == "kd"))

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        stage = self.plan[epoch]
        if stage.kind == "ce":
            trainer.epoch_info.update(phase="II")
            return
        phase = (f"anchor {self.anchors.index(stage.teacher_epoch) + 1}/{len(self.anchors)}"
                 if stage.kind == "kd" else "I")
        trainer.epoch_info.update(phase=phase, teacher_epoch=stage.teacher_epoch, T=float(stage.temperature))


def squared_error(zs: Tensor, target: Tensor, reduction: str) -> Tensor:
    """||z_s - target||^2 summed over classes, mean over batch (``sum``) or ``F.mse_loss`` (``mean``)."""
    if reduction == "mean":
        return F.mse_loss(upcast(zs), upcast(target))
    return (upcast(zs) - upcast(target)).pow(2).sum(dim=1).mean()


class FollowTeacher(PlanInfo):
    """:class:`PlanInfo` that also loads the teacher checkpoint a stage follows when the plan first reaches it
    (its logits for the transfer set, cached once when the inputs never change); ``followed``: the teacher
    outputs of each checkpoint followed, in order (the last one in use); ``saved``: teacher forwards the
    cache saved."""

    def __init__(self, plan: list[Stage], recipe: str, ctx: RunContext, teachers: TeacherTrajectory) -> None:
        super().__init__(plan, recipe)
        self.ctx, self.teachers = ctx, teachers
        self.followed: list[TeacherOutputs] = []
        self.teacher_epoch: int | None = None
        self.saved = 0

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        super().on_epoch_start(trainer, epoch)
        stage = self.plan[epoch]
        if stage.teacher_epoch is None or stage.teacher_epoch == self.teacher_epoch:
            return
        outputs = run_teacher_outputs(self.ctx, Tapped(self.teachers.at(stage.teacher_epoch)), needs={"logits"})
        self.followed.append(outputs)
        if outputs.warning:  # a stale cache file, rebuilt
            trainer.warn(outputs.warning)
        self.teacher_epoch = stage.teacher_epoch


def _check_checkpoints_followed(cfg: RunConfig, plan: list[Stage], teachers: TeacherTrajectory, recipe: str) -> None:
    """Every teacher epoch the plan follows has a checkpoint in the trajectory."""
    missing = sorted({s.teacher_epoch for s in plan if s.teacher_epoch is not None} - set(teachers.epochs))
    if missing:
        raise CheckpointError(f"the teacher trajectory {cfg.teacher.checkpoint!r} has no checkpoint after teacher "
                              f"epochs {missing[:5]} that {recipe} follows (it has {teachers.epochs[:3]}..."
                              f"{teachers.epochs[-3:]}); record every epoch with train.save_every=1")


def _following_terms(stage: Stage, zs: Tensor, zt: Tensor, shown: Tensor, y: Tensor,
                     cfg: RunConfig) -> dict[str, Tensor]:
    """The loss terms of a teacher-following stage (module docstring): Pro-KD's ||z_s - z_t / T||^2 (or KL at T),
    Annealing-KD's ||z_s - z_t Phi(T)||^2, RCO's Hinton KD; ``shown``: the raw student logits (for CE)."""
    p = cfg.prokd
    if stage.kind == "prokd":
        if p.loss == "kl":
            return {"prokd": kd_kl(zs, zt, stage.temperature)}
        return {"prokd": squared_error(zs, zt / stage.temperature, p.reduction)}
    if stage.kind == "anneal":
        phi = 1.0 - (stage.temperature - 1.0) / p.tau_max
        return {"anneal": squared_error(zs, zt * phi, p.reduction)}
    alpha = cfg.kd.alpha
    return {"ce": (1 - alpha) * F.cross_entropy(upcast(shown), y), "kd": alpha * kd_kl(zs, zt, stage.temperature)}


def _follow_step(cfg: RunConfig, plan: list[Stage], student: nn.Module, follower: FollowTeacher,
                 regression: bool) -> Callable[[Any, Any], StepOutput]:
    """The training step: the stage's teacher-following terms against the teacher in use, or phase II's label
    loss (CE; squared error on real-valued targets, as ``train.loss=l2``)."""
    standardize = cfg.prokd.logit_standardize

    def step(batch, progress):
        stage = plan[progress.epoch]
        zs = student(batch.x)
        if stage.kind == "ce":
            if regression:  # phase II on real-valued targets (STS-B): squared error, as train.loss=l2
                return StepOutput({"l2": label_squared_error(zs, batch.y)}, zs)
            return StepOutput({"ce": F.cross_entropy(upcast(zs), batch.y)}, zs)
        outputs = follower.followed[-1]
        zt = outputs(batch).logits
        if outputs.cached:
            follower.saved += batch.size
        shown = zs
        if standardize:  # teacher-following terms on z-scored logits; the metrics read the raw ones
            zs, zt = standardize_logits(upcast(zs)), standardize_logits(upcast(zt))
        return StepOutput(_following_terms(stage, zs, zt, shown, batch.y, cfg), shown)

    return step


def _summary_sections(cfg: RunConfig, plan: list[Stage], teachers: TeacherTrajectory,
                      follower: FollowTeacher) -> dict[str, Any]:
    """The summary's ``cost``, ``teacher_cache`` and ``plan`` sections. No wall_time_s: the engine fills in the
    run's own, every session; an online teacher trains inside it."""
    followed = follower.followed
    phase1 = sum(1 for s in plan if s.kind != "ce")
    # each process counts its own teacher's forwards and the rows of its share it read from the cache: summed
    forwards, saved = (int(v) for v in distributed.all_reduce_sum(torch.tensor(
        [sum(o.forwards for o in followed), follower.saved], dtype=torch.float64)).tolist())
    cost = {"teacher_epochs_trained": teachers.epochs_trained, "teacher_epochs": teachers.total_epochs,
            "student_epochs": cfg.train.epochs, "teacher_forward_images": forwards,
            "teacher_forwards_saved": saved}
    statuses = [o.status for o in followed]
    cache = {"status": "off", "why": followed[-1].why} if followed and not followed[-1].cached else \
        {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    return {"cost": cost, "teacher_cache": cache,
            "plan": {"mode": teachers.mode, "phase1_epochs": phase1, "phase2_epochs": cfg.train.epochs - phase1,
                     "stages": [[s.kind, s.teacher_epoch, s.temperature] for s in plan]}}


def follow_teacher(cfg: RunConfig, resume: bool, splits: Splits | None, run_dir: Path | None, recipe: str,
                   make_plan: Callable[[RunConfig, int, list[int] | None], list[Stage]]) -> RunResult:
    """Train the student by ``make_plan``'s per-epoch stages against a :class:`TeacherTrajectory` (mode by
    ``prokd.mode``, one rule for every recipe here)."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    source = TeacherSource(ctx, regression_ok=recipe in ("prokd", "annealing"))  # output regression
    teachers = source.trajectory(cfg.prokd.mode)
    available = teachers.epochs if teachers.mode == "replay" else None
    plan = make_plan(cfg, teachers.total_epochs, available)
    _check_checkpoints_followed(cfg, plan, teachers, recipe)
    warnings = (rco_warnings(cfg, teachers.total_epochs, available) if recipe == "rco"
                else temperature_warnings(cfg, plan))
    ctx.seed()
    student = ctx.model()
    regression = is_regression(ctx.splits.task)
    if cfg.prokd.loss == "kl" and regression:
        raise ConfigError("prokd.loss=kl compares class distributions; real-valued targets need prokd.loss=mse")
    follower = FollowTeacher(plan, recipe, ctx, teachers)
    step = _follow_step(cfg, plan, student, follower, regression)
    trainer = ctx.trainer(student, step, meta=ctx.meta(recipe), callbacks=[follower])
    source.report(trainer)
    for message in warnings:
        trainer.warn(message)
    trainer.keep_checkpoint_at({i + 1 for i in range(len(plan) - 1) if plan[i].kind != plan[i + 1].kind})
    while not trainer.done:
        trainer.run_epoch()
    teachers.finish()
    result = trainer.finish(**_summary_sections(cfg, plan, teachers, follower))
    return RunResult(ctx.run_dir, result.summary, student, result.history)


@RECIPES.register("prokd", "Pro-KD: the student follows the teacher's trajectory with annealed T, then CE",
                  options=ProKDOptions)
def prokd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Pro-KD in ``prokd.mode`` online (teacher trained in the same run) or replay (recorded trajectory)."""
    return follow_teacher(cfg, resume, splits, run_dir, "prokd", lambda c, e, _: prokd_plan(c, e))


@RECIPES.register("annealing", "Annealing-KD: frozen final teacher, ||z_s - z_t Phi(T)||^2 with T annealed, then CE")
def annealing(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
              run_dir: Path | None = None) -> RunResult:
    """Annealing-KD with the temperature schedule of Pro-KD (same phase-I length), frozen final teacher."""
    return follow_teacher(cfg, resume, splits, run_dir, "annealing", lambda c, e, _: prokd_plan(c, e, kind="anneal"))


@RECIPES.register("rco", "RCO: Hinton KD from teacher checkpoints at equal intervals, in order", options=RCOOptions)
def rco(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Route-constrained optimisation: ``rco.anchors`` teacher checkpoints, the last one the final teacher."""
    return follow_teacher(cfg, resume, splits, run_dir, "rco", rco_plan)


__all__ = ["prokd", "annealing", "rco", "prokd_plan", "rco_plan", "rco_anchors", "temperature", "squared_error"]


for _name in ("prokd", "annealing", "rco"):  # prokd.mode=auto replays a given teacher, as online would train it
    declare_teacher_use(_name, "recorded", when=lambda cfg: cfg.prokd.mode == "auto",
                        check=lambda cfg: trajectory_mode(cfg.prokd.mode, bool(cfg.teacher.checkpoint)))
