"""The one training loop every recipe uses.

``fit(model, step_fn, splits, cfg, run_dir)``: ``step_fn(batch, progress)`` returns the named
loss terms and the logits of the model being trained; the engine does the rest once: optimiser,
warm-up and schedule, autocast, backward, clipping, NaN guard, per-epoch val/test evaluation, the
best-on-val record, checkpoints (atomic, exact resume), trajectory, metrics, progress bar.
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
from teachkit.errors import CheckpointError, NonFiniteLossError
from teachkit.losses.base import Progress

StepFn = Callable[[Batch, Progress], tuple[dict[str, Tensor], Tensor]]


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
    from teachkit.errors import ConfigError

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use auto or cpu")
    return dev


def weights_state(model: nn.Module, extra: nn.Module | None) -> dict[str, Tensor]:
    tensors = prefixed("model/", model.state_dict())
    if extra is not None:
        tensors.update(prefixed("extra/", extra.state_dict()))
    return tensors


def fit(
    model: nn.Module,
    step_fn: StepFn,
    splits: Splits,
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    extra: nn.Module | None = None,
    meta: dict[str, Any] | None = None,
    resume: bool = False,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
    desc: str = "train",
) -> FitResult:
    """Train ``model`` (and the trainable ``extra`` modules, e.g. a loss's regressors) with ``step_fn``.

    Writes ``run_dir/checkpoints/{last,best}.safetensors``, ``metrics.jsonl``, ``summary.json`` and,
    with ``train.save_every=k``, ``trajectory/``. ``meta`` (model name, shapes, ...) is stored in every
    checkpoint so that it can be loaded on its own. ``resume=True`` continues from ``last``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tc, oc = cfg.train, cfg.optim
    meta = dict(meta or {})
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if extra is not None:
        params += [p for p in extra.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, oc)
    loader = BatchLoader(splits.train, cfg.data.batch_size, shuffle=True, seed=tc.seed,
                         augment=make_augment(cfg.data.augment, splits))
    steps = len(loader)
    ckpt_dir = run_dir / "checkpoints"
    last_path, best_path = ckpt_dir / "last.safetensors", ckpt_dir / "best.safetensors"
    log = RunLog(run_dir, tc.tensorboard)
    trajectory = Trajectory(run_dir / "trajectory") if tc.save_every else None
    history: list[dict[str, Any]] = []
    start_epoch, best = 0, {"epoch": 0, "val_acc": -1.0}
    wall_before = 0.0

    if resume and last_path.is_file():
        tensors, state = load_checkpoint(last_path)
        model.load_state_dict(strip("model/", tensors))
        if extra is not None:
            extra.load_state_dict(strip("extra/", tensors))
        optimizer_from_flat(optimizer, tensors, state["optimizer"])
        torch.set_rng_state(tensors["rng/torch"])
        if device.type == "cuda" and "rng/cuda" in tensors:
            torch.cuda.set_rng_state(tensors["rng/cuda"], device)
        start_epoch, best, wall_before = state["epoch"], state["best"], state.get("wall_time_s", 0.0)
        history = log.truncate(start_epoch)
        if trajectory is not None:
            trajectory.truncate(start_epoch)
    elif resume:
        raise CheckpointError(f"nothing to resume: {str(last_path)!r} does not exist")

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16")
    t_start = time.perf_counter()
    samples_seen = 0
    train_time = 0.0
    for epoch in range(start_epoch, tc.epochs):
        model.train()
        if extra is not None:
            extra.train()
        sums: dict[str, float] = {}
        correct = seen = 0
        t_epoch = time.perf_counter()
        bar = tqdm(loader.batches(epoch), total=steps, desc=f"{desc} {epoch + 1}/{tc.epochs}",
                   disable=not tc.progress, leave=False, dynamic_ncols=True)
        for step, batch in enumerate(bar):
            progress = Progress(epoch, step, tc.epochs, steps)
            lr = oc.lr * lr_factor(oc, epoch, step, steps, tc.epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with autocast:
                terms, logits = step_fn(batch, progress)
            loss = sum(terms.values())
            value = float(loss.detach())
            if not math.isfinite(value):
                kept = (f"last good checkpoint {str(last_path)!r} (epoch {epoch})"
                        if epoch > 0 else "no checkpoint was written yet")
                raise NonFiniteLossError(f"loss became {value} at epoch {epoch + 1}, step {step + 1}; "
                                         f"training stopped, {kept}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if oc.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, oc.grad_clip)
            optimizer.step()
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
        train_time += epoch_time
        samples_seen += seen
        val = evaluate(model, splits.val, cfg.data.eval_batch_size, splits.omitted)
        test = evaluate(model, splits.test, cfg.data.eval_batch_size, splits.omitted)
        record = {"epoch": epoch + 1, "lr": lr, "train": {k: v / seen for k, v in sums.items()},
                  "train_acc": 100 * correct / seen, "val": val, "test": test,
                  "epoch_time_s": epoch_time, "images_per_s": seen / max(1e-9, epoch_time)}
        history.append(record)
        weights = weights_state(model, extra)
        base_state = {**meta, "epoch": epoch + 1, "val_acc": val["acc"], "test_acc": test["acc"]}
        if val["acc"] > best["val_acc"]:
            best = {"epoch": epoch + 1, "val_acc": val["acc"], "test_acc": test["acc"]}
            save_checkpoint(best_path, weights, base_state)
        if trajectory is not None and (epoch + 1) % tc.save_every == 0:
            trajectory.add(epoch + 1, val["acc"], weights, base_state)
        opt_tensors, opt_struct = optimizer_to_flat(optimizer)
        rng = {"rng/torch": torch.get_rng_state()}
        if device.type == "cuda":
            rng["rng/cuda"] = torch.cuda.get_rng_state(device)
        wall = wall_before + time.perf_counter() - t_start
        save_checkpoint(last_path, {**weights, **opt_tensors, **rng},
                        {**base_state, "best": best, "optimizer": opt_struct, "wall_time_s": wall})
        log.log(record)
        if tc.progress:
            tqdm.write(f"{desc} epoch {epoch + 1}/{tc.epochs}  loss {record['train']['loss']:.4f}  "
                       f"train {record['train_acc']:.1f}%  val {val['acc']:.2f}%  test {test['acc']:.2f}%  "
                       f"({record['images_per_s']:.0f} img/s)")
        if on_epoch_end is not None:
            on_epoch_end(record)

    last = history[-1] if history else {"epoch": tc.epochs, "val": {"acc": float("nan")},
                                        "test": {"acc": float("nan")}}
    summary = {
        **meta,
        "epochs": tc.epochs,
        "last_epoch": last["epoch"],
        "val_acc": last["val"]["acc"],
        "test_acc": last["test"]["acc"],
        "best_epoch": best["epoch"],
        "best_val_acc": best["val_acc"],
        "test_acc_at_best": best.get("test_acc", float("nan")),
        **{f"test_{k}": v for k, v in last["test"].items() if k in ("acc_omitted", "acc_kept", "top5")},
        "wall_time_s": wall_before + time.perf_counter() - t_start,
        "images_per_s": samples_seen / train_time if train_time else float("nan"),
    }
    log.summary(summary)
    log.close()
    return FitResult(summary, history)
