"""The report's figures stay readable for many runs: bounded image size, a legend per group or an ``N rows`` note,
and no library warning in the output."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from teachkit.experiments.report import build_report
from tests.experiments.test_report import make_run


def png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels from a PNG's IHDR chunk (bytes 16..24, big-endian)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def many_runs(root: Path, count: int, groups: int = 0, wide: bool = False) -> Path:
    """``count`` runs, each its own row (kd.alpha differs); with ``groups``, kd.method takes that many values;
    ``wide``: five more keys vary (long row labels, as in a folder of mixed runs)."""
    for i in range(count):
        config = {"kd": {"alpha": round(0.01 * i, 2), "method": f"m{i % groups}" if groups else "kd"}}
        if wide:
            config = {"kd": {**config["kd"], "beta": i % 5, "gamma": i % 4}, "train": {"epochs": 3 + i % 2},
                      "optim": {"lr": 0.01 * (i % 6), "momentum": 0.1 * (i % 2)}}
        make_run(root / f"a-run-with-a-long-descriptive-folder-name-{i:02d}", last=70.0 + i % 7, best=70.0,
                 config=config)
    return root


def test_sixty_runs_give_a_bounded_plot_and_no_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from teachkit.experiments.report_plots import write_plots

    report = build_report(many_runs(tmp_path / "runs", 60, wide=True))
    assert len(report.rows) == 60 and len(report.by) == 6  # a legend entry per row: 60 long labels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = write_plots(report, tmp_path / "out")
    assert caught == [] and capsys.readouterr() == ("", "")
    names = {p.name for p in paths}
    assert {"curves.png", "curves.svg", "compute.png"} <= names
    width, height = png_size(tmp_path / "out" / "curves.png")
    assert width <= 2400 and height <= 1200, (width, height)
    assert png_size(tmp_path / "out" / "compute.png")[0] <= 2400


def test_many_rows_share_a_colour_and_a_legend_entry_per_group(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from teachkit.experiments.report_plots import MAX_LEGEND, row_styles
    from teachkit.experiments.stats import pyplot

    plt = pyplot()
    report = build_report(many_runs(tmp_path / "grouped", 30, groups=3))
    assert report.by == ["kd.alpha", "kd.method"] and len(report.rows) == 30
    styles = row_styles(plt, report.rows, report.by)  # kd.alpha splits 30 ways, kd.method 3
    labelled = [styles.label(r) for r in report.rows if styles.label(r) is not None]
    assert sorted(labelled) == ["kd.method=m0 (10 rows)", "kd.method=m1 (10 rows)", "kd.method=m2 (10 rows)"]
    assert len({styles.colour(r) for r in report.rows}) == 3 and styles.note == "30 rows, coloured by kd.method"
    few = build_report(many_runs(tmp_path / "few", MAX_LEGEND))
    styles = row_styles(plt, few.rows, few.by)
    assert all(styles.label(r) == r.label() for r in few.rows) and styles.note is None
    assert len({styles.colour(r) for r in few.rows}) == MAX_LEGEND
