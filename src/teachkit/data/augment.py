"""Batched data augmentation on the training device: reflect-pad random crop and horizontal flip.

The standard CIFAR recipe (He et al. 2016: pad 4, random 32x32 crop, random horizontal flip), done for a
whole batch with one gather instead of a per-sample loop. Random numbers come from a CPU
``torch.Generator`` (so runs are reproducible on any device) and are then moved to the batch's device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.data.base import Splits
from teachkit.errors import ConfigError

AUGMENT_KINDS = ("auto", "none", "crop", "flip", "crop_flip")


class Augment:
    """Random crop after ``crop_pad`` reflect padding (each sample its own offset) and/or a horizontal
    flip (last dim) with probability 0.5, for (N, C, H, W) images or (N, C, L) sequences."""

    def __init__(self, crop_pad: int = 0, flip: bool = False) -> None:
        if isinstance(crop_pad, bool) or not isinstance(crop_pad, int) or crop_pad < 0:
            raise ConfigError(f"crop_pad must be an integer >= 0, got {crop_pad!r}")
        self.crop_pad = crop_pad
        self.flip = bool(flip)

    def __repr__(self) -> str:
        return f"Augment(crop_pad={self.crop_pad}, flip={self.flip})"

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """A new augmented batch (or ``x`` itself when there is nothing to do). Draws, in this order:
        crop offsets (N, spatial dims) in 0..2*crop_pad, then N flip coins."""
        if x.dim() not in (3, 4):
            raise ValueError(f"Augment expects (N, C, H, W) or (N, C, L) input, got shape {tuple(x.shape)}")
        n, p, spatial = x.shape[0], self.crop_pad, tuple(x.shape[2:])
        if p and min(spatial) <= p:
            raise ValueError(f"crop_pad={p} must be smaller than the input's spatial size {spatial} "
                             "(reflect padding)")
        offsets = torch.randint(0, 2 * p + 1, (n, len(spatial)), generator=generator) if p else None
        flips = torch.rand(n, generator=generator) < 0.5 if self.flip else None
        if offsets is None and flips is None:
            return x
        dev = x.device
        if offsets is None:
            assert flips is not None
            mask = flips.to(dev).view(n, *([1] * (x.dim() - 1)))
            return torch.where(mask, x.flip(-1), x)

        padded = F.pad(x, (p, p) * len(spatial), mode="reflect")
        offsets = offsets.to(dev)
        # index grids: sample i reads padded[i, :, oy + r, ox + c] (ox + W-1-c when flipped)
        last = spatial[-1]
        cols = torch.arange(last, device=dev).expand(n, last)
        if flips is not None:
            cols = torch.where(flips.to(dev)[:, None], last - 1 - cols, cols)
        cols = cols + offsets[:, -1:]
        ch = torch.arange(x.shape[1], device=dev)
        batch = torch.arange(n, device=dev)
        if len(spatial) == 1:
            return padded[batch[:, None, None], ch[None, :, None], cols[:, None, :]]
        rows = torch.arange(spatial[0], device=dev)[None, :] + offsets[:, :1]
        return padded[batch[:, None, None, None], ch[None, :, None, None], rows[:, None, :, None],
                      cols[:, None, None, :]]


def make_augment(kind: str, splits: Splits) -> Augment | None:
    """The augmentation named ``kind`` for ``splits``: "auto" (the dataset's ``default_augment``: crop_flip
    for CIFAR, none otherwise), "none", "crop", "flip" or "crop_flip". The crop pads by
    max(1, min(spatial size) // 8) pixels: 4 for 32x32 (the CIFAR recipe), 3 for 28x28, 1 for 8x8."""
    if kind not in AUGMENT_KINDS:
        raise ConfigError(f"unknown augment {kind!r}; choose one of: {', '.join(AUGMENT_KINDS)}")
    if kind == "auto":
        kind = splits.default_augment
        if kind not in AUGMENT_KINDS or kind == "auto":
            raise ConfigError(f"dataset {splits.name!r} has an unknown default augment {kind!r}")
    if kind == "none":
        return None
    shape = splits.input_shape
    if len(shape) not in (2, 3):
        raise ConfigError(f"augment {kind!r} needs inputs shaped (C, H, W) or (C, L); "
                          f"dataset {splits.name!r} has {shape}")
    crop_pad = 0
    if "crop" in kind:
        size = min(shape[1:])
        if size < 2:
            raise ConfigError(f"augment {kind!r}: dataset {splits.name!r} inputs {shape} are too small "
                              "to crop")
        crop_pad = max(1, size // 8)
    return Augment(crop_pad=crop_pad, flip="flip" in kind)
