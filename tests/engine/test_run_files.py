"""Run files: the modes they are written with (the umask's), what a failed write says, what a malformed checkpoint
sidecar says."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from teachkit.engine import checkpoint
from teachkit.engine.checkpoint import atomic_write, current_umask, load_checkpoint, save_checkpoint, write_json
from teachkit.engine.runlog import RunLog
from teachkit.errors import CheckpointError, WriteError
from teachkit.recipes import train_model


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of every file and folder under ``root`` (itself included)."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return out


@pytest.mark.parametrize("mask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                          (0o002, 0o664, 0o775)])
def test_run_files_and_folders_follow_the_umask(tiny, tmp_path, mask, file_mode, folder_mode):
    with umask(mask):
        assert current_umask() == mask
        result = train_model(tiny(name="m", train={"epochs": 1, "save_every": 1, "progress": False}))
    found = modes(result.run_dir)
    for name in ("config.yaml", "summary.json", "metrics.jsonl", "checkpoints/last.safetensors",
                 "checkpoints/last.json", "checkpoints/best.safetensors", "trajectory/trajectory.json",
                 "trajectory/epoch_0001.safetensors"):
        assert found.pop(name) == file_mode, name
    for name in (".", "checkpoints", "trajectory"):
        assert found.pop(name) == folder_mode, name
    assert all(mode == file_mode for mode in found.values()), found  # anything else written there too


def test_atomic_write_gives_the_mode_open_would(tmp_path):
    with umask(0o027):
        write_json(tmp_path / "a" / "s.json", {"x": 1})
        with open(tmp_path / "plain", "w") as f:
            f.write("x")
    assert stat.S_IMODE((tmp_path / "a" / "s.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o750


def test_the_umask_falls_back_to_the_one_read_at_import(monkeypatch):
    monkeypatch.setattr(checkpoint, "_umask_from_proc", lambda: None)
    monkeypatch.setattr(checkpoint, "_UMASK_AT_IMPORT", 0o027)
    assert current_umask() == 0o027 and checkpoint.file_mode() == 0o640


# ----------------------------------------------------------------------------- failed writes name the file


def fail_with(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code, fragment", [
    (errno.EROFS, "Read-only file system (the filesystem holding it is mounted read-only; choose out_dir on a "
                  "writable disk)"),
    (errno.EACCES, "Permission denied (no permission to write in '{tmp}'; check its owner and mode, or out_dir)"),
    (errno.ENOSPC, "No space left on device"),
])
def test_a_failed_write_names_the_file_and_why(tmp_path, monkeypatch, code, fragment):
    path = tmp_path / "summary.json"
    path.write_text("{}")
    monkeypatch.setattr(checkpoint.os, "replace", fail_with(code))
    with pytest.raises(WriteError) as e:
        write_json(path, {"x": 1})
    assert str(e.value) == f"cannot write {str(path)!r}: " + fragment.replace("{tmp}", str(tmp_path))
    assert path.read_text() == "{}" and not list(tmp_path.glob("*.tmp"))


def test_a_read_only_filesystem_names_the_file_when_the_temporary_file_cannot_be_made(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", fail_with(errno.EROFS))
    with pytest.raises(WriteError, match=r"^cannot write '.*checkpoints/last.safetensors': Read-only file system "
                                         r"\(the filesystem holding it is mounted read-only"):
        save_checkpoint(tmp_path / "checkpoints" / "last.safetensors", {"w": torch.ones(2)}, {"epoch": 1})


def test_appending_the_metrics_line_on_a_read_only_filesystem(tmp_path, monkeypatch):
    log = RunLog(tmp_path)
    monkeypatch.setattr("builtins.open", fail_with(errno.EROFS))
    with pytest.raises(WriteError, match=r"^cannot write '.*metrics.jsonl': Read-only file system \(the filesystem"):
        log.log({"epoch": 1})


def test_a_read_only_out_dir_is_not_called_permission_denied(tiny, tmp_path, monkeypatch):
    from teachkit.recipes import context

    (tmp_path / "runs").mkdir()
    monkeypatch.setattr(context.os, "access", lambda path, mode: False)
    real = os.statvfs

    class ReadOnly:
        def __init__(self, result: os.statvfs_result) -> None:
            self.f_flag = result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(checkpoint.os, "statvfs", lambda p: ReadOnly(real(p)))
    with pytest.raises(context.ConfigError) as e:
        context.RunContext.open(tiny())
    assert str(e.value) == (f"cannot write in folder {str(tmp_path / 'runs')!r}: Read-only file system (its "
                            "filesystem is mounted read-only; check out_dir)")


# ----------------------------------------------------------------------------- checkpoint sidecars


@pytest.mark.parametrize("sidecar, fragment", [
    ('["0123abcd"]', "holds a JSON array of 1 item, not a mapping with the sha256 of 'c.safetensors'"),
    ('[]', "holds a JSON array of 0 items, not a mapping"),
    ('"0123abcd"', "holds a JSON string, not a mapping"),
    ("12", "holds a JSON number, not a mapping"),
    ("null", "holds a JSON null, not a mapping"),
    ('{"sha256": 12}', "has sha256=12, not a hex digest string"),
    ("{not json", "is not valid JSON (expected a mapping with the sha256 of 'c.safetensors')"),
])
def test_a_malformed_sidecar_says_what_it_holds(tmp_path, sidecar, fragment):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": torch.ones(3)}, {"epoch": 1})
    path.with_suffix(".json").write_text(sidecar)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert message.startswith(f"checkpoint sidecar {str(path.with_suffix('.json'))!r} ") and "\n" not in message
    assert fragment in message and message.endswith("delete it and the checkpoint's own digest is checked instead")
    path.with_suffix(".json").unlink()  # the advice works
    assert load_checkpoint(path)[1] == {"epoch": 1}


def test_atomic_write_of_a_file_under_a_file_names_it(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(WriteError, match=r"^cannot write '.*f/c.json': Not a directory$"):
        atomic_write(tmp_path / "f" / "c.json", lambda tmp: Path(tmp).write_text("{}"))


def test_sidecar_rewritten_after_a_stale_one_keeps_the_mode(tmp_path):
    with umask(0o022):
        path = tmp_path / "c.safetensors"
        save_checkpoint(path, {"w": torch.ones(3)}, {"epoch": 1})
        side = json.loads(path.with_suffix(".json").read_text())
        path.with_suffix(".json").write_text(json.dumps({**side, "sha256": "0" * 64}))
        load_checkpoint(path)  # stale sidecar: rewritten
    assert stat.S_IMODE(path.with_suffix(".json").stat().st_mode) == 0o644
