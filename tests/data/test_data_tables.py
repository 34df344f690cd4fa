"""The ``csv`` and ``parquet`` sources: label / feature columns, split column or separate files, regression."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from teachkit.data import load_raw, load_splits


def table(n: int = 12) -> pd.DataFrame:
    species = [("setosa", "virginica", "versicolor")[i % 3] for i in range(n)]
    return pd.DataFrame({"a": [float(i) for i in range(n)], "b": [i % 2 == 0 for i in range(n)],
                         "note": [f"row{i}" for i in range(n)], "species": species,
                         "price": [0.5 * i for i in range(n)]})


def test_csv_default_features_and_string_labels(tmp_path: Path) -> None:
    table().to_csv(tmp_path / "t.csv", index=False)
    raw = load_raw("csv", str(tmp_path / "t.csv"), {"label": "species"})
    # features: every other numeric column (a, b, price); "note" is text and left out
    assert raw.train_x.shape == (12, 3) and raw.train_x[1].tolist() == [1.0, 0.0, 0.5]
    assert raw.num_classes == 3 and raw.train_y[:3].tolist() == [0, 2, 1]  # setosa < versicolor < virginica
    assert raw.test_x is None and raw.val_x is None and raw.task == "classification"


def test_csv_split_column_and_features_option(tmp_path: Path) -> None:
    df = table()
    df["fold"] = ["train"] * 6 + ["val"] * 3 + ["test"] * 3
    df.to_csv(tmp_path / "t.csv", index=False)
    opts = {"train": "t.csv", "label": "species", "features": ["price", "a"], "split_column": "fold"}
    s = load_splits("csv", root=str(tmp_path), options=opts)
    assert (len(s.train), len(s.val), len(s.test)) == (6, 3, 3)
    assert s.input_shape == (2,) and s.mean is not None and s.mean.tolist() == [1.25, 2.5]  # price, a of rows 0..5


def test_default_split_column_named_split(tmp_path: Path) -> None:
    df = table()
    df["split"] = [" Train", "train", "val", "train", "test", "train"] * 2
    df.to_csv(tmp_path / "t.csv", index=False)
    raw = load_raw("csv", str(tmp_path / "t.csv"), {"label": "species"})
    assert (len(raw.train_y), len(raw.val_y), len(raw.test_y)) == (8, 2, 2)


def test_csv_separate_files_and_carved_val(tmp_path: Path) -> None:
    table(30).to_csv(tmp_path / "train.csv", index=False)
    table(6).to_csv(tmp_path / "test.csv", index=False)
    opts = {"train": "train.csv", "test": "test.csv", "label": "species", "features": ["a"]}
    s = load_splits("csv", root=str(tmp_path), options=opts, val_fraction=0.2)
    assert len(s.test) == 6 and len(s.val) == 6 and len(s.train) == 24
    assert torch.bincount(s.val.y).tolist() == [2, 2, 2]


def test_parquet_regression_with_two_targets(tmp_path: Path) -> None:
    df = table(20)
    df["y2"] = [float(-i) for i in range(20)]
    df.to_parquet(tmp_path / "t.parquet")
    opts = {"train": "t.parquet", "label": ["price", "y2"], "features": ["a", "b"], "task": "regression"}
    raw = load_raw("parquet", str(tmp_path), opts)
    assert raw.task == "regression" and raw.num_classes == 2 and raw.train_y.dtype == torch.float32
    assert raw.train_y[3].tolist() == [1.5, -3.0]
    s = load_splits("parquet", root=str(tmp_path), options=opts)
    assert (len(s.test), len(s.val), len(s.train)) == (4, 2, 14)


@pytest.mark.parametrize("labels, ids, k", [([3, 1, 3, 0], [3, 1, 3, 0], 4), ([-1, 1, 1, -1], [0, 1, 1, 0], 2),
                                            ([1.0, 2.0, 1.0, 2.0], [1, 2, 1, 2], 3), ([True, False, True, True],
                                                                                      [1, 0, 1, 1], 2)])
def test_integer_labels_are_ids_others_are_numbered(tmp_path: Path, labels: list, ids: list[int], k: int) -> None:
    pd.DataFrame({"f": [0.0, 1.0, 2.0, 3.0], "label": labels}).to_csv(tmp_path / "t.csv", index=False)
    raw = load_raw("csv", str(tmp_path / "t.csv"))
    assert raw.train_y.tolist() == ids and raw.num_classes == k


def test_semicolon_delimiter(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("f;g;label\n1;2;a\n3;4;b\n")
    raw = load_raw("csv", str(tmp_path / "t.csv"), {"delimiter": ";"})
    assert raw.train_x.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_root_file_with_a_test_file_beside_it(tmp_path: Path) -> None:
    table(9).to_csv(tmp_path / "train.csv", index=False)
    table(3).to_csv(tmp_path / "test.csv", index=False)
    raw = load_raw("csv", str(tmp_path / "train.csv"), {"test": "test.csv", "label": "species"})
    assert len(raw.train_y) == 9 and raw.test_y is not None and len(raw.test_y) == 3
