"""Pieces every recipe composes: seeding, data, models, run folders, frozen teachers."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from teachkit.config import DataConfig, ModelConfig, RunConfig, dump_yaml, from_dict, read_yaml, to_dict
from teachkit.data import load_splits
from teachkit.data.base import Splits
from teachkit.engine.checkpoint import load_checkpoint, strip
from teachkit.engine.trainer import resolve_device
from teachkit.errors import CheckpointError, ConfigError
from teachkit.models import TapSpec, build_model

# Keys that may differ between a run and its resumption (they do not change the result).
RESUMABLE_DIFFERENCES = {("train", "progress"), ("train", "device"), ("train", "tensorboard")}


@dataclass
class RunResult:
    """A finished run: its folder, summary.json contents, per-epoch history and trained model."""

    run_dir: Path
    summary: dict[str, Any]
    model: nn.Module
    history: list[dict[str, Any]] = field(default_factory=list)


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def load_data(data: DataConfig, device: torch.device, subset: bool = True) -> Splits:
    """The dataset's splits on ``device``. ``subset=False`` (teachers) ignores the student's transfer-set
    options ``data.train_subset``, ``omit_classes`` and ``few_shot``."""
    splits = load_splits(data.name, root=data.root, val_fraction=data.val_fraction, split_seed=data.split_seed,
                         train_subset=data.train_subset if subset else None, options=data.options,
                         omit_classes=data.omit_classes if subset else (), few_shot=data.few_shot if subset else 0)
    return splits.to(device)


def model_meta(cfg: RunConfig, splits: Splits, loss: str) -> dict[str, Any]:
    """What a checkpoint records to be loadable on its own: model, shapes, data, objective."""
    return {"model": to_dict(cfg.model), "input_shape": list(splits.input_shape), "data": to_dict(cfg.data),
            "num_classes": splits.num_classes, "dataset": splits.name, "loss": loss}


def make_model(model_cfg: ModelConfig, splits: Splits, device: torch.device) -> nn.Module:
    model = build_model(model_cfg.name, splits.input_shape, splits.num_classes, **model_cfg.options)
    if model_cfg.taps:
        model.tap_spec = TapSpec.from_dict(model_cfg.taps)
    return model.to(device)


def prepare_run_dir(cfg: RunConfig, resume: bool, run_dir: Path | None = None) -> Path:
    """Create ``out_dir/name`` and save the resolved config; refuse to overwrite or mix configs."""
    run_dir = Path(run_dir) if run_dir is not None else Path(cfg.out_dir) / cfg.name
    saved = run_dir / "config.yaml"
    if saved.is_file():
        if not resume:
            raise ConfigError(f"run folder {str(run_dir)!r} already exists; pass --resume to continue it "
                              f"or choose another name=...")
        old = to_dict(from_dict(read_yaml(saved)))
        new = to_dict(cfg)
        for section, values in new.items():
            if isinstance(values, dict):
                for key, value in values.items():
                    if (section, key) not in RESUMABLE_DIFFERENCES and old[section].get(key) != value:
                        raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}.{key}="
                                          f"{old[section].get(key)!r}, not {value!r}")
            elif section not in ("out_dir",) and old.get(section) != values:
                raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}="
                                  f"{old.get(section)!r}, not {values!r}")
    run_dir.mkdir(parents=True, exist_ok=True)
    saved.write_text(dump_yaml(cfg))
    return run_dir


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
    model = build_model(model_cfg.name, shape, classes, **model_cfg.options)
    if model_cfg.taps:
        model.tap_spec = TapSpec.from_dict(model_cfg.taps)
    try:
        model.load_state_dict(strip("model/", tensors))
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {str(file)!r} does not fit model {model_cfg.name!r}: "
                              f"{str(e).splitlines()[0]}") from None
    return model.to(device), state


class FrozenTeacher(nn.Module):
    """A teacher that stays in eval mode, never takes gradients and is not in any optimiser."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    def train(self, mode: bool = True) -> FrozenTeacher:  # noqa: ARG002 - always eval
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(x)


def check_compatible(teacher_state: dict, splits: Splits) -> None:
    """Teacher and student/dataset must agree on class count and input shape."""
    if int(teacher_state["num_classes"]) != splits.num_classes:
        raise ConfigError(f"teacher has {teacher_state['num_classes']} classes but dataset {splits.name!r} "
                          f"(and so the student) has {splits.num_classes}")
    if tuple(teacher_state["input_shape"]) != tuple(splits.input_shape):
        raise ConfigError(f"teacher takes inputs of shape {tuple(teacher_state['input_shape'])} but dataset "
                          f"{splits.name!r} has {tuple(splits.input_shape)}")


def device_of(cfg: RunConfig) -> torch.device:
    return resolve_device(cfg.train.device)


def with_changes(cfg: RunConfig, **sections: dict[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with fields of sections replaced: ``with_changes(cfg, train={"epochs": 3})``."""
    out = cfg
    for section, changes in sections.items():
        value = getattr(out, section)
        if isinstance(changes, dict) and dataclasses.is_dataclass(value):
            value = dataclasses.replace(value, **changes)
        else:
            value = changes
        out = dataclasses.replace(out, **{section: value})
    return out
