"""The bodies of ``teachkit predict`` and ``teachkit export`` (the CLI parses and calls these)."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np

from teachkit.engine.checkpoint import atomic_write
from teachkit.errors import ConfigError, DataError
from teachkit.predict import load_predictor
from teachkit.predict.base import Predictor


def check_out_file(out: Path) -> None:
    """ConfigError unless ``out`` can be written: its folder must exist and ``out`` must not be a folder."""
    if out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a folder; give a file name such as predictions.csv")
    folder = out.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"--out {str(out)!r}: its folder {str(folder)!r} {what}")


def predictions_csv(predictor: Predictor, names: list[str], predictions: list[Any],
                    proba: np.ndarray | None) -> str:
    """The CSV text: one row per input (its name, the prediction, and with ``proba`` one column per class)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    labels = predictor.labels or []
    writer.writerow([predictor.row_label, "prediction", *(labels if proba is not None else [])])
    for i, (name, value) in enumerate(zip(names, predictions, strict=True)):
        shown = f"{value:.6g}" if isinstance(value, float) else value
        extra = [f"{p:.6g}" for p in proba[i]] if proba is not None else []
        writer.writerow([name, shown, *extra])
    return buffer.getvalue()


def predict_command(run: str, inputs: str, out: str | None = None, select: str = "best",
                    proba: bool = False) -> int:
    """``teachkit predict RUN INPUT``: predictions for every input, as CSV to ``out`` or stdout."""
    path = Path(inputs).expanduser()
    if not path.exists():
        raise DataError(f"input {str(path)!r} does not exist")
    out_path = Path(out).expanduser() if out is not None else None
    if out_path is not None:
        check_out_file(out_path)
    predictor = load_predictor(run, select)
    items, names = predictor.read_inputs(path)
    if len(names) == 0:
        raise DataError(f"input {str(path)!r} holds no rows to predict")
    probabilities = predictor.predict_proba(items) if proba else None
    predictions = predictor.labels_of(probabilities) if probabilities is not None else predictor.predict(items)
    text = predictions_csv(predictor, names, predictions, probabilities)
    if out_path is None:
        sys.stdout.write(text)
    else:
        atomic_write(out_path, lambda tmp: Path(tmp).write_text(text))
        print(f"teachkit: {len(names)} predictions written to {out_path}", file=sys.stderr)
    return 0


def export_command(run: str, folder: str, select: str = "best", onnx: bool = False, force: bool = False) -> int:
    """``teachkit export RUN DIR``: see :mod:`teachkit.predict.export`."""
    from teachkit.predict.export import export_run

    done = export_run(run, folder, select, onnx=onnx, force=force)
    print(f"teachkit: exported to {done}", file=sys.stderr)
    return 0
