"""Safe, atomic checkpoints and training trajectories.

A checkpoint is one ``.safetensors`` file (all tensors: weights, optimiser buffers, RNG state as
uint8) whose metadata carries the JSON state and a sha256 of its own content (the state and every
tensor), plus a ``.json`` sidecar with the same state and the file's sha256. Files are written to a
temporary name and renamed into place, so a crash never leaves a half-written checkpoint under the real
name; a kill between the file's rename and its sidecar's leaves a stale sidecar, which the file's own
digest recognises (the file is accepted and the sidecar rewritten). Nothing is ever unpickled.

Every write goes through :func:`atomic_write`, which turns an ``OSError`` (disk full, read-only folder, a file
where a folder should be) into a one-line :class:`WriteError` naming the file and the system's reason; the
previous version of the file is untouched. Files get the mode ``open`` would give them (0666 without the
umask's bits), folders 0777 without them. A kill can leave a temporary ``.NAME.XXXX.tmp`` beside the file:
:func:`remove_temporary_files` sweeps them when a run folder is reopened.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from teachkit.errors import CheckpointError, WriteError
from teachkit.options import short_repr

STATE_KEY = "teachkit_state"
DIGEST_KEY = "teachkit_content_sha256"
TMP_SUFFIX = ".tmp"


def os_reason(e: OSError) -> str:
    """The system's reason of an OSError in a few words (``No space left on device``)."""
    if e.errno is not None:
        return os.strerror(e.errno)
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def write_error(path: str | Path, e: OSError) -> WriteError:
    """``cannot write 'PATH': REASON`` as a :class:`WriteError`; a read-only filesystem or a missing permission
    says where to look."""
    return WriteError(f"cannot write {str(path)!r}: {os_reason(e)}{write_hint(e.errno, path)}")


def write_hint(code: int | None, path: str | Path) -> str:
    """What to do about a write that failed with ``errno`` ``code`` (``""`` when there is nothing to say)."""
    if code == errno.EROFS:
        return " (the filesystem holding it is mounted read-only; choose out_dir on a writable disk)"
    if code in (errno.EACCES, errno.EPERM):
        return f" (no permission to write in {str(Path(path).parent)!r}; check its owner and mode, or out_dir)"
    return ""


def not_writable_reason(folder: str | Path) -> tuple[int, str]:
    """Why ``folder`` cannot be written, for a folder ``os.access`` refused: ``(EROFS, 'Read-only file
    system')`` on a read-only mount, else ``(EACCES, 'Permission denied')``."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows) or the folder vanished
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    return code, os.strerror(code)


def _umask_from_proc() -> int | None:
    """The process's umask from ``/proc/self/status`` (Linux >= 4.7); None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_at_import() -> int:
    mask = os.umask(0o022)  # read by setting it: done once, at import, before any thread writes files
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_from_proc()
if _UMASK_AT_IMPORT is None:
    _UMASK_AT_IMPORT = _umask_at_import()


def current_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status``); where that is unavailable, the
    umask the process had when teachkit was imported."""
    mask = _umask_from_proc()
    return _UMASK_AT_IMPORT if mask is None else mask


def file_mode() -> int:
    """The mode a new file gets from ``open``: 0666 without the umask's bits (0644 under umask 022)."""
    return 0o666 & ~current_umask()


def _as_os_error(e: Exception) -> OSError | None:
    """The OSError inside a safetensors I/O failure (``... I/O error: File too large (os error 27)``)."""
    m = re.search(r"os error (\d+)", str(e))
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``; an OSError (disk full,
    read-only folder, ...) is a one-line :class:`WriteError` naming ``path``, and ``path`` keeps its
    previous content."""
    path = Path(path)
    tmp = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a folder should be
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from None
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, file_mode())  # mkstemp makes it 0600: give it the mode `open` would (the umask's)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise write_error(path, e) from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str | None) -> None:
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def remove_temporary_files(folder: str | Path) -> list[Path]:
    """Delete the temporary files (``*.tmp``) a kill left anywhere under ``folder``; return them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for tmp in folder.rglob(f"*{TMP_SUFFIX}"):
        if tmp.is_file() and not tmp.is_symlink():
            try:
                tmp.unlink()
            except OSError as e:
                raise write_error(tmp, e) from None
            removed.append(tmp)
    return removed


def write_json(path: str | Path, obj: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")

    atomic_write(path, write)


def content_digest(state_json: str, tensors: dict[str, Tensor]) -> str:
    """sha256 of a checkpoint's content: its state JSON and every tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256(state_json.encode())
    for key in sorted(tensors):
        t = tensors[key].detach().to("cpu").contiguous()
        h.update(f"\0{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: str | Path, tensors: dict[str, Tensor], state: dict[str, Any]) -> str:
    """Write ``tensors`` + JSON ``state`` atomically; return the file's sha256."""
    path = Path(path)
    flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    state_json = json.dumps(state)
    meta = {STATE_KEY: state_json, DIGEST_KEY: content_digest(state_json, flat)}

    def write(tmp: str) -> None:
        try:
            save_file(flat, tmp, metadata=meta)
        except SafetensorError as e:  # an I/O failure inside safetensors is not an OSError
            os_error = _as_os_error(e)
            if os_error is None:
                raise
            raise os_error from None

    atomic_write(path, write)
    digest = sha256_file(path)
    write_json(path.with_suffix(".json"), {**state, "file": path.name, "sha256": digest})
    return digest


def _read(path: Path, verify: bool = True) -> tuple[dict[str, Tensor], dict, bool | None]:
    """(tensors, state, whether the content digest matches; None for files written without one, or when
    ``verify`` is False because the file's sha256 was already checked)."""
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        state_json = meta.get(STATE_KEY, "{}")
        state = json.loads(state_json)
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as e:
        reason = os_reason(e) if isinstance(e, OSError) else (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable ({reason})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a teachkit checkpoint (its state is a "
                              f"{type(state).__name__}, not a mapping)")
    digest = meta.get(DIGEST_KEY)
    if not verify or digest is None:
        return tensors, state, None
    return tensors, state, digest == content_digest(state_json, tensors)


def _sidecar_sha256(path: Path, sidecar: Path) -> str | None:
    """The sha256 the JSON ``sidecar`` of checkpoint ``path`` records; a one-line CheckpointError saying what the
    sidecar holds when it is not a mapping with a ``sha256`` string (without a sidecar, the file's own content
    digest vouches for it; the next save writes a new one)."""
    fix = "delete it and the checkpoint's own digest is checked instead"
    try:
        data = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint sidecar {str(sidecar)!r} is not valid JSON (expected a mapping with "
                              f"the sha256 of {path.name!r}); {fix}") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint sidecar {str(sidecar)!r} cannot be read: {os_reason(e)}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint sidecar {str(sidecar)!r} holds a JSON {_json_kind(data)}, not a mapping "
                              f"with the sha256 of {path.name!r}; {fix}")
    digest = data.get("sha256")
    if digest is not None and not isinstance(digest, str):
        raise CheckpointError(f"checkpoint sidecar {str(sidecar)!r} has sha256={short_repr(digest, 40)}, not a "
                              f"hex digest string; {fix}")
    return digest


def _json_kind(value: Any) -> str:
    """How JSON names the type of a parsed value (``array``, ``string``, ``number``...)."""
    if isinstance(value, list):
        return f"array of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return {str: "string", int: "number", float: "number"}.get(type(value), type(value).__name__)


def load_checkpoint(path: str | Path, expect_sha256: str | None = None) -> tuple[dict[str, Tensor], dict]:
    """Read a checkpoint, verifying its sha256 against ``expect_sha256`` (a trajectory manifest's) or the JSON
    sidecar's, and its content digest. A sidecar left stale by a kill between the file's rename and its own
    (the file's content digest intact) is rewritten; any other mismatch is a one-line CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    bad = CheckpointError(f"checkpoint {str(path)!r} fails its sha256 check (truncated or modified)")
    sidecar = path.with_suffix(".json")
    from_sidecar = expect_sha256 is None and sidecar.is_file()
    if from_sidecar:
        expect_sha256 = _sidecar_sha256(path, sidecar)
    try:
        actual = sha256_file(path) if expect_sha256 is not None else None
    except OSError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {os_reason(e)}") from None
    if actual is not None and actual != expect_sha256:
        try:
            tensors, state, intact = _read(path)
        except CheckpointError:
            raise bad from None
        if not (from_sidecar and intact):
            raise bad
        write_json(sidecar, {**state, "file": path.name, "sha256": actual})  # the sidecar was stale
        return tensors, state
    tensors, state, intact = _read(path, verify=actual is None)  # a matching sha256 already vouches for it
    if intact is False:
        raise bad
    return tensors, state


def _keys(text: str, limit: int = 3) -> str:
    keys = re.findall(r'"([^"]*)"', text)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def describe_mismatch(e: BaseException, limit: int = 3) -> str:
    """A ``load_state_dict`` (or optimiser) failure in one line of whole items: missing and unexpected keys
    (the first few, then a count) and size mismatches, never cut in the middle of a word."""
    if isinstance(e, KeyError) and e.args:
        return f"missing {e.args[0]}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if not lines[0].startswith("Error(s) in loading state_dict"):
        return lines[0]
    parts = []
    for line in lines[1:]:
        size = re.match(r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[.*?\])\) from "
                        r"checkpoint, the shape in current model is torch\.Size\((\[.*?\])\)", line)
        if size:
            parts.append(f"{size.group(1)} has shape {size.group(2)} in the checkpoint but {size.group(3)} here")
        elif line.startswith("Missing key(s)"):
            parts.append(f"missing {_keys(line)}")
        elif line.startswith("Unexpected key(s)"):
            parts.append(f"unexpected {_keys(line)}")
        else:
            parts.append(line.rstrip("."))
    more = f"; and {len(parts) - limit} more" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def prefixed(prefix: str, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{prefix}{k}": v for k, v in tensors.items()}


def strip(prefix: str, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def optimizer_to_flat(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """An optimiser state_dict as (tensors, JSON-able structure) without pickle."""
    sd = opt.state_dict()
    tensors: dict[str, Tensor] = {}
    state_json: dict[str, dict] = {}
    for idx, st in sd["state"].items():
        entry = {}
        for key, val in st.items():
            if isinstance(val, Tensor):
                tensors[f"optim/{idx}/{key}"] = val
                entry[key] = "<tensor>"
            else:
                entry[key] = val
        state_json[str(idx)] = entry
    return tensors, {"state": state_json, "param_groups": sd["param_groups"]}


def optimizer_from_flat(opt: torch.optim.Optimizer, tensors: dict[str, Tensor], structure: dict) -> None:
    state = {}
    for idx, entry in structure["state"].items():
        state[int(idx)] = {k: (tensors[f"optim/{idx}/{k}"] if v == "<tensor>" else v) for k, v in entry.items()}
    # the kernels (foreach, fused) stay this run's optim.implementation, not the saving run's: same state either way
    kernels = [{k: g[k] for k in ("foreach", "fused") if k in g} for g in opt.param_groups]
    opt.load_state_dict({"state": state, "param_groups": structure["param_groups"]})
    for group, kept in zip(opt.param_groups, kernels, strict=False):
        group.update(kept)


class Trajectory:
    """A folder of per-epoch weight checkpoints plus ``trajectory.json`` (epoch, val_acc, file, sha256).

    Written by any run with ``train.save_every=k``; read by Pro-KD replay, RCO and checkpoint search.
    """

    MANIFEST = "trajectory.json"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.entries: list[dict] = []
        manifest = self.folder / self.MANIFEST
        if manifest.is_file():
            try:
                entries = json.loads(manifest.read_text())["checkpoints"]
                ok = isinstance(entries, list) and all(
                    isinstance(e, dict) and type(e.get("epoch")) is int and isinstance(e.get("file"), str)
                    and isinstance(e.get("sha256"), str) for e in entries)
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                ok = False
            except OSError as e:
                raise CheckpointError(f"trajectory manifest {str(manifest)!r} cannot be read: {os_reason(e)}") \
                    from None
            if not ok:
                raise CheckpointError(f"trajectory manifest {str(manifest)!r} is malformed")
            self.entries = entries

    @staticmethod
    def file_name(epoch: int) -> str:
        """The checkpoint file of ``epoch`` inside the trajectory folder."""
        return f"epoch_{epoch:04d}.safetensors"

    def add(self, epoch: int, val: Mapping[str, float], tensors: dict[str, Tensor], state: dict) -> None:
        """Save the weights after ``epoch`` and list them with their validation metrics (``val_acc``, ...)."""
        name = self.file_name(epoch)
        digest = save_checkpoint(self.folder / name, tensors, state)
        self.entries = [e for e in self.entries if e["epoch"] != epoch]
        self.entries.append({"epoch": epoch, **{f"val_{k}": v for k, v in val.items()}, "file": name,
                             "sha256": digest})
        self.entries.sort(key=lambda e: e["epoch"])
        write_json(self.folder / self.MANIFEST, {"checkpoints": self.entries})

    def _inside(self, name: str) -> Path:
        """``folder/name``, refused when the manifest's file name points outside the trajectory folder."""
        file = self.folder / name
        if file.resolve().parent != self.folder.resolve():
            raise CheckpointError(f"trajectory manifest {str(self.folder / self.MANIFEST)!r} lists {name!r}, which is "
                                  "not a file of its folder")
        return file

    def path(self, epoch: int) -> Path:
        """The file holding the checkpoint after ``epoch`` (a CheckpointError when there is none)."""
        for e in self.entries:
            if e["epoch"] == epoch:
                return self._inside(e["file"])
        raise CheckpointError(f"trajectory {str(self.folder)!r} has no checkpoint for epoch {epoch}")

    @property
    def epochs(self) -> list[int]:
        return [e["epoch"] for e in self.entries]

    def truncate(self, last_epoch: int) -> None:
        """Forget entries after ``last_epoch`` (used on resume)."""
        self.entries = [e for e in self.entries if e["epoch"] <= last_epoch]
        if self.folder.exists():
            write_json(self.folder / self.MANIFEST, {"checkpoints": self.entries})

    def load(self, epoch: int) -> tuple[dict[str, Tensor], dict]:
        for e in self.entries:
            if e["epoch"] == epoch:
                return load_checkpoint(self._inside(e["file"]), expect_sha256=e["sha256"])
        raise CheckpointError(f"trajectory {str(self.folder)!r} has no checkpoint for epoch {epoch}")

    def __len__(self) -> int:
        return len(self.entries)
