"""Split properties of load_splits, checked on a test source whose inputs encode each sample's id."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from teachkit.data import DATASETS, RawDataset, load_splits
from teachkit.data.base import Splits, TensorSplit
from teachkit.errors import ConfigError
from teachkit.registry import Entry

COUNTS = (40, 20, 10, 5)  # 75 samples, classes 0..3


def ids_source(root: str | None = None, counts: list[int] | tuple[int, ...] = COUNTS,
               test: bool = False) -> RawDataset:
    """Sample i has x = (i, -2i) in 2 channels of length 1 and label c for its block of ``counts``;
    interleaved so that labels are not sorted by id."""
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    y = y[torch.argsort(torch.arange(len(y)) * 7919 % len(y))]
    ids = torch.arange(len(y), dtype=torch.float32)
    x = torch.stack([ids, -2 * ids], 1)[:, :, None]
    if test:
        return RawDataset(x, y, x[:5] + 1000, y[:5], num_classes=len(counts), name="ids")
    return RawDataset(x, y, None, None, num_classes=len(counts), name="ids")


@pytest.fixture(autouse=True)
def _ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DATASETS._entries, "ids", Entry("ids", ids_source, "test source"))


def ids_of(s: Splits, part: TensorSplit) -> list[int]:
    assert s.mean is not None and s.std is not None
    raw = part.x[:, 0, 0] * s.std[0] + s.mean[0]
    return torch.round(raw).long().tolist()


def per_class(s: Splits, part: TensorSplit) -> list[int]:
    return torch.bincount(part.y, minlength=s.num_classes).tolist()


def test_disjoint_cover_and_hand_computed_counts() -> None:
    s = load_splits("ids", val_fraction=0.25)
    tr, va, te = set(ids_of(s, s.train)), set(ids_of(s, s.val)), set(ids_of(s, s.test))
    assert not (tr & va) and not (tr & te) and not (va & te)
    assert tr | va | te == set(range(75))
    # 20% of (40, 20, 10, 5) is (8, 4, 2, 1); 25% of the remaining (32, 16, 8, 4) is (8, 4, 2, 1)
    assert per_class(s, s.test) == [8, 4, 2, 1]
    assert per_class(s, s.val) == [8, 4, 2, 1]
    assert per_class(s, s.train) == [24, 12, 6, 3]
    # labels travel with their samples
    y_of_id = ids_source().train_y
    for part in (s.train, s.val, s.test):
        assert part.y.tolist() == [int(y_of_id[i]) for i in ids_of(s, part)]


def test_stratified_within_one_of_expected_fraction() -> None:
    counts = [97, 51, 33, 12, 7, 3, 2]
    s = load_splits("ids", val_fraction=0.13, split_seed=5, options={"counts": counts})
    test_c = per_class(s, s.test)
    for k, n in zip(test_c, counts, strict=True):
        assert abs(k - 0.2 * n) <= 1
    rest = [n - k for n, k in zip(counts, test_c, strict=True)]
    val_c = per_class(s, s.val)
    for k, n in zip(val_c, rest, strict=True):
        assert abs(k - 0.13 * n) <= 1
        # every class keeps a sample on both sides; a lone sample (the 2-sample class gave one to test) stays
        assert (k >= 1 and n - k >= 1) if n >= 2 else k == 0
    # round(0.2 * 205) = 41 test samples although the 2-sample class needs one (0.4 rounds to 0 by itself)
    assert len(s.test) == 41 and test_c[-1] == 1


def test_val_fraction_hand_computed() -> None:
    # val 10% of (32, 16, 8, 4): quotas (3.2, 1.6, 0.8, 0.4), total round(6.0) = 6 -> (3, 2, 1, 0) by largest
    # remainder; class 3 is lifted to 1 so that it has a val sample, and class 1 (rounded up from 1.6) gives
    # one back to keep the total at 6: (3, 1, 1, 1)
    s = load_splits("ids", val_fraction=0.1)
    assert per_class(s, s.val) == [3, 1, 1, 1] and len(s.val) == 6


def test_official_test_split_is_kept() -> None:
    s = load_splits("ids", val_fraction=0.2, options={"test": True})
    assert len(s.test) == 5 and sorted(ids_of(s, s.test)) == [1000, 1001, 1002, 1003, 1004]
    assert len(s.train) + len(s.val) == 75 and per_class(s, s.val) == [8, 4, 2, 1]


def test_determinism_and_seed_dependence() -> None:
    a = load_splits("ids", split_seed=3)
    b = load_splits("ids", split_seed=3)
    c = load_splits("ids", split_seed=4)
    for part in ("train", "val", "test"):
        assert torch.equal(getattr(a, part).x, getattr(b, part).x)
        assert torch.equal(getattr(a, part).y, getattr(b, part).y)
    assert set(ids_of(a, a.test)) != set(ids_of(c, c.test))
    assert set(ids_of(a, a.val)) != set(ids_of(c, c.val))


def test_train_subset_leaves_val_and_test_unchanged_and_is_stratified() -> None:
    full = load_splits("ids", val_fraction=0.25, split_seed=1)
    sub = load_splits("ids", val_fraction=0.25, split_seed=1, train_subset=9)
    for part in ("val", "test"):
        assert torch.equal(getattr(full, part).x, getattr(sub, part).x)  # same samples, same normalisation
        assert torch.equal(getattr(full, part).y, getattr(sub, part).y)
    assert torch.equal(full.mean, sub.mean) and torch.equal(full.std, sub.std)
    assert len(sub.train) == 9 and set(ids_of(sub, sub.train)) <= set(ids_of(full, full.train))
    # 9 of (24, 12, 6, 3) -> quotas (4.8, 2.4, 1.2, 0.6): floors (4, 2, 1, 0), 2 more to 0.8 and 0.6
    assert per_class(sub, sub.train) == [5, 2, 1, 1]
    again = load_splits("ids", val_fraction=0.25, split_seed=1, train_subset=9)
    assert torch.equal(again.train.x, sub.train.x)


def test_train_subset_keeps_every_class_when_possible() -> None:
    s = load_splits("ids", options={"counts": [200, 3, 3]}, train_subset=3)
    assert per_class(s, s.train) == [1, 1, 1]
    full = load_splits("ids", options={"counts": [200, 3, 3]})
    s = load_splits("ids", options={"counts": [200, 3, 3]}, train_subset=len(full.train))
    assert sorted(ids_of(s, s.train)) == sorted(ids_of(full, full.train))


@pytest.mark.parametrize("shape", [[3, 6, 5], [2, 11], [4]])
def test_normalisation_per_channel(shape: list[int]) -> None:
    s = load_splits("synthetic", options={"shape": shape, "n_train": 300, "n_test": 50, "separation": 3.0})
    x = s.train.x.double()
    dims = [0, *range(2, x.dim())]
    zeros = torch.zeros(shape[0], dtype=torch.float64)
    torch.testing.assert_close(x.mean(dim=dims), zeros, atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std(dim=dims, unbiased=False), torch.ones(shape[0], dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert s.mean is not None and s.mean.shape == (shape[0],) and s.std is not None
    # val and test go through the same affine map: undoing it gives back the raw synthetic tensors' stats
    raw = DATASETS.get("synthetic")(None, shape=shape, n_train=300, n_test=50, separation=3.0)
    view = (1, -1) + (1,) * (len(shape) - 1)
    assert raw.test_x is not None
    torch.testing.assert_close(s.test.x * s.std.view(view) + s.mean.view(view), raw.test_x, atol=1e-4, rtol=0)


def test_ids_channel_stats_hand_computed() -> None:
    # train ids are 45 of 0..74; channel 1 is -2 * channel 0, so its mean is -2x and its std 2x channel 0's
    s = load_splits("ids", val_fraction=0.25)
    assert s.mean is not None and s.std is not None
    ids = torch.tensor(ids_of(s, s.train), dtype=torch.float64)
    assert s.mean[0].item() == pytest.approx(ids.mean().item(), rel=1e-6)
    assert s.std[0].item() == pytest.approx(ids.std(unbiased=False).item(), rel=1e-6)
    assert s.mean[1].item() == pytest.approx(-2 * ids.mean().item(), rel=1e-6)
    assert s.std[1].item() == pytest.approx(2 * ids.std(unbiased=False).item(), rel=1e-6)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset 'digit' \(did you mean 'digits'\?\)"):
        load_splits("digit")
    for bad in (0, 0.0, 1, 1.5, -0.1, True, "0.1"):
        with pytest.raises(ConfigError, match="val_fraction"):
            load_splits("ids", val_fraction=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"train_subset=0 .*choose 1\.\.45"):
        load_splits("ids", val_fraction=0.25, train_subset=0)
    with pytest.raises(ConfigError, match=r"train_subset=46 .*choose 1\.\.45"):
        load_splits("ids", val_fraction=0.25, train_subset=46)
    msg = (r"unknown option 'shap' for dataset 'synthetic' \(did you mean 'shape'\?\)"
           r".*allowed options: n_test, n_train, num_classes, seed, separation, shape")
    with pytest.raises(ConfigError, match=msg):
        load_splits("synthetic", options={"shap": [3, 4, 4]})
    with pytest.raises(ConfigError, match="unknown option 'foo' for dataset 'digits'.*allowed options: none"):
        load_splits("digits", options={"foo": 1})
    with pytest.raises(ConfigError, match="option 'shape'"):
        load_splits("synthetic", options={"shape": [3, 0]})
    with pytest.raises(ConfigError, match="option 'n_train'"):
        load_splits("synthetic", options={"n_train": 1.5})
    with pytest.raises(ConfigError) as e:
        load_splits("cifar")
    assert "\n" not in str(e.value) and "cifar10" in str(e.value)


def test_registry_names_and_descriptions() -> None:
    names = {"digits", "mnist1d", "mnist5k", "mnist", "cifar10", "cifar100", "synthetic"}
    assert names <= set(DATASETS.names())
    for entry in DATASETS.entries():
        assert entry.description and "\n" not in entry.description


def test_synthetic_is_deterministic_and_balanced() -> None:
    a = DATASETS.get("synthetic")(None, shape=[2, 4, 4], num_classes=4, n_train=40, n_test=8, seed=7)
    b = DATASETS.get("synthetic")(None, shape=(2, 4, 4), num_classes=4, n_train=40, n_test=8, seed=7)
    c = DATASETS.get("synthetic")(None, shape=[2, 4, 4], num_classes=4, n_train=40, n_test=8, seed=8)
    assert torch.equal(a.train_x, b.train_x) and not torch.equal(a.train_x, c.train_x)
    assert Counter(a.train_y.tolist()) == {0: 10, 1: 10, 2: 10, 3: 10}
    assert a.train_x.shape == (40, 2, 4, 4) and a.test_x is not None and a.test_x.shape[0] == 8
    flat = DATASETS.get("synthetic")(None, shape=[6])
    assert flat.train_x.shape[1:] == (6,)


def test_splits_to_keeps_statistics() -> None:
    s = load_splits("ids")
    moved = s.to("cpu")
    assert moved.mean is not None and s.mean is not None and torch.equal(moved.mean, s.mean)
    assert moved.default_augment == s.default_augment and moved.task == s.task
    assert torch.equal(moved.train.x, s.train.x)
