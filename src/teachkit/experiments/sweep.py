"""``teachkit sweep SWEEP.yaml``: a paper's grid as one command, resumable, on local workers or a Ray cluster.

Planning (:func:`plan_sweep`, before anything runs) turns the sweep file (:mod:`teachkit.experiments.sweep_spec`)
into jobs:

- every run's config is validated as ``teachkit run`` would (a bad key or value fails the whole sweep first);
- **shared teachers**: a run whose recipe reads a frozen or recorded teacher (``kd``, ``takd``, ``eskd``,
  ``prokd``/``annealing``/``rco`` with ``prokd.mode=auto``, ``seqkd``, ``ban``:
  :func:`~teachkit.recipes.teacher.declare_teacher_use`) and names it in-command (``teacher.model``, no
  ``teacher.checkpoint``) gets it as a job of its own, ``out_dir/teachers/<model>-<loss>-seed<s>-<hash>``, the
  hash of the teacher's config: every run of every sweep in ``out_dir`` naming the same teacher config shares
  that one folder, trained once, before them (``teacher.checkpoint`` is set to it: the weights are those the
  run would have trained itself; a run that needs the recorded trajectory gets a ``-traj`` teacher saved
  every epoch);
- **shared teacher outputs**: students of ``kd`` that would read the same teacher-output cache
  (:mod:`teachkit.recipes.teacher_cache`: same teacher, transfer set, precision, and for augmented views the
  same seed and batch size) wait for one of them, the cache's producer, so the others read its file instead
  of running the teacher; the sweep reports the teacher forwards saved;
- **folders**: a finished run is skipped, an interrupted one resumed (the run folder's exact resume); a folder
  made by another sweep, or by hand, or whose saved config differs from what the sweep generates (the
  differing key is named) is refused before anything runs.
- **cycles**: runs that wait for each other (each one's ``teacher.checkpoint`` inside the next one's folder) are
  refused with one line naming them (:func:`check_cycles`), as is a sweep file that defines no runs.

Running (:func:`run_sweep`): each job is a process (``python -m teachkit.experiments.sweep_job``) holding a
lock on its run folder, on local workers (``--workers N``, each with ``cores / N`` threads so workers do not
stall each other's OpenMP) or as Ray tasks (``--backend ray``). A job that fails (any exit, a kill) is marked
failed with its log's last lines (or ``killed by signal 9 (SIGKILL)``), its dependents are blocked, the rest go on;
the sweep exits 1 at the end, printing the failed runs even with ``--quiet``, and rerunning retries what failed.
Jobs never outlive the driver: they watch its heartbeat file (:class:`~teachkit.experiments.sweep_job.Heartbeat`)
and its pid, and stop within a second or so of its death, a ``kill -9`` included. Progress: one live line on a
terminal (one line per event in a log file) and ``out_dir/<sweep>/sweep_status.json``, rewritten atomically at
every event. At the end the report
(:mod:`teachkit.experiments.report`) is written into ``out_dir/<sweep>/report``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from teachkit.config import CORE, absolute_paths, dump_yaml, from_dict, path_values, to_dict, with_changes
from teachkit.engine.checkpoint import atomic_write
from teachkit.errors import ConfigError, TeachkitError
from teachkit.experiments.sweep_backends import Backend, make_backend, signal_name
from teachkit.experiments.sweep_job import Heartbeat
from teachkit.experiments.sweep_spec import RunSpec, SweepSpec, read_sweep
from teachkit.losses.objective import needs_of
from teachkit.recipes import RECIPES
from teachkit.recipes.context import check_run_dir, finished_epoch_files
from teachkit.recipes.teacher import SHARED_RUNS, TEACHER_CHECKS, teacher_run_config, teacher_use
from teachkit.recipes.teacher_cache import CACHEABLE

MARKER = "sweep.json"
STATUS = "sweep_status.json"
TEACHERS = "teachers"
SHARED = "shared"
#: config keys that do not change a run's result (left out of a teacher's identity)
NEUTRAL = {("train", "progress"), ("train", "device"), ("train", "tensorboard"), ("train", "save_every")}
STATES = ("done", "running", "failed", "blocked", "queued")
#: the line that opens each attempt in a job's log (:func:`teachkit.experiments.sweep_backends.log_header`)
HEADER = re.compile(r"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


@dataclass
class Job:
    """One run of the sweep: a shared teacher or a student (any recipe)."""

    name: str
    role: str
    recipe: str
    cfg: Any
    run_dir: Path
    labels: dict[str, Any] = field(default_factory=dict)
    #: jobs that must finish successfully first (the teacher)
    needs: list[str] = field(default_factory=list)
    #: jobs that must finish first, successfully or not (the producer of a shared teacher-output cache)
    after: list[str] = field(default_factory=list)
    teacher_id: str | None = None
    state: str = "queued"
    started: float | None = None
    finished: float | None = None
    returncode: int | None = None
    error: str | None = None
    attempt_log: Path | None = None
    skipped: bool = False
    #: read once when the job ends (or is found finished): epochs its run logged, teacher forwards its cache saved
    epochs_logged: int = 0
    forwards_saved: int = 0

    def ended(self) -> None:
        """Record what the run folder says now that the job stopped (its logged epochs, its cache's savings)."""
        self.epochs_logged = logged_epochs(self.run_dir)
        try:
            summary = json.loads((self.run_dir / "summary.json").read_text())
            self.forwards_saved = int((summary.get("cost") or {}).get("teacher_forwards_saved") or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            self.forwards_saved = 0

    def epochs_now(self) -> int:
        """Epochs the run has logged: read from its folder while it runs, recorded once it ended."""
        return logged_epochs(self.run_dir) if self.state == "running" else self.epochs_logged

    @property
    def wall_s(self) -> float | None:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started


@dataclass
class Plan:
    """The validated jobs of a sweep, teachers first."""

    spec: SweepSpec
    jobs: list[Job]
    _by_name: dict[str, Job] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {j.name: j for j in self.jobs}

    def job(self, name: str) -> Job:
        return self._by_name[name]

    @property
    def folder(self) -> Path:
        return self.spec.folder

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for j in self.jobs if j.state == s) for s in STATES}


# ----------------------------------------------------------------------------- planning


def _identity(cfg: Any, recipe: str = "train") -> dict[str, Any]:
    """What decides the result of a shared run of ``recipe``: the core sections of its config (and the recipe's
    own section) without neutral keys; other recipes' sections, whose defaults may grow, are left out."""
    tree = to_dict(cfg)
    keep = [k for k in CORE if k not in ("name", "out_dir")] + [recipe]
    if recipe == "train":
        keep = [k for k in keep if k not in ("teacher", "kd")]
    identity = {k: tree[k] for k in keep if k in tree}
    for section, key in NEUTRAL:
        identity.get(section, {}).pop(key, None)
    return identity


def teacher_job_config(cfg: Any, recorded: bool) -> Any:
    """The config of the teacher that run ``cfg`` would train in-command, as a plain ``train`` run: the full
    training split, the teacher's model, optimiser, epochs, loss and seed, every epoch saved if ``recorded``."""
    tcfg = teacher_run_config(cfg, save_every=1 if recorded else 0)
    tree = to_dict(tcfg)
    data = {**tree["data"], "subset_seed": None} if tree["data"].get("train_subset") is None else tree["data"]
    return from_dict({"plugins": tree["plugins"], "data": data, "model": tree["model"], "optim": tree["optim"],
                      "train": tree["train"], "out_dir": tree["out_dir"]})


def _digest(identity: dict[str, Any]) -> str:
    """The sha256 of a run's identity (its config as sorted JSON)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _teacher_name(tcfg: Any, recorded: bool) -> tuple[str, str]:
    """The folder name of a shared teacher and the sha256 of what decides its weights (save_every aside)."""
    identity = _identity(tcfg)
    digest = _digest(identity)
    name = f"{tcfg.model.name}-{tcfg.train.loss}-seed{tcfg.train.seed}-{digest[:10]}{'-traj' if recorded else ''}"
    return name, digest


def _cache_group(job: Job, teacher: str) -> tuple | None:
    """Students reading the same teacher-output cache share this key (None: the run reads none)."""
    cfg = job.cfg
    if job.recipe != "kd" or cfg.teacher.cache == "off":
        return None
    if not needs_of(cfg.kd.methods)[1] <= set(CACHEABLE):
        return None
    views = cfg.data.augment != "none"
    return (teacher, json.dumps(to_dict(cfg.data), sort_keys=True, default=str), cfg.train.precision,
            str(cfg.train.channels_last), cfg.train.compile, getattr(cfg.train, "micro_batch", None),
            cfg.train.device, cfg.teacher.cache_dtype, cfg.teacher.cache_topk,
            (cfg.train.seed, cfg.data.batch_size) if views else None)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    file = folder / MARKER
    if not file.is_file():
        return None
    try:
        marker = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"run folder {str(folder)!r}: its {MARKER} cannot be read ({e}); a sweep wrote it: "
                          "delete the folder to start that run again") from None
    if not isinstance(marker, dict):
        raise ConfigError(f"run folder {str(folder)!r}: its {MARKER} is not a JSON object")
    return marker


def _marker(plan: Plan, job: Job) -> dict[str, Any]:
    if job.role == "teacher":
        return {"role": "teacher", "teacher_id": job.teacher_id, "recipe": job.recipe, "run": job.name,
                "labels": {}, "seed_keys": []}
    return {"sweep": plan.spec.name, "run": job.name, "role": "student", "recipe": job.recipe,
            "labels": job.labels, "seed_keys": plan.spec.seed_keys,
            "depends_on": [str(plan.job(n).run_dir) for n in job.needs]}


def _summary_done(folder: Path, epochs: int) -> bool:
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and int(summary.get("epochs", epochs) or 0) >= epochs


def _check_folder(plan: Plan, job: Job) -> None:
    """Refuse a folder another sweep or a person made, or whose config differs; mark a finished job done."""
    folder = job.run_dir
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"sweep run {job.name!r}: {str(folder)!r} is a file, not a run folder")
    if not folder.is_dir():
        return
    marker = _read_marker(folder)
    if marker is None:
        if (folder / "config.yaml").is_file() or finished_epoch_files(folder):
            raise ConfigError(f"run folder {str(folder)!r} was not made by a sweep (no {MARKER}); move it away or "
                              f"choose another out_dir")
        return
    if job.role == "teacher":
        if marker.get("role") != "teacher" or marker.get("teacher_id") != job.teacher_id:
            raise ConfigError(f"run folder {str(folder)!r} holds another run than the shared teacher this sweep "
                              f"names (its {MARKER} differs); move it away")
    elif marker.get("sweep") != plan.spec.name or marker.get("run") != job.name:
        raise ConfigError(f"run folder {str(folder)!r} was made by sweep {marker.get('sweep')!r} (run "
                          f"{marker.get('run')!r}), not by this sweep {plan.spec.name!r}; choose another out_dir or "
                          f"sweep name")
    try:
        check_run_dir(absolute_paths(job.cfg), folder, resume=True)  # as the job records it
    except ConfigError as e:
        raise ConfigError(f"sweep run {job.name!r}: {e}") from None
    if _summary_done(folder, job.cfg.train.epochs):
        job.state, job.skipped = "done", True
        job.ended()


def plan_sweep(path: str | Path, out_dir: str | None = None, overrides: list[str] | None = None) -> Plan:
    """Read, expand and validate the sweep file (``overrides``: ``key=value`` applied to every run's config);
    resolve shared teachers, runs that name another run's folder as teacher, cache producers; check folders."""
    spec = read_sweep(path, out_dir, overrides)
    students: list[Job] = []
    for run in spec.runs:
        students.append(_student(spec, run))
    uses: dict[str, str] = {}  # teacher identity -> frozen / recorded (recorded wins: one teacher serves both)
    wanted: list[tuple[Job, str | None]] = []
    for job in students:
        use = teacher_use(job.recipe, job.cfg)
        identity = _teacher_name(teacher_job_config(job.cfg, recorded=False), False)[1] if use else None
        if identity is not None:
            uses[identity] = "recorded" if "recorded" in (use, uses.get(identity)) else "frozen"
        wanted.append((job, identity))
    teachers: dict[str, Job] = {}
    for job, identity in wanted:
        if identity is None:
            continue
        recorded = uses[identity] == "recorded"
        tcfg = teacher_job_config(job.cfg, recorded=recorded)
        name, _ = _teacher_name(tcfg, recorded)
        tname = f"{TEACHERS}/{name}"
        if tname not in teachers:
            tcfg = with_changes(tcfg, name=tname, out_dir=str(spec.out_dir), train={"progress": False})
            teachers[tname] = Job(tname, "teacher", "train", tcfg, spec.out_dir / tname, teacher_id=identity)
        job.needs.append(tname)
        job.cfg = with_changes(job.cfg, teacher={"checkpoint": str(teachers[tname].run_dir)})
    shared = _shared_runs(spec, students, teachers)
    by_folder = {j.run_dir.resolve(): j.name for j in students}
    for job in students:  # a teacher.checkpoint inside another run of this sweep: run that one first
        given = job.cfg.teacher.checkpoint
        if given and not job.needs:
            path = Path(given).resolve()
            for folder in (path, *path.parents):
                if folder in by_folder and by_folder[folder] != job.name:
                    job.needs.append(by_folder[folder])
                    break
    producers: dict[tuple, str] = {}
    for job in students:
        teacher = job.needs[0] if job.needs else str(job.cfg.teacher.checkpoint)
        group = _cache_group(job, teacher)
        if group is None:
            continue
        if group in producers:
            job.after.append(producers[group])
        else:
            producers[group] = job.name
    for job in students:  # teacher settings the recipe would refuse (prokd.mode=replay without a teacher, ...)
        check = TEACHER_CHECKS.get(job.recipe)
        if check is not None:
            try:
                check(job.cfg)
            except ConfigError as e:
                raise ConfigError(f"sweep run {job.name!r}: {e}") from None
    plan = Plan(spec, [*teachers.values(), *shared, *students])
    check_cycles(plan.jobs)
    folders: dict[Path, str] = {}
    for job in plan.jobs:
        key = job.run_dir.resolve()
        if key in folders:
            raise ConfigError(f"sweep runs {folders[key]!r} and {job.name!r} would share the folder "
                              f"{str(job.run_dir)!r}")
        folders[key] = job.name
        _check_folder(plan, job)
    return plan


def missing_inputs(plan: Plan) -> list[str]:
    """``key='path' (run NAME[, +k more])`` for every distinct declared path of a job still to run (``data.root``,
    ``teacher.checkpoint``, ``takd.assistant_checkpoint``, ...) that does not exist and that no job of the plan
    writes (a shared teacher's folder, another run's)."""
    written = [j.run_dir.resolve() for j in plan.jobs]
    users: dict[tuple[str, str], list[str]] = {}
    for job in plan.jobs:
        if job.skipped:
            continue
        for key, value in path_values(job.cfg):
            path = Path(os.path.expanduser(value))
            if path.exists():
                continue
            full = path.resolve()
            if any(full == w or w in full.parents for w in written):
                continue
            users.setdefault((key, value), []).append(job.name)
    return [f"{key}={value!r} (run {names[0]}" + (f", +{len(names) - 1} more)" if len(names) > 1 else ")")
            for (key, value), names in users.items()]


def check_inputs(plan: Plan) -> None:
    """A one-line ConfigError listing every missing data path and teacher file (:func:`missing_inputs`), before
    any job starts."""
    missing = missing_inputs(plan)
    if missing:
        raise ConfigError(f"sweep {plan.spec.name}: {len(missing)} input path(s) do not exist, so no run was "
                          f"started: {'; '.join(missing)} (paths in a config or sweep file are relative to that file's "
                          "folder, on the command line to the working directory)")


def check_cycles(jobs: list[Job]) -> None:
    """A one-line ConfigError naming the runs when jobs wait for each other in a circle (run a's
    ``teacher.checkpoint`` inside run b's folder and b's inside a's): none of them could ever start."""
    waits = {j.name: [*j.needs, *j.after] for j in jobs}
    state: dict[str, int] = {}  # 1: on the current path, 2: checked
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for other in waits.get(name, []):
            if state.get(other) == 1:
                return [*path[path.index(other):], other]
            if other not in state and (cycle := visit(other)) is not None:
                return cycle
        path.pop()
        state[name] = 2
        return None

    for job in jobs:
        if job.name not in state and (cycle := visit(job.name)) is not None:
            chain = " -> ".join(repr(n) for n in cycle)
            raise ConfigError(f"sweep runs wait for each other in a cycle, so none of them can start: {chain} (each "
                              f"names the next one's folder as its teacher.checkpoint); give one of them a teacher "
                              f"outside the cycle")


def _shared_runs(spec: SweepSpec, students: list[Job], teachers: dict[str, Job]) -> list[Job]:
    """Sub-runs a recipe would train itself (TAKD's assistant, :func:`~teachkit.recipes.teacher.
    declare_shared_run`) as jobs of their own, one per distinct config, each after its teacher."""
    jobs: dict[str, Job] = {}
    for job in students:
        for what, make, option_key, when in SHARED_RUNS.get(job.recipe, []):
            if not when(job.cfg):
                continue
            recipe, sub = make(job.cfg)
            tree = to_dict(sub)
            if tree["data"].get("train_subset") is None:
                tree["data"]["subset_seed"] = None
            identity = {"recipe": recipe, **_identity(from_dict(tree), recipe)}
            digest = _digest(identity)
            name = f"{SHARED}/{what}-{sub.model.name}-seed{sub.train.seed}-{digest[:10]}"
            if name not in jobs:
                cfg = from_dict({**tree, "name": name, "out_dir": str(spec.out_dir),
                                 "train": {**tree["train"], "progress": False}})
                jobs[name] = Job(name, "teacher", recipe, cfg, spec.out_dir / name, teacher_id=digest,
                                 needs=list(job.needs))
            job.needs.append(name)
            section, key = option_key.split(".", 1)
            job.cfg = with_changes(job.cfg, **{section: {key: str(jobs[name].run_dir)}})
    return list(jobs.values())


def _student(spec: SweepSpec, run: RunSpec) -> Job:
    RECIPES.entry(run.recipe)  # an unknown recipe: one line with did-you-mean
    tree = {**run.config, "name": f"{spec.name}/{run.name}", "out_dir": str(spec.out_dir)}
    tree["train"] = {**(tree.get("train") or {}), "progress": False}
    try:
        cfg = from_dict(tree)
    except ConfigError as e:
        raise ConfigError(f"sweep run {run.name!r}: {e}") from None
    return Job(run.name, "student", run.recipe, cfg, spec.out_dir / spec.name / run.name, labels=run.labels)


# ----------------------------------------------------------------------------- progress


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def logged_epochs(folder: Path) -> int:
    """Epochs a run folder has logged so far (lines of its metrics.jsonl)."""
    try:
        with open(folder / "metrics.jsonl", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Progress:
    """The sweep's progress: a live line on a terminal, one line per event otherwise; the JSON status file."""

    def __init__(self, plan: Plan, backend: str, capacity: int, stream: TextIO | None = None,
                 quiet: bool = False) -> None:
        self.plan, self.backend, self.capacity = plan, backend, max(1, capacity)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = quiet
        self.started = time.time()
        self._live = False

    def eta(self) -> float | None:
        """Seconds left: the mean wall time of this session's finished jobs of each role, for every job not
        done, over the workers (None before a job of that role finished)."""
        jobs = self.plan.jobs
        means = {}
        for role in ("teacher", "student"):
            walls = [j.wall_s for j in jobs if j.role == role and j.state == "done" and not j.skipped
                     and j.wall_s is not None]
            means[role] = sum(walls) / len(walls) if walls else None
        left = 0.0
        for j in jobs:
            if j.state not in ("queued", "running"):
                continue
            mean = means[j.role] if means[j.role] is not None else means["student"] or means["teacher"]
            if mean is None:
                return None
            left += max(mean - (j.wall_s or 0.0), 0.0) if j.state == "running" else mean
        return left / self.capacity

    def line(self) -> str:
        c = self.plan.counts()
        running = [j for j in self.plan.jobs if j.state == "running"]
        shown = ", ".join(f"{j.name} {j.epochs_now()}/{j.cfg.train.epochs}" for j in running[:3])
        more = f" +{len(running) - 3}" if len(running) > 3 else ""
        failed = c["failed"] + c["blocked"]
        return (f"sweep {self.plan.spec.name}: {c['done']}/{len(self.plan.jobs)} done, {c['running']} running, "
                f"{failed} failed, {c['queued']} queued  ETA {_duration(self.eta())}"
                + (f"  [{shown}{more}]" if shown else ""))

    def event(self, text: str) -> None:
        if self.quiet:
            return
        if self._live:
            self.stream.write("\r\033[K")
            self._live = False
        self.stream.write(f"{text}\n")
        if not self.tty:
            self.stream.write(f"  {self.line()}\n")
        self.stream.flush()
        self.refresh()

    def refresh(self) -> None:
        if self.quiet or not self.tty:
            return
        self.stream.write("\r\033[K" + self.line()[:200])
        self.stream.flush()
        self._live = True

    def close(self) -> None:
        if self._live:
            self.stream.write("\n")
            self.stream.flush()
            self._live = False

    def status(self) -> dict[str, Any]:
        now = time.time()
        return {"sweep": self.plan.spec.name, "file": str(self.plan.spec.path), "out_dir": str(self.plan.spec.out_dir),
                "backend": self.backend, "workers": self.capacity, "started": self.started, "updated": now,
                "counts": self.plan.counts(), "total": len(self.plan.jobs), "eta_s": self.eta(),
                "teacher_forwards_saved": forwards_saved(self.plan),
                "jobs": [{"name": j.name, "role": j.role, "recipe": j.recipe, "run_dir": str(j.run_dir),
                          "state": j.state, "skipped": j.skipped, "needs": j.needs, "after": j.after,
                          "labels": j.labels, "epochs": j.cfg.train.epochs, "epochs_done": j.epochs_now(),
                          "started": j.started, "finished": j.finished, "wall_s": j.wall_s,
                          "returncode": j.returncode, "error": j.error,
                          "log": str(j.attempt_log) if j.attempt_log else None} for j in self.plan.jobs]}

    def write_status(self) -> None:
        text = json.dumps(self.status(), indent=1, default=str) + "\n"
        atomic_write(self.plan.folder / STATUS, lambda tmp: Path(tmp).write_text(text))


def forwards_saved(plan: Plan) -> int:
    """Teacher forwards the students' caches saved (their summaries' ``cost.teacher_forwards_saved``)."""
    return sum(j.forwards_saved for j in plan.jobs if j.role == "student" and j.state == "done")


# ----------------------------------------------------------------------------- running


def _safe(name: str) -> str:
    return name.replace("/", "__")


def log_tail(file: Path | None, lines: int = 5) -> str:
    """The last non-empty lines a job's last attempt wrote to its log (after the attempt's header line), joined
    with `` | `` (what a failed job said); empty when it wrote nothing."""
    if file is None:
        return ""
    try:
        with open(file, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [t.strip() for t in text.replace("\r", "\n").splitlines() if t.strip()]
    headers = [i for i, t in enumerate(kept) if HEADER.match(t)]
    if headers:
        kept = kept[headers[-1] + 1:]
    return " | ".join(kept[-lines:])


def failure_reason(returncode: int | None, log: Path | None, known: str | None = None) -> str:
    """Why a job failed: ``killed by signal 9 (SIGKILL)`` for a signal, else what the backend knows (a Ray task
    that died), else its log's last lines, else its exit status."""
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode} ({signal_name(-returncode)})"
    return known or log_tail(log) or f"exit status {returncode}"


def _prepare(plan: Plan, job: Job, driver: Path | None = None) -> tuple[list[str], Path]:
    """Write the job's config file and marker; returns its command (``driver``: the driver's heartbeat file,
    which the job watches) and log file."""
    work = plan.folder / "_sweep"
    config_file = work / "configs" / f"{_safe(job.name)}.yaml"
    log = work / "logs" / f"{_safe(job.name)}.log"
    lock = plan.spec.out_dir / "_locks" / f"{_safe(str(job.run_dir.relative_to(plan.spec.out_dir)))}.lock"
    for folder in (config_file.parent, log.parent, lock.parent, job.run_dir):
        folder.mkdir(parents=True, exist_ok=True)
    # absolute paths and out_dir: the job reads the file from its own folder, maybe in another working directory
    text = dump_yaml(with_changes(absolute_paths(job.cfg), out_dir=os.path.abspath(job.cfg.out_dir)))
    atomic_write(config_file, lambda tmp: Path(tmp).write_text(text))
    marker = json.dumps(_marker(plan, job), indent=1, default=str) + "\n"
    atomic_write(job.run_dir / MARKER, lambda tmp: Path(tmp).write_text(marker))
    argv = [sys.executable, "-m", "teachkit.experiments.sweep_job", "--recipe", job.recipe,
            "--config", str(config_file), "--lock", str(lock)]
    if driver is not None:
        argv += ["--driver", str(driver)]
    return argv, log


def _ready(plan: Plan, job: Job) -> bool:
    return all(plan.job(n).state == "done" for n in job.needs) and \
        all(plan.job(n).state in ("done", "failed", "blocked") for n in job.after)


def _block(plan: Plan, failed: Job, progress: Progress) -> None:
    for job in plan.jobs:
        if job.state == "queued" and failed.name in job.needs:
            job.state, job.error = "blocked", f"{failed.role} {failed.name} failed"
            progress.event(f"blocked  {job.name} ({job.error})")
            _block(plan, job, progress)


def execute(plan: Plan, backend: Backend, progress: Progress, poll_s: float = 1.0) -> None:
    """Run the plan's queued jobs on ``backend`` as their dependencies allow; returns when none can run. A
    heartbeat file names this process to the jobs, which stop when it dies (:mod:`~.sweep_job`)."""
    with Heartbeat(plan.folder / "_sweep" / f"driver-{os.getpid()}.json") as heartbeat:
        _execute(plan, backend, progress, poll_s, heartbeat.file)
    for job in plan.jobs:  # cannot happen after check_cycles; never report such a sweep as done
        if job.state == "queued":
            waits = [n for n in [*job.needs, *job.after] if plan.job(n).state != "done"]
            job.state, job.error = "blocked", f"never started: waits for {', '.join(waits) or 'nothing'}"
    progress.write_status()


def _execute(plan: Plan, backend: Backend, progress: Progress, poll_s: float, driver: Path) -> None:
    handles: dict[Any, Job] = {}
    progress.write_status()
    try:
        while True:
            for job in plan.jobs:
                if len(handles) >= backend.capacity:
                    break
                if job.state == "queued" and _ready(plan, job):
                    argv, log = _prepare(plan, job, driver)
                    job.attempt_log, job.state, job.started, job.finished = log, "running", time.time(), None
                    job.returncode = job.error = None
                    handles[backend.start(argv, log)] = job
                    progress.event(f"started  {job.name}" + (" (resuming)" if finished_epoch_files(job.run_dir)
                                                             else ""))
                    progress.write_status()
            if not handles:
                break
            for handle, rc in backend.wait(list(handles), poll_s):
                job = handles.pop(handle)
                job.finished, job.returncode = time.time(), rc
                job.ended()
                if rc == 0 and (job.run_dir / "summary.json").is_file():
                    job.state = "done"
                    progress.event(f"done     {job.name}  {_duration(job.wall_s)}  {result_of(job)}")
                else:
                    job.state = "failed"
                    job.error = failure_reason(rc, job.attempt_log, backend.reason(handle))
                    progress.event(f"FAILED   {job.name}" + (f" (exit {rc}): " if rc >= 0 else ": ") + job.error)
                    _block(plan, job, progress)
                progress.write_status()
            progress.refresh()
    except BaseException:
        backend.stop(list(handles))
        for job in handles.values():
            job.state, job.finished, job.error = "failed", time.time(), "interrupted"
            job.ended()
        progress.close()
        progress.write_status()
        raise
    progress.close()
    progress.write_status()


def result_of(job: Job) -> str:
    """``test 90.12%`` (the summary's last-epoch test metric) for an event line."""
    try:
        s = json.loads((job.run_dir / "summary.json").read_text())
        m = s.get("select_metric", "acc")
        value = s.get(f"test_{m}")
        return f"test {m} {value:.2f}" + ("%" if s.get("select_metric_percent", m == "acc") else "")
    except (OSError, ValueError, TypeError, AttributeError):
        return ""


@dataclass
class SweepResult:
    plan: Plan
    failed: list[Job]
    report: Any = None

    @property
    def ok(self) -> bool:
        return not self.failed


def print_outcome(plan: Plan, failed: list[Job], out: TextIO, quiet: bool) -> None:
    """The sweep's summary line and one line per failed run (name and reason); with ``quiet`` only when
    something failed."""
    if quiet and not failed:
        return
    print(f"sweep {plan.spec.name}: {plan.counts()['done']}/{len(plan.jobs)} done, {len(failed)} failed; "
          f"teacher forwards saved by cached teacher outputs: {forwards_saved(plan):,}; status: "
          f"{plan.folder / STATUS}", file=out)
    for j in failed:
        print(f"  failed: {j.name}: {j.error}" + (f" (log: {j.attempt_log})" if j.attempt_log else ""), file=out)
    if failed and not quiet:
        print("rerun the same command to retry the failed runs (finished runs are skipped, interrupted ones "
              "resume)", file=out)


def describe_plan(plan: Plan) -> str:
    """The plan as text: one line per job (state, role, dependencies)."""
    lines = [f"sweep {plan.spec.name}: {len(plan.jobs)} runs ({sum(j.role == 'teacher' for j in plan.jobs)} shared "
             f"teachers) -> {plan.folder}"]
    for j in plan.jobs:
        extra = []
        if j.needs:
            extra.append(f"teacher {', '.join(j.needs)}")
        if j.after:
            extra.append(f"after {', '.join(j.after)} (teacher-output cache)")
        state = "done (skipped)" if j.skipped else "resume" if finished_epoch_files(j.run_dir) else "new"
        lines.append(f"  {state:<14} {j.role:<7} {j.recipe:<9} {j.name}" + (f"  [{'; '.join(extra)}]" if extra else ""))
    return "\n".join(lines)


def run_sweep(path: str | Path, *, workers: int = 1, workers_given: bool = True, backend: str = "local",
              threads: int | None = None, overrides: list[str] | None = None,
              gpus_per_run: float = 0.0, out_dir: str | None = None, dry_run: bool = False, report: bool = True,
              quiet: bool = False, stream: TextIO | None = None,
              reporter: Callable[[Plan], Any] | None = None) -> SweepResult:
    """Plan and run the sweep file ``path`` (see the module docstring); returns the plan and its failures."""
    if workers < 1:
        raise ConfigError(f"--workers {workers} is out of range: must be >= 1")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads {threads} is out of range: must be >= 1")
    if gpus_per_run < 0:
        raise ConfigError(f"--gpus-per-run {gpus_per_run} is out of range: must be >= 0")
    chosen = make_backend(backend, workers=workers, threads=threads, gpus_per_run=gpus_per_run,
                          workers_given=workers_given)  # a missing Ray is reported before anything is read
    plan = plan_sweep(path, out_dir, overrides)
    out = stream or sys.stderr
    if dry_run:
        print(describe_plan(plan), file=sys.stdout)
        for line in missing_inputs(plan):
            print(f"teachkit: warning: input path does not exist: {line}", file=out)
        return SweepResult(plan, [])
    check_inputs(plan)
    plan.folder.mkdir(parents=True, exist_ok=True)
    with chosen:  # connected first (a Ray cluster that does not answer is one line, before anything is printed)
        progress = Progress(plan, backend, chosen.capacity, out, quiet)
        skipped = sum(j.skipped for j in plan.jobs)
        teachers = sum(j.role == "teacher" for j in plan.jobs)
        users = sum(1 for j in plan.jobs if j.needs)
        progress.event(f"sweep {plan.spec.name}: {len(plan.jobs)} runs ({teachers} shared teachers for {users} "
                       f"runs; {skipped} already finished) on {chosen.describe()} -> {plan.folder}")
        execute(plan, chosen, progress)
    failed = [j for j in plan.jobs if j.state in ("failed", "blocked")]
    print_outcome(plan, failed, out, quiet)
    result = SweepResult(plan, failed)
    if report and reporter is not None and any(j.role == "student" and j.state == "done" for j in plan.jobs):
        try:
            result.report = reporter(plan)
        except TeachkitError as e:  # the runs are kept whatever the report says
            print(f"teachkit: warning: the report was not written: {e}", file=out)
    return result


def show_status(path: str | Path, out_dir: str | None = None) -> str:
    """The status of the sweep ``path`` (possibly running in another process) as text: its status file's counts
    and ETA, and each job's state with the epochs its run folder has logged by now."""
    spec = read_sweep(path, out_dir)
    file = spec.folder / STATUS
    if not file.is_file():
        return f"sweep {spec.name}: not started (no {file})"
    try:
        status = json.loads(file.read_text())
        jobs, counts = status["jobs"], status["counts"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"sweep status file {str(file)!r} cannot be read ({type(e).__name__}); rerun the sweep "
                          f"to rewrite it") from None
    age = time.time() - float(status.get("updated", time.time()))
    lines = [f"sweep {spec.name}: {counts.get('done', 0)}/{status.get('total', len(jobs))} done, "
             f"{counts.get('running', 0)} running, {counts.get('failed', 0) + counts.get('blocked', 0)} failed, "
             f"{counts.get('queued', 0)} queued; ETA {_duration(status.get('eta_s'))} as of {_duration(age)} ago"]
    for job in jobs:
        done = logged_epochs(Path(job["run_dir"]))
        extra = f"  {job['error']}" if job.get("error") else ""
        lines.append(f"  {job['state']:<8} {done:>4}/{job['epochs']:<4} {job['name']}{extra}")
    return "\n".join(lines)


__all__ = ["Job", "Plan", "Progress", "SweepResult", "describe_plan", "execute", "log_tail", "plan_sweep",
           "run_sweep", "show_status", "teacher_job_config"]
