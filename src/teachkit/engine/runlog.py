"""Run folder: resolved config, metrics.jsonl, optional TensorBoard events, summary.json.

``metrics.jsonl`` holds one JSON line per finished epoch. An epoch's line is appended after its ``last``
checkpoint, and that checkpoint also stores the line's record, so a kill between the two is repaired on
resume (:meth:`RunLog.repair`): the log is rewritten to exactly the epochs the checkpoint has seen. Every
write failure (disk full, read-only folder) is a one-line :class:`~teachkit.engine.checkpoint.WriteError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from teachkit.engine.checkpoint import atomic_write, os_reason, write_error, write_json
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
            try:
                self.writer = SummaryWriter(str(run_dir / "tensorboard"))
            except OSError as e:
                raise write_error(run_dir / "tensorboard", e) from None

    def records(self) -> list[dict]:
        """The epoch records; a last line cut short by a kill is dropped (the epoch's checkpoint holds its
        record, so resuming rewrites it), any other unreadable line is a CheckpointError."""
        if not self.path.is_file():
            return []
        try:
            text = self.path.read_text(errors="replace")
        except OSError as e:
            raise CheckpointError(f"run log {str(self.path)!r} cannot be read: {os_reason(e)}") from None
        lines = [line for line in text.splitlines() if line.strip()]
        out = []
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break
                record = None
            if not (isinstance(record, dict) and type(record.get("epoch")) is int):
                raise CheckpointError(f"run log {str(self.path)!r} is corrupt at line {i + 1}")
            out.append(record)
        return out

    def _rewrite(self, records: list[dict]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in records)
        try:
            if self.path.is_file() and self.path.read_text(errors="replace") == text:
                return
        except OSError:
            pass
        atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))

    def truncate(self, last_epoch: int) -> list[dict]:
        """Keep only epochs <= ``last_epoch`` (on resume after a crash mid-epoch)."""
        return self.repair(last_epoch)

    def repair(self, last_epoch: int, last_record: dict[str, Any] | None = None) -> list[dict]:
        """Make the log agree with a checkpoint after ``last_epoch`` epochs: drop lines of later epochs (written
        before a kill, their checkpoint lost) and duplicates, and put back ``last_record`` (the epoch's record the
        checkpoint stores) when the kill came between the checkpoint and its line. Returns the records."""
        by_epoch: dict[int, dict] = {}
        for r in self.records():
            if r["epoch"] <= last_epoch:
                by_epoch[r["epoch"]] = r  # a repeated epoch (re-run after a kill): the later line wins
        added = None
        if last_record is not None and last_epoch > 0 and by_epoch.get(last_epoch) != last_record:
            by_epoch[last_epoch] = added = last_record
        kept = [by_epoch[e] for e in sorted(by_epoch)]
        if kept or self.path.exists():
            self._rewrite(kept)
        if added is not None:
            self._mirror(added)
        return kept

    def reset(self) -> None:
        """Forget every record (a run that starts from epoch 0)."""
        if self.path.exists():
            self._rewrite([])

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line (and to TensorBoard)."""
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise write_error(self.path, e) from None
        self._mirror(record)

    def _mirror(self, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        try:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "epoch":
                    self.writer.add_scalar(key, value, record["epoch"])
                elif isinstance(value, dict):
                    for k, v in value.items():
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            self.writer.add_scalar(f"{key}/{k}", v, record["epoch"])
            self.writer.flush()
        except OSError as e:
            raise write_error(self.run_dir / "tensorboard", e) from None

    def summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically."""
        write_json(self.run_dir / "summary.json", summary)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
