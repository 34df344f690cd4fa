"""Pieces shared by the sources that read a user's own files (``arrays``, ``csv``, ``parquet``,
``image_folder``): option checks, path resolution, label coding and assembling a :class:`RawDataset`.

Labels, per split, become targets as follows (``task`` option of the source):

- ``classification`` / ``binary``: integer labels >= 0 are class ids as they are (``num_classes`` = the
  largest + 1); any other labels (strings, negative integers) are sorted and numbered 0, 1, ... over all
  splits. Whole-number floats count as integers. A label found in val or test but never in train is an error,
  and so is a class count above the number of training rows or above :data:`MAX_CLASSES` (100,000): such ids
  are not 0..C-1 (one stray label of 1e9 would otherwise ask for a billion classes); relabel them, or set
  ``task: regression`` for real-valued targets. A fractional float label is an error for a class task.
- ``regression``: float32 targets, (N,) for one output or (N, d) for d outputs (``num_classes`` = d).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import REGRESSION, RawDataset
from teachkit.errors import ConfigError, DataError

#: the ``task`` values a file source accepts (``binary`` = two classes measured by F1, see teachkit.tasks.binary)
FILE_TASKS = ("classification", "binary", REGRESSION)
SPLITS = ("train", "val", "test")
#: the most classes a file source may have (inferred from its labels); more is taken for a labelling mistake
MAX_CLASSES = 100_000
#: floats at or beyond this magnitude are not exact integers, so never class ids
_EXACT_FLOAT_INT = 2.0**53


def check_task(dataset: str, task: Any) -> str:
    """The ``task`` option, one of :data:`FILE_TASKS`; ConfigError otherwise."""
    if task not in FILE_TASKS:
        raise ConfigError(f"dataset {dataset!r} option 'task' must be one of {', '.join(FILE_TASKS)}, got {task!r}")
    return str(task)


def str_option(dataset: str, key: str, value: Any) -> str:
    """``value`` as a non-empty string; ConfigError otherwise."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be a non-empty string, got {value!r}")
    return value


def str_list_option(dataset: str, key: str, value: Any) -> list[str]:
    """``value`` (a string or a non-empty list of strings) as a list of strings; ConfigError otherwise."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(v, str) and v for v in items):
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be a string or a list of strings, got {value!r}")
    return list(items)


def resolve(root: str | None, path: Any, dataset: str, key: str, kind: str = "file") -> Path:
    """``path`` (option ``key``) made absolute: relative paths are taken under ``root`` (``data.root``; its
    folder when it names a file), or the working directory without one. DataError naming the option and the
    path when it is not a ``kind`` (``file``, ``folder``, or ``file or folder``)."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be a path, got {path!r}")
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and root is not None:
        p = (Path(root).parent if Path(root).is_file() else Path(root)) / p
    exists = {"folder": p.is_dir(), "file": p.is_file()}.get(kind, p.exists())
    if not exists:
        where = f" (under data.root {root!r})" if root is not None and not Path(str(path)).is_absolute() else ""
        raise DataError(f"dataset {dataset!r}: {kind} {str(path)!r} of option {key!r} not found{where}")
    return p


def default_file(root: str | None, dataset: str, what: str) -> Path:
    """The file a source reads when its ``train`` option is not set: ``data.root`` itself must be that file."""
    if root is not None and Path(root).is_file():
        return Path(root)
    got = "not set" if root is None else f"{root!r}, not a file"
    raise ConfigError(f"dataset {dataset!r} needs option 'train' ({what}, relative to data.root) or data.root "
                      f"naming that file; data.root is {got}")


def features_tensor(dataset: str, part: str, x: np.ndarray) -> torch.Tensor:
    """Numeric inputs (N, ...) as a float32 tensor ((N,) becomes (N, 1)); DataError for other dtypes, NaN/inf."""
    if x.dtype == np.bool_:
        x = x.astype(np.float32)
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise DataError(f"dataset {dataset!r}: {part} inputs must be numeric, got dtype {x.dtype}")
    if x.ndim == 0:
        raise DataError(f"dataset {dataset!r}: {part} inputs must have a sample dimension, got a scalar")
    x = x.reshape(-1, 1) if x.ndim == 1 else x
    if 0 in x.shape[1:]:
        raise DataError(f"dataset {dataset!r}: {part} inputs have shape {x.shape}: no feature per sample")
    with np.errstate(over="ignore"):  # numbers beyond float32's range become inf: named below
        out = torch.from_numpy(np.require(x, np.float32, ["C", "W"]))
    if out.numel() and not bool(torch.isfinite(out).all()):
        at = tuple(int(i) for i in torch.nonzero(~torch.isfinite(out))[0].tolist())
        value = x[at].item()
        why = (f"{value:.3g} is beyond float32's range (about 3.4e38); rescale the inputs" if math.isfinite(value)
               else f"{value} (missing values?)")
        raise DataError(f"dataset {dataset!r}: {part} inputs contain NaN or infinite values: row {at[0] + 1}, "
                        f"position {list(at[1:])} holds {why}")
    return out


def _as_int_labels(y: np.ndarray) -> np.ndarray | None:
    """``y`` as int64 when it holds whole numbers (integers, bools, or whole-number floats); else None."""
    if y.dtype == np.bool_ or np.issubdtype(y.dtype, np.integer):
        return y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating) and not _non_class(y).any():
        return y.astype(np.int64)
    return None


def _non_class(y: np.ndarray) -> np.ndarray:
    """Where float labels ``y`` are not class ids: NaN, infinite, fractional or too large to be exact integers."""
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(y) | (y != np.round(y)) | (np.abs(y) >= _EXACT_FLOAT_INT)


def check_class_count(dataset: str, ids: dict[str, np.ndarray], k: int) -> None:
    """DataError when ``k`` classes (largest id + 1) exceed the training rows or :data:`MAX_CLASSES`: the ids
    are then not 0..C-1 (a stray label); the message names the largest label, its split and row."""
    rows = len(ids["train"])
    if k <= min(rows, MAX_CLASSES):
        return
    part = max((p for p, v in ids.items() if v.size), key=lambda p: int(ids[p].max()))
    row = int(np.argmax(ids[part]))
    limit = f"the {rows:,} training rows" if rows < MAX_CLASSES else f"the limit of {MAX_CLASSES:,} classes"
    raise DataError(f"dataset {dataset!r}: {part} label {int(ids[part][row])} (row {row + 1}) would make {k:,} "
                    f"classes (ids 0..largest), more than {limit}; labels must be class ids 0..C-1: relabel them "
                    f"(strings are numbered in sorted order), or set task: {REGRESSION} for real-valued targets")


def class_targets(dataset: str, labels: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], int, list[str]]:
    """Class ids per split, ``num_classes`` and the class names (see the module docstring)."""
    for part, y in labels.items():
        if y.ndim != 1:
            raise DataError(f"dataset {dataset!r}: {part} labels must be one per sample (N,), got shape {y.shape}; "
                            f"several target columns need task {REGRESSION!r}")
        if np.issubdtype(y.dtype, np.floating) and _as_int_labels(y) is None:
            row = int(np.flatnonzero(_non_class(y))[0])
            raise DataError(f"dataset {dataset!r}: {part} labels hold the non-class value {float(y[row])!r} (row "
                            f"{row + 1}); class labels are integers 0..C-1 or strings (real-valued targets need "
                            f"option task: {REGRESSION})")
    ints = {part: _as_int_labels(y) for part, y in labels.items()}
    if all(v is not None and (v.size == 0 or v.min() >= 0) for v in ints.values()):
        ids = {part: v for part, v in ints.items() if v is not None}
        k = 1 + max((int(v.max()) for v in ids.values() if v.size), default=0)
        check_class_count(dataset, ids, k)
        names = [str(c) for c in range(k)]
    else:
        as_text = {part: np.asarray([str(v) for v in y.tolist()], dtype=object) if ints[part] is None
                   else ints[part] for part, y in labels.items()}
        values = sorted({v for y in as_text.values() for v in y.tolist()}, key=lambda v: (isinstance(v, str), v))
        index = {v: i for i, v in enumerate(values)}
        ids = {part: np.asarray([index[v] for v in y.tolist()], dtype=np.int64) for part, y in as_text.items()}
        k, names = len(values), [str(v) for v in values]
        if k > MAX_CLASSES:
            raise DataError(f"dataset {dataset!r}: the labels hold {k:,} distinct values, more than the limit of "
                            f"{MAX_CLASSES:,} classes; is the label column an id or a real-valued target (task: "
                            f"{REGRESSION})?")
    seen = set(np.unique(ids["train"]).tolist())
    for part in ("val", "test"):
        if part in ids:
            unseen = sorted(set(np.unique(ids[part]).tolist()) - seen)
            if unseen:
                raise DataError(f"dataset {dataset!r}: class {names[unseen[0]]!r} appears in {part} but not in train "
                                "(every class needs training examples)")
    return {part: torch.from_numpy(np.require(v, np.int64, ["C", "W"])) for part, v in ids.items()}, max(k, 1), names


def regression_targets(dataset: str, labels: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], int]:
    """Float32 targets per split ((N,) or (N, d)) and the output width d."""
    out: dict[str, torch.Tensor] = {}
    widths = set()
    for part, y in labels.items():
        if y.dtype == np.bool_:
            y = y.astype(np.float32)
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise DataError(f"dataset {dataset!r}: {part} targets must be numeric for task {REGRESSION!r}, "
                            f"got dtype {y.dtype}")
        if y.ndim not in (1, 2):
            raise DataError(f"dataset {dataset!r}: {part} regression targets must be (N,) or (N, d), got shape "
                            f"{y.shape}")
        with np.errstate(over="ignore"):  # beyond float32's range: refused just below
            t = torch.from_numpy(np.require(y, np.float32, ["C", "W"]))
        if not bool(torch.isfinite(t).all()):
            raise DataError(f"dataset {dataset!r}: {part} targets contain NaN or infinite values (missing values?)")
        widths.add(1 if t.dim() == 1 else int(t.shape[1]))
        out[part] = t
    if len(widths) != 1:
        raise DataError(f"dataset {dataset!r}: regression targets differ in width between splits: {sorted(widths)}")
    return out, widths.pop()


def assemble(dataset: str, parts: dict[str, tuple[np.ndarray, np.ndarray]], task: str,
             default_augment: str = "none", feature_names: list[str] | None = None) -> RawDataset:
    """The RawDataset of per-split (inputs, labels) arrays; ``parts`` holds ``train`` and optionally ``val``,
    ``test``. Inputs become float32, labels class ids or regression targets (module docstring); the class names
    and ``feature_names`` (a table's feature columns) are recorded for predictors."""
    xs: dict[str, torch.Tensor] = {}
    for part, (x, y) in parts.items():
        for what, a in (("inputs", x), ("labels", y)):
            if np.ndim(a) == 0:
                raise DataError(f"dataset {dataset!r}: {part} {what} must be an array with one row per sample "
                                f"(N, ...), got a 0-d array (one value: {np.asarray(a).item()!r})")
        if len(x) == 0:
            raise DataError(f"dataset {dataset!r}: the {part} split is empty")
        if len(x) != len(y):
            raise DataError(f"dataset {dataset!r}: {part} has {len(x)} inputs but {len(y)} labels")
        xs[part] = features_tensor(dataset, part, x)
    labels = {part: y for part, (_, y) in parts.items()}
    names: list[str] | None = None
    if task == REGRESSION:
        ys, k = regression_targets(dataset, labels)
    else:
        ys, k, names = class_targets(dataset, labels)
    for part in ("val", "test"):
        if part in xs and xs[part].shape[1:] != xs["train"].shape[1:]:
            raise DataError(f"dataset {dataset!r}: {part} inputs have shape {tuple(xs[part].shape[1:])} per sample, "
                            f"train {tuple(xs['train'].shape[1:])}")
    return RawDataset(xs["train"], ys["train"], xs.get("test"), ys.get("test"), num_classes=k,
                      default_augment=default_augment, task=task, name=dataset, val_x=xs.get("val"),
                      val_y=ys.get("val"), class_names=_label_names(names, k),
                      feature_names=tuple(feature_names) if feature_names else None)


def _label_names(names: list[str] | None, k: int) -> tuple[str, ...] | None:
    """The class names worth recording: ``None`` when the labels were the class ids themselves (0..k-1)."""
    if not names or names == [str(c) for c in range(k)]:
        return None
    return tuple(names)
