"""One run preamble for every recipe: device, run folder (validated before it is created), data, seeding.

``RunContext.open(cfg, resume, splits, run_dir)`` validates everything it can before writing anything: the
run name (one folder name inside ``out_dir``), that the folder can be created and written, the run folder's
history (see :func:`check_run_dir`), the data, the selection metric and the model (built on the meta device).
Only then does it create the folder, remove what a kill or a failed attempt left (temporary files; the
outputs of an attempt that finished no epoch) and write ``config.yaml`` atomically, with the files the data
asks a run to keep (translation: ``vocab.json``, ``bpe.json``); a refused run leaves nothing behind. The
context builds what a recipe hands to the engine: models, the training batch source, the task's evaluator,
the loop options and a ready :class:`~teachkit.engine.Trainer`.

A run folder in which no epoch ever finished (no ``*.safetensors`` anywhere inside it, sub-runs such as
``teacher/`` included) belongs to a command that failed early: it is reused as if new, with or without
``--resume``. A folder with a finished epoch needs ``--resume`` and the same config, except keys a section
declares ``resumable`` and ``train.epochs``, which may grow (the run is extended).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from teachkit import distributed
from teachkit.config import SECTIONS, RunConfig, absolute_paths, dump_yaml, from_dict, read_yaml, to_dict, with_changes
from teachkit.data import Splits, make_augment
from teachkit.data.loader import make_batches
from teachkit.data.raw import is_regression, is_tokens
from teachkit.engine import EVALUATORS, Callback, LoopConfig, OptimConfig, StepFn, Trainer, resolve_device
from teachkit.engine.callbacks import callback_specs, given_callbacks
from teachkit.engine.checkpoint import (
    Trajectory,
    atomic_write,
    not_writable_reason,
    os_reason,
    remove_temporary_files,
    write_hint,
)
from teachkit.engine.precision import (
    Precision,
    compile_may_pay,
    has_recurrent,
    resolve_channels_last,
    resolve_compile,
    resolve_precision,
)
from teachkit.engine.trainer import select_metric
from teachkit.errors import ConfigError, WriteError
from teachkit.models import ModelConfig, make_model
from teachkit.models.probe import check_model_on_data
from teachkit.models.zoo import is_user_model
from teachkit.recipes.common import load_data, model_meta, seed_everything
from teachkit.trust import TrustError, reading_from
from teachkit.types import BatchSource, Evaluator


def resumable(cfg: RunConfig, section: str) -> frozenset[str]:
    """The keys of ``section`` that may differ between a run and its resumption (its options' ``resumable``)."""
    return getattr(getattr(cfg, section, None), "resumable", frozenset())


def check_run_name(name: str) -> None:
    """A run name is a relative folder path inside ``out_dir`` (``prokd/cifar100/kd`` nests folders): no empty,
    ``.`` or ``..`` part, not absolute, without ``\\``."""
    parts = name.split("/") if isinstance(name, str) else []
    if not isinstance(name, str) or "\\" in name or "\0" in name or not parts or \
            any(p.strip() in ("", ".", "..") for p in parts):
        raise ConfigError(f"name={name!r} is not allowed: a run name is a folder path inside out_dir (parts "
                          f"separated by '/', none empty, '.' or '..'; not absolute; no '\\')")


def check_writable(run_dir: Path) -> None:
    """The run folder can be created (or exists as a folder) and written; a one-line ConfigError otherwise."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {str(run_dir)!r} is a file, not a folder; choose another name=... or "
                          f"out_dir=...")
    existing = run_dir
    while not existing.exists():
        if existing.is_symlink():  # a dangling link in the way
            raise ConfigError(f"cannot create run folder {str(run_dir)!r}: {str(existing)!r} is a broken link")
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != run_dir and not existing.is_dir():
        raise ConfigError(f"cannot create run folder {str(run_dir)!r}: {str(existing)!r} is a file, not a "
                          f"folder (check out_dir)")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "run folder" if existing == run_dir else "folder"
        code, reason = not_writable_reason(existing)
        hint = "its filesystem is mounted read-only; " if code == errno.EROFS else ""
        raise ConfigError(f"cannot write in {what} {str(existing)!r}: {reason} ({hint}check out_dir)")


def finished_epoch_files(run_dir: Path) -> list[Path]:
    """The checkpoints under ``run_dir`` (recursively: sub-runs such as ``teacher/``) that only a finished
    epoch writes; a trajectory's epoch-0 record (the initialisation) does not count."""
    if not run_dir.is_dir():
        return []
    return [f for f in run_dir.rglob("*.safetensors") if f.name != Trajectory.file_name(0)]


#: what an attempt that finished no epoch may have left (removed when the folder is reused)
STALE_PATTERNS = ("*.jsonl", "summary.json", "teacher.json", Trajectory.MANIFEST, "epoch_0000.*", "*.tmp")


def remove_stale_outputs(run_dir: Path) -> None:
    """Delete the outputs of an earlier attempt that finished no epoch (logs, summaries, sidecars, the
    epoch-0 trajectory record, sub-runs' configs); ``run_dir/config.yaml`` is rewritten by the caller."""
    stale = {f for pattern in STALE_PATTERNS for f in run_dir.rglob(pattern)}
    stale |= {f for f in run_dir.rglob("checkpoints/*.json")}
    stale |= {f for f in run_dir.rglob("config.yaml") if f.parent != run_dir}
    for f in sorted(stale):
        if f.is_file() or f.is_symlink():
            try:
                f.unlink()
            except OSError as e:
                raise WriteError(f"cannot remove stale {str(f)!r}: {os_reason(e)}") from None


class EmptyConfig(Exception):
    """A run folder's ``config.yaml`` with no keys in it (``what``: how it is empty)."""

    def __init__(self, saved: Path) -> None:
        try:
            size = saved.stat().st_size
        except OSError:
            size = -1
        self.what = "empty (0 bytes)" if size == 0 else "empty (it holds no keys)"
        super().__init__(self.what)


#: the augmentations whose random crop pads (``auto`` crops on these datasets)
CROPPING = ("crop", "crop_flip")
CROPPING_BY_DEFAULT = ("cifar10", "cifar100")


def legacy_pad_mode(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config from before ``data.augment_options`` existed, whose crop padded by reflection then: with
    ``pad_mode: reflect`` made explicit, so resuming it with today's default (zeros) is refused in one line
    instead of silently changing the padding half-way through the run."""
    section = data.get("data")
    if not isinstance(section, dict) or "augment_options" in section:
        return data
    augment = section.get("augment", "auto")
    if augment in CROPPING or (augment == "auto" and section.get("name") in CROPPING_BY_DEFAULT):
        return {**data, "data": {**section, "augment_options": {"pad_mode": "reflect"}}}
    return data


def _saved_config(run_dir: Path) -> dict[str, Any]:
    """The config ``run_dir/config.yaml`` records, defaults filled in; a one-line ConfigError when it is not a
    config or is empty (an emptied file would otherwise read as the defaults and blame ``name='run'``)."""
    saved = run_dir / "config.yaml"
    try:
        with reading_from(f"run folder {str(run_dir)!r} (its config.yaml)"):
            data = read_yaml(saved)
            if not data:  # an emptied file must not read as the defaults (name='run')
                raise EmptyConfig(saved)
            return to_dict(from_dict(legacy_pad_mode(data)))
    except EmptyConfig as e:
        raise ConfigError(f"cannot resume {str(run_dir)!r}: its config.yaml is {e.what}, so the config the run was "
                          f"made with is unknown; restore that file (e.g. from the config you ran it with), or delete "
                          f"it to resume with this command's config unchecked") from None
    except TrustError:
        raise
    except ConfigError as e:
        raise ConfigError(f"cannot resume {str(run_dir)!r}: its config.yaml is not a valid config ({e})") from None


def check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool) -> bool:
    """Refuse to overwrite a run folder that holds a finished epoch, or to resume it with a config that changes
    the result (keys a section declares ``resumable``, such as ``train.progress``, may differ, and
    ``train.epochs`` may grow: the run is extended). Returns True when the folder starts afresh (it does not
    exist, or no epoch finished anywhere inside it: a command that failed early is retried as new)."""
    if not finished_epoch_files(run_dir):
        return True
    if not resume:
        raise ConfigError(f"run folder {str(run_dir)!r} already exists; pass --resume to continue it "
                          f"or choose another name=...")
    if not (run_dir / "config.yaml").is_file():
        return False  # made by an older version or by hand: nothing to compare with
    old = _saved_config(run_dir)
    new = to_dict(cfg)
    for section, values in new.items():
        if isinstance(values, dict):
            before = old.get(section) or {}
            for key, value in values.items():
                if key in resumable(cfg, section) or before.get(key) == value:
                    continue
                if (section, key) == ("train", "epochs") and isinstance(before.get(key), int):
                    if value > before[key]:
                        continue  # extend the run
                    raise ConfigError(f"cannot resume {str(run_dir)!r} with train.epochs={value!r}: it was made "
                                      f"with train.epochs={before[key]!r}; --resume may only raise it")
                raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}.{key}="
                                  f"{before.get(key)!r}, not {value!r}")
        elif section not in ("out_dir",) and old.get(section) != values:
            raise ConfigError(f"cannot resume {str(run_dir)!r}: it was made with {section}="
                              f"{old.get(section)!r}, not {values!r}")
    return False


def _create(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created (deepest last), a WriteError when it cannot."""
    missing = []
    parent = folder
    while not parent.exists() and parent.parent != parent:
        missing.append(parent)
        parent = parent.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(f"cannot create run folder {str(folder)!r}: {os_reason(e)}{write_hint(e.errno, folder)}") \
            from None
    return missing[::-1]


def _remove_created(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()  # only when empty: never removes anything else
        except OSError:
            return


#: ``data`` keys that say how the data is batched, not which data it is: a run keeps its own
BATCHING_KEYS = ("batch_size", "eval_batch_size", "augment", "augment_options", "group_by_length")


def record_data(cfg: RunConfig, splits: Splits) -> RunConfig:
    """``cfg`` with the ``data`` section the given ``splits`` were made from (their dataset, root, options,
    split and subset settings; ``cfg``'s batching kept), so the run folder names the data it really used and
    can be evaluated or resumed later. Splits built by hand (no recorded section) must match ``data.name``."""
    made_from = splits.config
    if made_from is None:
        if splits.name != cfg.data.name:
            raise ConfigError(f"the given splits are of dataset {splits.name!r} but data.name is "
                              f"{cfg.data.name!r}; build them with teachkit.data.load_splits (which records how) "
                              "or set data.name to match")
        return cfg
    changes = {f.name: getattr(made_from, f.name) for f in dataclasses.fields(made_from)
               if f.name not in BATCHING_KEYS}
    if all(getattr(cfg.data, k) == v for k, v in changes.items()):
        return cfg
    return with_changes(cfg, data=changes)


@dataclass
class RunContext:
    """A run's validated folder, device, data (the student's ``splits``) and config."""

    cfg: RunConfig
    run_dir: Path
    device: torch.device
    splits: Splits
    resume: bool = False
    _full: Splits | None = field(default=None, repr=False)
    _recurrent: bool | None = field(default=None, repr=False)

    @classmethod
    def open(cls, cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
             run_dir: str | Path | None = None) -> RunContext:
        """Validate the run name, the folder (writable; its history, see :func:`check_run_dir`), the data
        (loaded unless given), the selection metric and the model against the data; then create the folder,
        clear what an interrupted or failed attempt left, and write config.yaml: a refused run leaves nothing
        behind (a write that fails, e.g. on a full disk, removes the folders it created)."""
        device = resolve_device(cfg.train.device)
        if splits is not None:
            cfg = record_data(cfg, splits)
        cfg = absolute_paths(cfg)  # config.yaml and the checkpoints read the same from any working directory
        if run_dir is None:
            check_run_name(cfg.name)
        folder = Path(run_dir) if run_dir is not None else Path(cfg.out_dir) / cfg.name
        check_writable(folder)
        fresh = check_run_dir(cfg, folder, resume)
        splits = splits if splits is not None else load_data(cfg.data, device)
        evaluator = EVALUATORS.get(splits.task)(splits, cfg.data.eval_batch_size)
        select_metric(evaluator, cfg.train.select_metric)
        if cfg.data.group_by_length and not (is_tokens(splits.train.x) and "attention_mask" in splits.train.x):
            raise ConfigError("data.group_by_length=true needs tokenised text (a dataset with sequences and an "
                              f"attention mask); dataset {splits.name!r} has none")
        if is_regression(splits.task) != (cfg.train.loss == "l2"):
            raise ConfigError(f"train.loss={cfg.train.loss} does not fit dataset {splits.name!r} (task {splits.task}): "
                              + ("real-valued targets need train.loss=l2" if is_regression(splits.task) else
                                 "l2 is for real-valued targets (task regression); use ce, mse or mse-logits"))
        with torch.device("meta"):  # the model's options and input shape are checked without allocating it
            model = make_model(cfg.model, splits.input_shape, splits.num_classes)
            evaluator.check_model(model)
        if getattr(model, "input_kind", None) == "tokens" and not is_tokens(splits.train.x):
            raise ConfigError(f"model {cfg.model.name!r} reads token ids, but dataset {splits.name!r} gives "
                              f"{'images' if len(splits.input_shape) == 3 else 'feature vectors'}; use a text "
                              "dataset, or a model for these inputs")
        if is_user_model(cfg.model.name):  # a forward of two rows: shapes and output width, before any write
            rows = torch.arange(min(2, len(splits.train)))
            check_model_on_data(model, splits.train.x[rows], len(rows), splits.num_classes, splits.task,
                                cfg.model.name, splits.name,
                                rebuild=lambda: make_model(cfg.model, splits.input_shape, splits.num_classes))
        text = dump_yaml(cfg)
        distributed.barrier()  # under torchrun: every process has checked the folder before rank 0 writes it
        if distributed.is_main():
            created = _create(folder)
            try:
                if fresh:
                    remove_stale_outputs(folder)
                remove_temporary_files(folder)
                atomic_write(folder / "config.yaml", lambda tmp: Path(tmp).write_text(text))
                for file, content in getattr(splits.train.x, "artifacts", {}).items():  # a vocabulary, BPE merges
                    atomic_write(folder / file, lambda tmp, c=content: Path(tmp).write_text(c, encoding="utf-8"))
            except BaseException:
                _remove_created(created)
                raise
        distributed.barrier()
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

    def batches(self, splits: Splits | None = None, batch_size: int | None = None) -> BatchSource:
        """The training batches: ``data.batch_size``, shuffled and augmented per (``train.seed``, epoch)."""
        splits = splits or self.splits
        lengths = splits.train.x["attention_mask"].sum(dim=1) if self.cfg.data.group_by_length else None
        return make_batches(splits.train, batch_size or self.cfg.data.batch_size, shuffle=True,
                            seed=self.cfg.train.seed,
                            augment=make_augment(self.cfg.data.augment, splits, self.cfg.data.augment_options),
                            lengths=lengths)

    def evaluator(self, splits: Splits | None = None) -> Evaluator:
        """The task's evaluator (``splits.task``) on val and test."""
        splits = splits or self.splits
        return EVALUATORS.get(splits.task)(splits, self.cfg.data.eval_batch_size)

    def loop(self, **changes: Any) -> LoopConfig:
        return self.cfg.train.loop(**changes)

    @property
    def precision(self) -> Precision:
        """``train.precision`` resolved for the run's device and student (``cfg.model``), as the engine resolves
        it for the trainer's first module."""
        if self._recurrent is None:
            with torch.device("meta"):  # the model's layers, without allocating them
                self._recurrent = has_recurrent(make_model(self.cfg.model, self.splits.input_shape,
                                                           self.splits.num_classes))
        return resolve_precision(self.cfg.train.precision, self.device, recurrent=self._recurrent)

    @property
    def channels_last(self) -> bool:
        """``train.channels_last`` resolved (``auto``: on in bf16/fp16), as the engine resolves it."""
        return resolve_channels_last(self.cfg.train.channels_last, self.precision)

    @property
    def compiles(self) -> bool:
        """``train.compile`` resolved for the run's student and device over ``train.epochs`` x its batches per
        epoch, as the engine resolves it for the trainer's first module (``auto``: where it pays back)."""
        if self.cfg.train.compile != "auto":
            return bool(self.cfg.train.compile)
        steps = self.cfg.train.epochs * len(self.batches())
        if not compile_may_pay(self.device, steps):  # off whatever the model: none built
            return False
        with torch.device("meta"):  # the model's layers, without allocating them
            model = make_model(self.cfg.model, self.splits.input_shape, self.splits.num_classes)
        return resolve_compile("auto", self.device, model, steps)

    def trainer(self, modules: nn.Module | Mapping[str, nn.Module], step: StepFn, *, meta: dict[str, Any],
                callbacks: Sequence[Callback] = (), desc: str | None = None, optim: OptimConfig | None = None,
                loop: LoopConfig | None = None, splits: Splits | None = None,
                evaluator: Evaluator | None = None, frozen: Mapping[str, nn.Module] | None = None) -> Trainer:
        """A :class:`Trainer` for this run: its batches, evaluator (the task's unless given), optimiser, loop
        options and folder; ``frozen`` names the modules the step runs without training them (the teacher)."""
        trainer = Trainer(modules, step, self.batches(splits), optim or self.cfg.optim,
                          evaluator or self.evaluator(splits),
                          self.run_dir, loop=loop or self.loop(), callbacks=[*callbacks, *self.user_callbacks()],
                          meta=meta, resume=self.resume, desc=desc or self.cfg.name, frozen=frozen)
        for message in (splits or self.splits).warnings:  # the data's own (pairs skipped, one class)
            trainer.warn(message)
        return trainer

    def user_callbacks(self) -> list[Callback]:
        """The user's callbacks for one trainer of this run, after the recipe's own: fresh instances of
        ``train.callbacks`` and the Python API's objects (:func:`teachkit.engine.callbacks.given_callbacks`)."""
        return [*(spec.build() for spec in callback_specs(self.cfg.train.callbacks)), *given_callbacks()]
