"""Sweeps that cannot run or go wrong: teacher cycles and empty files refused when planning, a Ray address that
does not answer, failures shown under --quiet, a job killed by a signal, and jobs that stop when their driver
dies (a real driver killed with SIGKILL)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from teachkit import cli
from teachkit.errors import ConfigError
from teachkit.experiments.sweep import Progress, execute, failure_reason, log_tail, plan_sweep, print_outcome
from teachkit.experiments.sweep_backends import LocalBackend, _host_port, check_ray_address, connect_ray, log_header
from teachkit.experiments.sweep_job import DriverWatch, Heartbeat, descendants, process_alive
from tests.experiments.test_sweep import base, write_sweep

ROOT = Path(__file__).parents[2]


def one_error_line(capsys, argv: list[str]) -> str:
    """Run the CLI; assert exit status 2 and exactly one stderr line, ``teachkit: error: ...``; return it."""
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("teachkit: error: "), err
    return lines[0]


# ----------------------------------------------------------------------------- refused when planning


def test_runs_naming_each_other_as_teachers_are_a_cycle(tmp_path, capsys):
    runs = tmp_path / "runs" / "cyc"
    path = write_sweep(tmp_path, {"sweep": "cyc", "config": base(tmp_path), "recipe": "kd",
                                  "list": [{"label": "a", "teacher.checkpoint": str(runs / "b")},
                                           {"label": "b", "teacher.checkpoint": str(runs / "c" / "checkpoints")},
                                           {"label": "c", "teacher.checkpoint": str(runs / "a")},
                                           {"label": "free", "recipe": "train"}]})
    with pytest.raises(ConfigError, match=r"in a cycle, so none of them can start: 'a' -> 'b' -> 'c' -> 'a'"):
        plan_sweep(path)
    line = one_error_line(capsys, ["sweep", str(path)])
    assert "'a' -> 'b' -> 'c' -> 'a'" in line and "teacher.checkpoint" in line and "'free'" not in line
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.parametrize("text", ["", "# a sweep, some day\n\n# nothing yet\n", "{}\n", "sweep: s\nrecipe: train\n"],
                         ids=["0-bytes", "comments", "braces", "name-only"])
def test_a_sweep_file_without_runs_is_refused(tmp_path, capsys, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    line = one_error_line(capsys, ["sweep", str(path), "--out-dir", str(tmp_path / "runs")])
    assert f"sweep file '{path}' defines no runs" in line and "base: FILE" in line and "grid:" in line \
        and "list:" in line
    assert ("(it is empty)" in line) == (text != "sweep: s\nrecipe: train\n")
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- Ray


def test_a_ray_address_that_does_not_answer_fails_within_seconds(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # a closed port
    path = write_sweep(tmp_path, {"sweep": "r", "config": base(tmp_path), "recipe": "train"})
    started = time.monotonic()
    line = one_error_line(capsys, ["sweep", str(path), "--backend", "ray"])
    assert time.monotonic() - started < 20
    assert line.startswith("teachkit: error: RAY_ADDRESS='127.0.0.1:1' does not answer (connection refused within ")
    assert "unset it to run on a local Ray instance" in line


def test_ray_address_forms_and_bounded_connect():
    assert _host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert _host_port("ray://head.example:10001") == ("head.example", 10001)
    assert _host_port("[::1]:6379") == ("::1", 6379)
    assert _host_port("auto") is None and _host_port("local") is None
    check_ray_address("auto")  # left to Ray
    never = threading.Event()

    class Hangs:  # a port that accepts but is no Ray cluster: ray.init retries for minutes
        @staticmethod
        def init(**kwargs):
            never.wait(30)

    with pytest.raises(ConfigError, match=r"^RAY_ADDRESS='10.0.0.5:6379': Ray did not connect to it within 0.3 s"):
        connect_ray(Hangs, "10.0.0.5:6379", timeout=0.3)
    never.set()

    class Refuses:
        @staticmethod
        def init(**kwargs):
            raise ConnectionError("Could not find any running Ray instance.\nPlease start one")

    with pytest.raises(ConfigError, match=r"^RAY_ADDRESS='auto': Ray cannot connect to it: Could not find any "
                                          r"running Ray instance.$"):
        connect_ray(Refuses, "auto")


class FakeRay:
    """A stand-in for the ``ray`` module: a local cluster of ``num_cpus`` CPUs whose tasks end at once, failed
    (exit 1, nothing run); it counts the tasks in flight, as Ray would run them."""

    def __init__(self, gpus: float = 0.0) -> None:
        self.cpus, self.gpus, self.in_flight, self.most = 0.0, gpus, set(), 0

    def is_initialized(self) -> bool:
        return self.cpus > 0

    def init(self, num_cpus: int, **kwargs) -> None:
        self.cpus = float(num_cpus)

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def remote(self, function):
        fake = self

        class Task:
            def options(self, **kwargs):
                return self

            def remote(self, *args) -> object:
                ref = object()
                fake.in_flight.add(ref)
                fake.most = max(fake.most, len(fake.in_flight))
                return ref

        return Task()

    def wait(self, refs, num_returns: int, timeout: float):
        return list(refs), []

    def get(self, ref) -> int:
        self.in_flight.discard(ref)
        return 1

    def cancel(self, ref, force: bool = False) -> None:
        self.in_flight.discard(ref)

    def shutdown(self) -> None:
        self.cpus = 0.0


@pytest.mark.parametrize(("workers", "gpus", "expected"), [(None, 0.0, "3 tasks at a time"),
                                                           (1, 0.0, "1 task at a time"),
                                                           (5, 0.0, "3 tasks at a time (--workers 5: the cluster's "
                                                                    "3 CPU + 0 GPU hold 3)"),
                                                           (None, 2.0, "2 tasks at a time")],
                         ids=["cluster-cpus", "one-worker", "workers-capped", "gpus"])
def test_the_ray_header_names_the_tasks_that_run_at_once(tmp_path, monkeypatch, workers, gpus, expected):
    """The header's count is the most jobs ever running (status lines) and in flight (Ray), with a 3-CPU cluster."""
    from teachkit.experiments import sweep_backends
    from teachkit.experiments.sweep import run_sweep

    ray = FakeRay(gpus)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(sweep_backends, "cpu_count", lambda: 3)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = write_sweep(tmp_path, {"sweep": "r", "config": base(tmp_path), "recipe": "train",
                                  "grid": {"train.seed": [0, 1, 2, 3, 4, 5]}})
    stream = io.StringIO()
    result = run_sweep(path, backend="ray", workers=workers or 1, workers_given=workers is not None,
                       gpus_per_run=1.0 if gpus else 0.0, stream=stream)
    text = stream.getvalue()
    header = text.splitlines()[0]
    assert f"on Ray (a local Ray instance), {expected}, 1 CPU + {1 if gpus else 0} GPU each" in header, header
    running = [int(line.split(" running")[0].rsplit(" ", 1)[1]) for line in text.splitlines() if " running," in line]
    shown = int(expected.split(" ")[0])
    assert max(running) == ray.most == shown and len(result.failed) == 6


# ----------------------------------------------------------------------------- failures


def test_quiet_sweep_still_prints_its_failures(tmp_path, capsys):
    path = write_sweep(tmp_path, {"sweep": "q", "config": base(tmp_path), "recipe": "train",
                                  "list": [{"label": "bad", "train.epochs": 3}]})
    bad = tmp_path / "runs" / "q" / "bad"
    bad.mkdir(parents=True)
    (bad / "metrics.jsonl").mkdir()  # the run cannot write its log: it fails after its checks
    code = cli.main(["sweep", str(path), "--quiet", "--no-report"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("sweep q: 0/1 done, 1 failed; ")
    assert lines[1].startswith("  failed: bad: ") and "metrics.jsonl" in lines[1] and "--- " not in lines[1]
    plan = plan_sweep(path)
    stream = io.StringIO()
    print_outcome(plan, [], stream, quiet=True)
    assert stream.getvalue() == ""  # nothing failed: a quiet sweep prints nothing


class KillsEachJob(LocalBackend):
    """Local workers whose every job is killed with ``signum`` as soon as it started (the OOM killer, say)."""

    def __init__(self, signum: int) -> None:
        super().__init__(1, 1)
        self.signum = signum

    def start(self, argv, log):
        handle = super().start(argv, log)
        os.kill(handle.pid, self.signum)
        return handle


@pytest.mark.skipif(sys.platform != "linux", reason="forks jobs and kills them")
def test_a_job_killed_by_a_signal_says_so(tmp_path):
    path = write_sweep(tmp_path, {"sweep": "k", "config": base(tmp_path), "recipe": "train"})
    plan = plan_sweep(path)
    stream = io.StringIO()
    with KillsEachJob(signal.SIGKILL) as backend:
        execute(plan, backend, Progress(plan, "local", 1, stream), poll_s=0.1)
    (job,) = plan.jobs
    assert job.state == "failed" and job.returncode == -9 and job.error == "killed by signal 9 (SIGKILL)"
    assert "FAILED   run: killed by signal 9 (SIGKILL)" in stream.getvalue()
    status = json.loads((plan.folder / "sweep_status.json").read_text())
    assert status["jobs"][0]["error"] == "killed by signal 9 (SIGKILL)" and status["jobs"][0]["returncode"] == -9
    assert not list(plan.folder.glob("_sweep/driver-*.json"))  # the driver's heartbeat is gone with it


def test_failure_reasons_and_log_tail(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("Traceback\nOld: an earlier attempt's error\n")
    log_header(log, ["python", "-m", "teachkit.experiments.sweep_job", "--recipe", "train"])
    assert log_tail(log) == ""  # this attempt wrote nothing: not its header, not the earlier attempt
    assert failure_reason(-15, log) == "killed by signal 15 (SIGTERM)"
    assert failure_reason(1, log) == "exit status 1"
    assert failure_reason(1, log, "the Ray task died: WorkerCrashedError") == "the Ray task died: WorkerCrashedError"
    with open(log, "a") as f:
        f.write("teachkit: error: data.root does not exist\n")
    assert failure_reason(2, log) == "teachkit: error: data.root does not exist"


# ----------------------------------------------------------------------------- jobs die with their driver


def test_driver_watch_by_pid_and_by_heartbeat(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        file = tmp_path / "driver.json"
        beat = Heartbeat(file)
        beat.identity["pid"], beat.identity["start"] = sleeper.pid, None
        beat.beat()
        local = DriverWatch(file)
        assert local.local and local.gone() is None
        assert DriverWatch(None).gone() is None  # no driver named: only the parent is watched
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not process_alive(sleeper.pid) and local.gone() == f"the sweep's driver (pid {sleeper.pid}) died"
    # on another machine (a Ray node) the heartbeat file tells
    now = [0.0]
    beat.identity["node"], beat.identity["host"] = "elsewhere", "head-node"
    beat.beat()
    remote = DriverWatch(file, stale_s=30, clock=lambda: now[0])
    assert not remote.local and remote.gone() is None
    now[0] = 25.0
    beat.beat()  # the driver lives
    assert remote.gone() is None
    now[0] = 50.0
    assert remote.gone() is None
    now[0] = 56.0  # 31 s without a beat
    assert remote.gone() == (f"the sweep's driver (pid {sleeper.pid} on head-node) stopped its heartbeat "
                             f"'{file}' 31 s ago")


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if process_alive(p)]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_workers_stop_when_the_driver_is_killed(tmp_path):
    """A real ``teachkit sweep`` driver with 2 workers training long runs is killed with SIGKILL: every process
    it started (the fork server, the jobs it forked, the resource tracker) is gone within 10 s."""
    path = write_sweep(tmp_path, {"sweep": "o", "config": base(tmp_path, train={"epochs": 5000, "progress": False}),
                                  "recipe": "train", "grid": {"train.seed": [0, 1]}})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-m", "teachkit.cli", "sweep", str(path), "--workers", "2",
                               "--threads", "1", "--no-report"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    logs = [tmp_path / "runs" / "o" / f"seed={s}" / "metrics.jsonl" for s in (0, 1)]
    locks = [tmp_path / "runs" / "_locks" / f"o__seed={s}.lock" for s in (0, 1)]
    below: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not all(f.is_file() and f.stat().st_size for f in logs) and time.monotonic() < deadline:
            assert driver.poll() is None, "the sweep ended before its workers trained"
            time.sleep(0.1)
        below = descendants(driver.pid)
        jobs = [int(f.read_text().split()[0]) for f in locks]
        assert set(jobs) <= set(below) and len(below) >= 3, (jobs, below)  # the jobs, their fork server, ...
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while _alive(below) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(below), f"still running 10 s after the driver died: {_alive(below)}"
        epochs = [len(f.read_text().splitlines()) for f in logs]
        time.sleep(1.0)
        assert [len(f.read_text().splitlines()) for f in logs] == epochs  # nobody trains any more
    finally:
        driver.kill()
        for pid in _alive(below):
            os.kill(pid, signal.SIGKILL)
