"""The offline sources (packages of the `data` extra) with sizes and class counts known from their docs."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from teachkit.data import DATASETS, load_splits
from teachkit.errors import DataError


def counts(y: torch.Tensor) -> list[int]:
    return torch.bincount(y, minlength=10).tolist()


def test_digits() -> None:
    raw = DATASETS.get("digits")(None)
    assert raw.train_x.shape == (1797, 1, 8, 8) and raw.test_x is None
    assert raw.train_x.min().item() == 0.0 and raw.train_x.max().item() == 1.0  # 0..16 scaled by 1/16
    # scikit-learn's documented per-class counts of load_digits
    assert counts(raw.train_y) == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    s = load_splits("digits")
    # test: round(0.2 * 1797) = 359; val: round(0.1 * 1438) = 144; train: 1438 - 144
    assert (len(s.train), len(s.val), len(s.test)) == (1294, 144, 359)
    assert s.input_shape == (1, 8, 8) and s.num_classes == 10 and s.default_augment == "none"
    assert s.task == "classification"
    for c, n in enumerate([178, 182, 177, 183, 181, 182, 181, 179, 174, 180]):
        assert abs(counts(s.test.y)[c] - 0.2 * n) <= 1


def test_mnist1d(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_splits("mnist1d")
    assert (len(s.train), len(s.val), len(s.test)) == (3600, 400, 1000)  # package default 4,000 / 1,000
    assert s.input_shape == (1, 40) and s.default_augment == "none"
    assert counts(torch.cat([s.train.y, s.val.y, s.test.y])) == [500] * 10  # 5,000 // 10 per class
    # a fresh generation writes nothing into the working directory and leaves the global RNGs alone
    monkeypatch.chdir(tmp_path)
    np.random.seed(1)
    random.seed(1)
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    raw = DATASETS.get("mnist1d")(None, num_samples=200, seed=3)
    assert raw.train_x.shape == (160, 1, 40) and raw.test_x is not None and raw.test_x.shape == (40, 1, 40)
    assert list(tmp_path.iterdir()) == []
    assert np.array_equal(np.random.get_state()[1], np_before) and random.getstate() == py_before


def test_mnist5k() -> None:
    raw = DATASETS.get("mnist5k")(None)
    assert raw.train_x.shape == (5000, 1, 28, 28) and raw.test_x is None
    assert raw.train_x.min().item() == 0.0 and raw.train_x.max().item() == 1.0
    assert counts(raw.train_y) == [500] * 10
    s = load_splits("mnist5k")
    assert counts(s.test.y) == [100] * 10 and counts(s.val.y) == [40] * 10 and counts(s.train.y) == [360] * 10


def test_missing_package_is_a_one_line_data_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    msg = r"^dataset 'digits' needs scikit-learn: pip install 'teachkit\[data\]'$"
    with pytest.raises(DataError, match=msg):
        DATASETS.get("digits")(None)
