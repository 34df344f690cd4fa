"""One sweep job in its own process: ``python -m teachkit.experiments.sweep_job --recipe R --config F --lock L``.

Takes an exclusive lock on ``L`` (released when the process ends, however it ends), so a run folder is never
trained by two processes at once (a rerun while an orphaned job still runs); then runs recipe ``R`` on the
config file ``F`` with ``resume=True``: a new run starts, an interrupted one resumes exactly, a finished one
returns at once. Exit status: 0 done, 2 a user error (one line), 75 the run is busy elsewhere, 76 the sweep's
driver died (see below), anything else a crash (its traceback is in the job's log).

**A job never outlives its sweep.** With ``--driver FILE`` (the driver's heartbeat file, :class:`Heartbeat`) a
watcher thread (:class:`DriverWatch`) checks twice a second that the driver lives: on the driver's machine by its
pid (and start time: a reused pid is not the driver), elsewhere (a Ray node) by its heartbeat file, rewritten
every 2 s, going stale for 30 s; and on any machine that the job's parent (the fork server, the Ray worker) has
not exited. When one of them fails the job kills its own descendants and exits at once, as a ``kill -9`` would
(the run folder keeps its last finished epoch; a rerun resumes it). On Linux the job also asks for SIGTERM when
its parent dies (``PR_SET_PDEATHSIG``), and on SIGTERM kills its descendants before it dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from teachkit.errors import TeachkitError

BUSY = 75
#: exit status of a job that stopped because its sweep's driver died
ORPHANED = 76
#: the driver rewrites its heartbeat file this often (seconds)
HEARTBEAT_S = 2.0
#: a job on another machine than its driver stops when the driver's heartbeat has not changed for this long
STALE_S = 30.0
#: how often a job checks that its driver lives (seconds)
WATCH_S = 0.5


# ----------------------------------------------------------------------------- processes


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux ``PR_SET_PDEATHSIG``; a
    no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signum), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...), None where there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, Linux), None where unknown."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_alive(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie) and, where ``started`` is given and known, is the one that
    started then (not another process that reused the pid)."""
    if os.path.isdir("/proc/self"):
        fields = _proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X", "x"):
            return False
        return started is None or start_time(pid) in (None, started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from ``/proc`` (Linux; [] elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        fields = _proc_stat(int(name)) if name.isdigit() else None
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL every process below this one (data loader workers, anything a recipe started)."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _on_sigterm(signum: int, frame: Any) -> None:  # pragma: no cover - runs in a job process
    """SIGTERM (the sweep stopping the job, or its parent's death): take the descendants along, then die of it."""
    kill_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# ----------------------------------------------------------------------------- the driver's liveness


def node_id() -> str:
    """This machine and PID namespace: where a job's is its driver's, the driver's pid can be checked directly."""
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return "/".join(parts)


class Heartbeat:
    """The driver's side: a file naming the driver (pid, start time, machine) and a beat count, rewritten every
    ``interval`` seconds by a thread while the driver lives, removed when it stops (a context manager)."""

    def __init__(self, file: Path, interval: float = HEARTBEAT_S) -> None:
        self.file, self.interval = Path(file), interval
        self.identity = {"pid": os.getpid(), "start": start_time(os.getpid()), "node": node_id(),
                         "host": socket.gethostname()}
        self._beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Rewrite the file (atomically: a reader sees the old or the new text); a failed write is skipped."""
        self._beats += 1
        text = json.dumps({**self.identity, "beat": self._beats, "time": time.time()})
        tmp = self.file.with_name(f".{self.file.name}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, self.file)
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def __enter__(self) -> Heartbeat:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.beat()
        self._thread = threading.Thread(target=self._run, name="teachkit-sweep-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.file.unlink()
        except OSError:
            pass


class DriverWatch:
    """The job's side: :meth:`gone` says why the job's driver (named by its heartbeat ``file``) or the job's
    parent is gone, or None while both live."""

    def __init__(self, file: str | Path | None, stale_s: float = STALE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ppid = os.getppid()
        self.file = Path(file) if file else None
        self.stale_s, self.clock = stale_s, clock
        self.last = self._read()
        self.changed = clock()
        self.driver: dict[str, Any] | None = None
        try:
            named = json.loads(self.last) if self.last else None
        except ValueError:
            named = None
        if isinstance(named, dict) and isinstance(named.get("pid"), int) and named["pid"] > 0:
            self.driver = named
        self.local = self.driver is not None and self.driver.get("node") == node_id()

    def _read(self) -> bytes | None:
        try:
            return self.file.read_bytes() if self.file else None
        except OSError:
            return None

    def gone(self) -> str | None:
        if self.ppid > 1 and os.getppid() != self.ppid:
            return f"its parent process (pid {self.ppid}) exited"
        if not self.driver:
            return None
        pid = self.driver["pid"]
        if self.local:
            return None if process_alive(pid, self.driver.get("start")) else f"the sweep's driver (pid {pid}) died"
        now, text = self.clock(), self._read()
        if text and text != self.last:
            self.last, self.changed = text, now
        elif now - self.changed > self.stale_s:
            return (f"the sweep's driver (pid {pid} on {self.driver.get('host')}) stopped its heartbeat "
                    f"{str(self.file)!r} {now - self.changed:.0f} s ago")
        return None


def watch_driver(watch: DriverWatch, interval: float = WATCH_S) -> threading.Thread:
    """Start a thread that ends this job (its descendants first) as soon as ``watch`` says its driver is gone."""

    def loop() -> None:  # pragma: no cover - ends the process
        while True:
            time.sleep(interval)
            try:
                reason = watch.gone()
            except (OSError, ValueError, TypeError):
                continue
            if reason:
                print(f"teachkit: {reason}: stopping this job (its run keeps its last finished epoch; rerun the "
                      f"sweep to resume it)", file=sys.stderr, flush=True)
                kill_descendants()
                os._exit(ORPHANED)

    thread = threading.Thread(target=loop, name="teachkit-driver-watch", daemon=True)
    thread.start()
    return thread


# ----------------------------------------------------------------------------- the job


def _lock(path: str) -> object | None:
    """An open file holding an exclusive lock on ``path``, or None when another process holds it."""
    import fcntl

    f = open(path, "a+")  # noqa: SIM115 - held for the process's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teachkit-sweep-job")
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--driver", default=None, help="the sweep driver's heartbeat file: stop when it dies")
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    die_with_parent()
    watch_driver(DriverWatch(args.driver))
    held = _lock(args.lock)
    if held is None:
        print(f"teachkit: error: another process is running this job (lock {args.lock}); wait for it or stop it",
              file=sys.stderr)
        return BUSY
    try:
        from teachkit.config import load_config
        from teachkit.recipes import RECIPES

        cfg = load_config(args.config, resume=True)
        result = RECIPES.get(args.recipe)(cfg, resume=True)
        s = result.summary
        m = s.get("select_metric", "acc")
        print(json.dumps({"run": str(result.run_dir), f"val_{m}": s.get(f"val_{m}"), f"test_{m}": s.get(f"test_{m}"),
                          f"test_{m}_at_best": s.get(f"test_{m}_at_best"), "wall_time_s": s.get("wall_time_s")}))
        return 0
    except TeachkitError as e:
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("teachkit: interrupted; the run keeps its last finished epoch", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
