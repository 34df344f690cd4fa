"""A teacher-cache file whose row count differs from the transfer set is stale: rebuilt, with one warning line,
and the student trains exactly as with a fresh cache (it used to fail with an IndexError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from teachkit.cli import main
from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.recipes import train_model
from tests.conftest import tiny_config, untimed


def test_a_cache_with_the_wrong_row_count_is_rebuilt_with_one_warning(tmp_path: Path, tiny,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    teacher = train_model(tiny(name="teacher", train={"epochs": 1, "progress": False}))
    student = {"kd": {"method": "kd"}, "train": {"epochs": 1, "progress": True},
               "teacher": {"checkpoint": str(teacher.run_dir)}}
    for name in ("fresh", "again"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, name=name, **student)))
    assert main(["distill", str(tmp_path / "fresh.yaml")]) == 0
    fresh = json.loads((tmp_path / "runs" / "fresh" / "summary.json").read_text())
    path = Path(fresh["teacher_cache"]["file"])
    tensors, state = load_checkpoint(path)
    rows = int(tensors["logits"].shape[0])
    save_checkpoint(path, {"logits": tensors["logits"][:-5].clone()}, state)  # same key, verifies, 5 rows short
    capsys.readouterr()

    assert main(["distill", str(tmp_path / "again.yaml")]) == 0
    err = capsys.readouterr().err
    again = json.loads((tmp_path / "runs" / "again" / "summary.json").read_text())
    message = (f"teacher cache {str(path)!r} holds {rows - 5:,} rows but the transfer set has {rows:,} samples; "
               "treated as stale and rebuilt")
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [f"warning: again: {message}"]
    assert again["warnings"] == [message] and again["teacher_cache"]["status"] == "computed"
    assert load_checkpoint(path)[0]["logits"].shape[0] == rows  # rewritten whole
    ignored = {"name", "warnings", "wall_time_s", "cost"}
    assert {k: v for k, v in untimed(again).items() if k not in ignored} == \
        {k: v for k, v in untimed(fresh).items() if k not in ignored}  # the same numbers as the fresh run
    a, b = (load_checkpoint(tmp_path / "runs" / n / "checkpoints" / "last.safetensors")[0] for n in ("fresh", "again"))
    assert all(torch.equal(a[k], b[k]) for k in a)
