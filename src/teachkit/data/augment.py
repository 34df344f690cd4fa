"""Batched data augmentation on the training device: padded random crop and horizontal flip.

The CIFAR recipe of He et al. 2016 (pad 4, random 32x32 crop, random horizontal flip), done for a whole batch
with one gather instead of a per-sample loop. How the crop pads is ``data.augment_options.pad_mode``
(:class:`AugmentOptions`): ``zeros``, as torchvision's ``RandomCrop(32, padding=4)`` in RepDistiller, mdistiller
and torchdistill, or ``reflect``, as the L2T-DLF paper asks. teachkit normalises inputs when it loads them, before
augmenting, so zero padding fills with what a raw 0 pixel normalises to (``-mean / std`` per channel), the value
torchvision's order (crop the raw image, then ``ToTensor`` and ``Normalize``) gives. Random numbers come from a CPU
``torch.Generator`` (so runs are reproducible on any device) and are then moved to the batch's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.data.base import Splits
from teachkit.errors import ConfigError
from teachkit.options import Options

AUGMENT_KINDS = ("auto", "none", "crop", "flip", "crop_flip")
PAD_MODES = ("zeros", "reflect")


@dataclass
class AugmentOptions(Options):
    """``data.augment_options``: how the random crop pads. ``pad_mode``: ``zeros`` (torchvision's ``RandomCrop``
    default: pixels that are 0 in the raw image, i.e. ``-mean / std`` after normalisation) or ``reflect``
    (the border mirrored without repeating the edge pixel, ``F.pad(mode="reflect")``; the L2T-DLF paper)."""

    pad_mode: Literal["zeros", "reflect"] = "zeros"


class Augment:
    """Random crop after ``crop_pad`` padding (each sample its own offset) and/or a horizontal flip (last dim)
    with probability 0.5, for (N, C, H, W) images or (N, C, L) sequences.

    ``pad_mode="zeros"`` pads with ``fill`` (one value per channel, dim 1; None: 0), ``"reflect"`` mirrors the
    border. :func:`make_augment` sets ``fill`` to a raw 0 normalised with the splits' statistics."""

    def __init__(self, crop_pad: int = 0, flip: bool = False, pad_mode: str = "zeros",
                 fill: Sequence[float] | Tensor | None = None) -> None:
        if isinstance(crop_pad, bool) or not isinstance(crop_pad, int) or crop_pad < 0:
            raise ConfigError(f"crop_pad must be an integer >= 0, got {crop_pad!r}")
        if pad_mode not in PAD_MODES:
            raise ConfigError(f"pad_mode={pad_mode!r} is not allowed; choose one of: {', '.join(PAD_MODES)}")
        if fill is not None and pad_mode != "zeros":
            raise ConfigError(f"fill is for pad_mode='zeros', not {pad_mode!r}")
        self.crop_pad = crop_pad
        self.flip = bool(flip)
        self.pad_mode = pad_mode
        self.fill = None if fill is None else torch.as_tensor(fill, dtype=torch.float32).detach().flatten().cpu()
        self._fills: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def __repr__(self) -> str:  # part of the view cache's key: names everything that changes a view
        if not self.crop_pad:  # nothing is padded
            return f"Augment(crop_pad=0, flip={self.flip})"
        fill = "" if self.fill is None else ", fill=[" + ", ".join(f"{float(v):.9g}" for v in self.fill) + "]"
        return f"Augment(crop_pad={self.crop_pad}, flip={self.flip}, pad_mode={self.pad_mode!r}{fill})"

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """A new augmented batch (or ``x`` itself when there is nothing to do). Draws, in this order:
        crop offsets (N, spatial dims) in 0..2*crop_pad, then N flip coins."""
        if x.dim() not in (3, 4):
            raise ValueError(f"Augment expects (N, C, H, W) or (N, C, L) input, got shape {tuple(x.shape)}")
        n, p, spatial = x.shape[0], self.crop_pad, tuple(x.shape[2:])
        if p and self.pad_mode == "reflect" and min(spatial) <= p:
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

        padded = self.pad(x)
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

    def pad(self, x: Tensor) -> Tensor:
        """``x`` padded by ``crop_pad`` on both sides of every spatial dim, as ``pad_mode`` says."""
        p, dims = self.crop_pad, x.dim() - 2
        if self.pad_mode == "reflect":
            return F.pad(x, (p, p) * dims, mode="reflect")
        if self.fill is None:
            return F.pad(x, (p, p) * dims)
        if self.fill.numel() != x.shape[1]:
            raise ValueError(f"fill has {self.fill.numel()} values but the input has {x.shape[1]} channels")
        key = (x.device, x.dtype)
        if key not in self._fills:  # moved to the device once, not per batch
            self._fills[key] = self.fill.to(x.device, x.dtype).view(1, -1, *([1] * dims))
        padded = self._fills[key].expand(x.shape[0], x.shape[1], *(s + 2 * p for s in x.shape[2:])).contiguous()
        padded[(slice(None), slice(None), *(slice(p, p + s) for s in x.shape[2:]))] = x
        return padded


def raw_zero(splits: Splits) -> Tensor | None:
    """What a raw 0 becomes per channel after the splits' normalisation, ``(0 - mean) / std`` in float32 as
    :func:`teachkit.data.splits.normalise` computes it; None when the splits are not normalised."""
    if splits.mean is None or splits.std is None:
        return None
    mean, std = splits.mean.detach().float().cpu(), splits.std.detach().float().cpu()
    return torch.zeros_like(mean).sub(mean).div_(std)


def make_augment(kind: str, splits: Splits, options: AugmentOptions | None = None) -> Augment | None:
    """The augmentation named ``kind`` for ``splits``: "auto" (the dataset's ``default_augment``: crop_flip
    for CIFAR, none otherwise), "none", "crop", "flip" or "crop_flip". The crop pads by
    max(1, min(spatial size) // 8) pixels: 4 for 32x32 (the CIFAR recipe), 3 for 28x28, 1 for 8x8, as
    ``options.pad_mode`` says (default ``zeros``: a raw 0 pixel, normalised like the splits)."""
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
    pad_mode = (options or AugmentOptions()).pad_mode
    fill = raw_zero(splits) if crop_pad and pad_mode == "zeros" else None
    return Augment(crop_pad=crop_pad, flip="flip" in kind, pad_mode=pad_mode, fill=fill)
