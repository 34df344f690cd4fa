"""The demos' ``runs:`` progress: one line per finished run outside a terminal (never carriage returns), the
bar in a terminal; the paired-seed studies report each run's name and summary."""

from __future__ import annotations

import io
import re
from pathlib import Path

from teachkit.experiments.paired import paired_seed_runs
from teachkit.experiments.progress import RunsProgress
from teachkit.recipes.common import RunResult

LINE = re.compile(r"^run (\d+)/3  (\S+)  test (\w+) (\S+)  ([0-9.]+)s  \(elapsed \d+s\)$")


def test_one_line_per_run_outside_a_terminal():
    out = io.StringIO()
    progress = RunsProgress(3, stream=out)
    assert not progress.tty and progress.bar is None
    progress.done("seed0-teacher-ce", {"select_metric": "acc", "test_acc": 88.2049, "wall_time_s": 4.06})
    progress.done("seed0-no-kd", {"select_metric": "bleu", "select_metric_percent": False, "test_bleu": 23.456,
                                  "wall_time_s": 1.0, "cost": {"wall_time_s": 12.5}})
    progress.done("seed0-kd", {"select_metric": "acc", "wall_time_s": 2.0})  # no test figure: said so
    progress.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = [LINE.match(line).groups() for line in text.splitlines()]
    assert lines == [("1", "seed0-teacher-ce", "acc", "88.20%", "4.1"), ("2", "seed0-no-kd", "bleu", "23.46", "12.5"),
                     ("3", "seed0-kd", "acc", "n/a", "2.0")]


def test_a_terminal_gets_the_bar_and_no_lines():
    out = io.StringIO()
    progress = RunsProgress(2, stream=out, tty=True)
    progress.done("a", {"test_acc": 50.0})
    assert progress.bar is not None and progress.bar.n == 1
    progress.close()
    assert out.getvalue() == ""


def test_paired_seed_runs_report_name_and_summary(tmp_path, tiny):
    seen = []

    def method(value):
        def run(cfg, run_dir: Path) -> RunResult:
            return RunResult(run_dir, {"test_acc": value + cfg.train.seed}, None, [{"val": {"acc": value}}])
        return run

    runs, _ = paired_seed_runs(tiny(), {"a": method(10.0), "b": method(20.0)}, 2, tmp_path, "acc",
                               lambda name, summary: seen.append((name, summary["test_acc"])))
    assert seen == [("seed0-a", 10.0), ("seed0-b", 20.0), ("seed1-a", 11.0), ("seed1-b", 21.0)]
    assert [r["test_acc"] for r in runs["b"]] == [20.0, 21.0]
