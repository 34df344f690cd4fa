"""Sweeps: planning (shared teachers, cache producers, folder checks) and end-to-end runs on local workers,
with a worker killed mid-run and the sweep rerun; Ray as a backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from teachkit.config import from_dict
from teachkit.errors import ConfigError
from teachkit.experiments.sweep import MARKER, plan_sweep, run_sweep, teacher_job_config
from teachkit.recipes import RECIPES, distill, train_model
from tests.conftest import tiny_config

#: synthetic data hard enough that students differ (overlapping Gaussians)
DATA = {"name": "synthetic", "batch_size": 32,
        "options": {"shape": [1, 8, 8], "num_classes": 4, "n_train": 480, "n_test": 160, "separation": 0.4}}


def base(tmp_path, **sections) -> dict:
    cfg = tiny_config(tmp_path, data=DATA, **sections)
    cfg.pop("name"), cfg.pop("out_dir")
    return cfg


def write_sweep(tmp_path, sweep: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "runs"), **sweep}, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- planning


def test_teachers_shared_once_per_config(tmp_path):
    cfg = base(tmp_path, teacher={"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2, "seed": 0})
    path = write_sweep(tmp_path, {"sweep": "a", "config": cfg, "grid": {"train.seed": [0, 1, 2]},
                                  "list": [{"label": "no-kd", "recipe": "train"},
                                           {"kd.method": "kd", "grid": {"teacher.loss": ["ce", "mse"]}},
                                           {"kd.method": "dist", "grid": {"teacher.loss": ["ce", "mse"]}}]})
    plan = plan_sweep(path)
    teachers = [j for j in plan.jobs if j.role == "teacher"]
    students = [j for j in plan.jobs if j.role == "student"]
    assert len(teachers) == 2 and len(students) == 3 + 6 + 6  # one teacher per loss, whatever the student seed
    assert plan.jobs[:2] == teachers
    for t in teachers:
        assert t.cfg.train.seed == 0 and t.cfg.data.train_subset is None and t.cfg.train.save_every == 0
        users = [s for s in students if s.needs == [t.name]]
        assert len(users) == 6 and {s.cfg.teacher.loss for s in users} == {t.cfg.train.loss}
        assert all(s.cfg.teacher.checkpoint == str(t.run_dir) for s in users)
    assert all(not s.needs for s in students if s.recipe == "train")
    # a second sweep in the same out_dir naming the same teacher config shares its folder
    other = write_sweep(tmp_path, {"sweep": "b", "config": cfg, "list": [{"kd.method": "pkt", "teacher.loss": "mse"}]},
                        "other.yaml")
    (shared,) = [j for j in plan_sweep(other).jobs if j.role == "teacher"]
    assert shared.run_dir in {t.run_dir for t in teachers} and shared.cfg.train.loss == "mse"


def test_cache_producer_first_and_recorded_teachers(tmp_path):
    path = write_sweep(tmp_path, {"sweep": "c", "config": base(tmp_path),
                                  "list": [{"kd.method": "kd"}, {"kd.method": "dist"}, {"kd.method": "fitnet"},
                                           {"label": "prokd", "recipe": "prokd"},
                                           {"label": "online", "recipe": "prokd", "prokd.mode": "online"}]})
    plan = plan_sweep(path)
    kd, dist, fitnet, prokd, online = (plan.job(n) for n in ("kd", "dist", "fitnet", "prokd", "online"))
    assert kd.after == [] and dist.after == ["kd"]  # logits only: reads kd's teacher-output cache
    assert fitnet.after == []  # reads feature maps: runs the teacher itself
    # one teacher serves both: recorded every epoch because Pro-KD replays it, the final one for kd
    assert prokd.needs[0].endswith("-traj") and plan.job(prokd.needs[0]).cfg.train.save_every == 1
    assert kd.needs == dist.needs == fitnet.needs == prokd.needs
    alone = write_sweep(tmp_path, {"sweep": "k", "config": base(tmp_path), "list": [{"kd.method": "kd"}]}, "k.yaml")
    (teacher,) = [j for j in plan_sweep(alone).jobs if j.role == "teacher"]
    assert not teacher.name.endswith("-traj") and teacher.cfg.train.save_every == 0
    assert online.needs == [] and online.cfg.teacher.checkpoint is None  # online mode trains its own teacher


def test_teacher_settings_a_recipe_refuses_fail_the_plan(tmp_path):
    path = write_sweep(tmp_path, {"sweep": "m", "config": base(tmp_path), "recipe": "prokd",
                                  "list": [{"label": "auto"}, {"label": "replay", "prokd.mode": "replay"}]})
    with pytest.raises(ConfigError, match=r"sweep run 'replay': prokd.mode=replay: replay mode needs "
                                          r"teacher.checkpoint"):
        plan_sweep(path)


def test_hoisted_teacher_gives_the_in_command_student(tmp_path):
    """The sweep's teacher job config trains the weights the student would have trained in-command."""
    cfg = from_dict({**base(tmp_path), "name": "in-command", "out_dir": str(tmp_path / "a"),
                     "teacher": {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2, "loss": "mse"},
                     "data": {**DATA, "train_subset": 200, "subset_seed": 1}})
    own = distill(cfg)
    tcfg = teacher_job_config(cfg, recorded=False)
    from teachkit.config import with_changes

    teacher = train_model(with_changes(tcfg, name="teacher", out_dir=str(tmp_path / "b")))
    given = distill(with_changes(cfg, name="given", out_dir=str(tmp_path / "b"),
                                 teacher={"checkpoint": str(teacher.run_dir)}))
    for a, b in [(own.run_dir / "teacher", teacher.run_dir), (own.run_dir, given.run_dir)]:
        wa, wb = load_file(a / "checkpoints" / "last.safetensors"), load_file(b / "checkpoints" / "last.safetensors")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert own.summary["test_acc"] == given.summary["test_acc"]


def test_folders_of_others_are_refused(tmp_path):
    path = write_sweep(tmp_path, {"sweep": "d", "config": base(tmp_path), "recipe": "train",
                                  "grid": {"train.seed": [0, 1]}})
    folder = tmp_path / "runs" / "d" / "seed=0"
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"sweep": "other", "run": "seed=0", "role": "student"}))
    with pytest.raises(ConfigError, match=r"was made by sweep 'other' \(run 'seed=0'\), not by this sweep 'd'"):
        plan_sweep(path)
    (folder / MARKER).unlink()
    (folder / "config.yaml").write_text("name: x\n")
    with pytest.raises(ConfigError, match="was not made by a sweep"):
        plan_sweep(path)


# ----------------------------------------------------------------------------- running


def test_sweep_runs_skips_and_refuses_a_changed_config(tmp_path):
    sweep = {"sweep": "e", "config": base(tmp_path), "recipe": "train", "grid": {"train.seed": [0, 1]}}
    result = run_sweep(write_sweep(tmp_path, sweep), workers=2, quiet=True)
    assert result.ok and [j.state for j in result.plan.jobs] == ["done", "done"]
    for job in result.plan.jobs:  # the same numbers as the run made directly
        direct = train_model(from_dict({**job_config(job), "name": "direct", "out_dir": str(tmp_path / "x")}),
                             run_dir=tmp_path / "x" / job.name)
        summary = json.loads((job.run_dir / "summary.json").read_text())
        assert summary["test_acc"] == direct.summary["test_acc"] and summary["val_acc"] == direct.summary["val_acc"]
    status = json.loads((tmp_path / "runs" / "e" / "sweep_status.json").read_text())
    assert status["counts"]["done"] == 2 and status["total"] == 2 and status["jobs"][0]["epochs_done"] == 2
    again = run_sweep(write_sweep(tmp_path, sweep), quiet=True)
    assert all(j.skipped for j in again.plan.jobs)
    sweep["config"]["optim"]["lr"] = 0.2
    with pytest.raises(ConfigError, match=r"sweep run 'seed=0': cannot resume .* it was made with optim.lr=0.05, "
                                          r"not 0.2"):
        plan_sweep(write_sweep(tmp_path, sweep))


def job_config(job) -> dict:
    from teachkit.config import to_dict

    tree = to_dict(job.cfg)
    tree.pop("name"), tree.pop("out_dir")
    return tree


def _lines(file: Path) -> int:
    try:
        return len(file.read_text().splitlines())
    except OSError:
        return 0


@pytest.mark.skipif(sys.platform != "linux", reason="kills a worker by its lock file's pid")
def test_grid_with_shared_teachers_survives_a_killed_worker(tmp_path):
    """3 methods x 2 teacher objectives x 3 seeds plus no KD on 2 workers; the CE teacher's worker is killed
    mid-run: its students are blocked, the rest finish, the sweep exits 1; the rerun resumes the teacher (same
    weights as an uninterrupted one), trains every teacher exactly once, and the report's numbers are the
    runs' summaries."""
    cfg = base(tmp_path, teacher={"model": {"name": "mlp", "options": {"hidden": [256, 256]}}, "epochs": 40,
                                  "seed": 0},
               train={"epochs": 3, "progress": False})
    sweep = {"sweep": "grid", "config": cfg, "grid": {"train.seed": [0, 1, 2]},
             "list": [{"label": "no-kd", "recipe": "train"},
                      *({"kd.method": m, "grid": {"teacher.loss": ["ce", "mse"]}} for m in ("kd", "dist", "pkt"))],
             "report": {"baseline": "variant=no-kd"}}
    path = write_sweep(tmp_path, sweep)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "teachkit.cli", "sweep", str(path), "--workers", "2", "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    plan = plan_sweep(path)
    teacher = next(j for j in plan.jobs if j.role == "teacher" and j.cfg.train.loss == "ce")
    log = teacher.run_dir / "metrics.jsonl"
    lock = tmp_path / "runs" / "_locks" / f"{teacher.name.replace('/', '__')}.lock"
    deadline = time.monotonic() + 120
    while _lines(log) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    os.kill(int(lock.read_text().split()[0]), signal.SIGKILL)
    killed_at = _lines(log)
    out, _ = proc.communicate(timeout=300)
    assert 2 <= killed_at < 40, out
    assert proc.returncode == 1, out
    assert "FAILED   teachers/mlp-ce-seed0" in out and "blocked  kd,loss=ce,seed=0" in out
    status = json.loads((tmp_path / "runs" / "grid" / "sweep_status.json").read_text())
    assert status["counts"] == {"done": 1 + 3 + 9, "running": 0, "failed": 1, "blocked": 9, "queued": 0}
    mse = next(j for j in plan.jobs if j.role == "teacher" and j.cfg.train.loss == "mse")
    mse_mtime = (mse.run_dir / "checkpoints" / "last.safetensors").stat().st_mtime_ns

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "started  teachers/mlp-ce-seed0" in rerun.stderr and "(resuming)" in rerun.stderr
    assert "teachers/mlp-mse" not in rerun.stderr  # finished: skipped, not trained again
    assert (mse.run_dir / "checkpoints" / "last.safetensors").stat().st_mtime_ns == mse_mtime
    assert [json.loads(x)["epoch"] for x in log.read_text().splitlines()] == list(range(1, 41))  # trained once
    assert len(list((tmp_path / "runs" / "teachers").iterdir())) == 2
    # the resumed teacher is the uninterrupted one, bit for bit
    direct = train_model(from_dict({**job_config(teacher), "name": "t", "out_dir": str(tmp_path / "direct")}))
    a = load_file(teacher.run_dir / "checkpoints" / "last.safetensors")
    b = load_file(direct.run_dir / "checkpoints" / "last.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # shared teacher outputs: dist and pkt read the cache kd wrote
    summaries = {j.name: json.loads((j.run_dir / "summary.json").read_text()) for j in plan.jobs if j.role == "student"}
    assert summaries["dist,loss=mse,seed=1"]["teacher_cache"]["status"] == "loaded"
    assert summaries["kd,loss=mse,seed=1"]["cost"]["teacher_forwards_saved"] > 0
    # the report (written at the end of the sweep) holds the runs' numbers
    report = (tmp_path / "runs" / "grid" / "report" / "report.csv").read_text().splitlines()
    assert len(report) >= 1 + 7
    check_report(tmp_path / "runs" / "grid", summaries)


def check_report(folder: Path, summaries: dict[str, dict]) -> None:
    """Each row of the report written at the end of the sweep holds its runs' numbers, computed here from their
    summaries: n, mean and sample std, and the paired difference to no KD with its t interval."""
    import csv
    import statistics

    rows = {(r["variant"], r["teacher.loss"]): r
            for r in csv.DictReader((folder / "report" / "report.csv").read_text().splitlines())}
    assert set(rows) == {("no-kd", "")} | {(m, loss) for m in ("kd", "dist", "pkt") for loss in ("ce", "mse")}
    base = [summaries[f"no-kd,seed={s}"]["test_acc"] for s in range(3)]
    for method in ("kd", "dist", "pkt"):
        for loss in ("ce", "mse"):
            values = [summaries[f"{method},loss={loss},seed={s}"]["test_acc"] for s in range(3)]
            row = rows[(method, loss)]
            assert int(row["n"]) == 3 and int(row["pairs"]) == 3
            assert float(row["test_last_mean"]) == pytest.approx(statistics.mean(values), abs=1e-5)
            assert float(row["test_last_std"]) == pytest.approx(statistics.stdev(values), abs=1e-5)
            diffs = [a - b for a, b in zip(values, base, strict=True)]
            half = 4.303 * statistics.stdev(diffs) / 3 ** 0.5  # t_{0.975, 2}
            assert float(row["diff"]) == pytest.approx(statistics.mean(diffs), abs=1e-5)
            assert float(row["diff_low"]) == pytest.approx(statistics.mean(diffs) - half, abs=1e-4)


@pytest.mark.skipif(sys.platform != "linux", reason="Ray's local cluster")
def test_ray_backend_gives_the_local_results(tmp_path):
    pytest.importorskip("ray")
    sweep = {"sweep": "r", "config": base(tmp_path), "grid": {"train.seed": [0, 1]},
             "list": [{"label": "no-kd", "recipe": "train"}, {"kd.method": "kd"}]}
    local = run_sweep(write_sweep(tmp_path, sweep), workers=2, quiet=True)
    ray_sweep = run_sweep(write_sweep(tmp_path, {**sweep, "out_dir": str(tmp_path / "ray")}, "r.yaml"),
                          backend="ray", workers=2, workers_given=True, threads=1, quiet=True)
    assert local.ok and ray_sweep.ok and len(ray_sweep.plan.jobs) == 2 + 4  # a teacher per seed
    for a, b in zip(local.plan.jobs, ray_sweep.plan.jobs, strict=True):
        sa, sb = (json.loads((j.run_dir / "summary.json").read_text()) for j in (a, b))
        assert a.name == b.name and sa["test_acc"] == sb["test_acc"] and sa["val_acc"] == sb["val_acc"]


def test_ray_missing_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"--backend ray needs Ray, which is not installed: pip install "
                                          r"'teachkit\[ray\]'"):
        run_sweep("unused.yaml", backend="ray")


def test_failed_job_is_reported_with_its_log_and_retried(tmp_path, monkeypatch):
    sweep = {"sweep": "f", "config": base(tmp_path), "recipe": "train", "list": [{"label": "ok"},
                                                                                 {"label": "bad", "train.epochs": 2}]}
    path = write_sweep(tmp_path, sweep)
    bad = tmp_path / "runs" / "f" / "bad"
    bad.mkdir(parents=True)
    (bad / "metrics.jsonl").mkdir()  # the run cannot write its log: it fails after its checks
    result = run_sweep(path, workers=1, quiet=True)
    (job,) = result.failed
    assert job.name == "bad" and job.state == "failed" and job.returncode not in (0, None)
    assert "metrics.jsonl" in job.error and result.plan.job("ok").state == "done"
    (bad / "metrics.jsonl").rmdir()
    again = run_sweep(path, workers=1, quiet=True)
    assert again.ok and again.plan.job("ok").skipped and not again.plan.job("bad").skipped


def test_recipes_reading_teachers_are_declared():
    from teachkit.recipes.teacher import TEACHER_USES

    assert {"kd", "takd", "eskd", "prokd", "annealing", "rco", "seqkd", "ban"} <= set(TEACHER_USES)
    assert "l2t" not in TEACHER_USES and "train" not in TEACHER_USES and set(TEACHER_USES) <= set(RECIPES.names())


def test_takd_assistant_shared_and_equal_to_in_command(tmp_path):
    """TAKD runs naming the same teacher and assistant share one assistant job (after the teacher); the student
    distilled from the shared assistant is the one TAKD trains on its own, bit for bit."""
    from teachkit.config import with_changes
    from teachkit.recipes.baselines import assistant_config

    cfg = base(tmp_path, takd={"assistant": {"name": "mlp", "options": {"hidden": [24]}}})
    path = write_sweep(tmp_path, {"sweep": "t", "config": cfg, "recipe": "takd",
                                  "list": [{"label": "s16", "model.options": {"hidden": [16]}},
                                           {"label": "s8", "model.options": {"hidden": [8]}}]})
    plan = plan_sweep(path)
    teacher, assistant, s16, s8 = plan.jobs
    assert teacher.name.startswith("teachers/") and assistant.name.startswith("shared/assistant-mlp-seed0-")
    assert assistant.needs == [teacher.name] and assistant.recipe == "kd"
    assert s16.needs == s8.needs == [teacher.name, assistant.name]
    assert s16.cfg.takd.assistant_checkpoint == str(assistant.run_dir)

    own_cfg = from_dict({**cfg, "name": "own", "out_dir": str(tmp_path / "own")})
    own = RECIPES.get("takd")(own_cfg)
    t = train_model(with_changes(teacher.cfg, out_dir=str(tmp_path / "b")))
    a_cfg = assistant_config(with_changes(own_cfg, teacher={"checkpoint": str(t.run_dir)}))
    a = distill(with_changes(a_cfg, name="assistant", out_dir=str(tmp_path / "b")))
    given = RECIPES.get("takd")(with_changes(own_cfg, name="given", out_dir=str(tmp_path / "b"),
                                             teacher={"checkpoint": str(t.run_dir)},
                                             takd={"assistant_checkpoint": str(a.run_dir)}))
    for x, y in [(own.run_dir / "assistant", a.run_dir), (own.run_dir / "student", given.run_dir / "student")]:
        wx, wy = (load_file(f / "checkpoints" / "last.safetensors") for f in (x, y))
        assert all(torch.equal(wx[k], wy[k]) for k in wx)
    assert own.summary["test_acc"] == given.summary["test_acc"]
