"""``csv`` and ``parquet``: your own tables, one row per sample (read with pandas; Parquet needs pyarrow).

Options (paths are relative to ``data.root``, or absolute):

- ``train``: the table file (``.csv``, ``.csv.gz``, ``.parquet``). Unset: ``data.root`` itself is the file.
- ``val``, ``test``: optional separate tables with the same columns.
- ``split_column``: a column whose values (``train``, ``val``, ``test``) say which split each row of the
  ``train`` table belongs to; by default a column named ``split``, when there is one.
- ``label`` (default ``label``): the target column; a list of columns for several regression targets.
- ``features``: the input columns, in order; by default every other numeric column (booleans count).
- ``task``: ``classification`` (default; integer labels are class ids, other labels are numbered in sorted
  order), ``binary`` (two classes, F1 / MCC) or ``regression`` (real-valued targets, float32).
- ``delimiter`` (csv only, default ``,``).

Splits not given by a file or the split column are carved from train (seeded; stratified for classes).
Features are standardised on the train split. Examples::

    data: {name: csv, root: ~/data/iris.csv, options: {label: species}}
    data: {name: csv, root: ~/data/houses, options: {train: train.csv, test: test.csv, label: price, task: regression}}
    data: {name: parquet, root: ~/data, options: {train: all.parquet, split_column: fold}}
"""

from __future__ import annotations

import lzma
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from teachkit.data.raw import DATASETS, REGRESSION, RawDataset, require
from teachkit.data.userdata import SPLITS, assemble, check_task, default_file, resolve, str_list_option, str_option
from teachkit.errors import ConfigError, DataError

Reader = Callable[[Path], Any]  # path -> pandas.DataFrame
#: what reading a truncated or corrupt compressed table raises (``.csv.gz``, ``.bz2``, ``.xz``, ``.zip``)
COMPRESSION_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile)


def _columns(df: Any, limit: int = 12) -> str:
    names = [str(c) for c in df.columns]
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more if names else "none"


def split_rows(dataset: str, path: Path, df: Any, column: str) -> dict[str, Any]:
    """The rows of ``df`` grouped by the values of ``column`` (train / val / test), without that column."""
    values = df[column].map(lambda v: str(v).strip().lower())
    unknown = sorted(set(values) - set(SPLITS))
    if unknown:
        row = int(np.flatnonzero(values.to_numpy() == unknown[0])[0])
        raise DataError(f"dataset {dataset!r}: {str(path)!r} column {column!r} holds {df[column].iloc[row]!r} "
                        f"(row {row + 1}); allowed values: {', '.join(SPLITS)}")
    rest = df.drop(columns=[column])
    return {part: rest[(values == part).to_numpy()] for part in SPLITS if (values == part).any()}


def feature_names(dataset: str, path: Path, df: Any, labels: list[str], features: list[str] | None,
                  pd: Any) -> list[str]:
    """The feature columns: those named (each must exist and be numeric), or every numeric non-label column."""
    if features is None:
        chosen = [c for c in df.columns if c not in labels and pd.api.types.is_numeric_dtype(df[c])]
        if not chosen:
            raise DataError(f"dataset {dataset!r}: {str(path)!r} has no numeric feature column besides the label "
                            f"(columns: {_columns(df)}); non-numeric columns need encoding as numbers")
        return chosen
    for c in features:
        if c in labels:
            raise ConfigError(f"dataset {dataset!r}: column {c!r} is both a feature and the label")
    return list(features)


def check_finite_columns(dataset: str, where: str, df: Any, features: list[str], x: np.ndarray) -> None:
    """DataError naming the column and row of the first infinite value of ``x`` (float32 features of ``df``):
    an ``inf`` in the file, or a number beyond float32's range (about 3.4e38)."""
    bad = ~np.isfinite(x)
    if not bad.any():
        return
    row, col = (int(i) for i in np.argwhere(bad)[0])
    value = df[features[col]].iloc[row]
    label = df.index[row] + 1 if isinstance(df.index[row], int | np.integer) else row + 1
    why = (f"{float(value):.3g} (row {label}), beyond float32's range (about 3.4e38); rescale the column"
           if np.isfinite(float(value)) else f"{value} (row {label}); features must be finite numbers")
    raise DataError(f"dataset {dataset!r}: {where} feature column {features[col]!r} holds {why}")


def frame_arrays(dataset: str, where: str, df: Any, labels: list[str], features: list[str], task: str,
                 pd: Any) -> tuple[np.ndarray, np.ndarray]:
    """(inputs (N, F) float32, labels) of one table; one-line DataError for each way it can be wrong."""
    if len(df) == 0:
        raise DataError(f"dataset {dataset!r}: {where} has no rows")
    for c in labels:
        if c not in df.columns:
            raise DataError(f"dataset {dataset!r}: {where} has no label column {c!r} (columns: {_columns(df)}); "
                            "set option 'label'")
        if df[c].isna().any():
            raise DataError(f"dataset {dataset!r}: {where} label column {c!r} has {int(df[c].isna().sum())} "
                            "missing values")
    for c in features:
        if c not in df.columns:
            raise DataError(f"dataset {dataset!r}: {where} has no feature column {c!r} (columns: {_columns(df)})")
        col = df[c]
        if not pd.api.types.is_numeric_dtype(col):
            example = col.dropna().iloc[0] if col.notna().any() else None
            raise DataError(f"dataset {dataset!r}: {where} feature column {c!r} is not numeric (dtype {col.dtype}, "
                            f"e.g. {example!r}); encode it as numbers or leave it out of 'features'")
        if col.isna().any():
            raise DataError(f"dataset {dataset!r}: {where} feature column {c!r} has {int(col.isna().sum())} "
                            "missing values")
    with np.errstate(over="ignore"):  # numbers beyond float32's range become inf: named below
        x = df[features].to_numpy(dtype=np.float32)
    check_finite_columns(dataset, where, df, features, x)
    if task == REGRESSION:
        for c in labels:
            if not pd.api.types.is_numeric_dtype(df[c]):
                raise DataError(f"dataset {dataset!r}: {where} label column {c!r} is not numeric (dtype "
                                f"{df[c].dtype}); task {REGRESSION!r} needs numbers")
        with np.errstate(over="ignore"):  # beyond float32's range: refused by regression_targets
            y = df[labels].to_numpy(dtype=np.float32)
        return x, y[:, 0] if len(labels) == 1 else y
    col = df[labels[0]]
    if pd.api.types.is_bool_dtype(col):
        return x, col.to_numpy(dtype=np.int64)
    if pd.api.types.is_numeric_dtype(col):
        return x, col.to_numpy(dtype=np.float64)
    return x, col.astype(str).to_numpy(dtype=object)


def load_table(dataset: str, root: str | None, reader: Reader, what: str, train: Any, val: Any, test: Any,
               label: Any, features: Any, split_column: Any, task: Any) -> RawDataset:
    """A RawDataset from the tables the options name (see the module docstring)."""
    pd = require("pandas", dataset, "pandas")
    task = check_task(dataset, task)
    labels = str_list_option(dataset, "label", label)
    if len(labels) > 1 and task != REGRESSION:
        raise ConfigError(f"dataset {dataset!r} option 'label' names {len(labels)} columns; several target columns "
                          f"need task: {REGRESSION}")
    chosen = None if features is None else str_list_option(dataset, "features", features)
    column = None if split_column is None else str_option(dataset, "split_column", split_column)
    train_path = resolve(root, train, dataset, "train") if train is not None else default_file(root, dataset, what)
    files = {"train": train_path}
    for part, spec in (("val", val), ("test", test)):
        if spec is not None:
            files[part] = resolve(root, spec, dataset, part)
    frames = {part: (path, reader(path)) for part, path in files.items()}

    path, df = frames["train"]
    if len(df) == 0:
        raise DataError(f"dataset {dataset!r}: {str(path)!r} has no rows")
    if column is not None and column not in df.columns:
        raise DataError(f"dataset {dataset!r}: {str(path)!r} has no split column {column!r} "
                        f"(columns: {_columns(df)})")
    column = column if column is not None else ("split" if "split" in df.columns and "split" not in labels else None)
    tables: dict[str, tuple[str, Any]] = {}
    if column is not None:
        for part, rows in split_rows(dataset, path, df, column).items():
            if part in frames and part != "train":
                raise DataError(f"dataset {dataset!r}: {part} rows come both from column {column!r} of "
                                f"{str(path)!r} and from option {part!r}; use one")
            tables[part] = (f"{str(path)!r} ({part} rows)", rows)
        if "train" not in tables:
            raise DataError(f"dataset {dataset!r}: column {column!r} of {str(path)!r} marks no row as 'train'")
    else:
        tables["train"] = (repr(str(path)), df)
    for part in ("val", "test"):
        if part in frames:
            p, other = frames[part]
            tables[part] = (repr(str(p)), other.drop(columns=[column]) if column in other.columns else other)
    names = feature_names(dataset, path, tables["train"][1], labels, chosen, pd)
    parts = {part: frame_arrays(dataset, where, frame, labels, names, task, pd)
             for part, (where, frame) in tables.items()}
    return assemble(dataset, parts, task, feature_names=[str(c) for c in names])


def _reader(dataset: str, read: Callable[[Path], Any], errors: tuple[type[BaseException], ...]) -> Reader:
    """``read`` with its failures turned into one-line DataErrors naming the file."""

    def reader(path: Path) -> Any:
        try:
            return read(path)
        except errors as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if isinstance(e, COMPRESSION_ERRORS):
                first += " (a truncated or corrupt compressed file?)"
            raise DataError(f"dataset {dataset!r}: cannot read {str(path)!r}: {first}") from None

    return reader


@DATASETS.register("csv", "your CSV table, one row per sample (options: train, val, test, label, features, "
                          "split_column, task, delimiter)", paths=("train", "val", "test"))
def csv(root: str | None = None, train: Any = None, val: Any = None, test: Any = None, label: Any = "label",
        features: Any = None, split_column: Any = None, task: str = "classification",
        delimiter: str = ",") -> RawDataset:
    """Your CSV table(s) with a header row; see the module docstring for the options."""
    pd = require("pandas", "csv", "pandas")
    sep = str_option("csv", "delimiter", delimiter)

    def read(path: Path) -> Any:
        try:
            return pd.read_csv(path, sep=sep)
        except pd.errors.EmptyDataError:
            raise DataError(f"dataset 'csv': {str(path)!r} is empty (no header row)") from None

    reader = _reader("csv", read, (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError, *COMPRESSION_ERRORS))
    return load_table("csv", root, reader, "a .csv file", train, val, test, label, features, split_column, task)


@DATASETS.register("parquet", "your Parquet table, one row per sample (options: train, val, test, label, features, "
                              "split_column, task); needs pyarrow", paths=("train", "val", "test"))
def parquet(root: str | None = None, train: Any = None, val: Any = None, test: Any = None, label: Any = "label",
            features: Any = None, split_column: Any = None, task: str = "classification") -> RawDataset:
    """Your Parquet table(s) read with pandas + pyarrow; see the ``csv`` options (no ``delimiter``)."""
    pd = require("pandas", "parquet", "pandas")
    pa = require("pyarrow", "parquet", "pyarrow")
    reader = _reader("parquet", lambda path: pd.read_parquet(path, engine="pyarrow"),
                     (pa.ArrowException, OSError, ValueError, EOFError))
    return load_table("parquet", root, reader, "a .parquet file", train, val, test, label, features, split_column,
                      task)
