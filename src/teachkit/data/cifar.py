"""CIFAR-10 / CIFAR-100, python versions (https://www.cs.toronto.edu/~kriz/cifar.html).

Layout (same page): ``cifar-10-python.tar.gz`` holds ``cifar-10-batches-py/`` with ``data_batch_1`` ..
``data_batch_5`` and ``test_batch``; ``cifar-100-python.tar.gz`` holds ``cifar-100-python/`` with
``train`` and ``test``. Each file is a pickled dict: ``b"data"`` a uint8 array N x 3072 (1024 red, then
1024 green, then 1024 blue values, each a 32x32 image in row-major order), and ``b"labels"`` (CIFAR-10)
or ``b"fine_labels"`` (CIFAR-100), a list of N ints.

Pickles can run arbitrary code when loaded, so they are read with :class:`SafeUnpickler`, which only
resolves the numpy globals needed to rebuild arrays and refuses everything else. Archives are read in
memory with :mod:`tarfile`; nothing is extracted to disk.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset
from teachkit.errors import DataError

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Stand-in for ``_codecs.encode``, which Python 3 protocol-2 pickles use to rebuild ``bytes``;
    only that use (latin-1 text to bytes) is allowed."""
    if not isinstance(text, str) or encoding.lower().replace("-", "").replace("_", "") != "latin1":
        raise DataError(f"refusing _codecs.encode with encoding {encoding!r} in a dataset pickle")
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The only globals a CIFAR pickle may name: numpy's array reconstruction helpers, under the module
    paths of numpy 1.x (``numpy.core``) and 2.x (``numpy._core``), resolved from the running numpy
    without importing the deprecated ``numpy.core`` alias; plus latin-1 ``_codecs.encode`` for pickles
    re-written by Python 3 with protocol 2 (the original Python 2 files do not need it)."""
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's multiarray._reconstruct
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                           ("_codecs", "encode"): _latin1_bytes}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
    try:  # protocol-5 pickles written by numpy (Python >= 3.14 default) rebuild arrays with _frombuffer
        frombuffer = np.ndarray.__reduce_ex__(np.zeros(1), 5)[0]
        if getattr(frombuffer, "__name__", "") == "_frombuffer":
            for core in ("numpy.core", "numpy._core"):
                allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    except Exception:  # pragma: no cover - depends on the numpy version
        pass
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """An Unpickler that rebuilds numpy arrays and plain containers only; any other global -> DataError."""

    ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        obj = self.ALLOWED.get((module, name))
        if obj is None:
            raise DataError(f"refusing to load global {module}.{name} (only numpy arrays are allowed in "
                            "dataset pickles)")
        return obj


def safe_load(data: bytes, source: str) -> Any:
    """Unpickle ``data`` (encoding="bytes", as the CIFAR python pickles need) with :class:`SafeUnpickler`;
    ``source`` names the file in error messages."""
    try:
        return SafeUnpickler(io.BytesIO(data), encoding="bytes").load()
    except DataError as e:
        raise DataError(f"{source}: {e}") from None
    except Exception as e:  # a corrupt pickle can raise almost anything
        raise DataError(f"{source}: not a valid pickle ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class CifarSpec:
    name: str
    num_classes: int
    archive: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    label_key: str


CIFAR10 = CifarSpec("cifar10", 10, "cifar-10-python.tar.gz", "cifar-10-batches-py",
                    tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "labels")
CIFAR100 = CifarSpec("cifar100", 100, "cifar-100-python.tar.gz", "cifar-100-python", ("train",), "test",
                     "fine_labels")


def _get(d: dict[Any, Any], key: str) -> Any:
    """``d[b"key"]`` (how the original Python 2 pickles load) or ``d["key"]`` (re-pickled by Python 3)."""
    if key.encode() in d:
        return d[key.encode()]
    return d.get(key)


def decode_batch(d: Any, source: str, spec: CifarSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 (N, 3, 32, 32) in [0, 1], y int64 (N,)) from one unpickled batch dict, validated."""
    if not isinstance(d, dict):
        raise DataError(f"{source}: expected a pickled dict, found {type(d).__name__}")
    data, labels = _get(d, "data"), _get(d, spec.label_key)
    if data is None or labels is None:
        raise DataError(f"{source}: missing key 'data' or {spec.label_key!r} (keys: {sorted(map(str, d))})")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{source}: 'data' must be a uint8 N x 3072 array, found {what}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise DataError(f"{source}: {spec.label_key!r} is not a list of integers") from e
    if y.ndim != 1 or y.shape[0] != data.shape[0]:
        raise DataError(f"{source}: {data.shape[0]} images but {spec.label_key!r} has shape {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DataError(f"{source}: labels must lie in 0..{spec.num_classes - 1}, found {y.min()}..{y.max()}")
    x = torch.from_numpy(np.ascontiguousarray(data)).reshape(-1, 3, 32, 32).float().div_(255.0)
    return x, torch.from_numpy(y)


def _read_files(root: Path, spec: CifarSpec) -> list[tuple[bytes, str]]:
    """(bytes, description) of each of the spec's train files then its test file, read from the extracted
    folder (``root/<folder>/`` or ``root`` itself) or else from the archive, in one sequential pass."""
    names = (*spec.train_files, spec.test_file)
    for folder in (root / spec.folder, root):
        if all((folder / n).is_file() for n in names):
            return [((folder / n).read_bytes(), repr(str(folder / n))) for n in names]
    archive = root / spec.archive
    if not archive.is_file():
        for folder in (root / spec.folder, root):
            missing = [n for n in names if not (folder / n).is_file()]
            if len(missing) < len(names):
                raise DataError(f"dataset {spec.name!r}: {str(folder)!r} lacks {', '.join(missing)} (expected "
                                f"{', '.join(names)}) and {spec.archive} is not in {str(root)!r}; download the "
                                f"python version from {CIFAR_URL}")
        raise DataError(f"dataset {spec.name!r}: neither {spec.archive} nor the extracted folder "
                        f"{spec.folder}/ found in {str(root)!r}; download the python version from "
                        f"{CIFAR_URL}")
    wanted = {f"{spec.folder}/{n}": n for n in names}
    blobs: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = wanted.get(member.name.removeprefix("./"))
                if name is None or name in blobs:
                    continue
                f = tar.extractfile(member) if member.isfile() else None
                if f is None:
                    raise DataError(f"{str(archive)!r} member {member.name} is not a regular file")
                blobs[name] = f.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DataError(f"{str(archive)!r} is truncated or corrupt: {e}") from e
    missing = [f"{spec.folder}/{n}" for n in names if n not in blobs]
    if missing:
        raise DataError(f"{str(archive)!r} lacks {', '.join(missing)}; is it the python version "
                        f"from {CIFAR_URL}?")
    return [(blobs[n], f"{str(archive)!r} member {spec.folder}/{n}") for n in names]


def load_cifar(root: str | None, spec: CifarSpec) -> RawDataset:
    """Read, unpickle safely, validate and concatenate the batches of one CIFAR variant."""
    if root is None:
        raise DataError(f"dataset {spec.name!r} needs a data root holding {spec.archive} or {spec.folder}/; "
                        f"download the python version from {CIFAR_URL}")
    parts = []
    for blob, where in _read_files(Path(root), spec):
        parts.append(decode_batch(safe_load(blob, where), where, spec))
    train, test = parts[:-1], parts[-1]
    x = torch.cat([p[0] for p in train]) if len(train) > 1 else train[0][0]
    y = torch.cat([p[1] for p in train]) if len(train) > 1 else train[0][1]
    return RawDataset(x, y, test[0], test[1], num_classes=spec.num_classes, default_augment="crop_flip", name=spec.name)


@DATASETS.register("cifar10", "CIFAR-10 50,000/10,000 images (3, 32, 32), 10 classes, from root "
                              "(python version)")
def cifar10(root: str | None = None) -> RawDataset:
    """CIFAR-10 from ``root/cifar-10-batches-py/`` or ``root/cifar-10-python.tar.gz`` (read in memory)."""
    return load_cifar(root, CIFAR10)


@DATASETS.register("cifar100", "CIFAR-100 50,000/10,000 images (3, 32, 32), 100 fine classes, from root "
                               "(python version)")
def cifar100(root: str | None = None) -> RawDataset:
    """CIFAR-100 (fine labels) from ``root/cifar-100-python/`` or ``root/cifar-100-python.tar.gz``."""
    return load_cifar(root, CIFAR100)
