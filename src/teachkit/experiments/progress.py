"""The ``runs:`` progress of a study (the demos): a live bar in a terminal, one line per finished run elsewhere.

Redirected to a log file (nohup, SLURM, CI), a carriage-return bar leaves one line of dozens of updates; there
each finished run prints ``run 3/42  seed0-no-kd  test acc 88.20%  4.1s  (elapsed 12s)`` on its own line instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm.auto import tqdm


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for files, pipes, closed or replaced streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _elapsed(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_line(summary: dict[str, Any]) -> str:
    """``test acc 88.20%  4.1s``: a run's selection metric on test (last epoch) and its wall time."""
    metric = summary.get("select_metric", "acc")
    value = summary.get(f"test_{metric}")
    percent = summary.get("select_metric_percent", metric == "acc")
    shown = "n/a" if not isinstance(value, (int, float)) else f"{value:.2f}%" if percent else f"{value:.4g}"
    wall = summary.get("cost", {}).get("wall_time_s", summary.get("wall_time_s"))
    took = f"  {wall:.1f}s" if isinstance(wall, (int, float)) else ""
    return f"test {metric} {shown}{took}"


class RunsProgress:
    """``done(name, summary)`` after each run: advances a bar on a terminal, else prints one line to ``stream``
    (stdout by default; ``tty`` overrides the terminal check)."""

    def __init__(self, total: int, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.total, self.count = total, 0
        self.stream = stream if stream is not None else sys.stdout
        self.tty = is_terminal(self.stream) if tty is None else tty
        self.started = time.perf_counter()
        self.bar = tqdm(total=total, desc="runs", dynamic_ncols=True) if self.tty else None

    def done(self, name: str, summary: dict[str, Any]) -> None:
        """Count one finished run ``name`` with its ``summary``."""
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
            return
        elapsed = _elapsed(time.perf_counter() - self.started)
        print(f"run {self.count}/{self.total}  {name}  {run_line(summary)}  (elapsed {elapsed})", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
