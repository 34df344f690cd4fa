"""ONNX export of image and tabular models with the run's normalisation folded into the graph: the ONNX model
takes raw inputs (table features in the recorded column order; pixels in [0, 1]) and returns logits."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.predict.base import Predictor, _output

#: the packages ``--onnx`` needs (the ``onnx`` extra)
ONNX_PACKAGES = ("onnx", "onnxscript")


class Normalised(nn.Module):
    """``model((x - mean) / std)`` with the statistics as constants, returning the logits tensor."""

    def __init__(self, model: nn.Module, mean: torch.Tensor | None, std: torch.Tensor | None, dims: int) -> None:
        super().__init__()
        self.model = model
        shape = (1, -1) + (1,) * (dims - 2)
        self.register_buffer("mean", None if mean is None else mean.float().view(shape))
        self.register_buffer("std", None if std is None else std.float().view(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / self.std
        return _output(self.model(x))


def folded(predictor: Predictor) -> Normalised:
    """The predictor's model with its normalisation in front (CPU, eval mode)."""
    stats = predictor.state.get("normalisation")
    mean = torch.tensor(stats["mean"]) if isinstance(stats, dict) else None
    std = torch.tensor(stats["std"]) if isinstance(stats, dict) else None
    dims = 1 + len(predictor.state["input_shape"])
    return Normalised(predictor.model, mean, std, dims).cpu().eval()


def export_onnx(predictor: Predictor, path: Path, opset: int = 18) -> None:
    """Write ``predictor``'s model as ONNX to ``path`` (input ``input``: raw (N, *input_shape) float32, batch
    dimension dynamic; output ``logits``). ConfigError when the model is not an image / tabular one, or the
    packages are missing."""
    if predictor.onnx_input is None:
        raise ConfigError(f"--onnx exports image and tabular models; this checkpoint's inputs are read by "
                          f"{type(predictor).__name__} (task {predictor.task!r}), which has no ONNX form")
    missing = [p for p in ONNX_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(f"--onnx needs the packages {', '.join(ONNX_PACKAGES)} ({', '.join(missing)} missing): "
                          "pip install 'teachkit[onnx]'")
    module = folded(predictor)
    shape = [int(d) for d in predictor.state["input_shape"]]
    example = torch.zeros(2, *shape)
    batch = torch.export.Dim("batch", min=1)
    device = predictor.device
    predictor.model.cpu()
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the exporter's notes (optional torchvision ops) are not the user's concern
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, (example,), dynamo=True, input_names=["input"],
                                        output_names=["logits"], dynamic_shapes=({0: batch},), opset_version=opset,
                                        verbose=False)
        program.save(str(path))
    except Exception as e:  # the exporter raises many kinds; a model it cannot trace is the user's to know about
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"ONNX export of model {type(predictor.model).__name__} failed: {first}") from None
    finally:
        logger.setLevel(level)
        predictor.model.to(device)
