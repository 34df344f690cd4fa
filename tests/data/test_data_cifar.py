"""CIFAR python-version reading on tiny batches written here in the layout of
https://www.cs.toronto.edu/~kriz/cifar.html, and refusal of pickles that name anything but numpy."""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from teachkit.data import DATASETS, load_splits
from teachkit.errors import DataError

C10_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]


def batch(n: int, labels: list[int], key: bytes, seed: int) -> dict[bytes, object]:
    """A batch dict as the original pickles load with encoding="bytes": bytes keys, uint8 N x 3072 data,
    labels a list of ints."""
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"testing batch", key: labels,
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)]}


def cifar10_files() -> dict[str, dict[bytes, object]]:
    files = {name: batch(4, [(i + k) % 10 for k in range(4)], b"labels", i)
             for i, name in enumerate(C10_TRAIN)}
    files["test_batch"] = batch(3, [9, 0, 5], b"labels", 99)
    return files


def cifar100_files() -> dict[str, dict[bytes, object]]:
    return {"train": batch(6, [0, 99, 42, 7, 7, 63], b"fine_labels", 1),
            "test": batch(2, [98, 1], b"fine_labels", 2)}


class Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2's cPickle wrote the original files: every (byte) string is a Python 2 ``str``
    (SHORT_BINSTRING / BINSTRING opcodes), so it loads as ``bytes`` with encoding="bytes"."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes | str) -> None:
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def py2_dumps(obj: object) -> bytes:
    """A Python-2-style pickle; numpy is named ``numpy.core.multiarray`` as in the original files."""
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def dumps(obj: object, protocol: int | str) -> bytes:
    return py2_dumps(obj) if protocol == "py2" else pickle.dumps(obj, protocol=protocol)  # type: ignore[arg-type]


def write_folder(folder: Path, files: dict[str, dict[bytes, object]], protocol: int | str = "py2") -> None:
    folder.mkdir(parents=True)
    for name, d in files.items():
        (folder / name).write_bytes(dumps(d, protocol))


def write_archive(path: Path, folder: str, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def check_cifar10(raw, files) -> None:  # type: ignore[no-untyped-def]
    assert raw.train_x.shape == (20, 3, 32, 32) and raw.train_x.dtype == torch.float32
    assert raw.test_x.shape == (3, 3, 32, 32)
    expected = [y for name in C10_TRAIN for y in files[name][b"labels"]]
    assert raw.train_y.tolist() == expected and raw.test_y.tolist() == [9, 0, 5]
    data = files["data_batch_2"][b"data"]  # train samples 4..7
    # channel c, row r, col k of an image sits at byte c*1024 + r*32 + k of its row
    for c, r, k in [(0, 0, 0), (1, 5, 31), (2, 31, 17)]:
        assert raw.train_x[5, c, r, k].item() == pytest.approx(data[1, c * 1024 + r * 32 + k] / 255, abs=1e-7)
    np.testing.assert_allclose(raw.test_x[2].numpy().reshape(-1), files["test_batch"][b"data"][2] / 255.0,
                               atol=1e-7)
    assert raw.num_classes == 10 and raw.default_augment == "crop_flip" and raw.task == "classification"


def test_py2_style_pickle_is_what_the_originals_hold() -> None:
    blob = py2_dumps({b"data": np.zeros((1, 3072), np.uint8)})
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in blob and b"_codecs" not in blob
    assert pickle.loads(blob, encoding="bytes")[b"data"].shape == (1, 3072)


@pytest.mark.parametrize("protocol", ["py2", 2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_from_folder(tmp_path: Path, protocol: int | str) -> None:
    files = cifar10_files()
    write_folder(tmp_path / "cifar-10-batches-py", files, protocol)
    check_cifar10(DATASETS.get("cifar10")(str(tmp_path)), files)


def test_cifar10_from_archive_in_memory(tmp_path: Path) -> None:
    files = cifar10_files()
    write_archive(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py",
                  {n: py2_dumps(d) for n, d in files.items()})
    check_cifar10(DATASETS.get("cifar10")(str(tmp_path)), files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-python.tar.gz"]  # nothing extracted


def test_cifar100_folder_and_archive(tmp_path: Path) -> None:
    files = cifar100_files()
    write_archive(tmp_path / "cifar-100-python.tar.gz", "cifar-100-python",
                  {n: py2_dumps(d) for n, d in files.items()})
    raw = DATASETS.get("cifar100")(str(tmp_path))
    assert raw.num_classes == 100 and raw.train_y.tolist() == [0, 99, 42, 7, 7, 63]
    assert raw.test_y.tolist() == [98, 1] and raw.test_x.shape == (2, 3, 32, 32)
    assert raw.train_x[3, 2, 31, 31].item() == pytest.approx(files["train"][b"data"][3, 3071] / 255, abs=1e-7)
    write_folder(tmp_path / "other" / "cifar-100-python", files)
    raw2 = DATASETS.get("cifar100")(str(tmp_path / "other"))
    assert torch.equal(raw.train_x, raw2.train_x) and torch.equal(raw.test_y, raw2.test_y)


def test_load_splits_cifar10(tmp_path: Path) -> None:
    write_folder(tmp_path / "cifar-10-batches-py", cifar10_files())
    s = load_splits("cifar10", root=str(tmp_path), val_fraction=0.25)
    assert len(s.train) + len(s.val) == 20 and len(s.test) == 3
    assert s.default_augment == "crop_flip" and s.input_shape == (3, 32, 32)


def test_missing_cifar_names_archive_folder_and_url(tmp_path: Path) -> None:
    for name, archive, folder in [("cifar10", "cifar-10-python.tar.gz", "cifar-10-batches-py"),
                                  ("cifar100", "cifar-100-python.tar.gz", "cifar-100-python")]:
        with pytest.raises(DataError) as e:
            DATASETS.get(name)(str(tmp_path))
        msg = str(e.value)
        assert archive in msg and folder in msg and "https://www.cs.toronto.edu/~kriz/cifar.html" in msg
        assert "\n" not in msg


class Evil:
    """Unpickling this runs a shell command -- unless the unpickler refuses os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    files = cifar10_files()
    files["data_batch_3"][b"labels"] = Evil(marker)  # type: ignore[assignment]
    write_folder(tmp_path / "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"data_batch_3.*refusing to load global \w+\.system"):
        DATASETS.get("cifar10")(str(tmp_path))
    assert not marker.exists()
    # the same from inside an archive, and a top-level evil object
    blobs = {n: py2_dumps(d) for n, d in cifar10_files().items()}
    blobs["test_batch"] = py2_dumps(Evil(marker))
    (tmp_path / "arch").mkdir()
    write_archive(tmp_path / "arch" / "cifar-10-python.tar.gz", "cifar-10-batches-py", blobs)
    with pytest.raises(DataError, match="refusing to load global"):
        DATASETS.get("cifar10")(str(tmp_path / "arch"))
    assert not marker.exists()


def test_corrupt_inputs(tmp_path: Path) -> None:
    files = cifar10_files()
    folder = tmp_path / "cifar-10-batches-py"
    write_folder(folder, files)
    good = (folder / "data_batch_1").read_bytes()
    (folder / "data_batch_1").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="data_batch_1.*not a valid pickle"):
        DATASETS.get("cifar10")(str(tmp_path))
    bad = dict(files["data_batch_1"])
    bad[b"data"] = np.zeros((4, 3000), np.uint8)
    (folder / "data_batch_1").write_bytes(py2_dumps(bad))
    with pytest.raises(DataError, match="uint8 N x 3072"):
        DATASETS.get("cifar10")(str(tmp_path))
    bad[b"data"], bad[b"labels"] = files["data_batch_1"][b"data"], [0, 1, 2]
    (folder / "data_batch_1").write_bytes(py2_dumps(bad))
    with pytest.raises(DataError, match="4 images"):
        DATASETS.get("cifar10")(str(tmp_path))
    bad[b"labels"] = [0, 1, 2, 10]
    (folder / "data_batch_1").write_bytes(py2_dumps(bad))
    with pytest.raises(DataError, match=r"0\.\.9"):
        DATASETS.get("cifar10")(str(tmp_path))


def test_truncated_archive_and_missing_member(tmp_path: Path) -> None:
    blobs = {n: py2_dumps(d) for n, d in cifar10_files().items()}
    archive = tmp_path / "cifar-10-python.tar.gz"
    write_archive(archive, "cifar-10-batches-py", blobs)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(DataError, match="cifar-10-python.tar.gz.*truncated or corrupt"):
        DATASETS.get("cifar10")(str(tmp_path))
    del blobs["test_batch"]
    write_archive(archive, "cifar-10-batches-py", blobs)
    with pytest.raises(DataError, match="lacks cifar-10-batches-py/test_batch"):
        DATASETS.get("cifar10")(str(tmp_path))


def test_codecs_only_for_latin1(tmp_path: Path) -> None:
    from teachkit.data.cifar import safe_load

    # _codecs.encode("x", "latin1") is what Python 3 protocol 2 emits for bytes; any other codec is refused
    ok = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x06\x00\x00\x00latin1\x86R."
    assert safe_load(ok, "ok") == b"x"
    bad = ok.replace(b"X\x06\x00\x00\x00latin1", b"X\x0a\x00\x00\x00zlib_codec")
    with pytest.raises(DataError, match="bad: refusing _codecs.encode with encoding 'zlib_codec'"):
        safe_load(bad, "bad")


@pytest.mark.parametrize("sub", ["cifar-10-batches-py", ""])
def test_folder_missing_test_batch_names_it(tmp_path: Path, sub: str) -> None:
    files = cifar10_files()
    del files["test_batch"]
    write_folder(tmp_path / sub if sub else tmp_path / "x", files)
    root = tmp_path if sub else tmp_path / "x"
    with pytest.raises(DataError, match=r"lacks test_batch \(expected data_batch_1.*test_batch\)") as e:
        DATASETS.get("cifar10")(str(root))
    assert "\n" not in str(e.value)
