"""What every predictor shares: a trained model plus everything its run applied to inputs before it.

A :class:`Predictor` is built from a checkpoint's recorded state (``model_meta``: the data section, the
normalisation statistics, the tokenizer, the vocabulary, the class names) so that raw inputs -- table rows, image
files, sentences -- go through the same preprocessing as in training. Each input kind is one module that
registers a subclass with :func:`register_predictor`; :func:`predictor_class` picks the one whose
:meth:`Predictor.handles` accepts a checkpoint's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from teachkit.data.raw import is_regression
from teachkit.errors import CheckpointError

__all__ = ["PREDICTORS", "Predictor", "predictor_class", "recorded_task", "register_predictor"]

#: registered predictor classes, most specific first (the generic one is registered last)
PREDICTORS: list[type[Predictor]] = []


def register_predictor(cls: type[Predictor]) -> type[Predictor]:
    """Class decorator: make ``cls`` a candidate of :func:`predictor_class` (checked in registration order,
    a subclass with ``generic = True`` last)."""
    PREDICTORS.append(cls)
    PREDICTORS.sort(key=lambda c: c.generic)
    return cls


def predictor_class(state: dict[str, Any]) -> type[Predictor]:
    """The registered predictor for a checkpoint's ``state``; a one-line CheckpointError when none fits."""
    for cls in PREDICTORS:
        if cls.handles(state):
            return cls
    raise CheckpointError(f"no predictor handles checkpoint {state.get('source_file', '')!r} "
                          f"(dataset {state.get('dataset')!r})")


class Predictor:
    """A trained model with its run's preprocessing (see the module docstring).

    ``model`` is the bare ``nn.Module`` (eval mode) for users who want it; ``state`` the checkpoint's recorded
    state; ``source`` the run folder, export folder or checkpoint file it was loaded from; ``class_names`` the
    labels :meth:`predict` returns (the run's own label names when it had them, else ``["0", "1", ...]``;
    ``None`` for regression and sequence outputs); ``task`` the evaluator's task (``classification``,
    ``binary``, ``regression``, ``glue``, ``translation``...).
    """

    #: a catch-all predictor is tried after every specific one
    generic: ClassVar[bool] = False
    #: the header of the CLI output's first column (what names an input: ``row``, ``file``, ``line``)
    row_label: ClassVar[str] = "row"
    #: what an ONNX export of this kind of model takes as input (``None``: no ONNX export, e.g. text)
    onnx_input: ClassVar[str | None] = None

    def __init__(self, model: nn.Module, state: dict[str, Any], source: Path,
                 device: torch.device | str = "cpu") -> None:
        self.model = model.eval()
        self.state = state
        self.source = Path(source)
        self.device = torch.device(device)
        self.task: str = recorded_task(state)
        names = state.get("class_names")
        self.class_names: list[str] | None = [str(n) for n in names] if isinstance(names, list) else None

    # -- what a subclass provides
    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        """Whether this predictor fits a checkpoint's recorded ``state``."""
        raise NotImplementedError

    def preprocess(self, inputs: Any) -> Any:
        """Raw inputs (rows, files, sentences) as the model's input batch (tensor or mapping), on ``device``."""
        raise NotImplementedError

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """Inputs read from a file or folder the CLI was given, and one row name per input (for the output)."""
        raise NotImplementedError

    def export_files(self, folder: Path) -> dict[str, Any] | None:
        """Copy the files the preprocessing reads (vocabularies, BPE codes, a tokenizer folder) into the export
        ``folder``; return the changes to the recorded state that point at the copies (paths relative to the
        export folder). Default: nothing to copy."""
        return None

    def preprocessing(self) -> dict[str, Any]:
        """What the run applied before the model, for an export's ``config.json`` (JSON values)."""
        keys = ("task", "class_names", "feature_names", "input_shape", "normalisation", "tokenizer", "vocabulary")
        out = {k: self.state[k] for k in keys if k in self.state}
        return {"predictor": type(self).__name__, "task": self.task, "labels": self.labels, **out}

    def normalised(self, x: torch.Tensor) -> torch.Tensor:
        """Raw inputs ``x`` (float32, (N, *input_shape)) normalised with the run's training statistics, on
        ``device`` (unchanged when the checkpoint records none)."""
        stats = self.state.get("normalisation")
        if isinstance(stats, dict) and "mean" in stats and "std" in stats:
            mean, std = torch.tensor(stats["mean"]), torch.tensor(stats["std"])
            shape = (1, -1) + (1,) * (x.dim() - 2)
            x = (x.float() - mean.view(shape)) / std.view(shape)
        return x.float().to(self.device)

    @property
    def labels(self) -> list[str] | None:
        """The name of each output column: the class names, else ``"0".."C-1"``; ``None`` for regression."""
        if is_regression(self.task):
            return None
        if self.class_names is not None:
            return list(self.class_names)
        count = self.state.get("num_classes")
        return [str(i) for i in range(count)] if isinstance(count, int) else None

    # -- shared behaviour
    @torch.no_grad()
    def scores(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        """The model's raw outputs (logits; regression values), float32, one row per input."""
        batch = self.preprocess(inputs)
        out = [_output(self.model(_take(batch, slice(i, i + batch_size)))).float().cpu()
               for i in range(0, _rows(batch), batch_size)]
        width = int(self.state.get("num_classes") or 1)
        return torch.cat(out).numpy() if out else np.zeros((0, width), np.float32)

    def predict_proba(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        """Class probabilities (softmax of the logits; sigmoid for one-logit binary models)."""
        logits = torch.from_numpy(self.scores(inputs, batch_size))
        if is_regression(self.task):
            raise CheckpointError("predict_proba: a regression model has no class probabilities; use predict")
        if logits.ndim == 2 and logits.shape[1] == 1:
            p = torch.sigmoid(logits)
            return torch.cat([1 - p, p], dim=1).numpy()
        return torch.softmax(logits, dim=-1).numpy()

    def predict(self, inputs: Any, batch_size: int = 256) -> list[Any]:
        """One prediction per input: a label in the run's own label names; a float (or list) for regression."""
        if is_regression(self.task):
            values = self.scores(inputs, batch_size)
            return [float(v[0]) if np.ndim(v) and len(v) == 1 else np.asarray(v).tolist() for v in values]
        return self.labels_of(self.predict_proba(inputs, batch_size))

    def labels_of(self, proba: np.ndarray) -> list[Any]:
        """The most probable class of each row of ``proba``: its class name, else its integer id."""
        names = self.class_names
        return [names[i] if names is not None and i < len(names) else int(i) for i in proba.argmax(axis=1)]

    def __call__(self, inputs: Any) -> Any:
        """``predict(inputs)``."""
        return self.predict(inputs)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.source)!r}, model {type(self.model).__name__}, task {self.task}, "
                f"{len(self.class_names) if self.class_names else 'no'} class names)")


def recorded_task(state: dict[str, Any]) -> str:
    """The task a checkpoint records; for checkpoints older than that field, its data section's ``task``
    option (file sources), else ``classification``."""
    task = state.get("task")
    if isinstance(task, str) and task:
        return task
    data = state.get("data")
    options = data.get("options") if isinstance(data, dict) else None
    task = options.get("task") if isinstance(options, dict) else None
    return task if isinstance(task, str) and task else "classification"


def _output(out: Any) -> torch.Tensor:
    """The logits of a model's output (a tensor, or the ``logits`` field of a mapping / dataclass)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and "logits" in out:
        return out["logits"]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, Sequence) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise CheckpointError(f"model output of type {type(out).__name__} has no logits")


def _rows(batch: Any) -> int:
    """The number of inputs in a batch: a tensor, tokenised text (``num_rows``) or a mapping of tensors."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if hasattr(batch, "num_rows"):  # TokenFeatures: a mapping whose len() counts its columns
        return int(batch.num_rows)
    if isinstance(batch, dict):
        return int(next(iter(batch.values())).shape[0]) if batch else 0
    return len(batch)


def _take(batch: Any, rows: slice) -> Any:
    """Rows of a batch (TokenFeatures trims each selection to its longest input, as in evaluation)."""
    if isinstance(batch, torch.Tensor):
        return batch[rows]
    if isinstance(batch, dict):
        return {k: v[rows] for k, v in batch.items()}
    return batch[rows]
