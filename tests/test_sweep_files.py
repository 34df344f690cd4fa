"""The shipped sweep files (sweeps/*.yaml): each plans (every run's config validated), expands to the expected
runs and shared jobs, gives every student that reads a teacher a shared one, and reproduces the configs it is
built from: every student config equals its source config under configs/ and every shared teacher equals the
teacher config those name, apart from what the sweep changes on purpose. The generators' --check passes."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from teachkit.config import from_dict, read_yaml, resolve_paths, to_dict
from teachkit.experiments.sweep import Job, Plan, plan_sweep
from teachkit.recipes.teacher import TEACHER_USES

REPO = Path(__file__).resolve().parent.parent
SWEEPS = REPO / "sweeps"
CONFIGS = REPO / "configs"

#: sweep file -> (students, shared teachers, shared TAKD assistants)
EXPECTED = {
    "prokd_cifar10.yaml": (18, 1, 3),
    "prokd_cifar100.yaml": (18, 1, 3),
    "prokd_glue_bert.yaml": (147, 8, 24),  # 8 tasks x 6 methods + STS-B NoKD, x 3 seeds
    "prokd_glue_roberta.yaml": (147, 8, 24),
    "prokd_squad_bert.yaml": (24, 2, 6),  # 2 versions x 4 methods x 3 seeds
    "prokd_squad_roberta.yaml": (24, 2, 6),
    "mse_teacher_table1.yaml": (864, 12, 0),  # 144 (pair, method) x {ce, mse} x 3 seeds
    "l2t_dlf_mnist.yaml": (12, 0, 0),  # 2 models x {ce, l2t} x 3 seeds
    "l2t_dlf_cifar.yaml": (48, 0, 0),  # 8 (dataset, model) x {ce, l2t} x 3 seeds
    "zoo_cifar100.yaml": (81, 1, 0),  # 27 methods (no KD included) x 3 seeds, one shared resnet32x4 teacher
}
#: recipes that follow the teacher's recorded trajectory (need a teacher saved every epoch)
RECORDED = {"prokd", "annealing", "rco", "eskd"}


def test_every_sweep_file_is_listed():
    assert sorted(p.name for p in SWEEPS.glob("*.yaml")) == sorted(EXPECTED)


@cache
def planned(name: str, out_dir: str) -> Plan:
    return plan_sweep(SWEEPS / name, out_dir=out_dir)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("sweeps"))


@cache
def config_by_name() -> dict[str, Path]:
    """Every config file under configs/ by its run name (what a student's teacher.checkpoint runs/<name> names)."""
    out = {}
    for path in CONFIGS.rglob("*.yaml"):
        name = (yaml.safe_load(path.read_text()) or {}).get("name")
        if isinstance(name, str):
            out[name] = path
    return out


@cache
def loaded(path: Path) -> dict:
    """The config file ``path`` as a sweep reads it: its paths relative to its folder."""
    return to_dict(from_dict(resolve_paths(read_yaml(path), path.parent)))


@cache
def entry_bases(name: str) -> dict[tuple[str, str], Path]:
    """(axis, label) -> the entry's base file, for the sweep's list entries that name one."""
    raw = read_yaml(SWEEPS / name)
    lists = raw["list"] if isinstance(raw["list"], dict) else {"variant": raw["list"]}
    return {(axis, str(e["label"])): (SWEEPS / e["base"]).resolve()
            for axis, entries in lists.items() for e in entries if "base" in e}


def source_file(name: str, job: Job) -> Path:
    """The config under configs/ that student ``job`` of sweep ``name`` runs."""
    if name == "mse_teacher_table1.yaml":
        cfg = job.cfg
        method = job.labels["run"].rsplit("-", 1)[1]
        return CONFIGS / "mse_teacher" / cfg.teacher.loss / f"{cfg.teacher.model.name}-{cfg.model.name}" / \
            f"{method}.yaml"
    bases = entry_bases(name)
    found = [bases[axis, label] for axis, label in job.labels.items() if (axis, label) in bases]
    if not found and "base" in read_yaml(SWEEPS / name):  # one base for every run (the zoo sweep)
        return (SWEEPS / read_yaml(SWEEPS / name)["base"]).resolve()
    assert len(found) == 1, job.name
    return found[0]


def without(tree: dict, *dotted: str) -> dict:
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for key in dotted:
        section, _, leaf = key.partition(".")
        if leaf:
            tree.get(section, {}).pop(leaf, None)
        else:
            tree.pop(section, None)
    return tree


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sweep_plans_and_shares_teachers(name, out_dir):
    plan = planned(name, out_dir)
    students = [j for j in plan.jobs if j.role == "student"]
    teachers = {j.name: j for j in plan.jobs if j.name.startswith("teachers/")}
    assistants = {j.name: j for j in plan.jobs if j.name.startswith("shared/assistant-")}
    assert (len(students), len(teachers), len(assistants)) == EXPECTED[name]
    assert len(plan.jobs) == len(students) + len(teachers) + len(assistants)
    used = set()
    for job in students:
        use = TEACHER_USES.get(job.recipe)
        if use is None:  # train, l2t: no teacher
            assert not job.needs, job.name
            continue
        assert use[1](job.cfg), f"{job.name}: its recipe {job.recipe} would not read the shared teacher"
        teacher = [n for n in job.needs if n.startswith("teachers/")]
        assert len(teacher) == 1, job.name
        assert job.cfg.teacher.checkpoint == str(teachers[teacher[0]].run_dir)
        used.add(teacher[0])
        if job.recipe in RECORDED:
            assert teacher[0].endswith("-traj") and teachers[teacher[0]].cfg.train.save_every == 1
        if job.recipe in ("prokd", "annealing", "rco"):
            assert job.cfg.prokd.mode == "auto"
        if job.recipe == "takd":
            assistant = [n for n in job.needs if n.startswith("shared/assistant-")]
            assert len(assistant) == 1 and job.cfg.takd.assistant_checkpoint == str(assistants[assistant[0]].run_dir)
    assert used == set(teachers)
    for job in teachers.values():
        assert job.cfg.train.seed == 0  # teacher.seed 0: one teacher for every student seed
    assert {job.cfg.train.seed for job in students} == {0, 1, 2}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sweep_runs_the_configs(name, out_dir):
    """Each student is its source config (seed, teacher and prokd.mode aside); each shared teacher is the teacher
    config that source names as ``teacher.checkpoint: runs/<name>`` (seed 0 and save_every aside)."""
    plan = planned(name, out_dir)
    teachers = {j.name: j for j in plan.jobs if j.role == "teacher"}
    ignored = ("name", "out_dir", "teacher", "train.seed", "train.progress", "prokd.mode", "takd.assistant_checkpoint")
    if name == "zoo_cifar100.yaml":  # every method on one base config: the kd section is what varies
        ignored = (*ignored, "kd")
        for job in (j for j in plan.jobs if j.role == "student" and j.recipe == "kd"):
            assert job.labels["variant"].split("-")[0] == job.cfg.kd.methods[0], job.name
    for job in (j for j in plan.jobs if j.role == "student"):
        path = source_file(name, job)
        source = loaded(path)
        assert without(to_dict(job.cfg), *ignored) == without(source, *ignored), f"{job.name} vs {path}"
        if not job.needs:
            continue
        assert source["teacher"]["select"] == job.cfg.teacher.select
        teacher_path = config_by_name()[read_yaml(path)["teacher"]["checkpoint"].removeprefix("runs/")]
        teacher = to_dict(teachers[job.needs[0]].cfg)
        skip = ("name", "out_dir", "train.seed", "train.save_every", "train.progress")
        assert without(teacher, *skip) == without(loaded(teacher_path), *skip), f"{job.name} vs {teacher_path}"


@pytest.mark.parametrize("script", ["generate_mse_teacher_configs.py", "generate_text_configs.py"])
def test_generators_are_up_to_date(script):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--check"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
