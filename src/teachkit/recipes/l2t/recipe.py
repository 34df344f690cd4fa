"""The L2T-DLF recipe: Learning to Teach with Dynamic Loss Functions (Wu et al., NeurIPS 2018).

``teachkit run l2t CONFIG``:

1. **The teacher** comes from :meth:`~teachkit.recipes.teacher.TeacherSource.learned`: the file
   ``teacher.checkpoint`` (a ``teacher.safetensors``, or the run folder of an earlier l2t run holding one;
   the teacher-training options of ``l2t`` are then unused), else on ``--resume`` this run's finished
   teacher, else it is trained now (paper Algorithm 1): ``l2t.teacher_steps`` episodes. A teacher-training
   student (the configured model, seeded like the final one) follows the final student's schedule: same
   batch stream, ``optim.lr`` x the schedule's factor at its step, ``optim.momentum`` and
   ``optim.weight_decay``. With ``l2t.warm_start_epochs`` = k it starts from a student trained with CE for k
   epochs first (the seed's warm-started students: a ``train`` run through the engine in ``warm_start/``,
   resumed or reused like any run), and so does the final student; it is then further warm-started by
   ``l2t.warm_start_steps`` CE steps inside the teacher phase. Each episode starts
   from where the previous one ended (``episode_start: continue``, warm-started students as in the paper's
   experiments) or from the warm start (``reset``), runs ``l2t.inner_steps`` momentum-SGD steps under
   L_{Phi_t}, Phi_t = teacher(s_t), and computes the exact gradient of the dev objective M(w_T) w.r.t. the
   teacher (:mod:`teachkit.recipes.l2t.hypergrad`, memory mode ``l2t.memory``); Adam (``teacher_lr``,
   ``teacher_betas``, ``teacher_eps``) updates the teacher. The dev batch (``dev_batch_size``) is drawn from
   the validation split carved from the training data, never from test. ``episode_gap`` plain steps under
   the current teacher may follow each episode (to cover more of the schedule). When the student reaches
   the end of its schedule it restarts from the warm start. Per-episode dev objective, dev accuracy and Phi
   statistics go to ``teacher_log.jsonl``; the teacher is saved (atomic safetensors + JSON) to
   ``teacher.safetensors`` after every good episode, together with everything the phase evolves (Adam's
   state, the teacher-training student's weights, momentum and step, its warm start, the state tracker, the
   position in the batch stream) until the last episode, which writes the teacher alone.
2. **Final student**: a fresh student (same seed) trained by the engine's :class:`~teachkit.engine.Trainer`
   for ``train.epochs`` epochs with the frozen teacher producing Phi_t from the running student state at
   every step (progress from the engine, train EMAs from each batch, dev loss/accuracy from each epoch's
   validation record). Per-epoch mean Phi statistics go to ``phi_log.jsonl`` and onto the epoch line
   (``phi mean diag(W) 1.0002, mean b +0.0001``, also the metrics record's ``info``). The state tracker is a
   buffer-only module handed to the engine with the student, so it is checkpointed and restored with it.

Translation: the loss applies per target token (the batch's packed rows), with the diagonal Phi of
:func:`~teachkit.recipes.l2t.loss.dynamic_loss` (``l2t.phi=auto`` picks it for a vocabulary, the full C x C
matrix otherwise); the state features are the token-level CE and accuracy, and the dev objective is the smooth
token error or the dev token CE -- not BLEU, which is not differentiable.

Non-finite hypergradient: the episode stops with a one-line error naming the teacher step; the teacher is
not updated and the last good one stays on disk.

``--resume`` is exact at any interruption: a finished teacher is reused, an unfinished teacher phase continues
after its last saved episode, and the final student resumes from its last checkpoint (tracker included).
Each log line is appended before the checkpoint it belongs to, and on resume ``teacher_log.jsonl`` /
``phi_log.jsonl`` are cut back to the checkpoint's episode / epoch (a line torn by a kill is dropped), so
they never lose or repeat a record.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit import distributed
from teachkit.config import RunConfig, with_changes
from teachkit.data import Splits
from teachkit.data.loader import make_batches
from teachkit.data.raw import SEQUENCE_TASKS
from teachkit.engine import EpochHooks, FitResult, Trainer
from teachkit.engine.checkpoint import (
    atomic_write,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    strip,
    write_error,
)
from teachkit.engine.schedule import lr_factor
from teachkit.errors import CheckpointError, ConfigError
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult, finished_run
from teachkit.recipes.context import RunContext
from teachkit.recipes.l2t.hypergrad import (
    FunctionalStudent,
    HypergradResult,
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
from teachkit.recipes.l2t.state import StudentStateTracker, TrackerModule
from teachkit.recipes.l2t.teachers import LossTeacher, build_teacher, load_teacher, save_teacher
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model
from teachkit.recipes.teacher import TeacherSource
from teachkit.types import Batch, BatchSource, Evaluator, Progress, StepOutput, upcast


@dataclass
class L2TOptions(Options):
    """Learning to Teach with Dynamic Loss Functions (Wu et al. 2018): the ``l2t`` section.

    The student minimises L_Phi(p, y) = -sigmoid(y^T W log p + b) (Sec. 3.2; optionally mixed with CE by
    ``ce_alpha``); a teacher model (``teacher_model``: ``static``, ``gated`` or the paper's ``attention``)
    maps the student's state to Phi_t and is trained with Adam (``teacher_lr``, ``teacher_betas``,
    ``teacher_eps``) on a dev-set ``objective`` (smooth error with ``smooth_k``, or dev CE;
    Sec. 3.3) by reverse-mode differentiation through ``inner_steps`` momentum-SGD steps (``optim.lr``,
    ``optim.momentum``, ``optim.weight_decay``). ``memory``: ``full``, ``checkpoint`` or ``truncate:K``;
    ``auto`` = ``checkpoint`` for translation (LSTM and Transformer students with millions of parameters and
    per-token activations), ``full`` otherwise.
    """

    teacher_model: Literal["static", "gated", "attention"] = "gated"
    teacher_steps: int = option(60, ge=1)
    inner_steps: int = option(20, ge=1)
    memory: str = "auto"
    objective: Literal["smooth_error", "dev_ce"] = "smooth_error"
    smooth_k: float = option(50.0, gt=0.0)
    ce_alpha: float = option(0.0, ge=0.0, le=1.0)
    teacher_lr: float = option(1e-4, gt=0.0)
    teacher_betas: list[float] = option(factory=lambda: [0.9, 0.999])
    teacher_eps: float = option(1e-8, gt=0.0)
    warm_start_steps: int = option(0, ge=0)
    #: CE epochs of the student before the teacher phase (through the engine, in ``warm_start/``); the final
    #: student starts from the same weights
    warm_start_epochs: int = option(0, ge=0)
    #: W of Phi: ``full`` C x C, ``diagonal`` (C,) (the per-token loss of translation), ``auto``: diagonal for
    #: translation (a vocabulary of thousands of classes), full otherwise
    phi: Literal["auto", "full", "diagonal"] = "auto"
    dev_batch_size: int = option(500, ge=1)
    #: each episode ``continue``s the teacher-training student where the last one ended, or ``reset``s it to
    #: the warm start; ``episode_gap`` plain steps under the current teacher separate episodes
    episode_start: Literal["continue", "reset"] = "continue"
    episode_gap: int = option(0, ge=0)
    #: gated teacher: hidden width (0: no hidden layer, h = tanh(Linear(s_t))) and number of gates of h(s_t)
    gate_hidden: int = option(16, ge=0)
    gate_rank: int = option(4, ge=1)
    #: attention teacher: number K of loss parameters (W_k, b_k) mixed by softmax(V s_t)
    attention_k: int = option(4, ge=1)

    def validate(self) -> None:
        if self.memory != "auto":
            parse_memory(self.memory, self.key("memory"))
        betas = self.teacher_betas
        if len(betas) != 2 or not all(0.0 <= x < 1.0 for x in betas):
            raise ConfigError(f"{self.key('teacher_betas')}={betas!r} must be two numbers in [0, 1)")

    def memory_mode(self, task: str) -> MemoryMode:
        """``memory`` parsed (``full``, ``checkpoint`` or ``truncate:K``), ``auto`` resolved for ``task``."""
        if self.memory == "auto":
            return MemoryMode("checkpoint" if task in SEQUENCE_TASKS else "full")
        return parse_memory(self.memory, self.key("memory"))


TEACHER_FILE = "teacher.safetensors"
TEACHER_LOG = "teacher_log.jsonl"
PHI_LOG = "phi_log.jsonl"


def check_config(cfg: RunConfig, splits: Splits | None = None) -> MemoryMode:
    """One-line ConfigErrors for settings the differentiated unroll cannot reproduce (those of other sections;
    the ``l2t`` section checks its own values when the config loads); the memory mode."""
    l2t, oc = cfg.l2t, cfg.optim
    if cfg.train.micro_batch:
        raise ConfigError("l2t: train.micro_batch is not supported; the unroll differentiates whole-batch steps")
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
    return l2t.memory_mode(splits.task if splits is not None else "")


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
    """The training batches in the order the engine's loader yields them, epoch after epoch; ``epoch`` and
    ``pos`` (batches taken from it) say where it is, and a stream built with them continues from there."""

    def __init__(self, loader: BatchSource, epoch: int = 0, pos: int = 0) -> None:
        self.loader, self.epoch, self.pos = loader, epoch, 0
        self._it = loader.batches(epoch)
        for _ in range(pos):
            if next(self._it, None) is None:
                break
            self.pos += 1

    def take(self, n: int) -> list[Batch]:
        out: list[Batch] = []
        while len(out) < n:
            batch = next(self._it, None)
            if batch is None:
                self.epoch, self.pos = self.epoch + 1, 0
                self._it = self.loader.batches(self.epoch)
                continue
            self.pos += 1
            out.append(batch)
        return out


def phi_line(stats: dict[str, float]) -> str:
    """Phi statistics (:func:`~teachkit.recipes.l2t.loss.phi_stats`) as the log lines show them, each number
    named: ``mean diag(W) 1.0002, mean b +0.0001`` (W = I, b = 0 is the loss -p_y / (1 + p_y))."""
    return f"mean diag(W) {stats['W_diag_mean']:.4f}, mean b {stats['b_mean']:+.4f}"


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line in one write (a kill can only leave the last line torn)."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise write_error(path, e) from None


def _jsonl_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log; a last line torn by a kill is dropped, any other bad line is an error."""
    if not path.is_file():
        return []
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise CheckpointError(f"log {str(path)!r} is corrupt at line {i + 1}") from None
    return out


def repair_jsonl(path: Path, key: str, last: int) -> list[dict[str, Any]]:
    """Cut the log ``path`` back to the records with ``record[key] <= last`` (those of the checkpoint a run
    resumes from), atomically; remove it when none is left. Returns the records kept."""
    kept = [r for r in _jsonl_records(path) if r.get(key, 0) <= last]
    if not kept:
        path.unlink(missing_ok=True)
        return kept
    text = "".join(json.dumps(r) + "\n" for r in kept)
    if path.read_text(errors="replace") != text:  # nothing to cut: no write
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return kept


def _inner_tensors(prefix: str, s: InnerState) -> dict[str, Tensor]:
    """An :class:`InnerState`'s tensors under ``prefix`` (its step goes in the JSON state)."""
    out = {f"{prefix}params/{i}": p for i, p in enumerate(s.params)}
    out.update({f"{prefix}velocity/{i}": v for i, v in enumerate(s.velocity)})
    out.update({f"{prefix}buffers/{k}": b for k, b in s.buffers.items()})
    return out


def _inner_state(prefix: str, tensors: dict[str, Tensor], like: InnerState, step: int,
                 device: torch.device) -> InnerState:
    """The :class:`InnerState` saved by :func:`_inner_tensors` (shapes and buffers as ``like``'s)."""
    t = strip(prefix, tensors)
    params = [t[f"params/{i}"].to(device) for i in range(len(like.params))]
    velocity = [t[f"velocity/{i}"].to(device) for i in range(len(like.velocity))]
    buffers = {k: t[f"buffers/{k}"].to(device) for k in like.buffers}
    for a, b in zip([*params, *velocity], [*like.params, *like.velocity], strict=True):
        if a.shape != b.shape:
            raise KeyError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    return InnerState(params, velocity, buffers, step)


class ObservedEvaluator(Evaluator):
    """``inner`` whose results are handed to ``observe`` as soon as they exist: after the epoch's training,
    before the engine writes the epoch's checkpoint and metrics line (so what ``observe`` records is in
    that checkpoint, and what it puts into ``trainer.epoch_info`` is on that line)."""

    def __init__(self, inner: Evaluator, observe: Callable[[dict[str, dict[str, float]]], None]) -> None:
        self.inner, self.observe = inner, observe
        self.primary, self.sample_unit = inner.primary, inner.sample_unit

    def metric_names(self) -> tuple[str, ...]:
        return self.inner.metric_names()

    def direction(self, metric: str) -> Literal["max", "min"]:
        return self.inner.direction(metric)

    def is_percent(self, metric: str) -> bool:
        return self.inner.is_percent(metric)

    def format(self, metric: str, value: float) -> str:
        return self.inner.format(metric, value)

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        return self.inner.train_metrics(outputs, batch)

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        results = self.inner.evaluate(model)
        self.observe(results)
        return results

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


WARM_START_DIR = "warm_start"


def diagonal_phi(cfg: RunConfig, splits: Splits) -> bool:
    """Whether Phi's W is diagonal: ``l2t.phi``, with ``auto`` = diagonal for translation (per-token loss)."""
    if cfg.l2t.phi == "auto":
        return splits.task in SEQUENCE_TASKS
    return cfg.l2t.phi == "diagonal"


def warm_start(ctx: RunContext) -> dict[str, Tensor] | None:
    """The student's weights after ``l2t.warm_start_epochs`` CE epochs (a ``train`` run in ``warm_start/``,
    reused when finished, resumed on ``--resume``); None without a warm start."""
    epochs = ctx.cfg.l2t.warm_start_epochs
    if not epochs:
        return None
    folder = ctx.run_dir / WARM_START_DIR
    done = finished_run(folder, ctx.device)
    if done is None or done.model is None:
        cfg = with_changes(ctx.cfg, name=f"{ctx.cfg.name}/{WARM_START_DIR}",
                           train={"epochs": epochs, "save_every": 0, "loss": "ce"})
        if ctx.cfg.train.progress:
            print(f"{ctx.cfg.name}: warm start: {epochs} CE epochs of the student -> {folder}", flush=True)
        done = train_model(cfg, resume=ctx.resume, splits=ctx.splits, run_dir=folder)
    assert done.model is not None
    return {k: v.detach().clone() for k, v in done.model.state_dict().items()}


def warm_model(ctx: RunContext, weights: dict[str, Tensor] | None) -> nn.Module:
    """A fresh student (seeded by ``train.seed``), loaded with the warm-start ``weights`` when given."""
    ctx.seed()
    model = ctx.model()
    if weights is not None:
        model.load_state_dict(weights)
    return model


def _ce_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Plain CE, the loss of the teacher-training student's ``l2t.warm_start_steps`` warm-up steps."""
    return F.cross_entropy(upcast(logits), y)


class _TeacherPhase:
    """What the teacher phase evolves (module docstring, step 1): the teacher and its Adam, the teacher-training
    student's state and its warm start, the state tracker, the position in the batch stream, and the info saved
    with the teacher. The seeded student is built first: the teacher's initial weights are drawn right after it."""

    stream: BatchStream
    start: InnerState

    def __init__(self, ctx: RunContext, warm: dict[str, Tensor] | None) -> None:
        cfg, splits = ctx.cfg, ctx.splits
        self.ctx, self.l2t, self.tc = ctx, cfg.l2t, cfg.train
        l2t = self.l2t
        self.mode = check_config(cfg, splits)
        C = splits.num_classes
        self.student = FunctionalStudent(warm_model(ctx, warm))
        self.teacher = build_teacher(l2t.teacher_model, C, StudentStateTracker.dim, l2t.gate_hidden, l2t.gate_rank,
                                     diagonal_phi(cfg, splits), l2t.attention_k).to(ctx.device)
        self.theta = teacher_params(self.teacher)
        self.adam = torch.optim.Adam(self.theta, lr=l2t.teacher_lr, betas=tuple(l2t.teacher_betas),
                                     eps=l2t.teacher_eps)
        self.loader = ctx.batches()  # the final student's batches, in the same order
        spe = len(self.loader)
        self.total = self.tc.epochs * spe
        self.opt = inner_optimizer(cfg, spe)
        self.dev_loader = make_batches(splits.val, min(l2t.dev_batch_size, len(splits.val)), shuffle=True,
                                       seed=self.tc.seed)
        self.tracker = StudentStateTracker(C)
        self.objective = objective_fn(cfg)
        self.log_path, self.teacher_path = ctx.run_dir / TEACHER_LOG, ctx.run_dir / TEACHER_FILE
        self.info: dict[str, Any] = {"teacher_steps": l2t.teacher_steps, "teacher_steps_done": 0,
                                     "memory": str(self.mode),
                                     "biased_hypergradient": self.mode.biased and self.mode.k < l2t.inner_steps,
                                     "objective": l2t.objective}
        self.state = self.student.initial_state(0)

    def inner_loss(self, logits: Tensor, y: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """``ce_alpha CE + (1 - ce_alpha) L_Phi``, the loss the unroll differentiates."""
        return l2t_student_loss(upcast(logits), y, W, b, self.l2t.ce_alpha)

    def begin(self) -> None:
        """On resume, continue after the last saved episode; else warm the student up with CE steps, start a
        fresh log and save the untrained teacher (with its resume state)."""
        saved = (_teacher_phase_saved(self.teacher_path, self.teacher, self.adam, self.state, self.ctx.device)
                 if self.ctx.resume else None)
        if saved is not None:
            self.info, self.state, self.start, (epoch, pos) = (saved["info"], saved["state"], saved["start"],
                                                               saved["stream"])
            self.tracker.load_state_dict(saved["tracker"])
            self.stream = BatchStream(self.loader, epoch, pos)
            repair_jsonl(self.log_path, "step", self.info["teacher_steps_done"])
            return
        self.stream = BatchStream(self.loader)
        if self.l2t.warm_start_steps:
            warm = unroll(self.student, self.state, self.stream.take(self.l2t.warm_start_steps), _ce_loss, self.opt,
                          seed=self.tc.seed)
            self.tracker.observe_steps(warm.train_ce, warm.train_acc)
            self.state = warm.end
        self.start = self.state.clone()
        self.log_path.unlink(missing_ok=True)
        self.save(0)

    def save(self, done: int) -> None:
        """The teacher after ``done`` episodes; with the phase's resume state unless it is finished."""
        if done == self.l2t.teacher_steps:
            save_teacher(self.teacher_path, self.teacher, self.info)
            return
        adam_tensors, adam_struct = optimizer_to_flat(self.adam)
        extra = {**{f"resume/{k}": v for k, v in adam_tensors.items()},
                 **_inner_tensors("resume/student/", self.state), **_inner_tensors("resume/start/", self.start)}
        resume = {"student_step": self.state.step, "start_step": self.start.step,
                  "stream": [self.stream.epoch, self.stream.pos], "tracker": self.tracker.state_dict(),
                  "adam": adam_struct}
        save_teacher(self.teacher_path, self.teacher, {**self.info, "resume": resume}, extra)

    def fresh_if_needed(self, s: InnerState, steps: int) -> InnerState:
        """``s``, or the warm start when episodes reset or ``steps`` more would pass the end of the schedule."""
        if self.l2t.episode_start == "reset" or s.step + steps > self.total:
            return self.start  # never modified in place: every step makes new tensors
        return s

    def run_episode(self, episode: int) -> None:
        """One teacher step: ``inner_steps`` differentiated student steps and the hypergradient, Adam on the
        teacher, the optional plain steps, then the log line and the save."""
        t0 = time.perf_counter()
        T = self.l2t.inner_steps
        self.state = self.fresh_if_needed(self.state, T)
        states = self.tracker.episode(self.state.step, T, self.total, self.ctx.device)
        batches = self.stream.take(T)
        dev = next(iter(self.dev_loader.batches(episode)))
        label = f"teacher step {episode + 1}/{self.l2t.teacher_steps}"
        try:
            res = hypergradient(self.student, self.state, self.teacher, states, batches, self.inner_loss, self.opt,
                                dev, self.objective, self.mode, seed=self.tc.seed, label=label)
        except NonFiniteHypergradientError as e:
            raise NonFiniteHypergradientError(f"{e}; last good teacher (after {episode} step(s)) kept in "
                                              f"{str(self.teacher_path)!r}") from None
        with torch.no_grad():
            W, b = self.teacher(states)
            stats = phi_stats(W, b)
        grad_norm = self.update_teacher(res.grads)
        self.tracker.observe_steps(res.train_ce, res.train_acc)
        self.tracker.observe_dev(res.dev_ce, res.dev_acc)
        self.state = res.end
        if self.l2t.episode_gap:
            self.plain_steps(episode, label)
        self.finish_episode(episode, res, stats, grad_norm, t0)

    def update_teacher(self, grads: list[Tensor]) -> float:
        """One Adam step on the teacher along the hypergradient; its norm."""
        grad_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        self.adam.zero_grad(set_to_none=True)
        for p, g in zip(self.theta, grads, strict=True):
            p.grad = g
        self.adam.step()
        return grad_norm

    def plain_steps(self, episode: int, label: str) -> None:
        """``l2t.episode_gap`` undifferentiated student steps under the updated teacher."""
        gap_steps = self.l2t.episode_gap
        self.state = self.fresh_if_needed(self.state, gap_steps)
        try:
            gap = unroll(self.student, self.state, self.stream.take(gap_steps), self.inner_loss, self.opt,
                         self.teacher, self.tracker.episode(self.state.step, gap_steps, self.total, self.ctx.device),
                         seed=self.tc.seed)
        except NonFiniteHypergradientError as e:
            raise NonFiniteHypergradientError(f"{e} (plain steps after {label}); last good teacher (after "
                                              f"{episode} step(s)) kept in {str(self.teacher_path)!r}") from None
        self.tracker.observe_steps(gap.train_ce, gap.train_acc)
        self.state = gap.end

    def finish_episode(self, episode: int, res: HypergradResult, stats: dict[str, float], grad_norm: float,
                       t0: float) -> None:
        """The episode's log line, then the save (a resume cuts the log back to it), then the progress line."""
        l2t, total = self.l2t, self.total
        record = {"step": episode + 1, "student_step": res.end.step, "progress": res.end.step / total,
                  "objective": l2t.objective, "dev_objective": res.objective, "dev_acc": 100 * res.dev_acc,
                  "dev_ce": res.dev_ce, "train_loss": sum(res.losses) / len(res.losses),
                  "train_acc": 100 * sum(res.train_acc) / len(res.train_acc), "hypergrad_norm": grad_norm,
                  "phi": stats, "memory": str(self.mode), "steps_differentiated": res.steps_differentiated,
                  "biased": res.biased, "time_s": time.perf_counter() - t0}
        _append_jsonl(self.log_path, record)  # before the checkpoint: a resume cuts the log back to it
        self.info = {**self.info, "teacher_steps_done": episode + 1, "dev_objective": res.objective,
                     "dev_acc": 100 * res.dev_acc}
        self.save(episode + 1)
        if self.tc.progress:
            print(f"{self.ctx.cfg.name} teacher step {episode + 1}/{l2t.teacher_steps}  dev {l2t.objective} "
                  f"{res.objective:.4f}  dev acc {100 * res.dev_acc:.1f}%  |grad theta| {grad_norm:.3g}  "
                  f"phi {phi_line(stats)}", flush=True)


def train_teacher(ctx: RunContext, warm: dict[str, Tensor] | None = None) -> tuple[LossTeacher, dict]:
    """``l2t.teacher_steps`` episodes of hypergradient descent on the teacher (module docstring), written to
    ``ctx.run_dir``; on ``ctx.resume`` an unfinished phase continues exactly after its last saved episode.
    Returns (teacher, info)."""
    phase = _TeacherPhase(ctx, warm)
    phase.begin()
    for episode in range(phase.info["teacher_steps_done"], ctx.cfg.l2t.teacher_steps):
        phase.run_episode(episode)
    return phase.teacher, phase.info


def _teacher_phase_saved(path: Path, teacher: LossTeacher, adam: torch.optim.Optimizer, like: InnerState,
                         device: torch.device) -> dict[str, Any] | None:
    """An unfinished teacher phase saved in ``path``, loaded into ``teacher`` and ``adam``: its info, the
    teacher-training student's state and warm start, the tracker's values and the batch stream position;
    None when there is nothing to continue (no file, or one without resume state)."""
    if not path.is_file():
        return None
    tensors, saved = load_checkpoint(path)
    resume = saved.get("resume")
    if not isinstance(resume, dict):
        return None
    try:
        teacher.load_state_dict(strip("teacher/", tensors))
        optimizer_from_flat(adam, strip("resume/", tensors), resume["adam"])
        state = _inner_state("resume/student/", tensors, like, int(resume["student_step"]), device)
        start = _inner_state("resume/start/", tensors, like, int(resume["start_step"]), device)
        epoch, pos = (int(x) for x in resume["stream"])
        tracker = dict(resume["tracker"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"cannot resume the teacher phase from {str(path)!r}: it does not fit this run "
                              f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
    info = {k: v for k, v in saved.items() if k not in ("teacher", "resume")}
    return {"info": info, "state": state, "start": start, "stream": (epoch, pos), "tracker": tracker}


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


def student_trainer(ctx: RunContext, teacher: LossTeacher, meta: dict[str, Any] | None = None,
                    warm: dict[str, Tensor] | None = None) -> tuple[Trainer, nn.Module]:
    """The engine's Trainer of a fresh student on ``ce_alpha CE + (1 - ce_alpha) L_{Phi_t}`` with
    Phi_t = teacher(s_t) from the running state, in ``ctx.run_dir`` (resumed exactly from its last checkpoint
    on ``--resume``: the state tracker is checkpointed with the student as the module ``l2t_state``, and
    ``phi_log.jsonl`` is cut back to the checkpoint's epoch); returns (trainer, student)."""
    cfg, run_dir, device = ctx.cfg, ctx.run_dir, ctx.device
    student = warm_model(ctx, warm)
    teacher = teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    tracker = StudentStateTracker(ctx.splits.num_classes)
    phi_path = run_dir / PHI_LOG
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

    def start(epoch: int) -> None:
        acc.update(W=0.0, b=0.0, n=0)

    def observe(results: dict[str, dict[str, float]]) -> None:
        """The epoch's validation: the dev features, its phi_log record and epoch-line columns, all before
        the engine writes the epoch's checkpoint (which then holds the updated tracker)."""
        val = results.get("val", {})
        tracker.observe_dev(val["loss"], val["acc"] / 100)
        if acc["n"]:
            stats = phi_stats(acc["W"] / acc["n"], acc["b"] / acc["n"])
            _append_jsonl(phi_path, {"epoch": trainer.epoch + 1, **stats, "state": tracker.state_dict()})
            trainer.epoch_info["phi"] = phi_line(stats)
        acc.update(W=0.0, b=0.0, n=0)

    trainer = ctx.trainer({"model": student, "l2t_state": TrackerModule(tracker)}, step, meta=dict(meta or {}),
                          callbacks=[EpochHooks(start=start)], evaluator=ObservedEvaluator(ctx.evaluator(), observe))
    repair_jsonl(phi_path, "epoch", trainer.epoch)  # records after the checkpoint's epoch (or all) go
    return trainer, student


def train_student(ctx: RunContext, teacher: LossTeacher, meta: dict[str, Any] | None = None,
                  warm: dict[str, Tensor] | None = None) -> tuple[FitResult, nn.Module]:
    """Train the student of :func:`student_trainer` for ``train.epochs``; returns (FitResult, student)."""
    trainer, student = student_trainer(ctx, teacher, meta, warm)
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
    warm = warm_start(ctx)

    def load(path: Path) -> tuple[LossTeacher, dict] | None:
        if teachers.given:
            origin["file"] = str(path)
        return finished_teacher(path, ctx.device, ctx.splits.num_classes)

    def train() -> tuple[LossTeacher, dict]:
        if distributed.world_size() > 1:
            raise ConfigError("recipe l2t: the teacher phase (hypergradients through one unrolled student trajectory) "
                              "runs in one process, not under torchrun; train the teacher in one process, then "
                              "distil data-parallel from it with teacher.checkpoint=<that run folder>")
        origin["steps_trained"] = cfg.l2t.teacher_steps
        return train_teacher(ctx, warm)

    teacher, info = teachers.learned(TEACHER_FILE, load, train)
    meta = ctx.meta("l2t-dlf")
    meta["l2t"] = {**info, "teacher_model": teacher.kind, "teacher_file": origin["file"],
                   "ce_alpha": cfg.l2t.ce_alpha}
    meta["l2t"]["warm_start_epochs"] = cfg.l2t.warm_start_epochs
    trainer, student = student_trainer(ctx, teacher, meta, warm)
    while not trainer.done:
        trainer.run_epoch()
    result = trainer.finish(cost={"teacher_steps_trained": origin["steps_trained"],
                                  "student_epochs": cfg.train.epochs + cfg.l2t.warm_start_epochs,
                                  "wall_time_s": time.perf_counter() - t0})
    return RunResult(ctx.run_dir, result.summary, student, result.history)
