"""``arrays``: your own tensors, from NumPy ``.npz`` files, pairs of ``.npy`` files or ``.pt`` dicts.

Options (paths are relative to ``data.root``, or absolute):

- ``train``: the training data, one of
  ``data.npz`` (arrays under the keys ``x_key`` and ``y_key``),
  ``[inputs.npy, labels.npy]`` (two ``.npy`` files), or
  ``data.pt`` (a dict of tensors saved with ``torch.save``, keys ``x_key`` / ``y_key``; read with
  ``torch.load(weights_only=True)``). Unset: ``data.root`` itself is the ``.npz`` / ``.pt`` file.
- ``val``, ``test``: the same forms, optional; a missing split is carved from train (seeded, stratified).
- ``x_key`` (default ``x``), ``y_key`` (default ``y``): the names of inputs and labels in ``.npz`` / ``.pt``.
- ``task``: ``classification`` (default; labels: integer class ids or strings, numbered in sorted
  order), ``binary`` (two classes, F1 / MCC) or ``regression`` (real-valued targets (N,) or (N, d)).

Inputs are any numeric array (N, ...), read as float32 and standardised per channel (dim 1) on the train
split. Nothing is unpickled: ``.npz`` / ``.npy`` are read with ``allow_pickle=False``.

Example::

    data:
      name: arrays
      root: ~/data/mine
      options: {train: train.npz, test: test.npz}
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset
from teachkit.data.userdata import SPLITS, assemble, check_task, default_file, resolve, str_option
from teachkit.errors import ConfigError, DataError

NAME = "arrays"
FORMS = "a .npz file, a .pt file or a list [inputs.npy, labels.npy]"


def _npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"dataset {NAME!r}: cannot read {str(path)!r} as a .npy array: {e}") from None


def _npz(path: Path, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in (x_key, y_key) if k not in f.files]
            if missing:
                raise DataError(f"dataset {NAME!r}: {str(path)!r} has no array {missing[0]!r} (it holds "
                                f"{', '.join(f.files) or 'nothing'}); set options x_key / y_key")
            return f[x_key], f[y_key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"dataset {NAME!r}: cannot read {str(path)!r} as a .npz archive: {e}") from None


def _pt(path: Path, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses arbitrary objects; a corrupt file can raise almost anything
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"dataset {NAME!r}: cannot read {str(path)!r} as a dict of tensors: {first}") from None
    if not isinstance(obj, dict):
        raise DataError(f"dataset {NAME!r}: {str(path)!r} holds a {type(obj).__name__}, expected a dict of tensors "
                        f"with keys {x_key!r} and {y_key!r}")
    out = []
    for key in (x_key, y_key):
        value = obj.get(key)
        if not isinstance(value, torch.Tensor):
            keys = ", ".join(map(str, obj)) or "nothing"
            raise DataError(f"dataset {NAME!r}: {str(path)!r} has no tensor {key!r} (it holds {keys}); set options "
                            "x_key / y_key")
        value = value.detach().cpu()
        out.append((value.float() if value.dtype in (torch.bfloat16, torch.float16) else value).numpy())
    return out[0], out[1]


def read_part(root: str | None, key: str, spec: Any, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of the split given by option ``key`` (one of the three forms of the docstring)."""
    if isinstance(spec, list | tuple):
        if len(spec) != 2 or not all(isinstance(p, str) and p.endswith(".npy") for p in spec):
            raise ConfigError(f"dataset {NAME!r} option {key!r}: a list must name two .npy files [inputs, labels], "
                              f"got {spec!r}")
        return _npy(resolve(root, spec[0], NAME, key)), _npy(resolve(root, spec[1], NAME, key))
    path = resolve(root, spec, NAME, key) if not isinstance(spec, Path) else spec
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _npz(path, x_key, y_key)
    if suffix in (".pt", ".pth"):
        return _pt(path, x_key, y_key)
    if suffix == ".npy":
        raise ConfigError(f"dataset {NAME!r} option {key!r}: a .npy file holds one array; give two as "
                          f"[inputs.npy, labels.npy]")
    raise ConfigError(f"dataset {NAME!r} option {key!r} must be {FORMS}, got {str(spec)!r}")


@DATASETS.register(NAME, "your tensors from .npz, [x.npy, y.npy] or a .pt dict (options: train, val, test, x_key, "
                         "y_key, task)", paths=("train", "val", "test"))
def arrays(root: str | None = None, train: Any = None, val: Any = None, test: Any = None, x_key: str = "x",
           y_key: str = "y", task: str = "classification") -> RawDataset:
    """Your tensors per split from .npz / .npy pairs / .pt dicts; see the module docstring for the options."""
    task = check_task(NAME, task)
    x_key, y_key = str_option(NAME, "x_key", x_key), str_option(NAME, "y_key", y_key)
    specs = {"train": train if train is not None else default_file(root, NAME, FORMS), "val": val, "test": test}
    parts = {part: read_part(root, part, spec, x_key, y_key) for part, spec in specs.items()
             if spec is not None and part in SPLITS}
    return assemble(NAME, parts, task)
