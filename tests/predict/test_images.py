"""Image predictors end to end: train on a folder of PNGs, predict the test files with the run's accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import teachkit
from teachkit.errors import DataError
from teachkit.predict.images import ImagePredictor
from tests.predict.helpers import accuracy, summary, train_run, write_images


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pngs")
    write_images(folder / "images", per_class=40)
    run = train_run(folder, {"name": "image_folder", "root": str(folder / "images"), "batch_size": 16,
                             "options": {"size": 8, "channels": 3}}, {"name": "mlp", "options": {"hidden": [16]}},
                    lr=0.02)
    return folder, run


def test_image_files_score_the_runs_own_test_accuracy(pngs) -> None:
    folder, run = pngs
    predictor = teachkit.load(run)
    assert isinstance(predictor, ImagePredictor) and predictor.class_names == ["dark", "light"]
    files, names = predictor.read_inputs(folder / "images" / "test")
    assert len(files) == 20 and names[0] == "dark/0-000.png"
    predicted = predictor.predict(files)
    truth = [n.split("/")[0] for n in names]
    assert accuracy(predicted, truth) == pytest.approx(summary(run)["test_acc_at_best"], abs=1e-4)
    assert predictor.predict(folder / "images" / "test") == predicted  # a folder path
    last = teachkit.load(run, select="last").predict(files)
    assert accuracy(last, truth) == pytest.approx(summary(run)["test_acc"], abs=1e-4)


def test_single_image_pil_and_pixel_arrays_agree(pngs) -> None:
    from PIL import Image

    folder, run = pngs
    predictor = teachkit.load(run)
    file = folder / "images" / "test" / "light" / "1-004.png"
    with Image.open(file) as img:  # 12x10: shorter side to 8 gives 10x8, centre crop keeps columns 1..8
        pixels = np.asarray(img.convert("RGB").resize((10, 8), Image.Resampling.BILINEAR))[:, 1:9]
    one = predictor.predict(file)
    assert len(one) == 1 and predictor.predict([Image.open(file)]) == one
    assert predictor.predict(pixels.transpose(2, 0, 1)) == one  # uint8 (C, H, W): divided by 255
    assert np.allclose(predictor.scores(pixels.transpose(2, 0, 1).astype(np.float32) / 255), predictor.scores(file))
    proba = predictor.predict_proba(file)
    assert proba.shape == (1, 2) and np.isclose(proba.sum(), 1.0)
    with pytest.raises(DataError, match=r"inputs have shape \(1, 3, 9, 9\); the model reads images of shape"):
        predictor.predict(np.zeros((1, 3, 9, 9), np.float32))


def test_unreadable_image_and_empty_folder_are_errors(pngs, tmp_path: Path) -> None:
    predictor = teachkit.load(pngs[1])
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="input: cannot decode image .*bad.png"):
        predictor.predict(tmp_path / "bad.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no PNG or JPEG image"):
        predictor.predict(tmp_path / "empty")
    with pytest.raises(DataError, match="is not an image"):
        predictor.read_inputs(Path(__file__))
