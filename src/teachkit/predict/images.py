"""Predictors for images: ``image_folder`` runs, and any run whose inputs are images (C, H, W) with 1 or 3
channels (digits-like arrays, MNIST, CIFAR).

Inputs: an image file or a folder of them (PNG / JPEG, searched recursively, sorted; hidden files skipped), a
list of paths or PIL images, or an array / tensor (N, C, H, W) (one image: (C, H, W)) in the scale the
dataset's source gives (pixels in [0, 1]; a uint8 array is divided by 255). Files are decoded as
``image_folder`` does in training (RGB or grayscale, shorter side resized to the run's size, centre-cropped),
then normalised with the run's statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.image_folder import EXTENSIONS, decode, fit_image
from teachkit.data.raw import require
from teachkit.errors import DataError
from teachkit.predict.base import Predictor, register_predictor
from teachkit.predict.readers import existing, read_npz_inputs
from teachkit.predict.tables import data_section


def image_files(folder: Path) -> list[Path]:
    """The PNG / JPEG files under ``folder`` (recursively, sorted, hidden ones skipped); DataError when none."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not files:
        raise DataError(f"input folder {str(folder)!r} holds no PNG or JPEG image")
    return files


@register_predictor
class ImagePredictor(Predictor):
    """Image files or pixel arrays -> the model's normalised (N, C, H, W) inputs."""

    row_label = "file"
    onnx_input = "images, float32 (N, C, H, W), pixels in [0, 1] (decoded and resized as config.json says)"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        shape = state.get("input_shape")
        if data_section(state).get("name") == "image_folder":
            return True
        return isinstance(shape, list) and len(shape) == 3 and shape[0] in (1, 3) and shape[1] == shape[2]

    @property
    def shape(self) -> tuple[int, int, int]:
        c, h, w = (int(d) for d in self.state["input_shape"])
        return c, h, w

    def preprocess(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, str | Path):
            inputs = self.read_inputs(Path(inputs))[0]
        if isinstance(inputs, list | tuple) and inputs and not isinstance(inputs[0], int | float | list):
            x = self.decode_all(list(inputs))
        else:
            x = self.pixel_array(inputs)
        return self.normalised(x)

    def decode_all(self, items: list[Any]) -> torch.Tensor:
        """Image files or PIL images as float32 (N, C, H, W) in [0, 1]."""
        image_module = require("PIL.Image", "image_folder", "Pillow")
        c, size, _ = self.shape
        out = np.empty((len(items), c, size, size), dtype=np.uint8)
        for i, item in enumerate(items):
            if isinstance(item, str | Path):
                out[i] = decode(existing(Path(item)), size, c, image_module, who="input")
            elif isinstance(item, image_module.Image):
                out[i] = fit_image(item, size, c, image_module)
            else:
                raise DataError(f"input {i + 1} is a {type(item).__name__}; expected an image path or a PIL image")
        return torch.from_numpy(out).float().div_(255.0)

    def pixel_array(self, inputs: Any) -> torch.Tensor:
        """An array / tensor (N, C, H, W) or (C, H, W) as float32 (uint8 pixels are divided by 255)."""
        x = inputs.detach().cpu() if isinstance(inputs, torch.Tensor) else torch.from_numpy(np.array(inputs))
        if tuple(x.shape) == self.shape:
            x = x[None]
        if x.dim() != 4 or tuple(x.shape[1:]) != self.shape:
            raise DataError(f"inputs have shape {tuple(x.shape)}; the model reads images of shape {self.shape} "
                            f"(N, {', '.join(map(str, self.shape))})")
        if x.dtype == torch.uint8:
            return x.float().div_(255.0)
        if not (x.is_floating_point() or x.dtype in (torch.int16, torch.int32, torch.int64)):
            raise DataError(f"inputs must be numeric pixels, got dtype {x.dtype}")
        x = x.float()
        if x.numel() and not bool(torch.isfinite(x).all()):
            image = int((~torch.isfinite(x)).nonzero()[0, 0]) + 1
            raise DataError(f"inputs hold NaN or infinite values (image {image})")
        return x

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """An image file, a folder of images (names relative to it) or an ``.npz`` (array ``x``)."""
        existing(path)
        if path.is_dir():
            files = image_files(path)
            return files, [str(f.relative_to(path)) for f in files]
        if path.suffix.lower() == ".npz":
            x = read_npz_inputs(path)
            return x, [str(i + 1) for i in range(len(x))]
        if path.suffix.lower() not in EXTENSIONS:
            raise DataError(f"input {str(path)!r} is not an image; expected a PNG / JPEG file, a folder of them or an "
                            ".npz file (array x)")
        return [path], [path.name]
