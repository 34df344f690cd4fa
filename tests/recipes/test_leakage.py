"""No silent leakage (teacher data vs the student's val/test), validated trajectory manifests, one trajectory-mode
rule for Pro-KD / Annealing-KD / RCO, teacher input renormalisation, epoch-line facts and warnings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.models import FrozenTeacher
from teachkit.recipes import RunContext, TeacherSource
from teachkit.recipes.kd import dominant_terms
from teachkit.recipes.leakage import check_overlap, split_differences
from tests.conftest import tiny_config

TEACHER = {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2}


def train_teacher(root: Path, name: str, *overrides: str) -> Path:
    """A teacher recorded every epoch (trajectory/) in ``root/runs/name``."""
    assert main(["train", str(root / "cfg.yaml"), f"name={name}", "model.options.hidden=[32]", "train.save_every=1",
                 *overrides, "--quiet"]) == 0
    return root / "runs" / name


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One config file and the teachers every test reads (trained once per module)."""
    root = tmp_path_factory.mktemp("leak")
    (root / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(root, teacher=TEACHER)))
    return {"root": root, "cfg": str(root / "cfg.yaml"),
            "rec": train_teacher(root, "rec"),
            "seed1": train_teacher(root, "seed1", "data.split_seed=1"),
            "valf": train_teacher(root, "valf", "data.val_fraction=0.2"),
            "opts": train_teacher(root, "opts", "data.options.n_train=200"),
            "small": train_teacher(root, "small", "model.options.hidden=[8]"),
            "pool": train_teacher(root, "pool", "data.train_subset=100", "data.subset_seed=3")}


def broken_copy(world, tag: str, edit) -> Path:
    """A copy of the recorded teacher ``rec`` whose trajectory manifest ``edit(doc, folder)`` changed."""
    folder = world["root"] / "broken" / tag
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(world["rec"], folder)
    manifest = folder / "trajectory" / "trajectory.json"
    doc = json.loads(manifest.read_text())
    new = edit(doc, folder)
    manifest.write_text(new if isinstance(new, str) else json.dumps(new if new is not None else doc))
    return folder


def _other_model(doc, folder):
    src = folder.parent.parent / "runs" / "small" / "trajectory" / "epoch_0001.safetensors"
    shutil.copy(src, folder / "trajectory" / "other.safetensors")
    digest = json.loads(src.with_suffix(".json").read_text())["sha256"]
    doc["checkpoints"][0].update(file="other.safetensors", sha256=digest)


MANIFESTS = {  # tag -> (edit of the parsed manifest, fragment of the one-line error)
    "string-epoch": (lambda d, f: d["checkpoints"][0].update(epoch="1"), "epoch='1' is not an integer >= 0"),
    "bool-epoch": (lambda d, f: d["checkpoints"][0].update(epoch=True), "epoch=True is not an integer"),
    "no-sha256": (lambda d, f: d["checkpoints"][1].pop("sha256") and None, "sha256=None is not a 64-digit hex digest"),
    "dict-not-list": (lambda d, f: {"checkpoints": {str(e["epoch"]): e for e in d["checkpoints"]}},
                      "'checkpoints' is a list of entries; got dict"),
    "list-at-top": (lambda d, f: d["checkpoints"], "must be an object whose 'checkpoints' is a list"),
    "string-entries": (lambda d, f: {"checkpoints": [e["file"] for e in d["checkpoints"]]},
                       "entry 0 is 'epoch_0001.safetensors', not an object"),
    "outside": (lambda d, f: d["checkpoints"][0].update(file="../checkpoints/last.safetensors"),
                "resolves outside its trajectory folder"),
    "absolute": (lambda d, f: d["checkpoints"][0].update(file=str(f / "checkpoints" / "last.safetensors")),
                 "resolves outside its trajectory folder"),
    "duplicate": (lambda d, f: d["checkpoints"][1].update(epoch=1), "epoch 1 is listed twice"),
    "missing-file": (lambda d, f: d["checkpoints"][0].update(file="epoch_0009.safetensors"), "does not exist"),
    "not-json": (lambda d, f: "{not json", "is not valid JSON"),
    "other-model": (_other_model, "another model's checkpoint"),
    "wrong-sha": (lambda d, f: d["checkpoints"][1].update(sha256="0" * 64), "fails its sha256 check"),
}


def bad_rows(world):
    rec, seed1 = str(world["rec"]), str(world["seed1"])
    rows = [
        (["distill", f"teacher.checkpoint={seed1}"], "data.split_seed=1 (this run: 0)"),
        (["run", "prokd", f"teacher.checkpoint={seed1}"], "data.split_seed=1 (this run: 0)"),
        (["run", "eskd", "eskd.search=true", f"teacher.checkpoint={seed1}"], "data.split_seed=1"),
        (["distill", f"teacher.checkpoint={world['valf']}"], "data.val_fraction=0.2 (this run: 0.1)"),
        (["distill", f"teacher.checkpoint={world['opts']}"], "data.options={"),
        (["distill", f"teacher.checkpoint={world['opts']}/trajectory/epoch_0001.safetensors"], "data.options={"),
        *[(["run", r, "prokd.mode=online", f"teacher.checkpoint={rec}"], "online mode trains the teacher itself")
          for r in ("prokd", "annealing", "rco")],
        *[(["run", r, "prokd.mode=replay"], "replay mode needs teacher.checkpoint") for r in ("annealing", "rco")],
        (["run", "rco", "prokd.mode=sometimes"], "prokd.mode='sometimes'"),
    ]
    for tag, (edit, fragment) in MANIFESTS.items():
        folder = broken_copy(world, tag, edit)
        recipe = ["run", "eskd", "eskd.search=true"] if tag in ("wrong-sha", "other-model") else ["run", "prokd"]
        rows.append(([*recipe, f"teacher.checkpoint={folder}"], fragment))
    tampered = broken_copy(world, "wrong-sha-rco", MANIFESTS["wrong-sha"][0])
    rows.append((["run", "rco", "rco.anchors=2", f"teacher.checkpoint={tampered}"], "fails its sha256 check"))
    return rows


def test_bad_inputs_are_one_line_errors(world, capsys):
    """Every row: exit status 2, the fragment in a one-line stderr, no traceback, no run folder kept busy."""
    failures = []
    for i, (args, fragment) in enumerate(bad_rows(world)):
        capsys.readouterr()
        head = args[:2] if args[0] == "run" else args[:1]
        code = main([*head, world["cfg"], *args[len(head):], f"name=bad{i}", "--quiet"])
        err = capsys.readouterr().err
        if code != 2 or fragment not in err or "Traceback" in err or err.strip().count("\n"):
            failures.append((args, fragment, code, err))
    assert not failures, "\n".join(f"{a} wants {f!r}, got {c}: {e.strip()[:300]}" for a, f, c, e in failures)


def test_allow_overlap_runs_records_and_passes_the_overlap_on(world, capsys):
    cfg, seed1 = world["cfg"], world["seed1"]
    assert main(["distill", cfg, "name=allowed", f"teacher.checkpoint={seed1}", "teacher.allow_overlap=true",
                 "--quiet"]) == 0
    summary = json.loads((world["root"] / "runs" / "allowed" / "summary.json").read_text())
    assert "data.split_seed=1 (this run: 0)" in summary["teacher_overlap_allowed"]
    assert any("teacher.allow_overlap=true" in w for w in summary["warnings"])
    shown = capsys.readouterr()
    assert "warning" in shown.out + shown.err  # printed, or (--quiet) counted on the summary line
    # a student of an overlapping teacher carries the overlap: as a teacher it is refused without allow_overlap
    assert main(["distill", cfg, "name=grandchild", f"teacher.checkpoint={world['root'] / 'runs' / 'allowed'}",
                 "--quiet"]) == 2
    assert "distilled from an overlapping teacher" in capsys.readouterr().err
    assert main(["run", "prokd", cfg, "name=allowed-replay", f"teacher.checkpoint={seed1}", "train.epochs=3",
                 "teacher.allow_overlap=true", "prokd.tau_max=2", "--quiet"]) == 0
    replay = json.loads((world["root"] / "runs" / "allowed-replay" / "summary.json").read_text())
    assert "data.split_seed=1" in replay["teacher_overlap_allowed"] and replay["plan"]["mode"] == "replay"
    # settings that only shrink the teacher's training pool are fine, and so is the student's own subset
    assert main(["distill", cfg, "name=from-pool", f"teacher.checkpoint={world['pool']}", "data.train_subset=60",
                 "data.subset_seed=2", "--quiet"]) == 0
    pooled = json.loads((world["root"] / "runs" / "from-pool" / "summary.json").read_text())
    assert "teacher_overlap_allowed" not in pooled


@pytest.mark.parametrize("teacher, student, fragment", [
    ({"name": "synthetic", "split_seed": 1}, {"name": "synthetic"}, "data.split_seed=1 (this run: 0)"),
    ({"name": "synthetic", "root": "~/x"}, {"name": "synthetic", "root": "/elsewhere"}, "data.root='~/x'"),
    ({"name": "digits"}, {"name": "synthetic"}, "data.name='digits' (this run: 'synthetic')"),
    ({"name": "synthetic", "train_subset": 5, "subset_seed": 2, "few_shot": 1, "omit_classes": [1], "batch_size": 3},
     {"name": "synthetic"}, None),
    ({"name": "synthetic", "future_split_key": 1}, {"name": "synthetic"}, "data.future_split_key=1 (this run: None)"),
])
def test_split_differences(teacher, student, fragment):
    from teachkit.data import DataConfig

    diffs = split_differences(teacher, from_dict({"data": student}).data)
    assert (diffs == []) if fragment is None else any(fragment in d for d in diffs), diffs
    assert check_overlap({"data": teacher}, DataConfig(**student), allow=True, where="t") == (
        None if fragment is None else f"teacher t was trained with {', '.join(diffs)}, so its training data may "
                                      f"include this run's val/test images")
    assert "records no data settings" in check_overlap({}, DataConfig(**student), allow=True, where="t")


def test_frozen_teacher_renormalises_to_its_own_statistics():
    module = torch.nn.Flatten()
    frozen = FrozenTeacher(module)
    x = torch.randn(4, 2, 3, 3)
    assert not frozen.renormalise([0.5, 1.0], [2.0, 3.0], None, None)  # an older checkpoint: unchanged
    assert torch.equal(frozen(x), x.flatten(1))
    assert not frozen.renormalise([0.5, 1.0], [2.0, 3.0], [0.5, 1.0], [2.0, 3.0])  # same statistics
    assert frozen.renormalise([0.5, 1.0], [2.0, 3.0], [0.1, -1.0], [1.0, 4.0])
    ms, ss, mt, st = (torch.tensor(v).view(1, 2, 1, 1) for v in ([0.5, 1.0], [2.0, 3.0], [0.1, -1.0], [1.0, 4.0]))
    assert torch.allclose(frozen(x), ((x * ss + ms - mt) / st).flatten(1), atol=1e-6)
    assert frozen.state_dict() == {}  # nothing extra in any checkpoint


def test_teacher_source_reads_statistics_from_the_checkpoint(tiny, tmp_path):
    ctx = RunContext.open(tiny(name="s", teacher={"epochs": 1}))
    plain = TeacherSource(ctx).checkpoint() / "checkpoints" / "last.safetensors"
    frozen, _ = TeacherSource(ctx).frozen()
    assert not frozen.renormalises  # no statistics recorded (or the same): nothing changes
    tensors, state = load_checkpoint(plain)
    assert state["normalisation"] == {"mean": ctx.splits.mean.flatten().tolist(),
                                      "std": ctx.splits.std.flatten().tolist()}  # every checkpoint records them
    channels = ctx.splits.input_shape[0]
    for name, stats, expect in [("same", ctx.splits, False), ("other", None, True)]:
        mean = stats.mean.tolist() if stats is not None else [0.5] * channels
        std = stats.std.tolist() if stats is not None else [2.0] * channels
        file = tmp_path / f"{name}.safetensors"
        save_checkpoint(file, tensors, {**state, "normalisation": {"mean": mean, "std": std}})
        given = RunContext.open(tiny(name=f"g-{name}", teacher={"checkpoint": str(file)}))
        assert TeacherSource(given).frozen()[0].renormalises is expect


def test_epoch_lines_warnings_and_messages(tiny, world, capsys):
    cfg, runs = world["cfg"], world["root"] / "runs"

    def run(*args: str) -> dict:
        assert main([*args, "train.progress=true"]) == 0, capsys.readouterr().err
        name = next(a[5:] for a in args if a.startswith("name="))
        return json.loads((runs / name / "summary.json").read_text())

    def infos(name: str) -> list[dict]:
        return [json.loads(line).get("info") for line in (runs / name / "metrics.jsonl").read_text().splitlines()]

    s = run("run", "prokd", cfg, "name=hot", "train.epochs=3", "prokd.tau_max=5")  # online, T: 5, 4 (never 1)
    assert any("temperature never reaches 1" in w for w in s["warnings"])
    assert infos("hot") == [{"phase": "I", "teacher_epoch": 1, "T": 5.0}, {"phase": "I", "teacher_epoch": 2, "T": 4.0},
                            {"phase": "II"}]
    out = capsys.readouterr().out
    assert "hot epoch 1/3  phase I  teacher_epoch 1  T 5" in out
    s = run("run", "rco", cfg, "name=rco", f"teacher.checkpoint={world['rec']}", "rco.anchors=4", "train.epochs=2")
    assert any("rco.anchors=4 repeats teacher checkpoints" in w for w in s["warnings"])
    assert [i["phase"] for i in infos("rco")] == ["anchor 1/2", "anchor 2/2"]
    s = run("run", "annealing", cfg, "name=ann", f"teacher.checkpoint={world['rec']}", "train.epochs=3",
            "prokd.tau_max=2")
    assert not any("temperature" in w for w in s.get("warnings", [])) and s["plan"]["mode"] == "replay"  # auto
    run("distill", cfg, "name=fresh", "teacher.epochs=1", "train.epochs=1")
    out = capsys.readouterr().out
    assert "no teacher.checkpoint given: training the teacher first" in out and "teacher finished: " in out
    run("run", "eskd", cfg, "name=search", "eskd.search=true", f"teacher.checkpoint={world['rec']}", "train.epochs=1")
    out = capsys.readouterr().out
    assert "student 1/2 follows the teacher checkpoint after epoch 1" in out
    assert "search/from-epoch-0002 epoch 1/1" in out
    s = run("distill", cfg, "name=loud", f"teacher.checkpoint={world['rec']}", "kd.gamma.kd=1000", "train.epochs=1")
    assert any("x the CE term" in w and "kd.gamma.kd" in w for w in s["warnings"])


@pytest.mark.parametrize("ratios, warned", [
    ({"kd": 36.0}, []),
    ({"fitnet": 499.0}, ["fitnet"]),
    ({"crd": 250.0, "kd": 1.0}, ["crd"]),
    ({}, []),  # no label term to compare with
])
def test_dominant_terms(ratios, warned):
    got = dominant_terms(ratios, {"fitnet": 100.0, "crd": 0.8, "kd": 0.9})
    assert [w.split(" term ")[0].split()[-1] for w in got] == warned
