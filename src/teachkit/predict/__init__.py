"""A trained model you can use: predictors that apply a run's own preprocessing to raw inputs, and exports.

:func:`load_predictor` reads a run folder, a checkpoint file or an export folder (``teachkit export``) and
returns the :class:`Predictor` that fits its recorded state: tables (:mod:`.tables`), images (:mod:`.images`),
text and translation (:mod:`.text`, :mod:`.translation`), else arrays (:mod:`.generic`). Code a checkpoint
names (a model factory, plugins) is imported under the usual trust rules (:mod:`teachkit.trust`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from teachkit.errors import CheckpointError, ConfigError
from teachkit.predict import causal_lm, generic, images, tables, text, translation  # noqa: F401  (register predictors)
from teachkit.predict.base import PREDICTORS, Predictor, predictor_class, register_predictor
from teachkit.recipes.common import load_model, student_of
from teachkit.registry import import_plugins
from teachkit.trust import reading_from

__all__ = ["EXPORT_CONFIG", "EXPORT_WEIGHTS", "PREDICTORS", "Predictor", "load_predictor", "predictor_class",
           "register_predictor", "resolve_checkpoint"]

#: the files of an export folder (``teachkit export``) that :func:`load_predictor` reads
EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "config.json"
SELECTS = ("best", "last")


def resolve_checkpoint(path: str | Path, select: str = "best") -> tuple[Path, Path]:
    """(checkpoint file, source folder or file) of a run folder (``checkpoints/{select}.safetensors``), an
    export folder (``model.safetensors``) or a checkpoint file; one-line CheckpointError when none is there."""
    if select not in SELECTS:
        raise ConfigError(f"select must be one of {', '.join(SELECTS)}, got {select!r}")
    path = Path(path).expanduser()
    if path.is_file():
        return path, path
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} does not exist (expected a run folder, an export folder or a "
                              ".safetensors checkpoint)")
    if (path / EXPORT_WEIGHTS).is_file():
        return path / EXPORT_WEIGHTS, path
    path, _ = student_of(path)  # a composed run (TAKD, ESKD, BAN): its final student, as teachkit eval finds it
    file = path / "checkpoints" / f"{select}.safetensors"
    if not file.is_file():
        raise CheckpointError(f"{str(path)!r} holds no checkpoints/{select}.safetensors and no {EXPORT_WEIGHTS}: not "
                              "a finished run folder or an export folder")
    return file, path


def recorded_plugins(source: Path) -> list[str]:
    """The plugins a run folder's ``config.yaml`` or an export folder's ``config.json`` names."""
    plugins: Any = None
    if (source / EXPORT_CONFIG).is_file() and (source / EXPORT_WEIGHTS).is_file():
        try:
            plugins = json.loads((source / EXPORT_CONFIG).read_text()).get("plugins")
        except (OSError, ValueError, AttributeError):
            raise CheckpointError(f"export config {str(source / EXPORT_CONFIG)!r} is unreadable") from None
    elif (source / "config.yaml").is_file():
        from teachkit.config import read_yaml

        plugins = read_yaml(source / "config.yaml").get("plugins")
    return [p for p in plugins if isinstance(p, str)] if isinstance(plugins, list) else []


def load_predictor(path: str | Path, select: str = "best", device: torch.device | str = "cpu") -> Predictor:
    """The predictor of a run folder (checkpoint ``select``: ``best`` or ``last``), an export folder or a
    checkpoint file: its model (eval mode, on ``device``) with the preprocessing its run applied."""
    file, source = resolve_checkpoint(path, select)
    if source.is_dir():
        with reading_from(f"folder {str(source)!r} (its recorded plugins)"):
            import_plugins(recorded_plugins(source))
    model, state = load_model(file, select, device)
    return predictor_class(state)(model, state, source, device)
