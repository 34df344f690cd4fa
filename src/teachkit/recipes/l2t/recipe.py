"""The L2T-DLF recipe: Learning to Teach with Dynamic Loss Functions (Wu et al., NeurIPS 2018).

``teachkit run l2t CONFIG``:

1. **The teacher** comes from :meth:`~teachkit.recipes.teacher.TeacherSource.learned`: the file
   ``teacher.checkpoint`` (a ``teacher.safetensors``, or the run folder of an earlier l2t run holding one;
   the teacher-training options of ``l2t`` are then unused), else on ``--resume`` this run's finished
   teacher, else it is trained now (paper Algorithm 1): ``l2t.teacher_steps`` episodes. A teacher-training
   student (the configured model, seeded like the final one) follows the final student's schedule: same
   batch stream, ``optim.lr`` x the schedule's factor at its step, ``optim.momentum`` and
   ``optim.weight_decay``. It is warm-started by ``l2t.warm_start_steps`` CE steps. Each episode starts
   from where the previous one ended (``episode_start: continue``, warm-started students as in the paper's
   experiments) or from the warm start (``reset``), runs ``l2t.inner_steps`` momentum-SGD steps under
   L_{Phi_t}, Phi_t = teacher(s_t), and computes the exact gradient of the dev objective M(w_T) w.r.t. the
   teacher (:mod:`teachkit.recipes.l2t.hypergrad`, memory mode ``l2t.memory``); Adam (``teacher_lr``,
   ``teacher_betas``, ``teacher_eps``) updates the teacher. The dev batch (``dev_batch_size``) is drawn from
   the validation split carved from the training data, never from test. ``episode_gap`` plain steps under
   the current teacher may follow each episode (to cover more of the schedule). When the student reaches
   the end of its schedule it restarts from the warm start. Per-episode dev objective, dev accuracy and Phi
   statistics go to ``teacher_log.jsonl``; the teacher is saved (atomic safetensors + JSON) to
   ``teacher.safetensors`` after every good episode.
2. **Final student**: a fresh student (same seed) trained by the engine's :class:`~teachkit.engine.Trainer`
   for ``train.epochs`` epochs with the frozen teacher producing Phi_t from the running student state at
   every step (progress from the engine, train EMAs from each batch, dev loss/accuracy from each epoch's
   validation record). Per-epoch mean Phi statistics go to ``phi_log.jsonl``.

Non-finite hypergradient: the episode stops with a one-line error naming the teacher step; the teacher is
not updated and the last good one stays on disk. ``--resume``: a finished teacher is reused and the final
student resumes from its last checkpoint; an unfinished teacher phase restarts from scratch.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.config import RunConfig
from teachkit.data import BatchLoader, Splits
from teachkit.engine import EpochHooks, FitResult, Trainer
from teachkit.engine.schedule import lr_factor
from teachkit.errors import ConfigError
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult
from teachkit.recipes.context import RunContext
from teachkit.recipes.l2t.hypergrad import (
    FunctionalStudent,
    InnerOptimizer,
    InnerState,
    MemoryMode,
    NonFiniteHypergradientError,
    Objective,
    hypergradient,
    parse_memory,
    teacher_params,
    unroll,
)
from teachkit.recipes.l2t.loss import dev_cross_entropy, l2t_loss_terms, l2t_student_loss, phi_stats, smooth_error
from teachkit.recipes.l2t.state import StudentStateTracker
from teachkit.recipes.l2t.teachers import LossTeacher, build_teacher, load_teacher, save_teacher
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TeacherSource
from teachkit.types import Batch, BatchSource, Progress, StepOutput, upcast


@dataclass
class L2TOptions(Options):
    """Learning to Teach with Dynamic Loss Functions (Wu et al. 2018): the ``l2t`` section.

    The student minimises L_Phi(p, y) = -sigmoid(y^T W log p + b) (Sec. 3.2; optionally mixed with CE by
    ``ce_alpha``); a teacher model (``teacher_model``: ``static`` or ``gated``; the paper's ``attention``
    teacher is not implemented) maps the student's state to Phi_t and is trained with Adam (``teacher_lr``,
    ``teacher_betas``, ``teacher_eps``) on a dev-set ``objective`` (smooth error with ``smooth_k``, or dev CE;
    Sec. 3.3) by reverse-mode differentiation through ``inner_steps`` momentum-SGD steps (``optim.lr``,
    ``optim.momentum``, ``optim.weight_decay``). ``memory``: ``full``, ``checkpoint`` or ``truncate:K``.
    """

    teacher_model: Literal["static", "gated", "attention"] = "gated"
    teacher_steps: int = option(60, ge=1)
    inner_steps: int = option(20, ge=1)
    memory: str = "full"
    objective: Literal["smooth_error", "dev_ce"] = "smooth_error"
    smooth_k: float = option(50.0, gt=0.0)
    ce_alpha: float = option(0.0, ge=0.0, le=1.0)
    teacher_lr: float = option(1e-4, gt=0.0)
    teacher_betas: list[float] = option(factory=lambda: [0.9, 0.999])
    teacher_eps: float = option(1e-8, gt=0.0)
    warm_start_steps: int = option(0, ge=0)
    dev_batch_size: int = option(500, ge=1)
    #: each episode ``continue``s the teacher-training student where the last one ended, or ``reset``s it to
    #: the warm start; ``episode_gap`` plain steps under the current teacher separate episodes
    episode_start: Literal["continue", "reset"] = "continue"
    episode_gap: int = option(0, ge=0)
    #: gated teacher: hidden width and number of gates of h(s_t)
    gate_hidden: int = option(16, ge=1)
    gate_rank: int = option(4, ge=1)

    def validate(self) -> None:
        parse_memory(self.memory, self.key("memory"))
        betas = self.teacher_betas
        if len(betas) != 2 or not all(0.0 <= x < 1.0 for x in betas):
            raise ConfigError(f"{self.key('teacher_betas')}={betas!r} must be two numbers in [0, 1)")

    @property
    def memory_mode(self) -> MemoryMode:
        """``memory`` parsed (``full``, ``checkpoint`` or ``truncate:K``)."""
        return parse_memory(self.memory, self.key("memory"))


TEACHER_FILE = "teacher.safetensors"
TEACHER_LOG = "teacher_log.jsonl"
PHI_LOG = "phi_log.jsonl"


def check_config(cfg: RunConfig, splits: Splits | None = None) -> MemoryMode:
    """One-line ConfigErrors for settings the differentiated unroll cannot reproduce (those of other sections
    and the unimplemented teacher; the ``l2t`` section checks its own values when the config loads); the
    memory mode."""
    l2t, oc = cfg.l2t, cfg.optim
    build_teacher(l2t.teacher_model, 2, StudentStateTracker.dim)  # attention fails here
    if oc.name != "sgd":
        raise ConfigError(f"l2t: optim.name={oc.name!r} is not supported; the teacher gradient differentiates "
                          f"momentum SGD (optim.name=sgd)")
    if oc.nesterov:
        raise ConfigError("l2t: optim.nesterov=true is not supported; the unroll is heavy-ball momentum SGD")
    if oc.grad_clip:
        raise ConfigError("l2t: optim.grad_clip is not supported; the unroll would not match the student's updates")
    if splits is not None and len(splits.val) == 0:
        raise ConfigError("l2t: the teacher objective needs a validation split, but it is empty "
                          "(data.val_fraction carves it from the training data)")
    return l2t.memory_mode


def objective_fn(cfg: RunConfig) -> Objective:
    """The teacher's dev objective M: smooth error with k = ``l2t.smooth_k`` or dev cross-entropy."""
    if cfg.l2t.objective == "dev_ce":
        return dev_cross_entropy
    k = cfg.l2t.smooth_k
    return lambda logits, y: smooth_error(logits, y, k)


def inner_optimizer(cfg: RunConfig, steps_per_epoch: int) -> InnerOptimizer:
    """The student's optimiser as the unroll runs it: lr x schedule factor at the student's step."""
    oc, epochs = cfg.optim, cfg.train.epochs
    total = epochs * steps_per_epoch

    def lr(step: int) -> float:
        epoch, i = divmod(min(step, total - 1), steps_per_epoch)
        return oc.lr * lr_factor(oc, epoch, i, steps_per_epoch, epochs)

    return InnerOptimizer(lr, oc.momentum, oc.weight_decay)


class BatchStream:
    """The training batches in the order the engine's loader yields them, epoch after epoch."""

    def __init__(self, loader: BatchSource) -> None:
        self.loader, self.epoch = loader, 0
        self._it = loader.batches(0)

    def take(self, n: int) -> list[Batch]:
        out: list[Batch] = []
        while len(out) < n:
            batch = next(self._it, None)
            if batch is None:
                self.epoch += 1
                self._it = self.loader.batches(self.epoch)
                continue
            out.append(batch)
        return out


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def train_teacher(ctx: RunContext) -> tuple[LossTeacher, dict]:
    """``l2t.teacher_steps`` episodes of hypergradient descent on the teacher (module docstring), written to
    ``ctx.run_dir``; returns (teacher, info)."""
    cfg, splits, run_dir, device = ctx.cfg, ctx.splits, ctx.run_dir, ctx.device
    l2t, tc = cfg.l2t, cfg.train
    mode = check_config(cfg, splits)
    C = splits.num_classes
    ctx.seed()
    student = FunctionalStudent(ctx.model())
    teacher = build_teacher(l2t.teacher_model, C, StudentStateTracker.dim, l2t.gate_hidden, l2t.gate_rank).to(device)
    theta = teacher_params(teacher)
    adam = torch.optim.Adam(theta, lr=l2t.teacher_lr, betas=tuple(l2t.teacher_betas), eps=l2t.teacher_eps)
    loader = ctx.batches()  # the final student's batches, in the same order
    spe = len(loader)
    total = tc.epochs * spe
    opt = inner_optimizer(cfg, spe)
    stream = BatchStream(loader)
    dev_loader = BatchLoader(splits.val, min(l2t.dev_batch_size, len(splits.val)), shuffle=True, seed=tc.seed)
    tracker = StudentStateTracker(C)
    objective = objective_fn(cfg)
    alpha = l2t.ce_alpha

    def inner_loss(logits: Tensor, y: Tensor, W: Tensor, b: Tensor) -> Tensor:
        return l2t_student_loss(upcast(logits), y, W, b, alpha)

    def ce_loss(logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(upcast(logits), y)

    state = student.initial_state(0)
    if l2t.warm_start_steps:
        warm = unroll(student, state, stream.take(l2t.warm_start_steps), ce_loss, opt, seed=tc.seed)
        tracker.observe_steps(warm.train_ce, warm.train_acc)
        state = warm.end
    start = state.clone()

    log_path, teacher_path = run_dir / TEACHER_LOG, run_dir / TEACHER_FILE
    log_path.write_text("")
    info = {"teacher_steps": l2t.teacher_steps, "teacher_steps_done": 0, "memory": str(mode),
            "biased_hypergradient": mode.biased and mode.k < l2t.inner_steps, "objective": l2t.objective}
    save_teacher(teacher_path, teacher, info)
    T = l2t.inner_steps

    def fresh_if_needed(s: InnerState, steps: int) -> InnerState:
        if l2t.episode_start == "reset" or s.step + steps > total:
            return start  # never modified in place: every step makes new tensors
        return s

    for episode in range(l2t.teacher_steps):
        t0 = time.perf_counter()
        state = fresh_if_needed(state, T)
        states = tracker.episode(state.step, T, total, device)
        batches = stream.take(T)
        dev = next(iter(dev_loader.batches(episode)))
        label = f"teacher step {episode + 1}/{l2t.teacher_steps}"
        try:
            res = hypergradient(student, state, teacher, states, batches, inner_loss, opt, dev, objective,
                                mode, seed=tc.seed, label=label)
        except NonFiniteHypergradientError as e:
            raise NonFiniteHypergradientError(f"{e}; last good teacher (after {episode} step(s)) kept in "
                                              f"{str(teacher_path)!r}") from None
        with torch.no_grad():
            W, b = teacher(states)
            stats = phi_stats(W, b)
        grad_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in res.grads))
        adam.zero_grad(set_to_none=True)
        for p, g in zip(theta, res.grads, strict=True):
            p.grad = g
        adam.step()
        tracker.observe_steps(res.train_ce, res.train_acc)
        tracker.observe_dev(res.dev_ce, res.dev_acc)
        state = res.end
        if l2t.episode_gap:
            state = fresh_if_needed(state, l2t.episode_gap)
            try:
                gap = unroll(student, state, stream.take(l2t.episode_gap), inner_loss, opt, teacher,
                             tracker.episode(state.step, l2t.episode_gap, total, device), seed=tc.seed)
            except NonFiniteHypergradientError as e:
                raise NonFiniteHypergradientError(f"{e} (plain steps after {label}); last good teacher (after "
                                                  f"{episode} step(s)) kept in {str(teacher_path)!r}") from None
            tracker.observe_steps(gap.train_ce, gap.train_acc)
            state = gap.end
        record = {"step": episode + 1, "student_step": res.end.step, "progress": res.end.step / total,
                  "objective": l2t.objective, "dev_objective": res.objective, "dev_acc": 100 * res.dev_acc,
                  "dev_ce": res.dev_ce, "train_loss": sum(res.losses) / len(res.losses),
                  "train_acc": 100 * sum(res.train_acc) / len(res.train_acc), "hypergrad_norm": grad_norm,
                  "phi": stats, "memory": str(mode), "steps_differentiated": res.steps_differentiated,
                  "biased": res.biased, "time_s": time.perf_counter() - t0}
        _append_jsonl(log_path, record)
        info = {**info, "teacher_steps_done": episode + 1, "dev_objective": res.objective,
                "dev_acc": 100 * res.dev_acc}
        save_teacher(teacher_path, teacher, info)
        if tc.progress:
            print(f"{cfg.name} teacher {episode + 1}/{l2t.teacher_steps}  M {res.objective:.4f}  "
                  f"dev {100 * res.dev_acc:.1f}%  |dtheta| {grad_norm:.3g}  "
                  f"diag(W) {stats['W_diag_mean']:.4f}  b {stats['b_mean']:+.4f}", flush=True)
    return teacher, info


def finished_teacher(path: Path, device: torch.device, num_classes: int) -> tuple[LossTeacher, dict] | None:
    """The teacher saved in ``path`` and its info when all its teacher steps were done, else None; a
    ConfigError when it was trained for another number of classes."""
    teacher, state = load_teacher(path, device)
    if state.get("teacher_steps_done") is None or state.get("teacher_steps_done") != state.get("teacher_steps"):
        return None
    if teacher.num_classes != num_classes:
        raise ConfigError(f"l2t: teacher {str(path)!r} was trained for {teacher.num_classes} classes but the "
                          f"student has {num_classes}")
    return teacher, {k: v for k, v in state.items() if k != "teacher"}


def student_trainer(ctx: RunContext, teacher: LossTeacher,
                    meta: dict[str, Any] | None = None) -> tuple[Trainer, nn.Module]:
    """The engine's Trainer of a fresh student on ``ce_alpha CE + (1 - ce_alpha) L_{Phi_t}`` with
    Phi_t = teacher(s_t) from the running state, in ``ctx.run_dir`` (resumed from its last checkpoint on
    ``--resume``); returns (trainer, student)."""
    cfg, run_dir, device = ctx.cfg, ctx.run_dir, ctx.device
    ctx.seed()
    student = ctx.model()
    teacher = teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    tracker = StudentStateTracker(ctx.splits.num_classes)
    phi_path = run_dir / PHI_LOG
    last = run_dir / "checkpoints" / "last.safetensors"
    resume = ctx.resume and last.is_file()
    if resume and (run_dir / "metrics.jsonl").is_file():  # read before the trainer truncates it to `last`
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if lines:
            tracker.observe_dev(lines[-1]["val"]["loss"], lines[-1]["val"]["acc"] / 100)
            tracker.train_acc = lines[-1]["train_acc"] / 100
    elif phi_path.exists():
        phi_path.unlink()
    alpha = cfg.l2t.ce_alpha
    acc: dict[str, Any] = {"W": 0.0, "b": 0.0, "n": 0}

    def step(batch: Batch, progress: Progress) -> StepOutput:
        s = tracker.features(progress.fraction, device)
        with torch.no_grad():
            W, b = teacher(s)
        logits = student(batch.x)
        terms = l2t_loss_terms(upcast(logits), batch.y, W, b, alpha)
        with torch.no_grad():
            lg = logits.detach().float()
            tracker.observe_train(float(F.cross_entropy(lg, batch.y)), float((lg.argmax(1) == batch.y).float().mean()))
            acc["W"] = acc["W"] + W
            acc["b"] = acc["b"] + b
            acc["n"] += 1
        return StepOutput(terms, logits)

    def on_epoch_end(record: dict[str, Any]) -> None:
        tracker.observe_dev(record["val"]["loss"], record["val"]["acc"] / 100)
        if acc["n"]:
            _append_jsonl(phi_path, {"epoch": record["epoch"], **phi_stats(acc["W"] / acc["n"], acc["b"] / acc["n"]),
                                     "state": tracker.state_dict()})
        acc.update(W=0.0, b=0.0, n=0)

    trainer = ctx.trainer(student, step, meta=dict(meta or {}), callbacks=[EpochHooks(end=on_epoch_end)])
    return trainer, student


def train_student(ctx: RunContext, teacher: LossTeacher,
                  meta: dict[str, Any] | None = None) -> tuple[FitResult, nn.Module]:
    """Train the student of :func:`student_trainer` for ``train.epochs``; returns (FitResult, student)."""
    trainer, student = student_trainer(ctx, teacher, meta)
    while not trainer.done:
        trainer.run_epoch()
    return trainer.finish(), student


@RECIPES.register("l2t", "L2T-DLF: teacher model of a dynamic loss trained by reverse-mode hypergradients "
                         "(Wu et al. 2018), then a fresh student under it", options=L2TOptions)
def l2t_dlf(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
            run_dir: Path | None = None) -> RunResult:
    """Obtain the L2T-DLF teacher (given, reused or trained: module docstring), then train a fresh student
    with the frozen teacher."""
    t0 = time.perf_counter()
    check_config(cfg)  # before the run folder exists
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    check_config(cfg, ctx.splits)
    teachers = TeacherSource(ctx)
    origin: dict[str, Any] = {"file": TEACHER_FILE, "steps_trained": 0}

    def load(path: Path) -> tuple[LossTeacher, dict] | None:
        if teachers.given:
            origin["file"] = str(path)
        return finished_teacher(path, ctx.device, ctx.splits.num_classes)

    def train() -> tuple[LossTeacher, dict]:
        origin["steps_trained"] = cfg.l2t.teacher_steps
        return train_teacher(ctx)

    teacher, info = teachers.learned(TEACHER_FILE, load, train)
    meta = ctx.meta("l2t-dlf")
    meta["l2t"] = {**info, "teacher_model": teacher.kind, "teacher_file": origin["file"],
                   "ce_alpha": cfg.l2t.ce_alpha}
    trainer, student = student_trainer(ctx, teacher, meta)
    while not trainer.done:
        trainer.run_epoch()
    result = trainer.finish(cost={"teacher_steps_trained": origin["steps_trained"],
                                  "student_epochs": cfg.train.epochs, "wall_time_s": time.perf_counter() - t0})
    return RunResult(ctx.run_dir, result.summary, student, result.history)
