"""The one training loop every recipe uses.

``fit(model, step_fn, splits, cfg, run_dir)``: ``step_fn(batch, progress)`` returns the named
loss terms and the logits of the model being trained; the engine does the rest once: optimiser,
warm-up and schedule, autocast, backward, clipping, NaN guard, per-epoch val/test evaluation, the
best-on-val record, checkpoints (atomic, exact resume), trajectory, metrics, progress bar.

:class:`Trainer` is the same loop one epoch at a time (``run_epoch``), for recipes that interleave
two models (Pro-KD trains teacher and student in turn). Each Trainer owns its random stream: the
global torch RNG is swapped in for its epochs and out afterwards, so interleaving two trainers
gives each exactly the stream it would have alone (online and replay Pro-KD agree bit for bit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from teachkit.config import OptimConfig, RunConfig
from teachkit.data import BatchLoader, make_augment
from teachkit.data.base import Batch, Splits
from teachkit.engine.checkpoint import (
    Trajectory,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    prefixed,
    save_checkpoint,
    strip,
)
from teachkit.engine.evaluate import evaluate
from teachkit.engine.runlog import RunLog
from teachkit.engine.schedule import lr_factor
from teachkit.errors import ConfigError, NonFiniteLossError
from teachkit.losses.base import Progress

StepFn = Callable[[Batch, Progress], tuple[dict[str, Tensor], Tensor]]
EpochHook = Callable[[int], None]


@dataclass
class FitResult:
    """What a finished ``fit`` returns: the summary dict and the per-epoch records."""

    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def build_optimizer(params: list[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
                               weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use auto or cpu")
    return dev


def memory_format(cfg: RunConfig, splits: Splits) -> torch.memory_format | None:
    """``torch.channels_last`` when ``train.channels_last`` is set and the inputs are images, else None."""
    return torch.channels_last if cfg.train.channels_last and len(splits.input_shape) == 3 else None


def to_memory_format(model: nn.Module, cfg: RunConfig, splits: Splits) -> nn.Module:
    """``model`` in the layout ``train.channels_last`` asks for (teachers too, for the KD step's speed)."""
    fmt = memory_format(cfg, splits)
    return model.to(memory_format=fmt) if fmt is not None else model


def weights_state(model: nn.Module, extra: nn.Module | None) -> dict[str, Tensor]:
    tensors = prefixed("model/", model.state_dict())
    if extra is not None:
        tensors.update(prefixed("extra/", extra.state_dict()))
    return tensors


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
        self.cpu = torch.get_rng_state()
        if self.cuda is not None:
            self.cuda = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(self._outer[1], self.device)
        torch.set_rng_state(self._outer[0])

    def tensors(self) -> dict[str, Tensor]:
        out = {"rng/torch": self.cpu}
        if self.cuda is not None:
            out["rng/cuda"] = self.cuda
        return out

    def load(self, tensors: dict[str, Tensor]) -> None:
        self.cpu = tensors["rng/torch"]
        if self.cuda is not None and "rng/cuda" in tensors:
            self.cuda = tensors["rng/cuda"]


class Trainer:
    """Train ``model`` (and the trainable ``extra`` modules, e.g. a loss's regressors) with ``step_fn``.

    Writes ``run_dir/checkpoints/{last,best}.safetensors``, ``metrics.jsonl``, ``summary.json`` and,
    with ``train.save_every=k``, ``trajectory/``. ``meta`` (model name, shapes, ...) is stored in every
    checkpoint so that it can be loaded on its own. ``resume=True`` continues from ``last`` (or starts
    afresh if no epoch was finished). ``on_epoch_start(epoch)`` runs before each epoch (0-based),
    ``on_epoch_end(record)`` after it.
    """

    def __init__(self, model: nn.Module, step_fn: StepFn, splits: Splits, cfg: RunConfig, run_dir: str | Path, *,
                 extra: nn.Module | None = None, meta: dict[str, Any] | None = None, resume: bool = False,
                 on_epoch_start: EpochHook | None = None,
                 on_epoch_end: Callable[[dict[str, Any]], None] | None = None, desc: str = "train") -> None:
        self.model, self.step_fn, self.splits, self.cfg, self.extra = model, step_fn, splits, cfg, extra
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.meta = dict(meta or {})
        self.on_epoch_start, self.on_epoch_end, self.desc = on_epoch_start, on_epoch_end, desc
        tc = cfg.train
        self.device = next(model.parameters()).device
        self.memory_format = memory_format(cfg, splits)
        to_memory_format(model, cfg, splits)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if extra is not None:
            self.params += [p for p in extra.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, cfg.optim)
        self.loader = BatchLoader(splits.train, cfg.data.batch_size, shuffle=True, seed=tc.seed,
                                  augment=make_augment(cfg.data.augment, splits))
        self.steps = len(self.loader)
        ckpt_dir = self.run_dir / "checkpoints"
        self.last_path, self.best_path = ckpt_dir / "last.safetensors", ckpt_dir / "best.safetensors"
        self.log = RunLog(self.run_dir, tc.tensorboard)
        self.trajectory = Trajectory(self.run_dir / "trajectory") if tc.save_every else None
        self.rng = RandomStream(tc.seed, self.device)
        self.history: list[dict[str, Any]] = []
        self.epoch = 0  # epochs completed
        self.best: dict[str, Any] = {"epoch": 0, "val_acc": -1.0}
        self.wall_before = 0.0
        self.samples_seen = 0
        self.train_time = 0.0
        self.extra_checkpoints: set[int] = set()
        if resume and self.last_path.is_file():  # resuming a run that never finished an epoch starts it
            self._resume()
        self.t_start = time.perf_counter()

    def _resume(self) -> None:
        tensors, state = load_checkpoint(self.last_path)
        self.model.load_state_dict(strip("model/", tensors))
        if self.extra is not None:
            self.extra.load_state_dict(strip("extra/", tensors))
        optimizer_from_flat(self.optimizer, tensors, state["optimizer"])
        self.rng.load(tensors)
        self.epoch, self.best, self.wall_before = state["epoch"], state["best"], state.get("wall_time_s", 0.0)
        self.history = self.log.truncate(self.epoch)
        if self.trajectory is not None:
            self.trajectory.truncate(self.epoch)

    @property
    def done(self) -> bool:
        return self.epoch >= self.cfg.train.epochs

    def keep_checkpoint_at(self, epochs: set[int]) -> None:
        """Also keep trajectory checkpoints after these epochs (e.g. phase boundaries)."""
        self.extra_checkpoints |= set(epochs)
        if self.trajectory is None and self.extra_checkpoints:
            self.trajectory = Trajectory(self.run_dir / "trajectory")

    def run_epoch(self) -> dict[str, Any]:
        """Train one epoch, evaluate on val and test, write checkpoints and the metrics line."""
        epoch = self.epoch
        if self.on_epoch_start is not None:
            self.on_epoch_start(epoch)
        with self.rng:
            record = self._train_epoch(epoch)
        self.epoch = epoch + 1
        if self.on_epoch_end is not None:
            self.on_epoch_end(record)
        return record

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        tc, oc, model, extra = self.cfg.train, self.cfg.optim, self.model, self.extra
        model.train()
        if extra is not None:
            extra.train()
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16")
        sums: dict[str, float] = {}
        correct = seen = 0
        lr = oc.lr
        t_epoch = time.perf_counter()
        bar = tqdm(self.loader.batches(epoch), total=self.steps, desc=f"{self.desc} {epoch + 1}/{tc.epochs}",
                   disable=not tc.progress, leave=False, dynamic_ncols=True)
        for step, batch in enumerate(bar):
            if self.memory_format is not None:
                batch = Batch(batch.x.contiguous(memory_format=self.memory_format), batch.y, batch.index)
            progress = Progress(epoch, step, tc.epochs, self.steps)
            lr = oc.lr * lr_factor(oc, epoch, step, self.steps, tc.epochs)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with autocast:
                terms, logits = self.step_fn(batch, progress)
            loss = sum(terms.values())
            value = float(loss.detach())
            if not math.isfinite(value):
                kept = (f"last good checkpoint {str(self.last_path)!r} (epoch {epoch})"
                        if epoch > 0 else "no checkpoint was written yet")
                raise NonFiniteLossError(f"loss became {value} at epoch {epoch + 1}, step {step + 1}; "
                                         f"training stopped, {kept}")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if oc.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.params, oc.grad_clip)
            self.optimizer.step()
            n = batch.y.shape[0]
            seen += n
            correct += int((logits.detach().argmax(1) == batch.y).sum())
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach()) * n
            sums["loss"] = sums.get("loss", 0.0) + value * n
            if tc.progress:
                bar.set_postfix(loss=f"{sums['loss'] / seen:.4f}", acc=f"{100 * correct / seen:.1f}",
                                img_s=f"{seen / max(1e-9, time.perf_counter() - t_epoch):.0f}")
        bar.close()
        epoch_time = time.perf_counter() - t_epoch
        self.train_time += epoch_time
        self.samples_seen += seen
        bs, omitted = self.cfg.data.eval_batch_size, self.splits.omitted
        val = evaluate(model, self.splits.val, bs, omitted)
        test = evaluate(model, self.splits.test, bs, omitted)
        record = {"epoch": epoch + 1, "lr": lr, "train": {k: v / seen for k, v in sums.items()},
                  "train_acc": 100 * correct / seen, "val": val, "test": test,
                  "epoch_time_s": epoch_time, "images_per_s": seen / max(1e-9, epoch_time)}
        self.history.append(record)
        weights = weights_state(model, extra)
        base_state = {**self.meta, "epoch": epoch + 1, "val_acc": val["acc"], "test_acc": test["acc"]}
        if val["acc"] > self.best["val_acc"]:
            self.best = {"epoch": epoch + 1, "val_acc": val["acc"], "test_acc": test["acc"]}
            save_checkpoint(self.best_path, weights, base_state)
        if self.trajectory is not None and ((tc.save_every and (epoch + 1) % tc.save_every == 0)
                                            or epoch + 1 in self.extra_checkpoints):
            self.trajectory.add(epoch + 1, val["acc"], weights, base_state)
        opt_tensors, opt_struct = optimizer_to_flat(self.optimizer)
        self.rng.cpu = torch.get_rng_state()  # this trainer's stream as of now (inside its context)
        if self.rng.cuda is not None:
            self.rng.cuda = torch.cuda.get_rng_state(self.device)
        wall = self.wall_before + time.perf_counter() - self.t_start
        save_checkpoint(self.last_path, {**weights, **opt_tensors, **self.rng.tensors()},
                        {**base_state, "best": self.best, "optimizer": opt_struct, "wall_time_s": wall})
        self.log.log(record)
        if tc.progress:
            tqdm.write(f"{self.desc} epoch {epoch + 1}/{tc.epochs}  loss {record['train']['loss']:.4f}  "
                       f"train {record['train_acc']:.1f}%  val {val['acc']:.2f}%  test {test['acc']:.2f}%  "
                       f"({record['images_per_s']:.0f} img/s)")
        return record

    def finish(self, **extra_summary: Any) -> FitResult:
        """Write ``summary.json`` (last and best-on-val results, wall time, img/s) and close the logs."""
        last = self.history[-1] if self.history else {"epoch": self.epoch, "val": {"acc": float("nan")},
                                                      "test": {"acc": float("nan")}}
        summary = {
            **self.meta,
            "epochs": self.cfg.train.epochs,
            "last_epoch": last["epoch"],
            "val_acc": last["val"]["acc"],
            "test_acc": last["test"]["acc"],
            "best_epoch": self.best["epoch"],
            "best_val_acc": self.best["val_acc"],
            "test_acc_at_best": self.best.get("test_acc", float("nan")),
            **{f"test_{k}": v for k, v in last["test"].items() if k in ("acc_omitted", "acc_kept", "top5")},
            "wall_time_s": self.wall_before + time.perf_counter() - self.t_start,
            "images_per_s": self.samples_seen / self.train_time if self.train_time else float("nan"),
            **extra_summary,
        }
        self.log.summary(summary)
        self.log.close()
        return FitResult(summary, self.history)


def fit(model: nn.Module, step_fn: StepFn, splits: Splits, cfg: RunConfig, run_dir: str | Path, *,
        extra: nn.Module | None = None, meta: dict[str, Any] | None = None, resume: bool = False,
        on_epoch_end: Callable[[dict[str, Any]], None] | None = None, desc: str = "train") -> FitResult:
    """Train for ``cfg.train.epochs`` epochs with :class:`Trainer` and return its summary and history."""
    trainer = Trainer(model, step_fn, splits, cfg, run_dir, extra=extra, meta=meta, resume=resume,
                      on_epoch_end=on_epoch_end, desc=desc)
    while not trainer.done:
        trainer.run_epoch()
    return trainer.finish()
