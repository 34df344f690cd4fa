"""Reading the inputs a user points a predictor at: tables, ``.npz`` arrays; one-line errors for each failure."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from teachkit.data.raw import require
from teachkit.data.tables import COMPRESSION_ERRORS
from teachkit.errors import DataError


def existing(path: Path) -> Path:
    """``path`` when it exists; DataError otherwise."""
    if not path.exists():
        raise DataError(f"input {str(path)!r} does not exist")
    return path


def read_table(path: Path, allowed: tuple[str, ...]) -> Any:
    """A CSV (``.csv``, ``.csv.gz``) or Parquet file as a pandas DataFrame; DataError naming the file when it is
    missing, of another kind (``allowed`` lists the kinds the caller takes) or unreadable."""
    pd = require("pandas", "csv", "pandas")
    name = path.name.lower()
    if not existing(path).is_file():
        raise DataError(f"input {str(path)!r} is a folder; expected one of: {', '.join(allowed)}")
    try:
        if name.endswith(".parquet"):
            require("pyarrow", "parquet", "pyarrow")
            return pd.read_parquet(path, engine="pyarrow")
        if name.endswith((".csv", ".csv.gz", ".tsv")):
            return pd.read_csv(path, sep="\t" if name.endswith(".tsv") else ",")
    except pd.errors.EmptyDataError:
        raise DataError(f"input {str(path)!r} is empty (no header row)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError, *COMPRESSION_ERRORS) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot read input {str(path)!r}: {first}") from None
    raise DataError(f"input {str(path)!r} is not a table this model reads; expected one of: {', '.join(allowed)}")


def read_npz_inputs(path: Path, key: str = "x") -> np.ndarray:
    """Array ``key`` of an ``.npz`` file (never unpickled); DataError when missing or unreadable."""
    if not existing(path).is_file():
        raise DataError(f"input {str(path)!r} is a folder, not an .npz file")
    try:
        with np.load(path, allow_pickle=False) as f:
            if key not in f.files:
                held = ", ".join(f.files) or "nothing"
                raise DataError(f"input {str(path)!r} has no array {key!r} (it holds {held})")
            return f[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read input {str(path)!r} as an .npz archive: {e}") from None
