"""RawDataset's optional val split and regression targets: validation and how splits_for honours them."""

from __future__ import annotations

import pytest
import torch

from teachkit.data import DATASETS, RawDataset, load_splits
from teachkit.errors import DataError
from teachkit.registry import Entry


def given(root: str | None = None, val: bool = True, test: bool = False, n: int = 40) -> RawDataset:
    """Sample i has x = i; labels round-robin over 2 classes; val (ids 100..) and test (ids 200..) optional."""
    x = torch.arange(n, dtype=torch.float32)[:, None]
    y = torch.arange(n) % 2
    vx, vy = (x[:6] + 100, y[:6]) if val else (None, None)
    tx, ty = (x[:4] + 200, y[:4]) if test else (None, None)
    return RawDataset(x, y, tx, ty, num_classes=2, name="given", val_x=vx, val_y=vy)


@pytest.fixture(autouse=True)
def _given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DATASETS._entries, "given", Entry("given", given, "test source"))


def ids(s, part) -> list[int]:  # type: ignore[no-untyped-def]
    return torch.round(part.x[:, 0] * s.std[0] + s.mean[0]).long().tolist()


def test_given_val_is_kept_and_test_is_carved() -> None:
    s = load_splits("given", val_fraction=0.5)
    assert ids(s, s.val) == list(range(100, 106))
    assert len(s.test) == 8 and len(s.train) == 32  # 20% of 40 carved; the rest trains, no val carving
    assert set(ids(s, s.train)) | set(ids(s, s.test)) == set(range(40))
    assert s.mean is not None and s.mean[0].item() == pytest.approx(sum(ids(s, s.train)) / 32, rel=1e-6)


def test_given_val_and_test_use_every_training_sample() -> None:
    s = load_splits("given", options={"test": True}, train_subset=10, subset_seed=0)
    assert ids(s, s.test) == [200, 201, 202, 203] and len(s.val) == 6 and len(s.train) == 10
    full = load_splits("given", options={"test": True})
    assert sorted(ids(full, full.train)) == list(range(40))


def test_validate_float_targets_only_for_regression() -> None:
    x = torch.zeros(4, 2)
    with pytest.raises(DataError, match=r"train labels must be int64 \(4,\).*real-valued targets need task"):
        RawDataset(x, torch.zeros(4), None, None, num_classes=2).validate()
    with pytest.raises(DataError, match=r"train regression targets must be float32 \(4,\), got torch.int64"):
        RawDataset(x, torch.zeros(4, dtype=torch.long), None, None, num_classes=1, task="regression").validate()
    with pytest.raises(DataError, match=r"must be float32 \(4, 3\), got torch.float32 \(4, 2\)"):
        RawDataset(x, torch.zeros(4, 2), None, None, num_classes=3, task="regression").validate()
    with pytest.raises(DataError, match="NaN or infinite"):
        RawDataset(x, torch.tensor([0.0, float("nan"), 1, 2]), None, None, num_classes=1, task="regression").validate()
    with pytest.raises(DataError, match="val_x and val_y must both be given"):
        RawDataset(x, torch.zeros(4, dtype=torch.long), None, None, num_classes=1, val_x=x).validate()
    with pytest.raises(DataError, match=r"val inputs \(3,\) differ from train \(2,\)"):
        RawDataset(x, torch.zeros(4, dtype=torch.long), None, None, num_classes=1, val_x=torch.zeros(2, 3),
                   val_y=torch.zeros(2, dtype=torch.long)).validate()
    RawDataset(x, torch.zeros(4, 2), None, None, num_classes=2, task="regression", val_x=x,
               val_y=torch.ones(4, 2)).validate()
