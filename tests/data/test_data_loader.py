"""BatchLoader: full coverage per epoch, order from (seed, epoch) only, batches consistent with the split."""

from __future__ import annotations

import pytest
import torch

from teachkit.data import Augment, BatchLoader, DataConfig
from teachkit.data.base import TensorSplit
from teachkit.errors import ConfigError
from teachkit.options import from_mapping


def make_split(n: int = 103) -> TensorSplit:
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 2, 4, 4).contiguous()
    return TensorSplit(x, torch.arange(n) % 7)


def order_of(loader: BatchLoader, epoch: int) -> list[int]:
    return [i for b in loader.batches(epoch) for i in b.index.tolist()]


def test_epoch_covers_every_index_once_and_batches_match_split() -> None:
    split = make_split()
    loader = BatchLoader(split, batch_size=10, shuffle=True, seed=0)
    assert len(loader) == 11  # ceil(103 / 10)
    batches = list(loader.batches(0))
    assert len(batches) == 11 and [len(b.index) for b in batches] == [10] * 10 + [3]
    assert sorted(i for b in batches for i in b.index.tolist()) == list(range(103))
    for b in batches:
        assert torch.equal(b.y, b.index % 7)  # y of sample i is i % 7
        assert torch.equal(b.x[:, 0, 0, 0], b.index.float())  # x of sample i is filled with i


def test_drop_last() -> None:
    loader = BatchLoader(make_split(), batch_size=10, shuffle=True, seed=0, drop_last=True)
    assert len(loader) == 10
    idx = order_of(loader, 3)
    assert len(idx) == 100 and len(set(idx)) == 100


def test_order_depends_on_seed_and_epoch_only() -> None:
    split = make_split()
    a = BatchLoader(split, batch_size=16, shuffle=True, seed=5)
    assert order_of(a, 2) == order_of(a, 2)
    resumed = BatchLoader(split, batch_size=16, shuffle=True, seed=5)  # e.g. after a restart
    _ = order_of(a, 0), order_of(a, 1)
    assert order_of(resumed, 2) == order_of(a, 2)
    assert order_of(a, 2) != order_of(a, 3)
    assert order_of(a, 2) != order_of(BatchLoader(split, batch_size=16, shuffle=True, seed=6), 2)
    # another batch size sees the same permutation (two methods with the same seed: same sample order)
    assert order_of(BatchLoader(split, batch_size=7, shuffle=True, seed=5), 2) == order_of(a, 2)
    # the global RNG plays no part
    torch.manual_seed(123)
    first = order_of(a, 4)
    torch.manual_seed(456)
    assert order_of(a, 4) == first


def test_no_shuffle_is_in_order() -> None:
    loader = BatchLoader(make_split(), batch_size=25, shuffle=False, seed=0)
    assert order_of(loader, 0) == list(range(103)) == order_of(loader, 9)


def test_augmented_batches_reproducible_and_order_unchanged() -> None:
    split = TensorSplit(torch.randn(50, 3, 8, 8), torch.arange(50) % 5)
    plain = BatchLoader(split, batch_size=8, shuffle=True, seed=1)
    aug = BatchLoader(split, batch_size=8, shuffle=True, seed=1, augment=Augment(crop_pad=2, flip=True))
    again = BatchLoader(split, batch_size=8, shuffle=True, seed=1, augment=Augment(crop_pad=2, flip=True))
    assert order_of(aug, 0) == order_of(plain, 0)
    for b1, b2, b0 in zip(aug.batches(0), again.batches(0), plain.batches(0), strict=True):
        assert torch.equal(b1.x, b2.x) and torch.equal(b1.y, b0.y)
        assert b1.x.shape == b0.x.shape
    assert not all(torch.equal(b1.x, b0.x) for b1, b0 in zip(aug.batches(0), plain.batches(0), strict=True))
    e0 = torch.cat([b.x for b in aug.batches(0)])
    e1 = torch.cat([b.x for b in aug.batches(1)])
    assert not torch.equal(e0, e1)


def test_bad_arguments() -> None:
    # batch sizes are validated once, by the data section (data.batch_size=0 is out of range)
    with pytest.raises(ConfigError, match="data.batch_size=0 is out of range"):
        from_mapping(DataConfig, {"batch_size": 0}, "data")
    with pytest.raises(ConfigError, match="drop_last"):
        BatchLoader(make_split(5), batch_size=8, shuffle=True, seed=0, drop_last=True)


def test_empty_split_yields_nothing() -> None:
    loader = BatchLoader(make_split(0), batch_size=4, shuffle=True, seed=0)
    assert len(loader) == 0 and list(loader.batches(0)) == []
