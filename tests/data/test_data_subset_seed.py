"""``data.subset_seed``: the student's transfer subset gets its own generator; None keeps today's draws."""

from __future__ import annotations

from fractions import Fraction

import torch

from teachkit.data import DataConfig, load_raw, load_splits
from teachkit.data.splits import stratified_fraction, stratified_subset

OPTS = {"shape": [2, 3], "num_classes": 4, "n_train": 200, "n_test": 40}


def _rows(x: torch.Tensor) -> set[tuple[float, ...]]:
    return {tuple(r) for r in x.flatten(1).tolist()}


def test_subset_seed_changes_subset_not_val_test_or_pool() -> None:
    full = load_splits("synthetic", options=OPTS, split_seed=3)
    a = load_splits("synthetic", options=OPTS, split_seed=3, train_subset=30, subset_seed=1)
    b = load_splits("synthetic", options=OPTS, split_seed=3, train_subset=30, subset_seed=2)
    again = load_splits("synthetic", options=OPTS, split_seed=3, train_subset=30, subset_seed=1)
    assert torch.equal(a.train.x, again.train.x)
    assert not torch.equal(a.train.x, b.train.x)
    for s in (a, b):
        for part in ("val", "test"):
            assert torch.equal(getattr(s, part).x, getattr(full, part).x)
            assert torch.equal(getattr(s, part).y, getattr(full, part).y)
        assert torch.equal(s.mean, full.mean) and torch.equal(s.std, full.std)
        assert len(s.train) == 30 and _rows(s.train.x) <= _rows(full.train.x)
        assert torch.bincount(s.train.y, minlength=4).tolist() == torch.bincount(a.train.y, minlength=4).tolist()


def test_subset_seed_none_is_todays_draw_from_the_split_generator() -> None:
    s = load_splits("synthetic", options=OPTS, split_seed=3, train_subset=30)
    assert torch.equal(s.train.x, load_splits("synthetic", options=OPTS, split_seed=3, train_subset=30,
                                              subset_seed=None).train.x)
    # today's draw: the split generator continues after carving test (official here) and val
    full = load_splits("synthetic", options=OPTS, split_seed=3)
    g = torch.Generator().manual_seed(3)
    raw = load_raw("synthetic", None, OPTS)
    stratified_fraction(raw.train_y, 4, Fraction(0.1), g)
    idx = stratified_subset(full.train.y, 4, 30, g)
    assert torch.equal(s.train.x, full.train.x[idx])


def test_subset_seed_draws_few_shot_and_teacher_ignores_it() -> None:
    a = load_splits("synthetic", options=OPTS, omit_classes=[1], few_shot=2, subset_seed=5)
    b = load_splits("synthetic", options=OPTS, omit_classes=[1], few_shot=2, subset_seed=6)
    assert int((a.train.y == 1).sum()) == 2 and not torch.equal(a.train.x, b.train.x)
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.test.x, b.test.x)
    assert DataConfig(subset_seed=4, train_subset=3).full().subset_seed is None
