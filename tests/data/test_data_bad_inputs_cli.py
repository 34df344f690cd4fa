"""Suspicious and oversized user data end to end: memory refused before allocating, one-line warnings kept in
the run summary (and silent under ``--quiet``), statistics of huge features in float64, per-class carving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from teachkit.cli import main
from teachkit.data import image_folder, load_splits, userdata
from teachkit.data.splits import channel_stats, take_per_class
from teachkit.errors import DataError
from tests.conftest import tiny_config
from tests.data.test_data_bad_inputs import png, write
from tests.tasks.test_translation_bad_inputs import PAIRS_DE, files, iwslt

ONE_CLASS = "f,label\n" + "".join(f"{i},a\n" for i in range(20))


def run(tmp_path: Path, data: dict[str, Any], *argv: str) -> tuple[int, dict[str, Any]]:
    """``teachkit train`` (progress on) on ``data`` (files under data.root = tmp_path/data): the exit status and
    the run summary ({} when there is none)."""
    cfg = tiny_config(tmp_path, data={"root": str(tmp_path / "data"), "options": {}, **data},
                      train={"epochs": 1, "progress": True})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    code = main(["train", str(tmp_path / "cfg.yaml"), *argv])
    summary_file = tmp_path / "runs" / cfg["name"] / "summary.json"
    return code, json.loads(summary_file.read_text()) if summary_file.is_file() else {}


def one_error_line(err: str, fragment: str) -> None:
    assert err.startswith("teachkit: error: ") and err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert fragment in err, err


def test_image_folder_over_the_memory_budget_is_refused_before_decoding(tmp_path: Path, monkeypatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "data", {"cat/0.png": png(), "dog/0.png": png()})
    monkeypatch.setattr(image_folder, "MEMORY_BUDGET_BYTES", 100 * 1024**2)
    monkeypatch.setattr(image_folder, "decode", lambda *a: pytest.fail("decoded before the memory check"))
    code, _ = run(tmp_path, {"name": "image_folder", "options": {"size": 4096}}, "--quiet")
    assert code == 2
    one_error_line(capsys.readouterr().err, "dataset 'image_folder': 2 images at size=4096, channels=3 would take "
                                            "0.4 GiB as float32 (n x channels x size^2 x 4 bytes), more than the "
                                            "0.1 GiB budget; lower option size")


def test_the_class_cap_is_checked_before_carving(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(userdata, "MAX_CLASSES", 5)
    write(tmp_path, {"t.csv": "f,label\n" + "".join(f"{i},{i % 7}\n" for i in range(14))})
    with pytest.raises(DataError, match=r"train label 6 \(row 7\) would make 7 classes .* more than the limit of 5"):
        load_splits("csv", str(tmp_path), options={"train": "t.csv"})
    write(tmp_path, {"s.csv": "f,label\n" + "".join(f"{i},c{i % 7}\n" for i in range(14))})
    with pytest.raises(DataError, match="the labels hold 7 distinct values, more than the limit of 5 classes"):
        load_splits("csv", str(tmp_path), options={"train": "s.csv"})


@pytest.mark.parametrize("quiet", [False, True])
def test_one_class_is_a_warning_kept_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     quiet: bool) -> None:
    write(tmp_path / "data", {"one.csv": ONE_CLASS})
    code, summary = run(tmp_path, {"name": "csv", "options": {"train": "one.csv"}}, *(["--quiet"] if quiet else []))
    err = capsys.readouterr().err
    assert code == 0, err
    message = ("dataset 'csv' has one class: every training label is class 0, so a model learns nothing from it "
               "(accuracy is trivially 100%); check the label column or add other classes")
    assert message in summary["warnings"] and summary["data_notes"]["warnings"] == [message]
    assert err == "" if quiet else err == f"warning: tiny: {message}\n"


@pytest.mark.parametrize("quiet", [False, True])
def test_translation_warnings_are_teachkit_lines_and_respect_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   quiet: bool) -> None:
    write(tmp_path, files(de=PAIRS_DE.replace("der hund läuft .", "")))
    cfg = {**iwslt(tmp_path), "train": {"epochs": 1, "progress": True}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "cfg.yaml"), *(["--quiet"] if quiet else [])]) == 0
    err = capsys.readouterr().err
    message = ("dataset 'iwslt14': 3 pairs with an empty side skipped (option empty_lines='skip'): train 1, val 1, "
               "test 1")
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert message in summary["warnings"] and summary["data_notes"]["warnings"] == [message]
    assert "UserWarning" not in err and ".py:" not in err
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warned == ([] if quiet else [f"warning: r: {message}"]), err


def test_features_near_the_float32_limit_are_normalised_in_float64(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    v = rng.standard_normal(200)
    write(tmp_path, {"big.csv": "f,label\n" + "".join(f"{a * 1e37},{int(a > 0)}\n" for a in v)})
    s = load_splits("csv", str(tmp_path), options={"train": "big.csv"})
    assert s.std is not None and torch.isfinite(s.std).all() and 5e36 < float(s.std[0]) < 2e37
    x = s.train.x[:, 0]
    assert torch.isfinite(x).all() and abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05
    zero = -float(s.mean[0]) / float(s.std[0])  # where the raw feature crosses 0: the label's boundary
    assert ((x > zero).long() == s.train.y).all()  # still separable: a model can learn it


def test_channel_stats_in_float64_agree_with_float32_on_ordinary_data() -> None:
    x = torch.randn(300, 3, 4, 4) * torch.tensor([1.0, 5.0, 0.0]).view(1, 3, 1, 1) + 2.0
    mean, std = channel_stats(x)
    var32, mean32 = torch.var_mean(x, dim=[0, 2, 3], correction=0)
    assert mean.dtype == std.dtype == torch.float32
    assert torch.allclose(mean, mean32, atol=1e-5) and torch.allclose(std[:2], var32[:2].sqrt(), rtol=1e-5)
    assert float(std[2]) == 1.0  # a constant channel


def test_channel_stats_refuse_non_finite_inputs() -> None:
    x = torch.zeros(4, 2)
    x[1, 1] = float("inf")
    with pytest.raises(DataError, match="dataset 'd': the train inputs hold NaN or infinite values in channel 1"):
        channel_stats(x, "dataset 'd'")


def test_per_class_carving_draws_as_the_per_class_loop_did() -> None:
    """The sort-based grouping gives the very positions (and random draws) of the former per-class scan."""
    y = torch.randint(0, 7, (500,), generator=torch.Generator().manual_seed(3))
    y[y == 4] = 5  # an empty class in the middle
    ks = [3, 0, 10, 2, 0, 7, 1]

    def reference(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        taken, rest = [], []
        for c, k in enumerate(ks):
            idx = (y == c).nonzero().flatten()
            if len(idx):
                perm = idx[torch.randperm(len(idx), generator=g)]
                taken.append(perm[:k])
                rest.append(perm[k:])
        return torch.sort(torch.cat(rest)).values, torch.sort(torch.cat(taken)).values

    ours = take_per_class(y, ks, torch.Generator().manual_seed(0))
    theirs = reference(torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_the_default_image_budget_is_half_the_machine_memory(monkeypatch) -> None:
    monkeypatch.setattr(image_folder.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1024}[name])
    assert image_folder.memory_budget() == (2 * 1024**2, "budget (half this machine's memory: normalising copies "
                                                         "them)")
