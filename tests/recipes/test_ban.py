"""Born-Again Networks (Furlanello et al. 2018): the chain of generations, resume, BANE, options and the CLI."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

import teachkit.recipes.ban as ban_module
import teachkit.recipes.teacher as teacher_module
from teachkit.config import load_config
from teachkit.engine.evaluate import predict
from teachkit.errors import ConfigError
from teachkit.recipes import RECIPES, load_model, train_model
from teachkit.recipes.common import load_data
from tests.conftest import tiny_config

SAME = {"name": "mlp", "options": {"hidden": [16]}}  # the tiny student's architecture


def read(path):
    return json.loads(path.read_text())


def test_generations_chain_ensemble_and_resume(tiny, capsys, monkeypatch):
    cfg = tiny(name="ban", train={"epochs": 2, "seed": 3, "progress": False}, teacher={"model": SAME, "epochs": 2},
               ban={"generations": 2, "ensemble": True})
    result = RECIPES.get("ban")(cfg)
    run = result.run_dir
    assert "warning" not in capsys.readouterr().err  # teacher and students share the architecture
    teacher, gen1, gen2 = run / "teacher", run / "gen-1", run / "gen-2"

    # gen-1 learnt from the teacher trained here, gen-2 from gen-1's final checkpoint; seeds train.seed + g
    configs = {g: yaml.safe_load((run / f"gen-{g}" / "config.yaml").read_text()) for g in (1, 2)}
    assert configs[1]["teacher"]["checkpoint"] == str(teacher)
    assert configs[2]["teacher"]["checkpoint"] == str(gen1) and configs[2]["teacher"]["select"] == "last"
    assert (configs[1]["train"]["seed"], configs[2]["train"]["seed"]) == (4, 5)
    assert read(gen1 / "teacher.json")["val_acc"] == pytest.approx(read(teacher / "summary.json")["val_acc"])
    assert read(gen2 / "teacher.json")["val_acc"] == pytest.approx(read(gen1 / "summary.json")["val_acc"])
    w1, _ = load_model(gen1)
    w2, _ = load_model(gen2)
    assert not torch.equal(next(w1.parameters()), next(w2.parameters()))

    # the summary: the last generation's, the table of all generations, the ensemble, the cost
    summary = read(run / "summary.json")
    assert summary == json.loads(json.dumps(result.summary))
    last = read(gen2 / "summary.json")
    assert summary["test_acc"] == pytest.approx(last["test_acc"])
    table = summary["generations"]
    assert [row["generation"] for row in table] == [0, 1, 2]
    assert [row["seed"] for row in table] == [3, 4, 5]
    for row, folder in zip(table, (teacher, gen1, gen2), strict=True):
        figures = read(folder / "summary.json")
        for key in ("val_acc", "test_acc", "best_val_acc", "test_acc_at_best"):
            assert row[key] == pytest.approx(figures[key]), (row["generation"], key)
    cost = summary["cost"]
    assert cost["teacher_epochs_trained"] == 2 and cost["student_epochs"] == 4
    assert cost["teacher_forward_images"] == sum(read(f / "summary.json")["cost"]["teacher_forward_images"]
                                                 for f in (gen1, gen2)) > 0

    # BANE = argmax of the mean softmax of the two students' last checkpoints, recomputed here
    splits = load_data(cfg.data, "cpu")
    ensemble = summary["ensemble"]
    assert ensemble["members"] == [1, 2]
    for split in ("val", "test"):
        data = getattr(splits, split)
        probs = torch.stack([predict(load_model(f)[0], data).softmax(1) for f in (gen1, gen2)]).mean(0)
        acc = (probs.argmax(1) == data.y).double().mean().item() * 100
        assert ensemble[f"{split}_acc"] == pytest.approx(acc, abs=1e-9)
        assert ensemble[f"{split}_loss"] == pytest.approx(torch.nn.functional.nll_loss(probs.log(), data.y).item(),
                                                          rel=1e-5)

    # --resume of the finished run trains nothing and reports the same figures
    def no_training(*args, **kwargs):
        raise AssertionError("a finished BAN run trained again")

    monkeypatch.setattr(ban_module, "distill", no_training)
    monkeypatch.setattr(teacher_module, "train_model", no_training)
    stamps = {p: p.stat().st_mtime_ns for f in (teacher, gen1, gen2) for p in f.rglob("*") if p.is_file()}
    again = RECIPES.get("ban")(cfg, resume=True)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert again.summary["generations"] == summary["generations"] and again.summary["ensemble"] == ensemble
    assert again.model is not None

    # an unfinished generation is trained on --resume; the finished ones before it are reused
    monkeypatch.undo()
    real, calls = ban_module.distill, []

    def counting(*args, **kwargs):
        calls.append(kwargs["run_dir"])
        return real(*args, **kwargs)

    monkeypatch.setattr(ban_module, "distill", counting)
    shutil.rmtree(gen2)
    redone = RECIPES.get("ban")(cfg, resume=True)
    assert calls == [gen2]
    assert redone.summary["generations"][1] == summary["generations"][1]


def test_given_teacher_of_another_architecture_warns(tiny, capsys):
    teacher = train_model(tiny(name="t", model={"name": "mlp", "options": {"hidden": [32]}}))
    capsys.readouterr()
    result = RECIPES.get("ban")(tiny(name="ban1", teacher={"checkpoint": str(teacher.run_dir), "select": "best"},
                                     ban={"generations": 1}))
    err = capsys.readouterr().err
    assert "warning: the teacher mlp {'hidden': [32]} is not the student model mlp {'hidden': [16]}" in err
    assert err.count("\n") == 1
    summary = result.summary
    assert "ensemble" not in summary
    assert summary["cost"]["teacher_epochs_trained"] == 0 and summary["cost"]["student_epochs"] == 2
    row = summary["generations"][0]
    assert row["run_dir"] == str(teacher.run_dir) and row["seed"] is None
    assert row["val_acc"] == pytest.approx(teacher.summary["best_val_acc"])  # teacher.select=best
    assert row["best_val_acc"] == pytest.approx(teacher.summary["best_val_acc"])
    assert row["test_acc_at_best"] == pytest.approx(teacher.summary["test_acc_at_best"])
    gen1 = yaml.safe_load((result.run_dir / "gen-1" / "config.yaml").read_text())
    assert (gen1["teacher"]["checkpoint"], gen1["teacher"]["select"]) == (str(teacher.run_dir), "best")


@pytest.mark.parametrize("overrides, match", [
    (["ban.generations=0"], "ban.generations=0 is out of range: must be >= 1"),
    (["ban.ensemble=maybe"], "ban.ensemble='maybe' is not allowed: expected true/false"),
    (["ban.generation=2"], "unknown config key 'ban.generation' (did you mean 'generations'?)"),
])
def test_bad_options_are_one_line_config_errors(overrides, match):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert match in str(e.value) and "\n" not in str(e.value)


def test_cli_run_ban_end_to_end(tmp_path):
    path = tmp_path / "cfg.yaml"  # the tiny teacher (mlp [32]) is wider than the student: warned, allowed
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, teacher={"epochs": 1})))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "teachkit.cli", "run", "ban", str(path), "name=b", "train.epochs=1",
                           "ban.generations=2", "ban.ensemble=true", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "teachkit: warning: the teacher mlp {'hidden': [32]} is not the student model" in proc.stderr
    run = tmp_path / "runs" / "b"
    assert f"run finished: {run}  val " in proc.stdout
    summary = read(run / "summary.json")
    assert [row["generation"] for row in summary["generations"]] == [0, 1, 2]
    assert set(summary["ensemble"]) >= {"val_acc", "test_acc"}


def test_resume_may_extend_the_chain(tiny, monkeypatch):
    """ban.generations is resumable: a finished 1-generation chain resumed with 2 trains only generation 2."""
    cfg = tiny(name="grow", train={"epochs": 1, "progress": False}, teacher={"model": SAME, "epochs": 1},
               ban={"generations": 1})
    RECIPES.get("ban")(cfg)
    calls = []
    real = ban_module.distill
    monkeypatch.setattr(ban_module, "distill", lambda c, **k: calls.append(c.name) or real(c, **k))
    from teachkit.config import with_changes

    result = RECIPES.get("ban")(with_changes(cfg, ban={"generations": 2}), resume=True)
    assert calls == ["grow/gen-2"] and [row["generation"] for row in result.summary["generations"]] == [0, 1, 2]
