"""The ``arrays`` source: .npz, pairs of .npy files and .pt dicts, given or carved splits, regression."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from teachkit.data import load_raw, load_splits


def make(n: int, seed: int, shape: tuple[int, ...] = (2, 3), classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype(np.float64), np.arange(n) % classes


def test_npz_train_and_test(tmp_path: Path) -> None:
    x, y = make(30, 0)
    xt, yt = make(6, 1)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=xt, y=yt)
    raw = load_raw("arrays", str(tmp_path), {"train": "train.npz", "test": str(tmp_path / "test.npz")})
    assert raw.train_x.dtype == torch.float32 and raw.train_x.shape == (30, 2, 3)
    assert raw.train_y.dtype == torch.int64 and raw.num_classes == 3 and raw.val_x is None
    torch.testing.assert_close(raw.test_x, torch.tensor(xt, dtype=torch.float32))
    s = load_splits("arrays", root=str(tmp_path), options={"train": "train.npz", "test": "test.npz"})
    assert len(s.test) == 6 and len(s.train) + len(s.val) == 30 and len(s.val) == 3  # 10% carved, stratified


def test_npy_pair_with_given_val_is_not_carved(tmp_path: Path) -> None:
    x, y = make(20, 0, shape=(4,))
    xv, yv = make(5, 1, shape=(4,))
    for name, a in {"x": x, "y": y, "xv": xv, "yv": yv}.items():
        np.save(tmp_path / f"{name}.npy", a)
    opts = {"train": ["x.npy", "y.npy"], "val": ["xv.npy", "yv.npy"]}
    s = load_splits("arrays", root=str(tmp_path), options=opts, val_fraction=0.5)
    assert len(s.val) == 5 and s.val.y.tolist() == yv.tolist()
    assert len(s.test) == 4 and len(s.train) == 16  # test carved: 20% of 20; val_fraction unused
    assert s.mean is not None
    torch.testing.assert_close(s.val.x * s.std + s.mean, torch.tensor(xv, dtype=torch.float32), atol=1e-5, rtol=0)


def test_pt_dict_custom_keys_and_root_file(tmp_path: Path) -> None:
    x, y = make(12, 0, shape=(1, 4, 4))
    torch.save({"images": torch.tensor(x, dtype=torch.float16), "labels": torch.tensor(y)}, tmp_path / "d.pt")
    raw = load_raw("arrays", str(tmp_path / "d.pt"), {"x_key": "images", "y_key": "labels"})
    assert raw.train_x.shape == (12, 1, 4, 4) and raw.train_x.dtype == torch.float32
    assert raw.train_y.tolist() == y.tolist()


def test_string_labels_are_sorted_class_ids(tmp_path: Path) -> None:
    x, _ = make(6, 0, shape=(2,))
    y = np.array(["dog", "cat", "eel", "cat", "dog", "eel"])
    np.savez(tmp_path / "d.npz", x=x, y=y)
    raw = load_raw("arrays", str(tmp_path), {"train": "d.npz"})
    assert raw.train_y.tolist() == [1, 0, 2, 0, 1, 2] and raw.num_classes == 3


@pytest.mark.parametrize("width", [None, 2])
def test_regression_targets_and_random_carving(tmp_path: Path, width: int | None) -> None:
    x, _ = make(50, 0, shape=(3,))
    y = np.random.default_rng(2).normal(size=(50,) if width is None else (50, width))
    np.savez(tmp_path / "r.npz", x=x, y=y)
    opts = {"train": "r.npz", "task": "regression"}
    raw = load_raw("arrays", str(tmp_path), opts)
    assert raw.task == "regression" and raw.train_y.dtype == torch.float32
    assert raw.num_classes == (width or 1) and raw.train_y.shape == y.shape
    a = load_splits("arrays", root=str(tmp_path), options=opts, split_seed=1, train_subset=7)
    b = load_splits("arrays", root=str(tmp_path), options=opts, split_seed=1, train_subset=7)
    c = load_splits("arrays", root=str(tmp_path), options=opts, split_seed=1, train_subset=7, subset_seed=3)
    assert (len(a.test), len(a.val), len(a.train)) == (10, 4, 7)
    assert torch.equal(a.train.y, b.train.y) and torch.equal(a.val.y, c.val.y) and torch.equal(a.test.y, c.test.y)
    assert not torch.equal(a.train.y, c.train.y)
    everything = torch.cat([a.test.y, a.val.y, load_splits("arrays", root=str(tmp_path), options=opts,
                                                           split_seed=1).train.y])
    assert sorted(everything.flatten().tolist()) == sorted(torch.tensor(y, dtype=torch.float32).flatten().tolist())
