"""Pieces every recipe composes: run results, seeding, data, model checkpoints, compatibility checks."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from teachkit.config import RunConfig, from_dict, to_dict, with_changes
from teachkit.data import DataConfig, Splits, splits_for
from teachkit.engine import load_checkpoint, resolve_device
from teachkit.engine.checkpoint import strip
from teachkit.engine.runlog import RunLog
from teachkit.errors import CheckpointError, ConfigError
from teachkit.models import FrozenTeacher, ModelConfig, make_model

__all__ = ["FrozenTeacher", "RunResult", "check_compatible", "checkpoint_file", "composed_cost", "device_of",
           "finished_run", "load_data", "load_model", "model_meta", "seed_everything", "with_changes"]


@dataclass
class RunResult:
    """A finished run: its folder, summary.json contents, per-epoch history and trained model."""

    run_dir: Path
    summary: dict[str, Any]
    model: nn.Module | None
    history: list[dict[str, Any]] = field(default_factory=list)


def finished_run(folder: Path, device: torch.device | str = "cpu") -> RunResult | None:
    """The run in ``folder`` when it finished (its ``summary.json`` exists): summary, per-epoch history and its
    final model; None otherwise. Composed recipes (TAKD's assistant, BAN's generations) reuse finished parts."""
    folder = Path(folder)
    if not (folder / "summary.json").is_file():
        return None
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"run summary {str(folder / 'summary.json')!r} is unreadable") from None
    model = load_model(folder, "last", device)[0] if (folder / "checkpoints" / "last.safetensors").is_file() else None
    return RunResult(folder, summary, model, RunLog(folder).records())


def composed_cost(results: list[RunResult], teacher_epochs: int, t0: float) -> dict[str, Any]:
    """The ``cost`` block of a recipe made of several runs: teacher epochs trained in this command, student
    epochs and teacher forward images summed over the runs, and this command's wall time."""
    return {"teacher_epochs_trained": teacher_epochs,
            "student_epochs": sum(r.summary.get("epochs", 0) for r in results),
            "teacher_forward_images": sum(r.summary.get("cost", {}).get("teacher_forward_images", 0) for r in results),
            "wall_time_s": time.perf_counter() - t0}


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def load_data(data: DataConfig, device: torch.device | str, subset: bool = True) -> Splits:
    """The dataset's splits on ``device``. ``subset=False`` (teachers) ignores the student's transfer-set
    options ``data.train_subset``, ``omit_classes`` and ``few_shot``."""
    return splits_for(data if subset else data.full()).to(device)


def device_of(cfg: RunConfig) -> torch.device:
    return resolve_device(cfg.train.device)


def model_meta(cfg: RunConfig, splits: Splits, loss: str) -> dict[str, Any]:
    """What a checkpoint records to be loadable on its own: model, shapes, data, objective."""
    return {"model": to_dict(cfg.model), "input_shape": list(splits.input_shape), "data": to_dict(cfg.data),
            "num_classes": splits.num_classes, "dataset": splits.name, "loss": loss}


def checkpoint_file(path: str | Path, select: str = "last") -> Path:
    """A checkpoint file from a file path or a run folder (``checkpoints/{select}.safetensors``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / f"{select}.safetensors"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return path


def load_model(path: str | Path, select: str = "last", device: torch.device | str = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a model from a teachkit checkpoint (file or run folder); returns (model, state)."""
    file = checkpoint_file(path, select)
    tensors, state = load_checkpoint(file)
    try:
        model_cfg = from_dict(state["model"], ModelConfig)
        shape, classes = tuple(state["input_shape"]), int(state["num_classes"])
    except (KeyError, TypeError):
        raise CheckpointError(f"checkpoint {str(file)!r} does not describe its model (not a teachkit checkpoint)") \
            from None
    model = make_model(model_cfg, shape, classes)
    try:
        model.load_state_dict(strip("model/", tensors))
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {str(file)!r} does not fit model {model_cfg.name!r}: "
                              f"{str(e).splitlines()[0]}") from None
    return model.to(device), state


def check_compatible(teacher_state: dict, splits: Splits) -> None:
    """Teacher and student/dataset must agree on class count and input shape."""
    if int(teacher_state["num_classes"]) != splits.num_classes:
        raise ConfigError(f"teacher has {teacher_state['num_classes']} classes but dataset {splits.name!r} "
                          f"(and so the student) has {splits.num_classes}")
    if tuple(teacher_state["input_shape"]) != tuple(splits.input_shape):
        raise ConfigError(f"teacher takes inputs of shape {tuple(teacher_state['input_shape'])} but dataset "
                          f"{splits.name!r} has {tuple(splits.input_shape)}")
