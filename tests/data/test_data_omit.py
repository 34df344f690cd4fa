import pytest
import torch

from teachkit.data import load_splits
from teachkit.errors import ConfigError

OPTS = {"shape": [1, 4, 4], "num_classes": 5, "n_train": 500, "n_test": 100}


def test_zero_shot_removes_classes_from_train_only():
    full = load_splits("synthetic", options=OPTS)
    s = load_splits("synthetic", options=OPTS, omit_classes=[1, 3])
    assert s.omitted == (1, 3)
    assert not torch.isin(s.train.y, torch.tensor([1, 3])).any()
    assert torch.equal(s.val.y, full.val.y) and torch.equal(s.test.y, full.test.y)
    kept = ~torch.isin(full.train.y, torch.tensor([1, 3]))
    assert len(s.train) == int(kept.sum())


def test_few_shot_keeps_k_per_omitted_class_and_is_seeded():
    a = load_splits("synthetic", options=OPTS, omit_classes=[2], few_shot=3)
    b = load_splits("synthetic", options=OPTS, omit_classes=[2], few_shot=3)
    assert int((a.train.y == 2).sum()) == 3
    assert torch.equal(a.train.x, b.train.x)


@pytest.mark.parametrize("kwargs, match", [
    ({"omit_classes": [7]}, r"data.omit_classes contains 7 but dataset 'synthetic' has classes 0..4"),
    ({"omit_classes": [-1]}, "contains -1"),
    ({"few_shot": 2}, "data.few_shot=2 needs data.omit_classes"),
    ({"omit_classes": [0], "few_shot": 10_000}, "data.few_shot=10000 but class 0 has only"),
    ({"omit_classes": [0, 1, 2, 3, 4]}, "leaves no training examples"),
])
def test_bad_omit_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        load_splits("synthetic", options=OPTS, **kwargs)
