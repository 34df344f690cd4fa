"""Predictors for feature vectors: ``csv`` / ``parquet`` tables and ``arrays`` datasets with (N, F) inputs.

The feature columns are taken by name, in the run's order: the checkpoint records them (``feature_names``);
for checkpoints older than that, the data section's ``features`` option, else every numeric column that is not
a label or split column (what the ``csv`` source did). Inputs: a pandas DataFrame, a list of dicts (one per
row), a CSV / Parquet / ``.npz`` path, or a numeric array (N, F) of raw features in that order. The run's
normalisation is applied to them, so raw rows score as the run's test split did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.errors import DataError
from teachkit.predict.base import Predictor, register_predictor
from teachkit.predict.readers import read_npz_inputs, read_table

TABLE_SOURCES = ("csv", "parquet")
ARRAY_SOURCES = ("arrays",)


def data_section(state: dict[str, Any]) -> dict[str, Any]:
    """The ``data`` section a checkpoint records (empty when it records none)."""
    data = state.get("data")
    return data if isinstance(data, dict) else {}


def _list_option(options: dict[str, Any], key: str, default: list[str]) -> list[str]:
    value = options.get(key, default)
    if value is None:
        return default
    return [value] if isinstance(value, str) else [str(v) for v in value]


@register_predictor
class TablePredictor(Predictor):
    """Rows of a table (or raw feature vectors) -> the model's normalised (N, F) inputs."""

    onnx_input = "raw features, float32 (N, F), in the column order of config.json's feature_names"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        name = data_section(state).get("name")
        shape = state.get("input_shape")
        return name in TABLE_SOURCES + ARRAY_SOURCES and isinstance(shape, list) and len(shape) == 1

    @property
    def width(self) -> int:
        """F, the number of features the model reads."""
        return int(self.state["input_shape"][0])

    @property
    def feature_names(self) -> list[str] | None:
        """The recorded feature columns, or those named by the data section's ``features`` option."""
        names = self.state.get("feature_names")
        if isinstance(names, list):
            return [str(n) for n in names]
        options = data_section(self.state).get("options") or {}
        given = options.get("features")
        return _list_option(options, "features", []) if given is not None else None

    def preprocess(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, str | Path):
            inputs = self.read_inputs(Path(inputs))[0]
        if isinstance(inputs, list) and inputs and all(isinstance(r, dict) for r in inputs):
            import pandas as pd

            inputs = pd.DataFrame(inputs)
        if hasattr(inputs, "columns") and hasattr(inputs, "iloc"):
            x = self.frame_features(inputs)
        else:
            x = self.array_features(inputs)
        return self.normalised(torch.from_numpy(x))

    def columns_of(self, df: Any) -> list[str]:
        """The feature columns to take from ``df``, in the model's order."""
        names = self.feature_names
        if names is not None:
            return names
        import pandas as pd

        options = data_section(self.state).get("options") or {}
        skip = {*_list_option(options, "label", ["label"]), *_list_option(options, "split_column", ["split"])}
        chosen = [str(c) for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])]
        if len(chosen) != self.width:
            raise DataError(f"input has {len(chosen)} numeric feature columns ({', '.join(chosen) or 'none'}) but "
                            f"the model reads {self.width} (this checkpoint does not record their names)")
        return chosen

    def frame_features(self, df: Any) -> np.ndarray:
        """The feature columns of DataFrame ``df`` as float32 (N, F); one-line DataError naming the column and
        row of a missing column or a non-numeric / missing value."""
        import pandas as pd

        names = self.columns_of(df)
        missing = [c for c in names if c not in df.columns]
        if missing:
            shown = ", ".join(str(c) for c in df.columns[:12]) or "none"
            raise DataError(f"input has no feature column {missing[0]!r} (the model reads {', '.join(names)}; the "
                            f"input has {shown})")
        out = np.empty((len(df), len(names)), dtype=np.float32)
        for j, c in enumerate(names):
            col = df[c]
            values = col.astype(np.float32) if pd.api.types.is_bool_dtype(col) else pd.to_numeric(col, errors="coerce")
            bad = np.flatnonzero(~np.isfinite(values.to_numpy(dtype=np.float64)))
            if bad.size:
                row = int(bad[0])
                value = col.iloc[row]
                shown = "a missing value" if pd.isna(value) else repr(value.item() if hasattr(value, "item") else value)
                raise DataError(f"input feature column {c!r} holds {shown} in row {row + 1}: features must be finite "
                                "numbers")
            out[:, j] = values.to_numpy(dtype=np.float32)
        return out

    def array_features(self, inputs: Any) -> np.ndarray:
        """Raw features given as an array or tensor (N, F) (or one row (F,)) as float32."""
        x = inputs.detach().cpu().numpy() if isinstance(inputs, torch.Tensor) else np.asarray(inputs)
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.shape[1] != self.width:
            raise DataError(f"inputs have shape {tuple(x.shape)}; the model reads rows of {self.width} features "
                            f"(N, {self.width})")
        if x.dtype == np.bool_:
            x = x.astype(np.float32)
        if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
            raise DataError(f"inputs must be numeric, got dtype {x.dtype}")
        x = x.astype(np.float32)
        bad = np.argwhere(~np.isfinite(x))
        if len(bad):
            row, col = (int(i) for i in bad[0])
            raise DataError(f"inputs hold {x[row, col]} in row {row + 1}, feature {col + 1}: features must be "
                            "finite numbers")
        return x

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """A CSV / Parquet table or an ``.npz`` (array ``x``): the inputs and their row numbers (1 = first)."""
        if path.suffix.lower() == ".npz":
            x = read_npz_inputs(path)
        else:
            x = read_table(path, (".csv", ".csv.gz", ".parquet", ".npz"))
        return x, [str(i + 1) for i in range(len(x))]
