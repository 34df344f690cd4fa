"""Run folder: resolved config, metrics.jsonl, optional TensorBoard events, summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from teachkit.engine.checkpoint import atomic_write, write_json
from teachkit.errors import CheckpointError


class RunLog:
    """Appends one JSON line per epoch to ``metrics.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = False) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # pragma: no cover - depends on the optional extra
                from teachkit.errors import ConfigError

                raise ConfigError("train.tensorboard=true needs tensorboard: pip install 'teachkit[tensorboard]'") \
                    from None
            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def records(self) -> list[dict]:
        """The epoch records; a last line cut short by a kill is dropped (the epoch's checkpoint was written
        before its line, so resuming rewrites it), any other unreadable line is a CheckpointError."""
        if not self.path.is_file():
            return []
        lines = [line for line in self.path.read_text(errors="replace").splitlines() if line.strip()]
        out = []
        for i, line in enumerate(lines):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break
                raise CheckpointError(f"run log {str(self.path)!r} is corrupt at line {i + 1}") from None
        return out

    def truncate(self, last_epoch: int) -> list[dict]:
        """Keep only epochs <= ``last_epoch`` (on resume after a crash mid-epoch)."""
        kept = [r for r in self.records() if r["epoch"] <= last_epoch]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))
        return kept

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "epoch":
                    self.writer.add_scalar(key, value, record["epoch"])
                elif isinstance(value, dict):
                    for k, v in value.items():
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            self.writer.add_scalar(f"{key}/{k}", v, record["epoch"])
            self.writer.flush()

    def summary(self, summary: dict[str, Any]) -> None:
        write_json(self.run_dir / "summary.json", summary)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
