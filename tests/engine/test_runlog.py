"""The run log: one JSON line per epoch, truncation on resume, an atomic summary."""

from __future__ import annotations

import json

from teachkit.engine.runlog import RunLog


def test_log_records_truncate_and_summary(tmp_path):
    log = RunLog(tmp_path)
    for epoch in (1, 2, 3):
        log.log({"epoch": epoch, "train": {"loss": 1.0 / epoch}, "val": {"acc": 10.0 * epoch}})
    assert [r["epoch"] for r in log.records()] == [1, 2, 3]
    kept = log.truncate(2)  # a crash after epoch 2's checkpoint but before its successor's
    assert [r["epoch"] for r in kept] == [1, 2] and [r["epoch"] for r in RunLog(tmp_path).records()] == [1, 2]
    log.log({"epoch": 3, "val": {"acc": 33.0}})
    assert [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    log.summary({"val_acc": 33.0})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"val_acc": 33.0}
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files
    log.close()


def test_empty_folder_has_no_records(tmp_path):
    assert RunLog(tmp_path).records() == [] and RunLog(tmp_path).truncate(5) == []


def test_a_line_cut_short_by_a_kill_is_dropped_and_corruption_elsewhere_named(tmp_path):
    import pytest

    from teachkit.errors import CheckpointError

    log = RunLog(tmp_path)
    log.log({"epoch": 1})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "val": {"ac')  # killed while appending
    assert [r["epoch"] for r in log.truncate(1)] == [1]
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 3}\n')
    with pytest.raises(CheckpointError, match="metrics.jsonl' is corrupt at line 2"):
        log.records()
