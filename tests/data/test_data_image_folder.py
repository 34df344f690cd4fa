"""The ``image_folder`` source on tiny PNG and JPEG files written here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from teachkit.data import load_raw, load_splits
from teachkit.errors import DataError


def save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def solid(h: int, w: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (h, w, 3)).copy()


def test_flat_layout_png_and_jpeg_rgb_and_gray(tmp_path: Path) -> None:
    for i in range(5):
        save(tmp_path / "red" / f"{i}.png", solid(10, 20, (255, 0, 0)))
        save(tmp_path / "blue" / f"{i}.JPG", solid(16, 8, (0, 0, 255)))
    (tmp_path / "blue" / "notes.txt").write_text("skipped")
    raw = load_raw("image_folder", str(tmp_path), {"size": 6})
    assert raw.train_x.shape == (10, 3, 6, 6) and raw.num_classes == 2
    assert raw.train_y.tolist() == [0] * 5 + [1] * 5  # blue < red
    torch.testing.assert_close(raw.train_x[0].mean((1, 2)), torch.tensor([0.0, 0.0, 1.0]), atol=0.02, rtol=0)
    torch.testing.assert_close(raw.train_x[9].mean((1, 2)), torch.tensor([1.0, 0.0, 0.0]), atol=0, rtol=0)
    gray = load_raw("image_folder", str(tmp_path), {"size": 4, "channels": 1})
    assert gray.train_x.shape == (10, 1, 4, 4) and 0.29 < float(gray.train_x[9].mean()) < 0.31  # L = 0.299 R
    s = load_splits("image_folder", root=str(tmp_path), options={"size": 4})
    assert (len(s.test), len(s.val), len(s.train)) == (2, 2, 6)  # stratified: a val image of each class


def test_resize_shorter_side_then_centre_crop(tmp_path: Path) -> None:
    img = np.zeros((4, 12, 3), np.uint8)
    img[:, 4:8] = 255  # a white middle third: what the centre crop keeps
    save(tmp_path / "a" / "x.png", img)
    raw = load_raw("image_folder", str(tmp_path), {"size": 4})
    assert torch.equal(raw.train_x[0], torch.ones(3, 4, 4))


def test_split_layout_given_val_and_test(tmp_path: Path) -> None:
    for part, n in (("train", 4), ("val", 2), ("test", 3)):
        for c, rgb in (("cat", (10, 10, 10)), ("dog", (200, 200, 200))):
            for i in range(n):
                save(tmp_path / part / c / f"{i}.png", solid(5, 5, rgb))
    s = load_splits("image_folder", root=str(tmp_path), options={"size": 5, "channels": 1})
    assert (len(s.train), len(s.val), len(s.test)) == (8, 4, 6)
    assert s.val.y.tolist() == [0, 0, 1, 1] and s.input_shape == (1, 5, 5)


def test_class_in_test_but_not_train_is_an_error(tmp_path: Path) -> None:
    save(tmp_path / "train" / "cat" / "0.png", solid(5, 5, (0, 0, 0)))
    save(tmp_path / "test" / "cow" / "0.png", solid(5, 5, (0, 0, 0)))
    with pytest.raises(DataError, match=r"class 'cow' is in test/ but not in train/"):
        load_raw("image_folder", str(tmp_path))
