"""MNIST IDX reading, on tiny files written here in the format of http://yann.lecun.com/exdb/mnist/."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from teachkit.data import DATASETS, load_splits
from teachkit.data.mnist import read_idx
from teachkit.errors import DataError

N_TRAIN, N_TEST = 30, 7


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """Magic (big-endian uint32), one big-endian uint32 per dim, then the raw unsigned bytes."""
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def make_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(N_TRAIN) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": np.array([3, 1, 4, 1, 5, 9, 2], dtype=np.uint8),
    }


def write_mnist(folder: Path, arrays: dict[str, np.ndarray], gz: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        blob = idx_bytes(arr, 0x00000803 if arr.ndim == 3 else 0x00000801)
        if gz:
            with gzip.open(folder / f"{name}.gz", "wb") as f:
                f.write(blob)
        else:
            (folder / name).write_bytes(blob)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("sub", ["", "MNIST/raw"])
def test_reads_plain_and_gz_in_both_layouts(tmp_path: Path, gz: bool, sub: str) -> None:
    arrays = make_arrays()
    write_mnist(tmp_path / sub if sub else tmp_path, arrays, gz)
    raw = DATASETS.get("mnist")(str(tmp_path))
    assert raw.train_x.shape == (N_TRAIN, 1, 28, 28) and raw.test_x is not None and raw.test_y is not None
    assert raw.test_x.shape == (N_TEST, 1, 28, 28)
    assert raw.train_x.dtype == torch.float32 and raw.train_y.dtype == torch.int64
    assert raw.train_y.tolist() == [i % 10 for i in range(N_TRAIN)]
    assert raw.test_y.tolist() == [3, 1, 4, 1, 5, 9, 2]
    img = arrays["train-images-idx3-ubyte"]
    # pixel (sample 4, row 27, col 3) is byte 4*784 + 27*28 + 3 of the data, scaled by 1/255
    assert raw.train_x[4, 0, 27, 3].item() == pytest.approx(img[4, 27, 3] / 255.0, abs=1e-7)
    expected = arrays["t10k-images-idx3-ubyte"][6] / 255.0
    np.testing.assert_allclose(raw.test_x[6, 0].numpy(), expected, atol=1e-7)
    assert raw.num_classes == 10 and raw.task == "classification" and raw.default_augment == "none"


def test_load_splits_on_tiny_mnist(tmp_path: Path) -> None:
    write_mnist(tmp_path, make_arrays(), gz=True)
    s = load_splits("mnist", root=str(tmp_path), val_fraction=0.1)
    # 30 train (3 per class): val = round(3.0) = 3 by apportionment, but each class with >= 2 samples
    # keeps one on each side, so every class gives exactly one -> 10 val, 20 train; the official test stays.
    assert (len(s.train), len(s.val), len(s.test)) == (20, 10, 7)
    assert sorted(s.val.y.tolist()) == list(range(10))


def test_missing_files_message_names_expected_files_dir_and_url(tmp_path: Path) -> None:
    arrays = make_arrays()
    del arrays["t10k-labels-idx1-ubyte"]
    write_mnist(tmp_path, arrays, gz=False)
    with pytest.raises(DataError) as e:
        DATASETS.get("mnist")(str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        assert name in msg
    assert "missing t10k-labels-idx1-ubyte" in msg
    assert str(tmp_path) in msg and "http://yann.lecun.com/exdb/mnist/" in msg


def test_no_root_is_a_data_error() -> None:
    with pytest.raises(DataError, match="yann.lecun.com"):
        DATASETS.get("mnist")(None)


def test_truncated_file(tmp_path: Path) -> None:
    write_mnist(tmp_path, make_arrays(), gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.*truncated"):
        DATASETS.get("mnist")(str(tmp_path))
    path.write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="truncated"):
        read_idx(path, 0x00000803)


def test_truncated_gz(tmp_path: Path) -> None:
    write_mnist(tmp_path, make_arrays(), gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz"):
        DATASETS.get("mnist")(str(tmp_path))


def test_wrong_magic_count_mismatch_and_bad_labels(tmp_path: Path) -> None:
    arrays = make_arrays()
    write_mnist(tmp_path, arrays, gz=False)
    labels = tmp_path / "train-labels-idx1-ubyte"
    # images written where labels belong: magic 0x803 instead of 0x801
    labels.write_bytes(idx_bytes(arrays["train-images-idx3-ubyte"], 0x00000803))
    with pytest.raises(DataError, match="magic 0x00000803, expected 0x00000801"):
        DATASETS.get("mnist")(str(tmp_path))
    labels.write_bytes(idx_bytes(np.zeros(N_TRAIN - 1, np.uint8), 0x00000801))
    with pytest.raises(DataError, match=f"holds {N_TRAIN} images.*{N_TRAIN - 1} labels"):
        DATASETS.get("mnist")(str(tmp_path))
    labels.write_bytes(idx_bytes(np.full(N_TRAIN, 10, np.uint8), 0x00000801))
    with pytest.raises(DataError, match="label 10 outside 0..9"):
        DATASETS.get("mnist")(str(tmp_path))
    (tmp_path / "train-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((N_TRAIN, 27, 28), np.uint8),
                                                                  0x00000803))
    with pytest.raises(DataError, match="27x28, expected 28x28"):
        DATASETS.get("mnist")(str(tmp_path))


@pytest.mark.parametrize("dims", [(2**31, 2**31, 4), (2**32 - 1, 2**32 - 1, 2**32 - 1), (2**32 - 1, 28, 28)])
def test_header_dims_that_overflow_are_one_line_errors(tmp_path: Path, dims: tuple[int, ...]) -> None:
    # 2^31 * 2^31 * 4 = 2^64 wraps to 0 in int64: a file with no data once passed the size check
    write_mnist(tmp_path, make_arrays(), gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(struct.pack(">4I", 0x00000803, *dims))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.*truncated: header says") as e:
        DATASETS.get("mnist")(str(tmp_path))
    assert "\n" not in str(e.value)
