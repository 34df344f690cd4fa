"""The one training loop every recipe and every task uses.

``fit(modules, step_fn, batches, optim, evaluator, run_dir, loop=...)`` takes only what it needs:

- ``modules``: the trainable modules by name; the first one (``model``) is the one evaluated; all are
  optimised, checkpointed (``<name>/<param>``) and resumed together (a distillation objective's
  regressors and memory banks train with the student);
- ``step_fn(batch, progress) -> StepOutput``: named loss terms, plus the outputs the evaluator's training
  metrics read (classification: the logits);
- ``batches``: any :class:`~teachkit.types.BatchSource`, reproducible per (seed, epoch);
- ``optim``: :class:`~teachkit.engine.optim.OptimConfig` (optimiser, warm-up and schedule, clipping);
- ``evaluator``: a :class:`~teachkit.types.Evaluator` (val/test metrics; the selection metric);
- ``loop``: :class:`LoopConfig` (epochs, seed, precision, selection, what the run folder keeps);
- ``callbacks``: :class:`~teachkit.engine.callbacks.Callback` objects called at the run's start and end, each
  epoch's start and end and after each optimiser step; one may stop the run (:meth:`Trainer.request_stop`).

The engine does everything else once: autocast, backward, clipping, the NaN guard, per-epoch
evaluation, the best-on-val record, atomic checkpoints with exact resume, the trajectory, metrics.jsonl,
summary.json and the progress bar. It never reads the run configuration and never builds data.

Run folder after any interruption: the ``last`` checkpoint stores the epoch's metrics record, so resuming
rewrites ``metrics.jsonl`` to exactly the epochs the checkpoint has seen, and temporary files a kill left are
removed. A write that fails (disk full) is a one-line :class:`~teachkit.engine.checkpoint.WriteError`; the
previous checkpoint stays valid. Resuming with more ``loop.epochs`` than the checkpoint was made with extends
the run (the learning-rate schedule of the remaining epochs follows the new length).

Output: with ``loop.progress`` a per-epoch line goes to stdout, and a progress bar to stderr only when stderr
is a terminal (no bar redraws in nohup, SLURM or CI logs); elsewhere a heartbeat line (step k/N, running loss,
throughput in the evaluator's unit) goes to stdout at most once per ``heartbeat_s`` seconds (60) within an epoch,
so a long epoch shows a sign of life in a log; ``progress=False`` silences all of them, and
warnings (:meth:`Trainer.warn`) are then only kept for the summary.

Host syncs: one per step, the NaN guard reading the loss (the progress bar's running values travel in
the same transfer); metrics accumulate on the device and are read once per epoch. Callbacks add none of their own:
a step's :class:`~teachkit.engine.callbacks.StepInfo` holds device tensors, built only for callbacks that override
``on_step_end``.

:class:`Trainer` is the same loop one epoch at a time (``run_epoch``), for recipes that interleave two
models (Pro-KD trains teacher and student in turn). Each Trainer owns its random stream: the global
torch RNG is swapped in for its epochs and out afterwards, so interleaving two trainers gives each
exactly the stream it would have alone (online and replay Pro-KD agree bit for bit).
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from teachkit import distributed
from teachkit.data.loader import BatchLoader
from teachkit.engine.callbacks import (
    Callback,
    EpochHooks,  # noqa: F401  (re-exported: teachkit.engine.trainer.EpochHooks)
    StepInfo,
    overrides_step_end,
)
from teachkit.engine.checkpoint import (
    Trajectory,
    describe_mismatch,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    prefixed,
    remove_temporary_files,
    save_checkpoint,
    strip,
    write_error,
)
from teachkit.engine.dot import scaler_conflict
from teachkit.engine.grad_buckets import GradientBuckets, hooks_available
from teachkit.engine.optim import OptimConfig, SplitBackward, build_optimizer
from teachkit.engine.precision import (
    Compiled,
    PrecisionName,
    compile_errors,
    has_recurrent,
    resolve_channels_last,
    resolve_compile,
    resolve_precision,
)
from teachkit.engine.runlog import RunLog
from teachkit.engine.schedule import lr_factor
from teachkit.errors import CheckpointError, ConfigError, NonFiniteLossError
from teachkit.options import Options, option, short_repr
from teachkit.types import Batch, BatchSource, Evaluator, Progress, StepOutput

StepFn = Callable[[Batch, Progress], StepOutput]


@dataclass
class LoopConfig(Options):
    """What the loop needs besides the optimiser: length, seed of its random stream, precision, how the
    best checkpoint is selected (``select_metric``, default the evaluator's primary metric; ``select_mode``
    ``auto`` = the evaluator's direction for that metric) and what the run folder keeps."""

    epochs: int = option(10, ge=1)
    seed: int = 0
    #: auto: bf16 autocast where the device runs it fast, else fp32 (teachkit.engine.precision)
    precision: PrecisionName = "auto"
    #: auto: on in bf16/fp16 (4-D weights and batches in NHWC layout)
    channels_last: bool | Literal["auto"] = "auto"
    #: torch.compile the student and the frozen teacher (eager fallback with a warning on failure); auto: where it
    #: was measured to pay back (engine.precision.resolve_compile)
    compile: bool | Literal["auto"] = "auto"
    save_every: int = option(0, ge=0)
    tensorboard: bool = False
    progress: bool = True
    select_metric: str | None = None
    select_mode: Literal["auto", "max", "min"] = "auto"
    #: gradient accumulation: each batch runs in chunks of at most this many samples, chunk losses weighted by
    #: their share of the batch's loss items (samples; target tokens for translation: the real count, so a short
    #: last chunk weighs less); None = whole
    micro_batch: int | None = option(None, ge=1)
    #: CPU: denormal floats read as zero during this run's epochs (pretrained Transformers fine-tune up to 4x
    #: faster on CPU, where denormals take a slow path; values below ~1e-38 become 0)
    flush_denormal: bool = False
    #: multi-process runs on CUDA: BatchNorm statistics over the global batch (SyncBatchNorm); else per process
    sync_batchnorm: bool = False


@dataclass
class FitResult:
    """What a finished ``fit`` returns: the summary dict and the per-epoch records."""

    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; a ConfigError otherwise.
    Under ``torchrun`` this joins the process group, and ``auto``/``cuda`` mean ``cuda:LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use auto or cpu")
    distributed.init_from_env(dev.type)
    if dev.type == "cuda" and dev.index is None and distributed.launched():
        dev = torch.device(f"cuda:{distributed.local_rank()}")
    return dev


def channels_last(model: nn.Module, enabled: bool) -> nn.Module:
    """``model`` with 4-D weights in channels_last layout when ``enabled`` (no-op for other models)."""
    return model.to(memory_format=torch.channels_last) if enabled else model


def batch_channels_last(t: Tensor) -> Tensor:
    """A 4-D batch in channels_last layout (other tensors unchanged)."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


class RandomStream:
    """A private torch RNG stream (CPU, and the CUDA device when used), swapped in with ``with``."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.Generator().manual_seed(seed).get_state()
        self.cuda: Tensor | None = None
        if device.type == "cuda":
            outer = torch.cuda.get_rng_state(device)
            torch.cuda.manual_seed(seed)
            self.cuda = torch.cuda.get_rng_state(device)
            torch.cuda.set_rng_state(outer, device)

    def __enter__(self) -> RandomStream:
        self._outer = (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda is not None else None)
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        self.capture()
        if self.cuda is not None:
            torch.cuda.set_rng_state(self._outer[1], self.device)
        torch.set_rng_state(self._outer[0])

    def capture(self) -> None:
        """Record the current global state as this stream's (call inside its ``with``)."""
        self.cpu = torch.get_rng_state()
        if self.cuda is not None:
            self.cuda = torch.cuda.get_rng_state(self.device)

    def tensors(self) -> dict[str, Tensor]:
        out = {"rng/torch": self.cpu}
        if self.cuda is not None:
            out["rng/cuda"] = self.cuda
        return out

    def load(self, tensors: dict[str, Tensor]) -> None:
        self.cpu = tensors["rng/torch"]
        if self.cuda is not None and "rng/cuda" in tensors:
            self.cuda = tensors["rng/cuda"]


def rank_seed(seed: int, rank: int) -> int:
    """The random stream's seed of process ``rank`` > 0 of a multi-process run (rank 0 keeps ``seed``, so a
    one-process run is unchanged): distinct dropout masks per process."""
    digest = hashlib.blake2b(f"teachkit:rank:{seed}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def select_metric(evaluator: Evaluator, name: str | None) -> str:
    """The metric that selects the best checkpoint: ``name`` (``train.select_metric``) or the evaluator's
    primary one; a one-line ConfigError naming the task's metrics when it reports no such metric."""
    name = name or evaluator.primary
    if name not in evaluator.metric_names():
        raise ConfigError(f"train.select_metric={name!r} is not a metric of this task; choose one "
                          f"of: {', '.join(evaluator.metric_names())}")
    return name


def flat_metrics(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}_{k}": v for k, v in metrics.items()}


#: outside a terminal, at most one heartbeat line per this many seconds within an epoch
HEARTBEAT_S = 60.0


def input_unit(x: Any) -> str:
    """The throughput unit of a batch's inputs: ``img`` (N, C, H, W), ``seq`` (token columns or (N, C, L)),
    ``row`` (N, features)."""
    if not isinstance(x, Tensor):
        return "seq"
    return {2: "row", 3: "seq"}.get(x.dim(), "img")


def bars_visible() -> bool:
    """Whether progress bars are drawn: in a notebook, or when stderr is a terminal (not nohup, SLURM, CI)."""
    if any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__):  # tqdm.auto picked the notebook widget
        return True
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class StepDone(NamedTuple):
    """What one optimiser step hands back to its epoch."""

    #: the values its host sync read: the loss, then (with a progress bar) the bar's running sums; None: no rows
    host: list[float] | None
    #: the loss (``loss``) and terms summed as chunk value x chunk samples, on the device (None: not asked for)
    terms: dict[str, Tensor] | None
    #: this process's samples of the step
    samples: int


class EpochSums:
    """The epoch's training metrics, summed on the device (the loss and terms weighted by each chunk's samples)
    and read once, at the epoch's end."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        #: samples of the global batches so far
        self.seen = 0

    def add(self, stats: Mapping[str, Tensor], metrics: Mapping[str, Tensor], size: int) -> None:
        """Add a chunk's detached loss and terms (``train.<name>``, x ``size``) and its metric sums."""
        for k, v in stats.items():
            self.sums[f"train.{k}"] = self.sums.get(f"train.{k}", 0) + v.double() * size
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0) + v.double()

    def running(self) -> list[Tensor]:
        """The progress bar's running values: the loss sum, and the accuracy sum when the task has one."""
        return [self.sums["train.loss"], *(self.sums[k] for k in ("train_acc",) if k in self.sums)]

    def means(self) -> dict[str, float]:
        """Every sum over all processes (one all-reduce and one read) divided by the samples seen."""
        names = list(self.sums)
        values = distributed.all_reduce_sum(torch.stack(list(self.sums.values()))).tolist() if names else []
        return {k: v / max(1, self.seen) for k, v in zip(names, values, strict=True)}


class EpochDisplay:
    """An epoch's progress output on rank 0: a bar when stderr is a terminal (running loss, accuracy and
    throughput), else a heartbeat line at most every ``trainer.heartbeat_s`` seconds; nothing without
    ``loop.progress``. ``bar`` iterates over the epoch's batches."""

    def __init__(self, trainer: Trainer, epoch: int) -> None:
        loop = trainer.loop
        self.trainer, self.epoch = trainer, epoch
        self.show = loop.progress and bars_visible() and trainer.main
        self.beat = loop.progress and trainer.main and not self.show  # in a log: heartbeat lines instead of the bar
        self.t_start = self.last_beat = time.perf_counter()
        self.bar = tqdm(trainer.batches.batches(epoch), total=trainer.steps,
                        desc=f"{trainer.desc} {epoch + 1}/{loop.epochs}", disable=not self.show, leave=False,
                        dynamic_ncols=True)

    def step_done(self, step: int, host: list[float] | None, sums: EpochSums) -> None:
        """The bar's postfix from the values the step's host sync read, or a heartbeat line when one is due."""
        trainer, seen = self.trainer, sums.seen
        if self.show and host is not None:
            post = {"loss": f"{host[1] / seen:.4f}"}
            if len(host) > 2:
                post["acc"] = f"{host[2] / seen:.1f}"
            post[f"{trainer.unit}_s"] = f"{seen / max(1e-9, time.perf_counter() - self.t_start):.0f}"
            self.bar.set_postfix(post)
        elif self.beat and step + 1 < trainer.steps and time.perf_counter() - self.last_beat >= trainer.heartbeat_s:
            self.last_beat = time.perf_counter()
            tqdm.write(trainer._heartbeat_line(self.epoch, step, seen, sums.sums, self.last_beat - self.t_start))

    def close(self) -> float:
        """Close the bar; the epoch's seconds so far."""
        self.bar.close()
        return time.perf_counter() - self.t_start


class Trainer:
    """Train ``modules`` with ``step_fn`` over ``batches``; see the module docstring for the arguments.

    Writes ``run_dir/checkpoints/{last,best}.safetensors``, ``metrics.jsonl``, ``summary.json`` and, with
    ``loop.save_every=k``, ``trajectory/``. ``meta`` (model name, shapes, ...) is stored in every checkpoint
    so that it can be loaded on its own. ``resume=True`` continues from ``last`` (or starts afresh if no
    epoch was finished).
    """

    def __init__(self, modules: nn.Module | Mapping[str, nn.Module], step_fn: StepFn, batches: BatchSource,
                 optim: OptimConfig, evaluator: Evaluator, run_dir: str | Path, *, loop: LoopConfig,
                 callbacks: Sequence[Callback] = (), meta: dict[str, Any] | None = None, resume: bool = False,
                 desc: str = "train", frozen: Mapping[str, nn.Module] | None = None,
                 heartbeat_s: float | None = None) -> None:
        self.modules = dict(modules) if isinstance(modules, Mapping) else {"model": modules}
        #: modules the step uses but never trains (the frozen teacher): same layout and compilation, no
        #: optimiser, no checkpoint, never wrapped for data parallelism
        self.frozen = dict(frozen or {})
        if not self.modules:
            raise ValueError("Trainer needs at least one module")
        self.model = next(iter(self.modules.values()))
        self.step_fn, self.batches, self.optim_cfg, self.evaluator = step_fn, batches, optim, evaluator
        self.loop, self.callbacks, self.desc = loop, list(callbacks), desc
        #: outside a terminal, the seconds between two heartbeat lines within an epoch (default HEARTBEAT_S)
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        #: throughput unit (``img``, ``seq``, ``sent``...): the evaluator's, else by the first batch's inputs
        self.unit = evaluator.sample_unit
        self._open_run_dir(Path(run_dir))
        self.meta = dict(meta or {})
        sync_bn = self._place_modules()
        self._build_optimizer()
        self.steps = len(batches)
        self._choose_selection()
        self._open_outputs()
        self._reset_state()
        self._startup_warnings(sync_bn)
        if resume and self.last_path.is_file():  # resuming a run that never finished an epoch starts it
            self._resume()
        elif self.main:  # a fresh start forgets what an earlier attempt in this folder logged
            self.log.reset()
            if self.trajectory is not None:
                self.trajectory.truncate(-1)
        self.t_start = time.perf_counter()

    def _open_run_dir(self, run_dir: Path) -> None:
        """Create the run folder (a one-line WriteError when it cannot be); under torchrun each process trains on
        its shard of every batch and rank 0 alone writes."""
        self.run_dir = run_dir
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(self.run_dir, e) from None
        #: data parallelism under torchrun: this process trains on its shard of every batch; rank 0 writes
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.main = self.rank == 0
        if self.main:
            remove_temporary_files(self.run_dir)  # left by a kill in the middle of an atomic write

    def _place_modules(self) -> bool:
        """Precision, memory layout, fp16's gradient scaler, SyncBatchNorm and torch.compile for the modules on
        their device; returns whether BatchNorm statistics are synchronised over processes."""
        loop = self.loop
        self.device = next(self.model.parameters()).device
        self.precision = resolve_precision(loop.precision, self.device, recurrent=has_recurrent(self.model))
        self.channels_last = resolve_channels_last(loop.channels_last, self.precision)
        for module in [*self.modules.values(), *self.frozen.values()]:
            channels_last(module, self.channels_last)
        self.scaler = self.precision.scaler(self.device)
        self._check_world(self.batches)
        sync_bn = loop.sync_batchnorm and self.world > 1 and self.device.type == "cuda"
        if sync_bn:
            for name in list(self.modules):
                self.modules[name] = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.modules[name])
            self.model = next(iter(self.modules.values()))
        self.compiled = Compiled()
        if resolve_compile(loop.compile, self.device, self.model, loop.epochs * len(self.batches)):
            self.compiled.add(next(iter(self.modules)), self.model)
            for name, module in self.frozen.items():
                self.compiled.add(name, module)
        return sync_bn

    def _build_optimizer(self) -> None:
        """The optimiser over every trainable parameter of the modules."""
        self.params = [p for m in self.modules.values() for p in m.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, self.optim_cfg)
        self._check_split_backward()
        #: several processes: the gradient average overlapped with the backward, bucket by bucket (None: one
        #: process, or the fallback of one all-reduce after the backward)
        self.buckets = (GradientBuckets(self.params, self.world) if self.world > 1 and hooks_available()
                        and not isinstance(self.optimizer, SplitBackward) else None)

    def _choose_selection(self) -> None:
        """The validation metric that selects the best checkpoint, and whether it is maximised."""
        self.select_metric = select_metric(self.evaluator, self.loop.select_metric)
        mode = self.loop.select_mode
        mode = mode if mode != "auto" else self.evaluator.direction(self.select_metric)
        self.maximise = mode == "max"

    def _open_outputs(self) -> None:
        """Checkpoint paths, the run log, the trajectory (``loop.save_every``) and this trainer's random stream."""
        loop = self.loop
        ckpt_dir = self.run_dir / "checkpoints"
        self.last_path, self.best_path = ckpt_dir / "last.safetensors", ckpt_dir / "best.safetensors"
        self.log = RunLog(self.run_dir, loop.tensorboard and self.main)
        self.trajectory = Trajectory(self.run_dir / "trajectory") if loop.save_every else None
        self.rng = RandomStream(loop.seed if self.main else rank_seed(loop.seed, self.rank), self.device)

    def _reset_state(self) -> None:
        """The state of a run that has trained no epoch (a resume then loads its checkpoint's)."""
        self.history: list[dict[str, Any]] = []
        self.epoch = 0  # epochs completed
        self.best: dict[str, Any] = {"epoch": 0}
        self.wall_before = 0.0
        self.samples_seen = 0
        self.train_time = 0.0
        self.extra_checkpoints: set[int] = set()
        self.warnings: list[str] = []
        #: recipe facts for the current epoch (phase, teacher epoch, temperature...), set by callbacks in
        #: ``on_epoch_start``: shown on the epoch line and stored in its metrics record under ``info``
        self.epoch_info: dict[str, Any] = {}
        #: the reason of the first :meth:`request_stop`, and the stop once it took effect (reason, epoch, step)
        self.stop_request: str | None = None
        self.stopped: dict[str, Any] | None = None
        self._started = False  # on_train_start called

    def _startup_warnings(self, sync_bn: bool) -> None:
        """Warnings about settings the run cannot honour as asked (precision, SyncBatchNorm on a CPU)."""
        if self.precision.warning:
            self.warn(self.precision.warning)
        if self.loop.sync_batchnorm and self.world > 1 and not sync_bn:
            self.warn("train.sync_batchnorm needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel); BatchNorm "
                      "statistics stay per process")

    def _check_world(self, batches: BatchSource) -> None:
        """With several processes, each takes an equal share of every batch: ``data.batch_size`` must divide."""
        size = batches.batch_size if isinstance(batches, BatchLoader) else None  # token batches vary anyway
        if self.world == 1 or size is None or size % self.world == 0:
            return
        lower, upper = size // self.world * self.world, (size // self.world + 1) * self.world
        options = " or ".join(str(v) for v in (lower, upper) if v > 0)
        raise ConfigError(f"data.batch_size={size} does not divide among the {self.world} processes (world size "
                          f"{self.world}): each takes an equal share of the global batch; use a multiple of "
                          f"{self.world}, e.g. {options}")

    def _state_field(self, state: dict[str, Any], key: str, ok: Callable[[Any], bool], expected: str,
                     default: Any = ...) -> Any:
        """``state[key]`` when ``ok`` accepts it; a one-line CheckpointError naming the file and the field."""
        if key not in state:
            if default is not ...:
                return default
            raise CheckpointError(f"cannot resume from {str(self.last_path)!r}: its state has no {key!r} field "
                                  f"(expected {expected})")
        value = state[key]
        if not ok(value):
            raise CheckpointError(f"cannot resume from {str(self.last_path)!r}: its state field {key}="
                                  f"{short_repr(value)} is not {expected}")
        return value

    def _resume(self) -> None:
        tensors, state = load_checkpoint(self.last_path)
        field_ = self._state_field
        epoch = field_(state, "epoch", lambda v: type(v) is int and v >= 0, "a whole number of epochs >= 0")
        best = field_(state, "best", lambda v: isinstance(v, dict) and type(v.get("epoch")) is int,
                      "a mapping with the best epoch")
        opt = field_(state, "optimizer", lambda v: isinstance(v, dict) and isinstance(v.get("state"), dict)
                     and isinstance(v.get("param_groups"), list), "an optimiser state (state, param_groups)")
        wall = field_(state, "wall_time_s", _is_number, "a number of seconds", 0.0)
        warnings = field_(state, "warnings", lambda v: isinstance(v, list), "a list of messages", [])
        record = field_(state, "record", lambda v: isinstance(v, dict) and v.get("epoch") == epoch,
                        f"the metrics record of epoch {epoch}", None)
        seen = field_(state, "samples_seen", _is_number, "a number of samples", 0)
        train_time = field_(state, "train_time_s", _is_number, "a number of seconds", 0.0)
        stopped = field_(state, "stopped", lambda v: isinstance(v, dict) and isinstance(v.get("reason"), str),
                         "a stop's reason, epoch and step", None)
        if epoch > self.loop.epochs:
            raise ConfigError(f"cannot resume from {str(self.last_path)!r}: it finished {epoch} epochs, more than "
                              f"the {self.loop.epochs} asked for (train.epochs may only grow on resume)")
        if "rng/torch" not in tensors:
            raise CheckpointError(f"cannot resume from {str(self.last_path)!r}: it holds no random state "
                                  f"(rng/torch); it is not a training checkpoint")
        try:
            for name, module in self.modules.items():
                module.load_state_dict(strip(f"{name}/", tensors))
            optimizer_from_flat(self.optimizer, tensors, opt)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
            raise CheckpointError(f"cannot resume from {str(self.last_path)!r}: it does not fit this run's "
                                  f"{' + '.join(self.modules)} ({describe_mismatch(e)})") from None
        if self.rank:
            own = {k.replace(f"rng/rank{self.rank}/", "rng/"): v for k, v in tensors.items()
                   if k.startswith(f"rng/rank{self.rank}/")}
            if not own:
                raise CheckpointError(f"cannot resume from {str(self.last_path)!r} with {self.world} processes: it "
                                      f"holds no random state for process {self.rank} (it was made with fewer)")
            tensors = {**tensors, **own}
        self.rng.load(tensors)
        scaler = state.get("scaler")
        if self.scaler is not None and isinstance(scaler, dict) and scaler:
            self.scaler.load_state_dict(scaler)
        self.epoch, self.best, self.wall_before = epoch, best, float(wall)
        self.samples_seen, self.train_time = int(seen), float(train_time)
        if stopped is not None:  # a stopped run stays stopped
            self.stopped, self.stop_request = dict(stopped), stopped["reason"]
        self.warnings = [str(w) for w in dict.fromkeys([*(str(w) for w in warnings), *self.warnings])]
        if self.main:
            self.history = self.log.repair(self.epoch, record)
            if self.trajectory is not None:
                self.trajectory.truncate(self.epoch)
        else:
            self.history = [r for r in self.log.records() if r["epoch"] <= self.epoch]

    def warn(self, message: str) -> None:
        """Print ``warning: message`` on one line (stderr, also outside a terminal; not with
        ``progress=false``, i.e. ``--quiet``) and keep it for the summary's ``warnings`` list (and across a
        resume); a message given twice is kept once."""
        if message in self.warnings:
            return
        self.warnings.append(message)
        if self.loop.progress and self.main:
            tqdm.write(f"warning: {self.desc}: {message}", file=sys.stderr)

    @property
    def wall_time(self) -> float:
        """Seconds this run has taken so far, over every session (resumes included)."""
        return self.wall_before + time.perf_counter() - self.t_start

    @property
    def done(self) -> bool:
        """Whether the run has trained all ``loop.epochs`` epochs or was stopped (:meth:`request_stop`)."""
        return self.epoch >= self.loop.epochs or self.stopped is not None

    def keep_checkpoint_at(self, epochs: set[int]) -> None:
        """Also keep trajectory checkpoints after these epochs (e.g. phase boundaries)."""
        self.extra_checkpoints |= set(epochs)
        if self.trajectory is None and self.extra_checkpoints:
            self.trajectory = Trajectory(self.run_dir / "trajectory")

    def weights(self) -> dict[str, Tensor]:
        tensors: dict[str, Tensor] = {}
        for name, module in self.modules.items():
            tensors.update(prefixed(f"{name}/", module.state_dict()))
        return tensors

    def request_stop(self, reason: str) -> None:
        """Stop the run (from a callback; the first reason is kept). In one process the request is honoured after
        the current optimiser step -- the epoch ends there and is evaluated and checkpointed as usual -- or, made in
        ``on_epoch_end``, before the next epoch; with several processes at the end of the epoch (any process's
        request stops all). ``done`` then holds, and the summary and the ``last`` checkpoint note ``stopped``."""
        if self.stop_request is None:
            self.stop_request = str(reason)

    def run_epoch(self) -> dict[str, Any]:
        """Train one epoch, evaluate, write checkpoints and the metrics line, then call the callbacks."""
        if self.stopped is not None:
            raise ConfigError(f"{self.desc}: training was stopped after epoch {self.stopped['epoch']} "
                              f"({self.stopped['reason']}), but this recipe needs epoch {self.epoch + 1} of it; "
                              f"remove the callback that stops it")
        self._start_training()
        epoch = self.epoch
        self.epoch_info = {}
        for cb in self.callbacks:
            cb.on_epoch_start(self, epoch)
        flush = self.loop.flush_denormal and self.device.type == "cpu"
        if flush:
            torch.set_flush_denormal(True)
        try:
            with self.rng:
                record = self._train_epoch(epoch)
        finally:
            if flush:
                torch.set_flush_denormal(False)
        self.epoch = epoch + 1
        for cb in self.callbacks:
            cb.on_epoch_end(self, record)
        self._settle_stop()
        return record

    def _start_training(self) -> None:
        """``on_train_start`` of every callback, once per trainer (before its first epoch, or in ``finish``)."""
        if not self._started:
            self._started = True
            for cb in self.callbacks:
                cb.on_train_start(self)

    def _settle_stop(self) -> None:
        """A stop the finished epoch's checkpoint does not note yet (requested in ``on_epoch_end``; with several
        processes, in any hook): every process agrees (one all-reduce per epoch with several) and the ``last``
        checkpoint's state is rewritten to note it, so a resume does not train on."""
        if self.stopped is not None:
            return
        requested = self.stop_request is not None
        if self.world > 1:
            flag = torch.tensor([float(requested)], dtype=torch.float64, device=self.device)
            requested = float(distributed.all_reduce_sum(flag)) > 0
        if not requested:
            return
        self.stopped = {"reason": self.stop_request or "requested by another process", "epoch": self.epoch,
                        "step": self.steps}
        if self.main:
            tensors, state = load_checkpoint(self.last_path)
            save_checkpoint(self.last_path, tensors, {**state, "stopped": self.stopped})
        distributed.barrier()

    def _nonfinite(self, value: float, epoch: int, step: int) -> NonFiniteLossError:
        kept = (f"last good checkpoint {str(self.last_path)!r} (epoch {epoch})"
                if epoch > 0 else "no checkpoint was written yet")
        return NonFiniteLossError(f"loss became {value} at epoch {epoch + 1}, step {step + 1}; training stopped, "
                                  f"{kept}")

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        """One epoch: its optimiser steps (each followed by the step callbacks and the stop check), then its end."""
        for module in self.modules.values():
            module.train()
        sums = EpochSums()
        display = EpochDisplay(self, epoch)
        hooks = [cb for cb in self.callbacks if overrides_step_end(cb)]
        lr, steps_run = self.optim_cfg.lr, 0
        for step, batch in enumerate(display.bar):
            batch = self._prepared(batch)
            lr = self._set_lr(epoch, step)
            sums.seen += batch.size
            done = self._optimiser_step(batch, Progress(epoch, step, self.loop.epochs, self.steps), sums,
                                        display.show, want_terms=bool(hooks))
            display.step_done(step, done.host, sums)
            steps_run = step + 1
            if hooks:
                self._step_end(hooks, epoch, step, done, lr)
            if self.stop_request is not None and self.world == 1:
                break
        return self._end_epoch(epoch, lr, sums, display.close(), steps_run)

    def _prepared(self, batch: Batch) -> Batch:
        """``batch`` in channels_last layout when the run uses it; the throughput unit from the first one."""
        if self.channels_last and isinstance(batch.x, Tensor) and batch.x.dim() == 4:
            batch = batch.map_x(batch_channels_last)
        if self.unit is None:
            self.unit = input_unit(batch.x)
        return batch

    def _set_lr(self, epoch: int, step: int) -> float:
        """The step's learning rate (warm-up and schedule), set on every parameter group."""
        oc = self.optim_cfg
        lr = oc.lr * lr_factor(oc, epoch, step, self.steps, self.loop.epochs)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _optimiser_step(self, batch: Batch, progress: Progress, sums: EpochSums, show: bool,
                        want_terms: bool) -> StepDone:
        """One optimiser step on ``batch``: forward and backward of each micro-batch chunk of this process's rows
        (each weighted by its share of the global batch's loss items), the NaN guard (the step's host sync), the
        gradient average over processes, then fp16's gradient scaler, clipping and the optimiser step."""
        local = self._local_rows(batch)
        chunks = (local.chunks(self.loop.micro_batch) if self.loop.micro_batch else [local]) if local.size else []
        self.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        terms: dict[str, Tensor] | None = {} if want_terms else None
        host = None
        if self.buckets is not None:
            self.buckets.reset()
        for i, chunk in enumerate(chunks):
            out, loss, stats = self._forward_chunk(chunk, progress, sums)
            if terms is not None:  # the step's sample-weighted sums, on the device (StepInfo)
                for k, v in stats.items():
                    terms[k] = terms.get(k, 0) + v.double() * chunk.size
            if self.world > 1:  # one guard per step, after every process's chunks (below)
                step_loss += stats["loss"].double()
            else:
                host = self._guard(stats["loss"], sums, show, progress)
            # chunks weigh by their share of the global batch's loss items; with several processes the
            # gradient average over processes (x 1/world) is undone by the factor world
            factor = None if len(chunks) == 1 and self.world == 1 else chunk.items * self.world / batch.items
            if self.buckets is not None and i == len(chunks) - 1:  # earlier chunks only accumulate
                self.buckets.arm()
            self._backward(out.terms, loss, factor)
        if self.world > 1:
            if self.buckets is not None:  # the buckets the backward left start before the guard's all-reduce
                self.buckets.flush()
            host = self._guard_processes(step_loss, sums, show, progress)
            self._average_gradients()
        self._apply_gradients()
        return StepDone(host, terms, local.size)

    def _local_rows(self, batch: Batch) -> Batch:
        """This process's rows of the global batch (every process drew the same batch)."""
        if self.world == 1:
            return batch
        return batch.rows(*distributed.shard_bounds(batch.size, self.world, self.rank))

    def _forward_chunk(self, chunk: Batch, progress: Progress,
                       sums: EpochSums) -> tuple[StepOutput, Tensor, dict[str, Tensor]]:
        """The chunk's step output, its loss (the sum of the terms) and the detached loss and terms, added to the
        epoch's sums with the evaluator's training metrics."""
        out = self._step(chunk, progress)
        loss = sum(out.terms.values())
        with torch.no_grad():
            stats = {"loss": loss.detach(), **{k: v.detach() for k, v in out.terms.items()}}
            extra = self.evaluator.train_metrics(out.outputs, chunk) if out.outputs is not None else {}
            sums.add(stats, {**extra, **out.metrics}, chunk.size)
        return out, loss, stats

    def _guard(self, loss: Tensor, sums: EpochSums, show: bool, progress: Progress) -> list[float]:
        """The NaN guard of one chunk in one process: the chunk's one host sync, which also reads the progress
        bar's running values when a bar is shown; a NonFiniteLossError for a loss that is not finite."""
        host = torch.stack([loss.double(), *sums.running()]).tolist() if show else [float(loss)]
        if not math.isfinite(host[0]):
            raise self._nonfinite(host[0], progress.epoch, progress.step)
        return host

    def _guard_processes(self, step_loss: Tensor, sums: EpochSums, show: bool, progress: Progress) -> list[float]:
        """The NaN guard of a step with several processes: the loss summed over them (one all-reduce)."""
        value = float(distributed.all_reduce_sum(step_loss))
        if not math.isfinite(value):
            raise self._nonfinite(value, progress.epoch, progress.step)
        return [value, *torch.stack(sums.running()).tolist()] if show else [value]

    def _apply_gradients(self) -> None:
        """fp16: unscale the gradients (clipping sees the true ones); clip; step (the scaler skips a step whose
        gradients overflowed and adapts its scale)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.optim_cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.optim_cfg.grad_clip)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def _step_end(self, hooks: list[Callback], epoch: int, step: int, done: StepDone, lr: float) -> None:
        """``on_step_end`` of the callbacks that override it, with the step's means as device tensors."""
        sums, n = dict(done.terms or {}), max(1, done.samples)
        loss = sums.pop("loss", None)  # None: this process had no rows in the step
        info = StepInfo(epoch=epoch, step=step, global_step=epoch * self.steps + step + 1,
                        steps_per_epoch=self.steps, terms={k: v / n for k, v in sums.items()},
                        loss=loss / n if loss is not None else torch.zeros((), dtype=torch.float64,
                                                                           device=self.device),
                        samples=done.samples, lr=lr)
        for cb in hooks:
            cb.on_step_end(self, info)

    def _end_epoch(self, epoch: int, lr: float, sums: EpochSums, epoch_time: float, steps_run: int) -> dict[str, Any]:
        """The epoch's end: its metric means (one read), evaluation, the record, the best epoch and checkpoints."""
        self.train_time += epoch_time
        self.samples_seen += sums.seen
        means = sums.means()
        if self.world > 1:  # BatchNorm statistics as DistributedDataParallel keeps them: rank 0's
            for module in self.modules.values():
                for buffer in module.buffers():
                    distributed.broadcast_(buffer)
        results = self.evaluator.evaluate(self.model)
        record = self._epoch_record(epoch, lr, means, results, epoch_time, sums.seen)
        self.history.append(record)
        if self.stop_request is not None and self.world == 1:  # the steps stopped within this epoch
            self.stopped = {"reason": self.stop_request, "epoch": epoch + 1, "step": steps_run}
        self._checkpoint_epoch(record, results)
        return record

    def _epoch_record(self, epoch: int, lr: float, means: dict[str, float], results: dict[str, dict[str, float]],
                      epoch_time: float, seen: int) -> dict[str, Any]:
        """The epoch's line of ``metrics.jsonl``: lr, training means, other sums, val/test results, timing."""
        train = {k[len("train."):]: v for k, v in means.items() if k.startswith("train.")}
        train = {"loss": train.pop("loss"), **train} if "loss" in train else train
        record = {"epoch": epoch + 1, "lr": lr, "train": train,
                  **{k: v for k, v in means.items() if not k.startswith("train.")}, **results,
                  "epoch_time_s": epoch_time, "images_per_s": seen / max(1e-9, epoch_time)}
        if self.epoch_info:
            record["info"] = dict(self.epoch_info)
        return record

    def _checkpoint_epoch(self, record: dict[str, Any], results: dict[str, dict[str, float]]) -> None:
        """The best-on-val record, then (rank 0) the epoch's checkpoints and metrics line."""
        epoch = record["epoch"]
        weights = self.weights()
        state = {**self.meta, "epoch": epoch, **{f"{s}_{k}": v for s, m in results.items() for k, v in m.items()}}
        better = self._better(results.get("val", {}).get(self.select_metric, float("nan")))
        if better:
            self.best = {"epoch": epoch, "metric": self.select_metric, **results}
        self.rng.capture()  # this trainer's stream as of now (inside its context)
        rng = self._rng_tensors()
        if self.main:
            self._write_epoch(record, weights, state, better, rng)
        distributed.barrier()  # the other processes read the run folder only once rank 0 has written it

    def _write_epoch(self, record: dict[str, Any], weights: dict[str, Tensor], state: dict[str, Any], better: bool,
                     rng: dict[str, Tensor]) -> None:
        loop, epoch, val = self.loop, record["epoch"] - 1, record.get("val", {})
        if better:
            save_checkpoint(self.best_path, weights, state)
        if self.trajectory is not None and ((loop.save_every and (epoch + 1) % loop.save_every == 0)
                                            or epoch + 1 in self.extra_checkpoints):
            self.trajectory.add(epoch + 1, val, weights, state)
        opt_tensors, opt_struct = optimizer_to_flat(self.optimizer)
        # the record goes into the checkpoint too: a kill before its metrics line is repaired on resume
        save_checkpoint(self.last_path, {**weights, **opt_tensors, **rng},
                        {**state, "best": self.best, "optimizer": opt_struct, "wall_time_s": self.wall_time,
                         "warnings": list(self.warnings), "samples_seen": self.samples_seen,
                         "scaler": self.scaler.state_dict() if self.scaler is not None else {},
                         "world_size": self.world, "train_time_s": self.train_time, "record": record,
                         **({"stopped": self.stopped} if self.stopped is not None else {})})
        self.log.log(record)
        if loop.progress:
            tqdm.write(self._epoch_line(record))

    def _rng_tensors(self) -> dict[str, Tensor]:
        """The random streams to checkpoint: this process's, and with several processes every process's
        (``rng/rank<r>/...``), gathered to all (a collective: every process calls it)."""
        own = self.rng.tensors()
        if self.world == 1:
            return own
        out = dict(own)
        for key, value in own.items():
            every = distributed.all_gather_cat(value.unsqueeze(0))
            for r in range(1, self.world):
                out[key.replace("rng/", f"rng/rank{r}/", 1)] = every[r].cpu()
        return out

    def _average_gradients(self) -> None:
        """Average the trainable parameters' gradients over the processes: wait for the buckets the backward
        started (:mod:`teachkit.engine.grad_buckets`), or, as a fallback, one all-reduce per dtype and device after
        the backward; a parameter no process gave a gradient keeps none, so the optimiser skips it as it would in
        one process."""
        if self.buckets is not None:
            self.buckets.wait()
            return
        groups: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        for params in groups.values():
            flags = torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype, device=params[0].device)
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                             + [flags])
            flat = distributed.all_reduce_sum(flat).div_(self.world)  # the gradients become views of it
            used = flat[-len(params):].tolist()  # one read per group
            offset = 0
            for i, p in enumerate(params):
                size = p.numel()
                if used[i] > 0:
                    p.grad = flat[offset:offset + size].view_as(p)
                offset += size

    def _backward(self, terms: Mapping[str, Tensor], loss: Tensor, factor: float | None) -> None:
        """Backpropagate the chunk's ``loss`` (the sum of ``terms``) times ``factor`` (None = 1), through the
        gradient scaler in fp16; an optimiser that needs the terms apart (:class:`SplitBackward`) does it."""
        if isinstance(self.optimizer, SplitBackward):
            self.optimizer.backward(terms, factor)
            return
        weighted = loss if factor is None else loss * factor
        (weighted if self.scaler is None else self.scaler.scale(weighted)).backward()

    def _check_split_backward(self) -> None:
        """An optimiser with :class:`SplitBackward` (DOT) runs in one process and without fp16's gradient scaler
        (clipping is refused by its options): a one-line ConfigError otherwise."""
        if not isinstance(self.optimizer, SplitBackward):
            return
        if self.scaler is not None:
            raise ConfigError(scaler_conflict("optim.name"))
        if self.world > 1:
            raise ConfigError(f"optim.name={self.optim_cfg.name} runs in one process, not {self.world}: run without "
                              "torchrun")

    def _step(self, chunk: Batch, progress: Progress) -> StepOutput:
        """``step_fn`` under the run's autocast; a compile failure reverts the compiled models to eager mode
        (one warning naming them) and retries the step."""
        try:
            with self.precision.autocast(self.device):
                return self.step_fn(chunk, progress)
        except compile_errors() as e:
            if not self.compiled:
                raise
            names = self.compiled.revert()
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            self.warn(f"torch.compile failed for {', '.join(names)} ({first}); running eagerly")
            with self.precision.autocast(self.device):
                return self.step_fn(chunk, progress)

    def _better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        best = self.best.get("val", {}).get(self.select_metric)
        if best is None:
            return True
        return value > best if self.maximise else value < best

    def _epoch_line(self, r: dict[str, Any]) -> str:
        parts = [f"{self.desc} epoch {r['epoch']}/{self.loop.epochs}"]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.get("info", {}).items()]
        parts.append(f"loss {r['train']['loss']:.4f}")
        if "train_acc" in r:
            parts.append(f"train {r['train_acc']:.1f}%")
        m = self.select_metric
        for split in ("val", "test"):
            if m in r.get(split, {}):
                value = self.evaluator.format(m, r[split][m])
                parts.append(f"{split} {value}" if m == "acc" else f"{split} {m} {value}")
        return "  ".join(parts) + f"  ({r['images_per_s']:.0f} {self.unit or 'sample'}/s)"

    def _heartbeat_line(self, epoch: int, step: int, seen: int, sums: Mapping[str, Tensor], elapsed: float) -> str:
        """``desc epoch 2/10  step 300/1000  loss 0.4127  (812 img/s)``: the epoch so far (one host read)."""
        loss = float(sums["train.loss"]) / max(1, seen) if "train.loss" in sums else float("nan")
        return (f"{self.desc} epoch {epoch + 1}/{self.loop.epochs}  step {step + 1}/{self.steps}  loss {loss:.4f}  "
                f"({seen / max(1e-9, elapsed):.0f} {self.unit}/s)")

    def _warn_collapse(self, last: dict[str, Any], best: dict[str, Any]) -> None:
        """Warn when the last epoch's selection metric is far worse than the best epoch's (a collapse that
        the best-epoch figure would hide): by more than 10 points for a percentage, 10% relative otherwise."""
        m = self.select_metric
        now, top = last.get("val", {}).get(m), best.get("val", {}).get(m)
        if now is None or top is None or not (math.isfinite(now) and math.isfinite(top)):
            return
        gap = (top - now) if self.maximise else (now - top)
        limit = 10.0 if self.evaluator.is_percent(m) else 0.1 * max(abs(top), 1e-12)
        if gap > limit:
            self.warn(f"the last epoch's val {m} ({self.evaluator.format(m, now)}) is far "
                      f"{'below' if self.maximise else 'above'} the best ({self.evaluator.format(m, top)} at epoch "
                      f"{best['epoch']}): training collapsed or diverged late; the summary's best-epoch figures "
                      f"hide it")

    def finish(self, **extra_summary: Any) -> FitResult:
        """Write ``summary.json`` (last and best-on-val results, wall time, img/s) and close the logs.

        For the selection metric ``m`` (``acc`` by default) the summary holds ``val_m`` / ``test_m`` (last
        epoch), ``best_val_m``, ``test_m_at_best`` and ``best_epoch``; every other metric as ``val_*`` /
        ``test_*`` of the last epoch. ``wall_time_s`` is this run's own time over every session; a ``cost``
        mapping given by the recipe is the total of everything the result is made of, so its ``wall_time_s``
        is set to this run's when missing and is never less than it. A run stopped by a callback notes
        ``stopped`` (reason, epoch, steps run in that epoch). Then ``on_train_end`` of every callback."""
        self._start_training()  # on_train_start always precedes on_train_end, even with no epoch left to train
        m = self.select_metric
        last = self.history[-1] if self.history else {"epoch": self.epoch}
        nan = float("nan")
        best = self.best
        self._warn_collapse(last, best)
        wall = self.wall_time
        cost = extra_summary.get("cost")
        if isinstance(cost, dict):
            given = cost.get("wall_time_s")
            extra_summary["cost"] = {**cost, "wall_time_s": max(given, wall) if _is_number(given) else wall}
        summary = {
            **self.meta,
            "epochs": self.loop.epochs,
            "last_epoch": last["epoch"],
            f"val_{m}": last.get("val", {}).get(m, nan),
            f"test_{m}": last.get("test", {}).get(m, nan),
            "select_metric": m,
            "select_metric_percent": self.evaluator.is_percent(m),
            "best_epoch": best["epoch"],
            f"best_val_{m}": best.get("val", {}).get(m, nan),
            f"test_{m}_at_best": best.get("test", {}).get(m, nan),
            **{k: v for split in ("val", "test") for k, v in flat_metrics(split, last.get(split, {})).items()},
            "wall_time_s": wall,
            "images_per_s": self.samples_seen / self.train_time if self.train_time else nan,
            "sample_unit": self.unit or "sample",  # what images_per_s counts (img, seq, sent, row)
            "precision": self.precision.name,
            "channels_last": self.channels_last,
            "compiled": list(self.compiled),
            **getattr(self.evaluator, "report", dict)(),  # facts of the last evaluation (a causal LM's speed)
            **extra_summary,
        }
        if self.stopped is not None:
            summary["stopped"] = dict(self.stopped)
        if self.warnings:
            summary["warnings"] = list(self.warnings)
        if self.main:
            self.log.summary(summary)
        self.log.close()
        if self.buckets is not None:
            self.buckets.remove()
            self.buckets = None
        distributed.barrier()
        for cb in self.callbacks:
            cb.on_train_end(self, summary)
        return FitResult(summary, self.history)


def fit(modules: nn.Module | Mapping[str, nn.Module], step_fn: StepFn, batches: BatchSource, optim: OptimConfig,
        evaluator: Evaluator, run_dir: str | Path, *, loop: LoopConfig, callbacks: Sequence[Callback] = (),
        meta: dict[str, Any] | None = None, resume: bool = False, desc: str = "train",
        frozen: Mapping[str, nn.Module] | None = None) -> FitResult:
    """Train for ``loop.epochs`` epochs with :class:`Trainer` and return its summary and history."""
    trainer = Trainer(modules, step_fn, batches, optim, evaluator, run_dir, loop=loop, callbacks=callbacks, meta=meta,
                      resume=resume, desc=desc, frozen=frozen)
    while not trainer.done:
        trainer.run_epoch()
    return trainer.finish()
