"""The paired-seed studies' curves plot (``teachkit demo --task text|nmt``): the legend clear of the curves."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from teachkit.experiments.paired import plot_epoch_bands


def test_epoch_bands_plot_keeps_its_legend_outside_and_warns_nothing(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    curves = {"none": [[60.0, 70.0, 75.0], [62.0, 71.0, 74.0]], "kd": [[61.0, 72.0, 78.0], [63.0, 73.0, 79.0]]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = plot_epoch_bands(curves, {"none": "no KD", "kd": "KD"}, {"none": "grey", "kd": "tab:blue"},
                                tmp_path / "bands.png", ylabel="val acc %", title="t", reference=80.0)
    assert path == tmp_path / "bands.png" and caught == []
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    assert 5.5 * 120 < width <= 1200 and height <= 3.6 * 120 + 20  # widened by the outside legend, bounded
