"""``text_table``: your own sentences (or sentence pairs) with a label, in CSV, TSV, Parquet or JSON Lines files.

Options (paths relative to ``data.root``, or absolute):

- ``train``: a file, or a folder whose ``.csv`` / ``.tsv`` / ``.parquet`` / ``.jsonl`` / ``.ndjson`` files (each
  optionally ``.gz``-compressed, except Parquet) are read in name order. Unset: ``data.root`` itself.
- ``val``: an optional file or folder with the same columns; ``test``: likewise, the test split.
- ``split_column``: a column whose values (``train``, ``val``, ``test``) place each row of the ``train`` files (by
  default a column named ``split``, when there is one). Splits not given are carved from train, seeded and
  stratified by class (regression: at random), as for every source.
- ``text_column``: the text column (default ``text``).
- ``text_pair_column``: an optional second text column (sentence pairs, tokenised as pairs).
- ``label_column``: the label column (default ``label``).
- ``task``: ``classification`` (string labels are numbered in sorted order, integer labels are class ids; the
  names are kept so predictions come out as your labels), ``binary`` (two classes, F1 / MCC; the second label in
  sorted order is the positive class) or ``regression`` (real-valued targets, float32).
- ``tokenizer``: default ``minilm-l6`` (bundled and offline), or any Hugging Face folder or cached Hub name.
- ``teacher_tokenizer``: a teacher's own tokenizer (its ids under the prefix ``teacher.``).
- ``max_length``: the longest tokenisation kept, in tokens (default 128).
- ``cache_dir``: the tokenisation cache folder (:func:`teachkit.data.text.tokenize_texts`).

The format comes from the file name's suffix. CSV and TSV files are UTF-8 with a header row and standard
quoting (a quoted cell may hold the delimiter or a line break; lines end at ``\n``, a lone ``\r`` is a space, as
pandas writes it unquoted inside a cell); a JSON Lines file holds one object per line
(blank lines skipped). Every message about a cell names the file, the line (Parquet: the row) and the column:
an empty text, a missing column or key, a line that is not JSON or not UTF-8, a label that does not fit the task.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, REGRESSION, RawDataset, require
from teachkit.data.text import text_option, tokenize_texts
from teachkit.data.userdata import SPLITS, check_task, class_targets, resolve
from teachkit.errors import ConfigError, DataError

NAME = "text_table"
#: file suffixes (after an optional ``.gz``) and their formats
FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: a carriage return not followed by a line feed: a space inside a cell, never a line break
_LONE_CR = re.compile(r"\r(?!\n)")
#: bump when reading changes, so that older tokenisation cache entries are not reused
READER_VERSION = 1


@dataclass
class TextRows:
    """Rows read from files: the wanted ``columns`` (name -> values, ``None`` for a missing cell) and each row's
    ``origin`` (file, line or row number), for messages."""

    columns: dict[str, list[Any]]
    origin: list[tuple[str, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.origin)

    def where(self, i: int, column: str) -> str:
        """``'file' line N column 'c'`` of row ``i`` (``row N`` for Parquet)."""
        path, number = self.origin[i]
        unit = "row" if path.endswith(".parquet") else "line"
        return f"{path!r} {unit} {number:,} column {column!r}"

    def extend(self, other: TextRows) -> None:
        for name, values in other.columns.items():
            self.columns.setdefault(name, []).extend(values)
        self.origin.extend(other.origin)

    def take(self, rows: Sequence[int]) -> TextRows:
        return TextRows({k: [v[i] for i in rows] for k, v in self.columns.items()}, [self.origin[i] for i in rows])


# -- reading files -----------------------------------------------------------------------------------------------
def file_format(path: Path) -> str | None:
    """``csv``, ``tsv``, ``parquet`` or ``jsonl`` from the suffix (``.gz`` looked through); None otherwise."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
        if suffixes and suffixes[-1] == ".parquet":
            return None
    return FORMATS.get(suffixes[-1]) if suffixes else None


def table_files(path: Path) -> list[Path]:
    """``path`` itself, or the readable files of the folder ``path`` in name order; DataError when none."""
    allowed = ", ".join(FORMATS)
    if path.is_file():
        if file_format(path) is None:
            raise DataError(f"dataset {NAME!r}: {str(path)!r} is not a table file this source reads; name it with one "
                            f"of the suffixes {allowed} (.gz allowed except for Parquet)")
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and file_format(p) is not None)
    if not files:
        raise DataError(f"dataset {NAME!r}: folder {str(path)!r} holds no {allowed} file")
    return files


def _text_of(path: Path) -> str:
    """The UTF-8 text of a (``.gz``) file, BOM dropped; a byte that is not UTF-8 is a DataError naming the line."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix.lower() == ".gz" else path.read_bytes()
    except (OSError, EOFError) as e:
        raise DataError(f"dataset {NAME!r}: cannot read {str(path)!r} ({e}; a truncated .gz file?)") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"dataset {NAME!r}: {str(path)!r} line {line:,} is not UTF-8 text (byte "
                        f"0x{data[e.start]:02x}); save the file as UTF-8") from None


def _missing(path: Path, column: str, present: Sequence[str]) -> DataError:
    return DataError(f"dataset {NAME!r}: {str(path)!r} has no column {column!r} (columns: "
                     f"{', '.join(map(str, present)) or 'none'}); set the option naming it")


def read_delimited(path: Path, delimiter: str, wanted: Sequence[str], optional: Sequence[str] = ()) -> TextRows:
    """The ``wanted`` (and present ``optional``) columns of a CSV / TSV file with a header row."""
    text = _LONE_CR.sub(" ", _text_of(path))  # pandas writes a lone \r inside a cell unquoted
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"dataset {NAME!r}: {str(path)!r} is empty (no header row)")
        for c in wanted:
            if c not in header:
                raise _missing(path, c, header)
        index = {c: header.index(c) for c in [*wanted, *(c for c in optional if c in header)]}
        out = TextRows({c: [] for c in index})
        last = reader.line_num
        for row in reader:
            start, last = last + 1, reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"dataset {NAME!r}: {str(path)!r} line {start:,} has {len(row)} fields, the header "
                                f"{len(header)} (delimiter {delimiter!r}; quote cells that hold it)")
            for c, i in index.items():
                out.columns[c].append(row[i])
            out.origin.append((str(path), start))
    except csv.Error as e:
        raise DataError(f"dataset {NAME!r}: {str(path)!r} line {reader.line_num:,} cannot be read: {e}") from None
    return out


def read_jsonl(path: Path, wanted: Sequence[str], optional: Sequence[str] = ()) -> TextRows:
    """The ``wanted`` (and ``optional``) keys of each object of a JSON Lines file."""
    out = TextRows({c: [] for c in [*wanted, *optional]})
    for number, line in enumerate(_text_of(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"dataset {NAME!r}: {str(path)!r} line {number:,} is not JSON ({e.msg}, character "
                            f"{e.colno})") from None
        if not isinstance(record, dict):
            raise DataError(f"dataset {NAME!r}: {str(path)!r} line {number:,} is a JSON {type(record).__name__}, "
                            "not an object with named fields")
        for c in wanted:
            if c not in record:
                raise DataError(f"dataset {NAME!r}: {str(path)!r} line {number:,} has no key {c!r} (keys: "
                                f"{', '.join(map(str, record)) or 'none'})")
        for c in out.columns:
            out.columns[c].append(record.get(c))
        out.origin.append((str(path), number))
    if optional and all(v is None for c in optional for v in out.columns[c]):
        for c in optional:
            del out.columns[c]
    return out


def read_parquet(path: Path, wanted: Sequence[str], optional: Sequence[str] = ()) -> TextRows:
    """The ``wanted`` (and present ``optional``) columns of a Parquet file (pyarrow)."""
    pq = require("pyarrow.parquet", NAME, "pyarrow")
    try:
        names = pq.read_schema(path).names
        for c in wanted:
            if c not in names:
                raise _missing(path, c, names)
        columns = [*wanted, *(c for c in optional if c in names)]
        table = pq.read_table(path, columns=columns)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is one line
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DataError(f"dataset {NAME!r}: cannot read {str(path)!r} ({reason})") from None
    return TextRows({c: table.column(c).to_pylist() for c in columns},
                    [(str(path), i + 1) for i in range(table.num_rows)])


def read_rows(path: Path, wanted: Sequence[str], optional: Sequence[str] = ()) -> TextRows:
    """The ``wanted`` columns (DataError when one is missing) and the present ``optional`` ones of every table
    file of ``path`` (a file or folder), concatenated in name order."""
    out = TextRows({})
    for file in table_files(path):
        kind = file_format(file)
        if kind == "parquet":
            rows = read_parquet(file, wanted, optional)
        elif kind == "jsonl":
            rows = read_jsonl(file, wanted, optional)
        else:
            rows = read_delimited(file, "\t" if kind == "tsv" else ",", wanted, optional)
        if out.origin and set(rows.columns) != set(out.columns):
            raise DataError(f"dataset {NAME!r}: {str(file)!r} has the columns {sorted(rows.columns)}, the files "
                            f"before it {sorted(out.columns)}")
        out.extend(rows)
    if not out.origin:
        raise DataError(f"dataset {NAME!r}: {str(path)!r} has no rows")
    return out


def texts_of(rows: TextRows, column: str) -> list[str]:
    """The text cells of ``column``; an empty or missing cell (or a non-text value) is a DataError naming it."""
    out = []
    for i, v in enumerate(rows.columns[column]):
        if isinstance(v, bool) or not isinstance(v, str | int | float) or \
                (isinstance(v, float) and not math.isfinite(v)):
            what = "no text" if v is None else f"{type(v).__name__} {str(v)[:40]!r}, not text"
            raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds {what}")
        s = str(v)
        if not s.strip():
            raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds an empty text; remove the row or "
                            "fill the cell")
        out.append(s)
    return out


# -- labels ------------------------------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (or a string spelling one); else None."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def label_array(rows: TextRows, column: str, task: str) -> np.ndarray:
    """The labels of every row: float64 targets (regression), int64 class ids when every label is a whole
    number, else their text (numbered in sorted order later). A DataError names the first cell that does not fit."""
    values = rows.columns[column]
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds no label")
        if not isinstance(v, str | int | float):
            raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds a {type(v).__name__}, not a label")
    numbers = [_number(v) for v in values]
    if task == REGRESSION:
        for i, f in enumerate(numbers):
            if f is None or not math.isfinite(f):
                raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds {values[i]!r}, not a finite "
                                f"number (task {REGRESSION!r} needs real-valued targets)")
        return np.asarray(numbers, dtype=np.float64)
    if all(f is not None and math.isfinite(f) for f in numbers):
        for i, f in enumerate(numbers):
            if f != round(f) or abs(f) >= 2.0**53:  # type: ignore[arg-type]
                raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds {values[i]!r}, not a class label "
                                f"(an integer or a text); set task: {REGRESSION} for real-valued targets")
        return np.asarray(numbers, dtype=np.int64)
    return np.asarray([v.strip() if isinstance(v, str) else str(v) for v in values], dtype=object)


def targets(labels: dict[str, np.ndarray], task: str) -> tuple[dict[str, torch.Tensor], int, list[str] | None]:
    """Per split targets, the class count (regression: output width 1) and the class names."""
    if task == REGRESSION:
        return {part: torch.from_numpy(y.astype(np.float32)) for part, y in labels.items()}, 1, None
    ids, k, names = class_targets(NAME, labels)
    if task == "binary" and k != 2:
        raise DataError(f"dataset {NAME!r} has task 'binary' but {k} classes ({', '.join(names[:6])}); binary needs "
                        "exactly two labels (or use task: classification)")
    return ids, k, names


# -- splits ------------------------------------------------------------------------------------------------------
def locate(root: str | None, value: Any, key: str) -> Path:
    """The file or folder of option ``key`` (relative to ``data.root``); ``data.root`` itself when unset."""
    if value is None:
        if root is None:
            raise ConfigError(f"dataset {NAME!r} needs option 'train' (a .csv/.tsv/.parquet/.jsonl file or a folder of "
                              "them, relative to data.root) or data.root naming it")
        path = Path(root)
        if not path.exists():
            raise DataError(f"dataset {NAME!r}: data.root {root!r} not found")
        return path
    return resolve(root, value, NAME, key, kind="file or folder")


def split_parts(rows: TextRows, column: str) -> list[str]:
    """The split (train / val / test) each row's ``column`` names; a DataError naming the first other value."""
    parts = []
    for i, v in enumerate(rows.columns[column]):
        part = str(v).strip().lower() if v is not None else ""
        if part not in SPLITS:
            raise DataError(f"dataset {NAME!r}: {rows.where(i, column)} holds {v!r}; allowed values: "
                            f"{', '.join(SPLITS)}")
        parts.append(part)
    return parts


def read_splits(root: str | None, files: dict[str, Any], wanted: list[str],
                split_column: str | None) -> tuple[TextRows, list[str]]:
    """Every row of the train (val, test) files and the split each belongs to (module docstring)."""
    default = "split" if split_column is None and "split" not in wanted else None
    train = read_rows(locate(root, files["train"], "train"), wanted, [split_column or default] if
                      (split_column or default) else [])
    column = split_column if split_column is not None else (default if default in train.columns else None)
    if split_column is not None and split_column not in train.columns:
        raise DataError(f"dataset {NAME!r}: the train rows have no split column {split_column!r}")
    parts = split_parts(train, column) if column is not None else ["train"] * len(train)
    if column is not None:
        del train.columns[column]
        if "train" not in parts:
            raise DataError(f"dataset {NAME!r}: column {column!r} marks no row as 'train'")
    for part in ("val", "test"):
        if files[part] is None:
            continue
        if part in parts:
            raise DataError(f"dataset {NAME!r}: {part} rows come both from column {column!r} and from option "
                            f"{part!r}; use one")
        rows = read_rows(locate(root, files[part], part), wanted)
        train.extend(TextRows({c: rows.columns[c] for c in wanted}, rows.origin))
        parts.extend([part] * len(rows))
    return train, parts


def _string(key: str, value: Any, optional: bool = False) -> str | None:
    if optional and value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"dataset {NAME!r} option {key!r} must be a non-empty string{' or null' if optional else ''}"
                          f", got {value!r}")
    return value


def check_columns(text_column: Any, text_pair_column: Any, label_column: Any, split_column: Any) -> list[str]:
    """The columns every file must have (text, pair, label), each option checked; ConfigError otherwise."""
    named = {"text_column": _string("text_column", text_column),
             "text_pair_column": _string("text_pair_column", text_pair_column, optional=True),
             "label_column": _string("label_column", label_column),
             "split_column": _string("split_column", split_column, optional=True)}
    seen: dict[str, str] = {}
    for key, value in named.items():
        if value is not None and value in seen:
            raise ConfigError(f"dataset {NAME!r} options {seen[value]!r} and {key!r} both name column {value!r}")
        if value is not None:
            seen[value] = key
    return [c for c in (named["text_column"], named["text_pair_column"], named["label_column"]) if c is not None]


@DATASETS.register(NAME, "your sentences or sentence pairs with a label: CSV, TSV, Parquet or JSON Lines files "
                         "(options train, val, test, split_column, text_column, text_pair_column, label_column, task, "
                         "tokenizer, teacher_tokenizer, max_length, cache_dir); tokenised and cached",
                   paths=("train", "val", "test"))
def text_table(root: str | None = None, train: str | None = None, val: str | None = None, test: str | None = None,
               split_column: str | None = None, text_column: str = "text", text_pair_column: str | None = None,
               label_column: str = "label", task: str = "classification", tokenizer: str = "minilm-l6",
               teacher_tokenizer: str | None = None, max_length: int = 128,
               cache_dir: str | None = None) -> RawDataset:
    """Your own text classification or regression data (see the module docstring for the options)."""
    task = check_task(NAME, task)
    wanted = check_columns(text_column, text_pair_column, label_column, split_column)
    max_length = text_option(NAME, "max_length", max_length, 8)
    _string("tokenizer", tokenizer)
    _string("teacher_tokenizer", teacher_tokenizer, optional=True)
    _string("cache_dir", cache_dir, optional=True)
    rows, parts = read_splits(root, {"train": train, "val": val, "test": test}, wanted, split_column)
    first = texts_of(rows, text_column)
    second = texts_of(rows, text_pair_column) if text_pair_column is not None else None
    labels = label_array(rows, label_column, task)
    order = {part: [i for i, p in enumerate(parts) if p == part] for part in SPLITS}
    order = {part: idx for part, idx in order.items() if idx}
    ys, k, names = targets({part: labels[idx] for part, idx in order.items()}, task)
    flat = [i for part in SPLITS for i in order.get(part, [])]  # rows in split order: one tokenisation
    texts = [first[i] for i in flat]
    pairs = None if second is None else [second[i] for i in flat]
    digest = hashlib.sha256(json.dumps([texts, pairs], ensure_ascii=False).encode("utf-8")).hexdigest()
    x = tokenize_texts(texts, pairs, tokenizer=tokenizer, max_length=max_length, cache_dir=cache_dir,
                       teacher_tokenizer=teacher_tokenizer,
                       key_parts={"source": NAME, "reader": READER_VERSION, "texts": digest})
    full = int((x["attention_mask"].sum(dim=1) >= max_length).sum()) if len(x["attention_mask"]) else 0
    x.info.notes.update({"rows": {part: len(idx) for part, idx in order.items()}, "rows_at_max_length": full,
                         "columns": wanted, "files": sorted({path for path, _ in rows.origin})})
    xs, start = {}, 0
    for part in SPLITS:
        n = len(order.get(part, []))
        if n:
            xs[part] = x.rows(slice(start, start + n))
        start += n
    return RawDataset(xs["train"], ys["train"], xs.get("test"), ys.get("test"), num_classes=k,
                      default_augment="none", task=task, name=NAME, val_x=xs.get("val"), val_y=ys.get("val"),
                      class_names=None if names is None else tuple(names))

