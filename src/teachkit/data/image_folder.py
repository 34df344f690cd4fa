"""``image_folder``: your own images, one sub-folder per class, decoded with Pillow.

Layouts (``root`` = ``data.root``)::

    root/<class>/*.png|*.jpg|*.jpeg                    one pool; val and test are carved (seeded, stratified)
    root/train/<class>/...  [root/val/<class>/...]  [root/test/<class>/...]   given splits

Class names are sorted and numbered 0, 1, ...; a class found in val or test but not in train is an error.
Each image is converted to RGB (``channels: 3``) or grayscale (``channels: 1``), resized so that its shorter
side is ``size`` pixels (bilinear), centre-cropped to ``size`` x ``size`` and scaled to [0, 1]:
x is float32 (N, channels, size, size). Files with other extensions and hidden files are skipped.

Options: ``size`` (default 32, at most :data:`MAX_SIZE` = 4096), ``channels`` (1 or 3, default 3). The
decoded images are held in memory as float32 (and copied once more when normalised): before decoding anything,
n_images x channels x size^2 x 4 bytes is checked against half this machine's physical memory
(:func:`memory_budget`); a larger figure is a DataError saying it in GiB. Example::

    data:
      name: image_folder
      root: ~/data/flowers
      options: {size: 64, channels: 3}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset, int_option, require
from teachkit.errors import ConfigError, DataError

NAME = "image_folder"
#: the largest ``size`` option (pixels per side); one 4096 x 4096 RGB image is 192 MiB as float32
MAX_SIZE = 4096
#: the memory the decoded images may take, in bytes; None: half this machine's physical memory
MEMORY_BUDGET_BYTES: int | None = None
EXTENSIONS = (".png", ".jpg", ".jpeg")
SPLIT_FOLDERS = ("train", "val", "test")


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def list_images(folder: Path) -> dict[str, list[Path]]:
    """Class name -> sorted image files of each class sub-folder of ``folder``; DataError when there is none
    or a class folder holds no image."""
    classes = _visible_dirs(folder)
    if not classes:
        raise DataError(f"dataset {NAME!r}: {str(folder)!r} has no class sub-folders; expected "
                        f"{str(folder)}/<class>/*.png (or .jpg)")
    found = {}
    for c in classes:
        files = sorted(p for p in c.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(c).parts))
        if not files:
            raise DataError(f"dataset {NAME!r}: class folder {str(c)!r} holds no PNG or JPEG image")
        found[c.name] = files
    return found


def fit_image(img: Any, size: int, channels: int, image_module: Any) -> np.ndarray:
    """An open PIL image as uint8 (channels, size, size): converted, shorter side resized to ``size``,
    centre-cropped (what training and prediction both apply)."""
    img = img.convert("RGB" if channels == 3 else "L")
    w, h = img.size
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    img = img.resize((nw, nh), image_module.Resampling.BILINEAR)
    left, top = (nw - size) // 2, (nh - size) // 2
    img = img.crop((left, top, left + size, top + size))
    arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def decode(path: Path, size: int, channels: int, image_module: Any, who: str = f"dataset {NAME!r}") -> np.ndarray:
    """One image file as uint8 (channels, size, size) (:func:`fit_image`); DataError naming it when it cannot
    be decoded."""
    try:
        with image_module.open(path) as img:
            return fit_image(img, size, channels, image_module)
    except (OSError, ValueError, SyntaxError, image_module.DecompressionBombError) as e:
        raise DataError(f"{who}: cannot decode image {str(path)!r}: {e}") from None


def memory_budget() -> tuple[int, str]:
    """(bytes, what they are) the decoded images may take: :data:`MEMORY_BUDGET_BYTES` when set, else half the
    machine's physical memory (normalising copies them once more; 64 GiB of memory assumed when unknown)."""
    if MEMORY_BUDGET_BYTES is not None:
        return MEMORY_BUDGET_BYTES, "budget"
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        total = 64 * 1024**3
    return total // 2, "budget (half this machine's memory: normalising copies them)"


def check_memory(listing: dict[str, dict[str, list[Path]]], size: int, channels: int) -> None:
    """DataError, before any image is decoded, when the float32 images (n x channels x size^2 x 4 bytes) would
    not fit :func:`memory_budget`."""
    n = sum(len(paths) for files in listing.values() for paths in files.values())
    need, (budget, what) = n * channels * size * size * 4, memory_budget()
    if need > budget:
        raise DataError(f"dataset {NAME!r}: {n:,} images at size={size}, channels={channels} would take "
                        f"{need / 1024**3:,.1f} GiB as float32 (n x channels x size^2 x 4 bytes), more than the "
                        f"{budget / 1024**3:,.1f} GiB {what}; lower option size")


def load_part(files: dict[str, list[Path]], index: dict[str, int], size: int, channels: int,
              image_module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 (N, C, size, size) in [0, 1], y int64 (N,)) of one split's class -> files listing."""
    n = sum(len(v) for v in files.values())
    x = np.empty((n, channels, size, size), dtype=np.uint8)
    y = np.empty(n, dtype=np.int64)
    i = 0
    for name, paths in files.items():
        for path in paths:
            x[i] = decode(path, size, channels, image_module)
            y[i] = index[name]
            i += 1
    return torch.from_numpy(x).float().div_(255.0), torch.from_numpy(y)


@DATASETS.register(NAME, "your images: root/<class>/*.png|jpg or root/{train,val,test}/<class>/ (options: size, "
                         "channels)")
def image_folder(root: str | None = None, size: int = 32, channels: int = 3) -> RawDataset:
    """Class sub-folders of PNG / JPEG images under ``root``; see the module docstring for layouts and options."""
    size = int_option(NAME, "size", size, 1)
    if size > MAX_SIZE:
        raise ConfigError(f"dataset {NAME!r} option 'size' must be 1..{MAX_SIZE} (pixels per side), got {size}")
    if channels not in (1, 3) or isinstance(channels, bool):
        raise ConfigError(f"dataset {NAME!r} option 'channels' must be 1 (grayscale) or 3 (RGB), got {channels!r}")
    image_module = require("PIL.Image", NAME, "Pillow")
    if root is None:
        raise ConfigError(f"dataset {NAME!r} needs data.root: a folder of class sub-folders (root/<class>/*.png) "
                          "or of train/, val/, test/ folders")
    folder = Path(root)
    if not folder.is_dir():
        raise DataError(f"dataset {NAME!r}: data.root {root!r} is not a folder")
    if (folder / "train").is_dir():
        listing = {part: list_images(folder / part) for part in SPLIT_FOLDERS if (folder / part).is_dir()}
    else:
        listing = {"train": list_images(folder)}
    names = sorted(listing["train"])
    for part in ("val", "test"):
        unseen = sorted(set(listing.get(part, {})) - set(names))
        if unseen:
            raise DataError(f"dataset {NAME!r}: class {unseen[0]!r} is in {part}/ but not in train/ "
                            f"(train classes: {', '.join(names)})")
    check_memory(listing, size, channels)
    index = {name: i for i, name in enumerate(names)}
    data = {part: load_part(files, index, size, channels, image_module) for part, files in listing.items()}
    tx, ty = data.get("test", (None, None))
    vx, vy = data.get("val", (None, None))
    return RawDataset(data["train"][0], data["train"][1], tx, ty, num_classes=len(names), name=NAME,
                      val_x=vx, val_y=vy, class_names=tuple(names))
