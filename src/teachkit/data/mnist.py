"""MNIST from the four IDX files (plain or gzipped), as published at http://yann.lecun.com/exdb/mnist/.

IDX format (same page): a 4-byte magic number ``0x00 0x00 <type> <ndim>`` (type 0x08 = unsigned byte),
then ``ndim`` big-endian uint32 dimension sizes, then the data in row-major order. Images use magic
0x00000803 (N, 28, 28), labels 0x00000801 (N,).
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset
from teachkit.errors import DataError

MNIST_URL = "http://yann.lecun.com/exdb/mnist/"
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801


def find_mnist_files(root: str | Path | None) -> dict[str, Path]:
    """Each of :data:`MNIST_FILES` found as ``root/NAME[.gz]`` or ``root/MNIST/raw/NAME[.gz]``
    (the torchvision layout); one-line DataError listing what is missing otherwise."""
    if root is None:
        raise DataError(f"dataset 'mnist' needs a data root holding {', '.join(MNIST_FILES)} (plain or .gz); "
                        f"download them from {MNIST_URL}")
    root = Path(root)
    dirs = [root, root / "MNIST" / "raw"]
    found: dict[str, Path] = {}
    for name in MNIST_FILES:
        for d in dirs:
            hits = [p for p in (d / name, d / f"{name}.gz") if p.is_file()]
            if hits:
                found[name] = hits[0]
                break
    missing = [n for n in MNIST_FILES if n not in found]
    if missing:
        raise DataError(f"dataset 'mnist': missing {', '.join(missing)} (plain or .gz) in {str(root)!r} "
                        f"(also searched {str(dirs[1])!r}); expected files: {', '.join(MNIST_FILES)}, "
                        f"published at {MNIST_URL}")
    return found


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The uint8 array stored in IDX file ``path`` (gzipped if it ends in .gz), checked against ``magic``
    and against its own header (the byte count must match the dimensions exactly)."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                blob = f.read()
        else:
            blob = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read {str(path)!r}: {e}") from e
    if len(blob) < 4:
        raise DataError(f"{str(path)!r} is truncated: {len(blob)} bytes, no IDX header")
    (found,) = struct.unpack(">I", blob[:4])
    if found != magic:
        raise DataError(f"{str(path)!r} is not an IDX file of the expected kind: magic 0x{found:08x}, "
                        f"expected 0x{magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(blob) < header:
        raise DataError(f"{str(path)!r} is truncated: {len(blob)} bytes, header needs {header}")
    dims = struct.unpack(f">{ndim}I", blob[4:header])
    expected = math.prod(dims)  # Python ints: a forged header cannot overflow (np.prod wraps around)
    have = len(blob) - header
    if have != expected:
        what = "truncated" if have < expected else "corrupt (trailing bytes)"
        raise DataError(f"{str(path)!r} is {what}: header says {'x'.join(map(str, dims))} = {expected} bytes "
                        f"of data, file holds {have}")
    return np.frombuffer(blob, dtype=np.uint8, offset=header).reshape(dims)


def read_mnist_pair(images: Path, labels: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 (N, 1, 28, 28) in [0, 1], y int64 (N,)) from one images/labels file pair."""
    x = read_idx(images, IMAGES_MAGIC)
    y = read_idx(labels, LABELS_MAGIC)
    if x.shape[1:] != (28, 28):
        raise DataError(f"{str(images)!r}: images are {x.shape[1]}x{x.shape[2]}, expected 28x28")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{str(images)!r} holds {x.shape[0]} images but {str(labels)!r} holds "
                        f"{y.shape[0]} labels")
    if y.size and int(y.max()) > 9:
        raise DataError(f"{str(labels)!r}: label {int(y.max())} outside 0..9")
    xt = torch.from_numpy(x.copy()).unsqueeze(1).float().div_(255.0)
    return xt, torch.from_numpy(y.astype(np.int64))


@DATASETS.register("mnist", "MNIST 60,000/10,000 images (1, 28, 28) from the four IDX files (plain or .gz) "
                            "in root")
def mnist(root: str | None = None) -> RawDataset:
    """LeCun et al.'s MNIST read from ``root`` (or ``root/MNIST/raw``); counts are taken from the headers."""
    files = find_mnist_files(root)
    x, y = read_mnist_pair(files["train-images-idx3-ubyte"], files["train-labels-idx1-ubyte"])
    xt, yt = read_mnist_pair(files["t10k-images-idx3-ubyte"], files["t10k-labels-idx1-ubyte"])
    return RawDataset(x, y, xt, yt, num_classes=10, default_augment="none", name="mnist")
