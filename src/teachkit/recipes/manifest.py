"""A recorded teacher trajectory, validated before any recipe trusts it.

``trajectory/trajectory.json`` (written by :class:`~teachkit.engine.Trajectory`) must be an object with a
``checkpoints`` list of ``{"epoch": int >= 0, "file": str, "sha256": 64 hex digits, ...}`` entries, epochs
unique, each file inside the trajectory folder (no absolute paths, ``..`` or links leading out), present,
and a checkpoint of the same model, shapes and data as the others (read from the safetensors header only; the
sha256 is verified when a checkpoint is loaded). Anything else is a one-line CheckpointError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from teachkit.engine import Trajectory
from teachkit.engine.checkpoint import STATE_KEY, load_checkpoint
from teachkit.errors import CheckpointError
from teachkit.options import short_repr

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: what every checkpoint of one trajectory must share
IDENTITY_KEYS = ("model", "input_shape", "num_classes", "data")


def peek_state(path: Path, sha256: str) -> dict[str, Any]:
    """A checkpoint's JSON state from its safetensors header (no tensors read, nothing hashed). A file whose
    header cannot be read is checked against ``sha256`` so that the error says what happened."""
    try:
        with safe_open(str(path), framework="pt") as f:
            state = json.loads((f.metadata() or {}).get(STATE_KEY, "{}"))
    except (SafetensorError, OSError, ValueError):
        load_checkpoint(path, expect_sha256=sha256)  # raises "fails its sha256 check" for a modified file
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} holds no teachkit state")
    return state


def validate_entries(folder: Path, doc: Any) -> list[dict[str, Any]]:
    """The manifest's entries, checked for types, unique epochs and files inside ``folder``."""
    where = f"trajectory manifest {str(folder / Trajectory.MANIFEST)!r}"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("checkpoints"), list):
        got = type(doc.get("checkpoints")).__name__ if isinstance(doc, Mapping) else type(doc).__name__
        raise CheckpointError(f"{where} must be an object whose 'checkpoints' is a list of entries; got {got}")
    root, seen = folder.resolve(), set()
    for i, entry in enumerate(doc["checkpoints"]):
        at = f"{where} entry {i}"
        if not isinstance(entry, Mapping):
            raise CheckpointError(f"{at} is {short_repr(entry)}, not an object with epoch, file and sha256")
        epoch, file, sha = entry.get("epoch"), entry.get("file"), entry.get("sha256")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise CheckpointError(f"{at}: epoch={short_repr(epoch)} is not an integer >= 0")
        if epoch in seen:
            raise CheckpointError(f"{at}: epoch {epoch} is listed twice")
        seen.add(epoch)
        if not isinstance(file, str) or not file:
            raise CheckpointError(f"{at}: file={short_repr(file)} is not a file name")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise CheckpointError(f"{at}: sha256={short_repr(sha)} is not a 64-digit hex digest")
        path = (folder / file).resolve()
        if path == root or not path.is_relative_to(root):
            raise CheckpointError(f"{at}: file {file!r} resolves outside its trajectory folder {str(folder)!r}")
        if not path.is_file():
            raise CheckpointError(f"{at}: checkpoint {str(folder / file)!r} does not exist")
    return list(doc["checkpoints"])


def read_trajectory(folder: str | Path) -> tuple[Trajectory, dict[str, Any]]:
    """The validated trajectory in ``folder`` (a run's ``trajectory/``) and its last checkpoint's state."""
    folder = Path(folder)
    manifest = folder / Trajectory.MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"no trajectory manifest {str(manifest)!r}: train the teacher with "
                              f"train.save_every=1 to record one")
    try:
        doc = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"trajectory manifest {str(manifest)!r} is not valid JSON") from None
    entries = validate_entries(folder, doc)
    if not entries:
        raise CheckpointError(f"trajectory {str(manifest)!r} lists no checkpoints")
    entries = sorted(entries, key=lambda e: e["epoch"])
    states = [peek_state(folder / e["file"], e["sha256"]) for e in entries]
    ref, ref_entry = states[-1], entries[-1]
    if any(key not in ref for key in ("model", "input_shape", "num_classes")):
        raise CheckpointError(f"checkpoint {str(folder / ref_entry['file'])!r} does not describe its model "
                              f"(not a teachkit checkpoint)")
    for entry, state in zip(entries, states, strict=True):
        for key in IDENTITY_KEYS:
            if state.get(key) != ref.get(key):
                raise CheckpointError(
                    f"trajectory manifest {str(manifest)!r}: epoch {entry['epoch']} ({entry['file']!r}) is a "
                    f"checkpoint with {key}={short_repr(state.get(key))}, not the trajectory's "
                    f"{short_repr(ref.get(key))} "
                    f"(epoch {ref_entry['epoch']}): another model's checkpoint")
    trajectory = Trajectory(folder)
    trajectory.entries = entries
    return trajectory, ref


__all__ = ["IDENTITY_KEYS", "peek_state", "read_trajectory", "validate_entries"]
