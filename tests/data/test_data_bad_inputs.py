"""Bad user data through the CLI: every row is one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import gzip
import io
import lzma
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from teachkit.cli import main
from tests.conftest import tiny_config

CSV = "f,g,label\n" + "".join(f"{i},{i % 3},{'ab'[i % 2]}\n" for i in range(10))
REG = "f,y\n" + "".join(f"{i},{i * 0.5}\n" for i in range(10))
X, Y = np.zeros((5, 2)), np.arange(5) % 2
BIG_LABEL = "f,label\n" + "".join(f"{i},{i % 2}\n" for i in range(10)) + "3,1000000000\n"  # row 11: 1e9
FAR = np.array([[-3e38], [-3e38], [-2e38], [-2e38], [-3e38]], dtype=np.float32)  # train mean about -2.6e38


def truncated(compress: Any) -> bytes:
    """The first half of the CSV table, compressed with ``compress``: a download cut short."""
    data = compress((CSV * 50).encode())
    return data[: len(data) // 2]


def parquet_bytes(labels: list[int]) -> bytes:
    """A Parquet table (features f, label) in memory."""
    pd = pytest.importorskip("pandas")
    buf = io.BytesIO()
    pd.DataFrame({"f": np.arange(len(labels), dtype=float), "label": labels}).to_parquet(buf)
    return buf.getvalue()


def source(name: str, **options: Any) -> dict[str, Any]:
    """A data section for source ``name`` with ``options`` (root: the test's data folder)."""
    return {"name": name, "options": options}


def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write(root: Path, files: dict[str, Any]) -> None:
    """Text, bytes, a dict of arrays (-> .npz), a tensor dict (-> .pt), an array (-> .npy), or None (a folder)."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir(exist_ok=True)
        elif isinstance(content, str):
            path.write_text(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif name.endswith(".pt"):
            torch.save(content, path)
        elif isinstance(content, dict):
            np.savez(path, **content)
        else:
            np.save(path, content)


ROWS = [
    # (files under root, data section (root = tmp folder unless given), extra overrides, expected fragment)
    ({}, {"name": "csv", "options": {"train": "nope.csv"}}, [], "file 'nope.csv' of option 'train' not found"),
    ({"t.csv": "f,g\n1,2\n"}, {"name": "csv", "options": {"train": "t.csv"}}, [], "has no label column 'label'"),
    ({"t.csv": "color,label\nred,1\nblue,0\n"}, {"name": "csv", "options": {"train": "t.csv", "features": ["color"]}},
     [], "feature column 'color' is not numeric"),
    ({"t.csv": "f,label\n"}, {"name": "csv", "options": {"train": "t.csv"}}, [], "has no rows"),
    ({"t.csv": ""}, {"name": "csv", "options": {"train": "t.csv"}}, [], "is empty (no header row)"),
    ({"u.csv": "f,label,split\n1,a,train\n2,b,valid\n"},
     {"name": "csv", "options": {"train": "u.csv"}}, [], "holds 'valid' (row 2); allowed values: train, val, test"),
    ({"t.csv": CSV}, {"name": "csv", "options": {"train": "t.csv", "split_column": "fold"}}, [],
     "has no split column 'fold'"),
    ({"t.csv": "f,label\n1,0.5\n2,1\n3,0\n"}, {"name": "csv", "options": {"train": "t.csv"}}, [],
     "non-class value 0.5"),
    ({"t.csv": CSV}, {"name": "csv", "options": {"train": "t.csv", "task": "ranking"}}, [],
     "option 'task' must be one of classification, binary, regression, got 'ranking'"),
    ({"t.csv": "f,label\n1,a\n,b\n3,a\n"}, {"name": "csv", "options": {"train": "t.csv"}}, [],
     "feature column 'f' has 1 missing values"),
    ({"t.csv": CSV}, {"name": "csv", "options": {"train": "t.csv", "lable": "g"}}, [],
     "unknown option 'lable' for dataset 'csv' (did you mean 'label'?)"),
    ({"t.csv": CSV, "test.csv": "f,g,label\n1,2,c\n"}, source("csv", train="t.csv", test="test.csv"), [],
     "class 'c' appears in test but not in train"),
    ({}, {"name": "csv"}, [], "needs option 'train'"),
    ({"t.parquet": b"PAR1 not really"}, {"name": "parquet", "options": {"train": "t.parquet"}}, [], "cannot read"),
    ({"d.npz": {"x": X}}, {"name": "arrays", "options": {"train": "d.npz"}}, [], "has no array 'y'"),
    ({"x.npy": X}, {"name": "arrays", "options": {"train": "x.npy"}}, [], "a .npy file holds one array"),
    ({"d.npz": {"x": np.array([{"a": 1}] * 5, dtype=object), "y": Y}}, source("arrays", train="d.npz"), [],
     "cannot read"),
    ({"d.pt": [1, 2]}, source("arrays", train="d.pt"), [], "holds a list, expected a dict of tensors"),
    ({"d.pt": b"garbage"}, {"name": "arrays", "options": {"train": "d.pt"}}, [], "as a dict of tensors"),
    ({"d.npz": {"x": X, "y": Y[:4]}}, source("arrays", train="d.npz"), [], "has 5 inputs but 4 labels"),
    ({"d.npz": {"x": X, "y": np.array(list("abcde"))}}, source("arrays", train="d.npz", task="regression"), [],
     "targets must be numeric for task 'regression'"),
    ({"empty": None}, {"name": "image_folder", "root": "empty"}, [], "has no class sub-folders"),
    ({"cat/notes.txt": "x"}, {"name": "image_folder"}, [], "holds no PNG or JPEG image"),
    ({"cat/0.png": b"\x89PNG broken"}, {"name": "image_folder"}, [], "cannot decode image"),
    ({"cat/0.png": png()}, {"name": "image_folder", "options": {"channels": 2}}, [],
     "option 'channels' must be 1 (grayscale) or 3 (RGB), got 2"),
    ({"train/cat/0.png": png(), "val/dog/0.png": png()}, {"name": "image_folder"}, [],
     "class 'dog' is in val/ but not in train/"),
    ({}, {"name": "image_folder", "root": "nowhere"}, [], "is not a folder"),
    ({"r.csv": REG}, {"name": "csv", "options": {"train": "r.csv", "label": "y", "task": "regression"}}, [],
     "train.loss=ce does not fit dataset 'csv' (task regression): real-valued targets need train.loss=l2"),
    ({"t.csv": CSV}, {"name": "csv", "options": {"train": "t.csv"}}, ["train.loss=l2"],
     "l2 is for real-valued targets (task regression)"),
    ({"r.csv": REG}, {"name": "csv", "options": {"train": "r.csv", "label": "y", "task": "regression"},
                      "omit_classes": [0]}, ["train.loss=l2"], "data.omit_classes needs class labels"),
    ({"r.csv": REG}, {"name": "csv", "options": {"train": "r.csv", "label": ["y", "f"]}}, [],
     "several target columns need task: regression"),
    # -- labels far outside the class range: refused before anything is allocated per class
    ({"t.csv": BIG_LABEL}, source("csv", train="t.csv"), [],
     "train label 1000000000 (row 11) would make 1,000,000,001 classes (ids 0..largest), more than the 11 training "
     "rows; labels must be class ids 0..C-1: relabel them"),
    ({"d.npz": {"x": X, "y": np.array([0, 1, 0, 1, 10**9])}}, source("arrays", train="d.npz"), [],
     "train label 1000000000 (row 5) would make 1,000,000,001 classes"),
    ({"t.parquet": parquet_bytes([0, 1, 0, 1, 2**40])}, source("parquet", train="t.parquet"), [],
     "train label 1099511627776 (row 5) would make 1,099,511,627,777 classes"),
    ({"t.csv": BIG_LABEL.replace("1000000000", "1"), "e.csv": "f,label\n1,7\n"}, source("csv", train="t.csv",
                                                                                         test="e.csv"), [],
     "class '7' appears in test but not in train"),
    ({"t.csv": "f,label\n1,0\n2,1e300\n3,1\n"}, source("csv", train="t.csv"), [],
     "train labels hold the non-class value 1e+300 (row 2); class labels are integers 0..C-1 or strings"),
    ({"t.csv": "f,label\n1,0\n2,1\n3,0.5\n"}, source("csv", train="t.csv", task="binary"), [],
     "non-class value 0.5 (row 3)"),
    # -- features near or beyond float32's limit, infinite features
    ({"t.csv": "f,label\n1,a\n1e39,b\n2,a\n"}, source("csv", train="t.csv"), [],
     "feature column 'f' holds 1e+39 (row 2), beyond float32's range (about 3.4e38); rescale the column"),
    ({"t.csv": "f,label\n1,a\ninf,b\n2,a\n"}, source("csv", train="t.csv"), [],
     "feature column 'f' holds inf (row 2); features must be finite numbers"),
    ({"d.npz": {"x": np.array([[1.0], [np.nan], [2.0]]), "y": np.arange(3)}}, source("arrays", train="d.npz"), [],
     "train inputs contain NaN or infinite values: row 2, position [0] holds nan"),
    ({"d.npz": {"x": FAR, "y": np.arange(5) % 2}, "e.npz": {"x": np.array([[3e38]]), "y": np.array([1])}},
     source("arrays", train="d.npz", test="e.npz"), [],
     "normalising the test inputs overflows float32 (row 1, channel 0)"),
    # -- odd array and file shapes
    ({"d.npz": {"x": np.array(3.0), "y": Y}}, source("arrays", train="d.npz"), [],
     "train inputs must be an array with one row per sample (N, ...), got a 0-d array (one value: 3.0)"),
    ({"d.npz": {"x": X, "y": np.array(1)}}, source("arrays", train="d.npz"), [],
     "train labels must be an array with one row per sample (N, ...), got a 0-d array (one value: 1)"),
    ({"d.npz": {"x": np.zeros((5, 0)), "y": Y}}, source("arrays", train="d.npz"), [],
     "train inputs have shape (5, 0): no feature per sample"),
    ({"t.csv.gz": truncated(gzip.compress)}, source("csv", train="t.csv.gz"), [],
     "t.csv.gz': Compressed file ended before the end-of-stream marker was reached (a truncated or corrupt "
     "compressed file?)"),
    ({"t.csv.xz": truncated(lzma.compress)}, source("csv", train="t.csv.xz"), [], "t.csv.xz': "),
    ({"cat/0.png": png()}, {"name": "image_folder", "options": {"size": 100000}}, [],
     "option 'size' must be 1..4096 (pixels per side), got 100000"),
]


@pytest.mark.parametrize("files, data, overrides, fragment", ROWS, ids=[r[3][:40] for r in ROWS])
def test_bad_user_data_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          files: dict[str, Any], data: dict[str, Any], overrides: list[str],
                                          fragment: str) -> None:
    root = tmp_path / "data"
    root.mkdir()
    write(root, files)
    section = {"root": str(root / data["root"]) if "root" in data else str(root), "options": {},
               **{k: v for k, v in data.items() if k != "root"}}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, data=section, train={"epochs": 1, "progress": False})))
    code = main(["train", str(cfg), *overrides, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "Traceback" not in err
    assert err.startswith("teachkit: error: ") and err.strip().count("\n") == 0, err
