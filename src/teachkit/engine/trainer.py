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
- ``callbacks``: :class:`Callback` objects called at each epoch's start and end.

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
the same transfer); metrics accumulate on the device and are read once per epoch.

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
from typing import Any, Literal

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from teachkit import distributed
from teachkit.data.loader import BatchLoader
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
from teachkit.engine.optim import OptimConfig, SplitBackward, build_optimizer
from teachkit.engine.precision import (
    Compiled,
    PrecisionName,
    compile_errors,
    has_recurrent,
    resolve_channels_last,
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
    #: torch.compile the student and the frozen teacher (eager fallback with a warning on failure)
    compile: bool = False
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


class Callback:
    """Hooks around each epoch; subclass and override what you need."""

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        """Before epoch ``epoch`` (0-based) trains."""

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After the epoch's record, checkpoints and metrics line are written."""


class EpochHooks(Callback):
    """A :class:`Callback` from plain functions: ``start(epoch)`` and ``end(record)``."""

    def __init__(self, start: Callable[[int], None] | None = None,
                 end: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.start, self.end = start, end

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        if self.start is not None:
            self.start(epoch)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.end is not None:
            self.end(record)


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
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(self.run_dir, e) from None
        #: data parallelism under torchrun: this process trains on its shard of every batch; rank 0 writes
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.main = self.rank == 0
        if self.main:
            remove_temporary_files(self.run_dir)  # left by a kill in the middle of an atomic write
        self.meta = dict(meta or {})
        self.device = next(self.model.parameters()).device
        self.precision = resolve_precision(loop.precision, self.device, recurrent=has_recurrent(self.model))
        self.channels_last = resolve_channels_last(loop.channels_last, self.precision)
        for module in [*self.modules.values(), *self.frozen.values()]:
            channels_last(module, self.channels_last)
        self.scaler = self.precision.scaler(self.device)
        self._check_world(batches)
        sync_bn = loop.sync_batchnorm and self.world > 1 and self.device.type == "cuda"
        if sync_bn:
            for name in list(self.modules):
                self.modules[name] = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.modules[name])
            self.model = next(iter(self.modules.values()))
        self.compiled = Compiled()
        if loop.compile:
            self.compiled.add(next(iter(self.modules)), self.model)
            for name, module in self.frozen.items():
                self.compiled.add(name, module)
        self.params = [p for m in self.modules.values() for p in m.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, optim)
        self._check_split_backward()
        self.steps = len(batches)
        self.select_metric = select_metric(evaluator, loop.select_metric)
        mode = loop.select_mode if loop.select_mode != "auto" else evaluator.direction(self.select_metric)
        self.maximise = mode == "max"
        ckpt_dir = self.run_dir / "checkpoints"
        self.last_path, self.best_path = ckpt_dir / "last.safetensors", ckpt_dir / "best.safetensors"
        self.log = RunLog(self.run_dir, loop.tensorboard and self.main)
        self.trajectory = Trajectory(self.run_dir / "trajectory") if loop.save_every else None
        self.rng = RandomStream(loop.seed if self.main else rank_seed(loop.seed, self.rank), self.device)
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
        if self.precision.warning:
            self.warn(self.precision.warning)
        if loop.sync_batchnorm and self.world > 1 and not sync_bn:
            self.warn("train.sync_batchnorm needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel); BatchNorm "
                      "statistics stay per process")
        if resume and self.last_path.is_file():  # resuming a run that never finished an epoch starts it
            self._resume()
        elif self.main:  # a fresh start forgets what an earlier attempt in this folder logged
            self.log.reset()
            if self.trajectory is not None:
                self.trajectory.truncate(-1)
        self.t_start = time.perf_counter()

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
        return self.epoch >= self.loop.epochs

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

    def run_epoch(self) -> dict[str, Any]:
        """Train one epoch, evaluate, write checkpoints and the metrics line, then call the callbacks."""
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
        return record

    def _nonfinite(self, value: float, epoch: int, step: int) -> NonFiniteLossError:
        kept = (f"last good checkpoint {str(self.last_path)!r} (epoch {epoch})"
                if epoch > 0 else "no checkpoint was written yet")
        return NonFiniteLossError(f"loss became {value} at epoch {epoch + 1}, step {step + 1}; training stopped, "
                                  f"{kept}")

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        loop, oc = self.loop, self.optim_cfg
        for module in self.modules.values():
            module.train()
        sums: dict[str, Tensor] = {}
        seen = 0
        lr = oc.lr
        t_epoch = time.perf_counter()
        show = loop.progress and bars_visible() and self.main
        beat = loop.progress and self.main and not show  # in a log: heartbeat lines instead of the bar
        last_beat = t_epoch
        bar = tqdm(self.batches.batches(epoch), total=self.steps, desc=f"{self.desc} {epoch + 1}/{loop.epochs}",
                   disable=not show, leave=False, dynamic_ncols=True)
        for step, batch in enumerate(bar):
            if self.channels_last and isinstance(batch.x, Tensor) and batch.x.dim() == 4:
                batch = batch.map_x(batch_channels_last)
            progress = Progress(epoch, step, loop.epochs, self.steps)
            if self.unit is None:
                self.unit = input_unit(batch.x)
            lr = oc.lr * lr_factor(oc, epoch, step, self.steps, loop.epochs)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            n = batch.size
            seen += n
            local = batch
            if self.world > 1:  # this process's rows of the global batch (every process drew the same batch)
                local = batch.rows(*distributed.shard_bounds(n, self.world, self.rank))
            chunks = (local.chunks(loop.micro_batch) if loop.micro_batch else [local]) if local.size else []
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
            for chunk in chunks:
                out = self._step(chunk, progress)
                loss = sum(out.terms.values())
                m = chunk.size
                with torch.no_grad():
                    stats = {"loss": loss.detach(), **{k: v.detach() for k, v in out.terms.items()}}
                    for k, v in stats.items():
                        sums[f"train.{k}"] = sums.get(f"train.{k}", 0) + v.double() * m
                    extra = self.evaluator.train_metrics(out.outputs, chunk) if out.outputs is not None else {}
                    for k, v in {**extra, **out.metrics}.items():
                        sums[k] = sums.get(k, 0) + v.double()
                if self.world > 1:  # one guard per step, after every process's chunks (below)
                    step_loss += stats["loss"].double()
                # the chunk's one host sync: the NaN guard (and the progress bar's running values)
                elif show:
                    shown = [k for k in ("train_acc",) if k in sums]
                    host = torch.stack([stats["loss"].double(), sums["train.loss"],
                                        *(sums[k] for k in shown)]).tolist()
                    value = host[0]
                else:
                    value = float(stats["loss"])
                if self.world == 1 and not math.isfinite(value):
                    raise self._nonfinite(value, epoch, step)
                # chunks weigh by their share of the global batch's loss items; with several processes the
                # gradient average over processes (x 1/world) is undone by the factor world
                factor = None if len(chunks) == 1 and self.world == 1 else chunk.items * self.world / batch.items
                self._backward(out.terms, loss, factor)
            if self.world > 1:
                value = float(distributed.all_reduce_sum(step_loss))
                if not math.isfinite(value):
                    raise self._nonfinite(value, epoch, step)
                if show:
                    shown = [k for k in ("train_acc",) if k in sums]
                    host = [value, *torch.stack([sums["train.loss"], *(sums[k] for k in shown)]).tolist()]
                self._average_gradients()
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clipping sees the true gradients
            if oc.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.params, oc.grad_clip)
            if self.scaler is None:
                self.optimizer.step()
            else:  # skips the step when a gradient overflowed, and adapts the scale
                self.scaler.step(self.optimizer)
                self.scaler.update()
            if show:
                post = {"loss": f"{host[1] / seen:.4f}"}
                if shown:
                    post["acc"] = f"{host[2] / seen:.1f}"
                post[f"{self.unit}_s"] = f"{seen / max(1e-9, time.perf_counter() - t_epoch):.0f}"
                bar.set_postfix(post)
            elif beat and step + 1 < self.steps and time.perf_counter() - last_beat >= self.heartbeat_s:
                last_beat = time.perf_counter()
                tqdm.write(self._heartbeat_line(epoch, step, seen, sums, last_beat - t_epoch))
        bar.close()
        epoch_time = time.perf_counter() - t_epoch
        self.train_time += epoch_time
        self.samples_seen += seen
        names = list(sums)
        values = distributed.all_reduce_sum(torch.stack(list(sums.values()))).tolist() if names else []
        if self.world > 1:  # BatchNorm statistics as DistributedDataParallel keeps them: rank 0's
            for module in self.modules.values():
                for buffer in module.buffers():
                    distributed.broadcast_(buffer)
        means = {k: v / max(1, seen) for k, v in zip(names, values, strict=True)}
        train = {k[len("train."):]: v for k, v in means.items() if k.startswith("train.")}
        train = {"loss": train.pop("loss"), **train} if "loss" in train else train
        results = self.evaluator.evaluate(self.model)
        val = results.get("val", {})
        record = {"epoch": epoch + 1, "lr": lr, "train": train,
                  **{k: v for k, v in means.items() if not k.startswith("train.")}, **results,
                  "epoch_time_s": epoch_time, "images_per_s": seen / max(1e-9, epoch_time)}
        if self.epoch_info:
            record["info"] = dict(self.epoch_info)
        self.history.append(record)
        weights = self.weights()
        state = {**self.meta, "epoch": epoch + 1, **{f"{s}_{k}": v for s, m in results.items() for k, v in m.items()}}
        better = self._better(val.get(self.select_metric, float("nan")))
        if better:
            self.best = {"epoch": epoch + 1, "metric": self.select_metric, **results}
        self.rng.capture()  # this trainer's stream as of now (inside its context)
        rng = self._rng_tensors()
        if self.main:
            self._write_epoch(record, weights, state, better, rng)
        distributed.barrier()  # the other processes read the run folder only once rank 0 has written it
        return record

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
                         "world_size": self.world, "train_time_s": self.train_time, "record": record})
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
        """Average the trainable parameters' gradients over the processes (one all-reduce per dtype and device,
        as DistributedDataParallel's buckets do, after the backward); a parameter no process gave a gradient
        keeps none, so the optimiser skips it as it would in one process."""
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
        """An optimiser with :class:`SplitBackward` (DOT) runs in one process, without fp16's gradient scaler and
        without clipping: a one-line ConfigError otherwise."""
        if not isinstance(self.optimizer, SplitBackward):
            return
        name = self.optim_cfg.name
        if self.scaler is not None:
            raise ConfigError(f"optim.name={name} keeps the task and distillation gradients apart, which fp16's "
                              f"gradient scaler does not support; use train.precision=fp32, bf16 or auto")
        if self.optim_cfg.grad_clip:
            raise ConfigError(f"optim.name={name} does not support optim.grad_clip={self.optim_cfg.grad_clip} "
                              f"(its two momenta see the gradients apart); unset optim.grad_clip")
        if self.world > 1:
            raise ConfigError(f"optim.name={name} runs in one process, not {self.world}: run without torchrun")

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
        is set to this run's when missing and is never less than it."""
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
            **extra_summary,
        }
        if self.warnings:
            summary["warnings"] = list(self.warnings)
        if self.main:
            self.log.summary(summary)
        self.log.close()
        distributed.barrier()
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
