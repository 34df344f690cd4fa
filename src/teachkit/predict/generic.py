"""The catch-all predictor: inputs given as arrays or tensors of the model's input shape, in the scale the
dataset's source gives them, normalised with the run's statistics (any dataset whose checkpoint records
them, and hand-made checkpoints that record no data at all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.errors import DataError
from teachkit.predict.base import Predictor, register_predictor
from teachkit.predict.readers import existing, read_npz_inputs


@register_predictor
class ArrayPredictor(Predictor):
    """Arrays (N, *input_shape) -> normalised model inputs."""

    generic = True
    onnx_input = "raw inputs, float32 (N, *input_shape), in the scale the dataset's source gives"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        return isinstance(state.get("input_shape"), list) and (
            isinstance(state.get("normalisation"), dict) or not isinstance(state.get("data"), dict))

    def preprocess(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, str | Path):
            inputs = self.read_inputs(Path(inputs))[0]
        x = inputs.detach().cpu() if isinstance(inputs, torch.Tensor) else torch.from_numpy(np.array(inputs))
        shape = tuple(int(d) for d in self.state["input_shape"])
        if tuple(x.shape) == shape:
            x = x[None]
        if tuple(x.shape[1:]) != shape:
            raise DataError(f"inputs have shape {tuple(x.shape)}; the model reads (N, {', '.join(map(str, shape))})")
        if not (x.is_floating_point() or x.dtype in (torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)):
            raise DataError(f"inputs must be numeric, got dtype {x.dtype}")
        x = x.float()
        if x.numel() and not bool(torch.isfinite(x).all()):
            row = int((~torch.isfinite(x)).nonzero()[0, 0])
            raise DataError(f"inputs hold NaN or infinite values (row {row + 1})")
        return self.normalised(x)

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """An ``.npz`` (array ``x``) or ``.npy`` file: the inputs and their row numbers (1 = first)."""
        suffix = existing(path).suffix.lower()
        if suffix == ".npz":
            x = read_npz_inputs(path)
        elif suffix == ".npy" and path.is_file():
            try:
                x = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise DataError(f"cannot read input {str(path)!r} as a .npy array: {e}") from None
        else:
            raise DataError(f"input {str(path)!r}: this model reads arrays; expected an .npz file (array x) or a "
                            ".npy file")
        return x, [str(i + 1) for i in range(len(x))]
