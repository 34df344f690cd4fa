"""One run preamble for every recipe: device, run folder (validated before it is created), data, seeding.

``RunContext.open(cfg, resume, splits, run_dir)`` checks the run folder first (an existing folder needs
``--resume`` and the same config), then loads the data (a bad dataset leaves no folder behind), then
creates the folder and writes ``config.yaml`` atomically. The context builds what a recipe hands to the
engine: models, the training batch source, the task's evaluator, the loop options and a ready
:class:`~teachkit.engine.Trainer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from teachkit.config import SECTIONS, RunConfig, dump_yaml, from_dict, read_yaml, to_dict
from teachkit.data import BatchLoader, Splits, make_augment
from teachkit.engine import EVALUATORS, Callback, LoopConfig, OptimConfig, StepFn, Trainer, resolve_device
from teachkit.engine.checkpoint import atomic_write
from teachkit.engine.trainer import select_metric
from teachkit.errors import ConfigError
from teachkit.models import ModelConfig, make_model
from teachkit.recipes.common import load_data, model_meta, seed_everything
from teachkit.types import Evaluator


def resumable(cfg: RunConfig, section: str) -> frozenset[str]:
    """The keys of ``section`` that may differ between a run and its resumption (its options' ``resumable``)."""
    return getattr(getattr(cfg, section, None), "resumable", frozenset())


def check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run folder, or to resume it with a config that changes the result (keys a
    section declares ``resumable``, such as ``train.progress``, may differ)."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    if not resume:
        raise ConfigError(f"run folder {str(run_dir)!r} already exists; pass --resume to continue it "
                          f"or choose another name=...")
    old = to_dict(from_dict(read_yaml(saved)))
    new = to_dict(cfg)
    for section, values in new.items():
        if isinstance(values, dict):
            before = old.get(section) or {}
            for key, value in values.items():
                if key not in resumable(cfg, section) and before.get(key) != value:
                    raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}.{key}="
                                      f"{before.get(key)!r}, not {value!r}")
        elif section not in ("out_dir",) and old.get(section) != values:
            raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}="
                              f"{old.get(section)!r}, not {values!r}")


@dataclass
class RunContext:
    """A run's validated folder, device, data (the student's ``splits``) and config."""

    cfg: RunConfig
    run_dir: Path
    device: torch.device
    splits: Splits
    resume: bool = False
    _full: Splits | None = field(default=None, repr=False)

    @classmethod
    def open(cls, cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
             run_dir: str | Path | None = None) -> RunContext:
        """Validate the run folder, load the data (unless given), check the selection metric and the model
        against the data, then create the folder with config.yaml: a refused run leaves nothing behind."""
        device = resolve_device(cfg.train.device)
        folder = Path(run_dir) if run_dir is not None else Path(cfg.out_dir) / cfg.name
        check_run_dir(cfg, folder, resume)
        splits = splits if splits is not None else load_data(cfg.data, device)
        select_metric(EVALUATORS.get(splits.task)(splits, cfg.data.eval_batch_size), cfg.train.select_metric)
        with torch.device("meta"):  # the model's options and input shape are checked without allocating it
            make_model(cfg.model, splits.input_shape, splits.num_classes)
        folder.mkdir(parents=True, exist_ok=True)
        text = dump_yaml(cfg)
        atomic_write(folder / "config.yaml", lambda tmp: Path(tmp).write_text(text))
        return cls(cfg, folder, device, splits, resume)

    def child(self, name: str, cfg: RunConfig, splits: Splits | None = None) -> RunContext:
        """A sub-run in ``run_dir/name`` (an in-command teacher, TAKD's assistant) with its own config."""
        return RunContext.open(cfg, self.resume, splits, self.run_dir / name)

    def section(self, name: str) -> Any:
        """The recipe section ``name`` of the config (``prokd``, ``l2t``, ...)."""
        if name not in SECTIONS:
            raise ConfigError(f"no config section {name!r} is registered")
        return self.cfg.sections[name]

    def full_splits(self) -> Splits:
        """The data a teacher sees: the full training split, without the student's transfer-set options
        (``data.train_subset``, ``omit_classes``, ``few_shot``); val and test are the same as the student's."""
        if not self.cfg.data.reduced:
            return self.splits
        if self._full is None:
            self._full = load_data(self.cfg.data, self.device, subset=False)
        return self._full

    def seed(self) -> None:
        """Seed Python, NumPy and torch with ``train.seed`` (before a model is initialised)."""
        seed_everything(self.cfg.train.seed, self.cfg.train.deterministic)

    def model(self, cfg: ModelConfig | None = None, splits: Splits | None = None) -> nn.Module:
        """``model`` (or ``cfg``) built for the data's input shape and classes, on the run's device."""
        splits = splits or self.splits
        return make_model(cfg or self.cfg.model, splits.input_shape, splits.num_classes).to(self.device)

    def meta(self, loss: str, splits: Splits | None = None) -> dict[str, Any]:
        """What every checkpoint of this run records to be loadable on its own."""
        return model_meta(self.cfg, splits or self.splits, loss)

    def batches(self, splits: Splits | None = None, batch_size: int | None = None) -> BatchLoader:
        """The training batches: ``data.batch_size``, shuffled and augmented per (``train.seed``, epoch)."""
        splits = splits or self.splits
        return BatchLoader(splits.train, batch_size or self.cfg.data.batch_size, shuffle=True,
                           seed=self.cfg.train.seed, augment=make_augment(self.cfg.data.augment, splits))

    def evaluator(self, splits: Splits | None = None) -> Evaluator:
        """The task's evaluator (``splits.task``) on val and test."""
        splits = splits or self.splits
        return EVALUATORS.get(splits.task)(splits, self.cfg.data.eval_batch_size)

    def loop(self, **changes: Any) -> LoopConfig:
        return self.cfg.train.loop(**changes)

    def trainer(self, modules: nn.Module | Mapping[str, nn.Module], step: StepFn, *, meta: dict[str, Any],
                callbacks: Sequence[Callback] = (), desc: str | None = None, optim: OptimConfig | None = None,
                loop: LoopConfig | None = None, splits: Splits | None = None) -> Trainer:
        """A :class:`Trainer` for this run: its batches, evaluator, optimiser, loop options and folder."""
        return Trainer(modules, step, self.batches(splits), optim or self.cfg.optim, self.evaluator(splits),
                       self.run_dir, loop=loop or self.loop(), callbacks=callbacks, meta=meta, resume=self.resume,
                       desc=desc or self.cfg.name)
