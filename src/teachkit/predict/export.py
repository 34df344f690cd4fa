"""``teachkit export RUN DIR``: a self-contained folder that :func:`teachkit.load` reads without the run folder.

Layout of DIR::

    model.safetensors   the weights and the checkpoint state (model config, input shape, normalisation, class
                        names, feature columns, data section), written by save_checkpoint
    model.json          its sidecar (the state again, with the file's sha256)
    config.json         the model's construction config and the preprocessing, for people and other tools
    README.md           a model card: task, data, metrics, teacher and method, how to load it
    model.onnx          with --onnx (image and tabular models): raw inputs -> logits, normalisation folded in

The folder is written under a temporary name beside DIR and renamed into place, so DIR is either absent, the
old folder (``--force``) or complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from teachkit.config import read_yaml
from teachkit.data.raw import new_temp_folder
from teachkit.engine.checkpoint import save_checkpoint, write_json
from teachkit.errors import ConfigError
from teachkit.predict import EXPORT_CONFIG, EXPORT_WEIGHTS, load_predictor, recorded_plugins
from teachkit.predict.base import Predictor
from teachkit.predict.card import model_card

#: checkpoint state that only resuming a training run needs
TRAINING_ONLY = ("optimizer", "scheduler", "source_file", "sampler", "scaler", "callbacks")


def run_folder_of(predictor: Predictor) -> Path | None:
    """The run folder the predictor's checkpoint belongs to (holding summary.json / config.yaml), if any."""
    source = predictor.source
    for folder in (source, source.parent.parent) if source.is_file() else (source,):
        if (folder / "summary.json").is_file() or (folder / "config.yaml").is_file():
            return folder
    return None


def read_run_files(folder: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary.json, config.yaml) of a run folder; empty mappings for what is missing or unreadable."""
    summary: Any = {}
    config: Any = {}
    if folder is not None and (folder / "summary.json").is_file():
        try:
            summary = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
    if folder is not None and (folder / "config.yaml").is_file():
        try:
            config = read_yaml(folder / "config.yaml")
        except ConfigError:
            config = {}
    return (summary if isinstance(summary, dict) else {}), (config if isinstance(config, dict) else {})


def check_target(folder: Path, source: Path, force: bool) -> None:
    """ConfigError when ``folder`` cannot take the export: a file, non-empty without ``force``, or the run
    folder itself (or a folder holding it)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"export folder {str(folder)!r} is a file; choose a folder")
    resolved, src = folder.resolve(), source.resolve()
    if resolved == src or resolved in src.parents:
        raise ConfigError(f"export folder {str(folder)!r} holds the run being exported; choose another folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ConfigError(f"export folder {str(folder)!r} is not empty; choose a new folder or pass --force to "
                          "replace it")
    for part in folder.parents:
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"export folder {str(folder)!r} is under {str(part)!r}, which is a file")
            break


def export_config(predictor: Predictor, summary: dict[str, Any], select: str) -> dict[str, Any]:
    """The ``config.json`` of an export: construction config, preprocessing, where it came from."""
    state = predictor.state
    return {"format": "teachkit-export", "version": 1, "model": state.get("model"),
            "input_shape": state.get("input_shape"), "num_classes": state.get("num_classes"),
            "preprocessing": predictor.preprocessing(), "data": state.get("data"),
            "plugins": recorded_plugins(predictor.source) if predictor.source.is_dir() else [],
            "source": {"path": str(predictor.source), "select": select, "epoch": state.get("epoch"),
                       "dataset": state.get("dataset"), "loss": state.get("loss")},
            "onnx_input": predictor.onnx_input,
            "metrics": {k: v for k, v in summary.items() if k.startswith(("test_", "val_", "best_"))}}


def write_export(predictor: Predictor, tmp: Path, select: str, onnx: bool) -> None:
    """Every file of the export into the (empty) folder ``tmp``."""
    summary, config = read_run_files(run_folder_of(predictor))
    changes = predictor.export_files(tmp) or {}
    state = {k: v for k, v in predictor.state.items() if k not in TRAINING_ONLY}
    state = {**state, **changes, "exported_from": str(predictor.source), "exported_select": select}
    tensors = {f"model/{k}": v for k, v in predictor.model.state_dict().items()}
    save_checkpoint(tmp / EXPORT_WEIGHTS, tensors, state)
    write_json(tmp / EXPORT_CONFIG, export_config(predictor, summary, select))
    if onnx:
        from teachkit.predict.onnx_export import export_onnx

        export_onnx(predictor, tmp / "model.onnx")
    text = model_card(predictor, summary, config, select, onnx)
    (tmp / "README.md").write_text(text)


def export_run(path: str | Path, folder: str | Path, select: str = "best", onnx: bool = False,
               force: bool = False) -> Path:
    """Export the model of a run folder / checkpoint / export folder ``path`` into ``folder`` (module
    docstring); returns ``folder``."""
    predictor = load_predictor(path, select)
    folder = Path(folder).expanduser()
    check_target(folder, predictor.source, force)
    if onnx and predictor.onnx_input is None:
        raise ConfigError(f"--onnx exports image and tabular models; this checkpoint's inputs are read by "
                          f"{type(predictor).__name__} (task {predictor.task!r}), which has no ONNX form")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_folder(folder.parent, f".{folder.name}.export-")
    try:
        write_export(predictor, tmp, select, onnx)
        if folder.exists():
            old = new_temp_folder(folder.parent, f".{folder.name}.old-")
            old.rmdir()
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
