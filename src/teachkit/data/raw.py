"""Raw datasets as sources return them, before splitting and normalisation, and their registry.

A source is a function ``(root: str | None, **options) -> RawDataset`` registered in :data:`DATASETS`.
Its keyword parameters (other than ``root``) are the options a config may set; anything else is refused
with a one-line :class:`ConfigError` by :func:`load_raw`.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import Tensor

from teachkit.errors import ConfigError, DataError
from teachkit.registry import Registry, closest


@dataclass
class RawDataset:
    """Tensors as a source provides them: ``*_x`` float32 (N, *shape) in [0, 1] or standardised,
    ``*_y`` int64 (N,). ``test_x`` / ``test_y`` are ``None`` when the source has no official test split
    (one is then carved by :func:`teachkit.data.load_splits`)."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor | None
    test_y: Tensor | None
    num_classes: int
    default_augment: str = "none"
    #: what the targets are (``classification``: int64 class ids); names the evaluator that measures models
    task: str = "classification"
    name: str = ""

    def validate(self) -> None:
        """DataError unless shapes, dtypes and label ranges are consistent."""
        who = f"dataset {self.name!r}" if self.name else "dataset"
        if (self.test_x is None) != (self.test_y is None):
            raise DataError(f"{who}: test_x and test_y must both be given or both be None")
        parts = [("train", self.train_x, self.train_y)]
        if self.test_x is not None and self.test_y is not None:
            parts.append(("test", self.test_x, self.test_y))
        for part, x, y in parts:
            if x.dim() < 2 or not x.is_floating_point():
                raise DataError(f"{who}: {part} inputs must be float (N, ...), "
                                f"got {x.dtype} {tuple(x.shape)}")
            if y.dim() != 1 or y.dtype != torch.int64 or y.shape[0] != x.shape[0]:
                raise DataError(f"{who}: {part} labels must be int64 ({x.shape[0]},), "
                                f"got {y.dtype} {tuple(y.shape)}")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise DataError(f"{who}: {part} labels must lie in 0..{self.num_classes - 1}, "
                                f"found {int(y.min())}..{int(y.max())}")
            if x.shape[1:] != self.train_x.shape[1:]:
                raise DataError(f"{who}: test inputs {tuple(x.shape[1:])} differ from train "
                                f"{tuple(self.train_x.shape[1:])}")


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


def int_option(dataset: str, key: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; ConfigError otherwise (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be an integer >= {minimum}, "
                          f"got {value!r}")
    return value
