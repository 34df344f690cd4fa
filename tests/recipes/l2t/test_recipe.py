"""The l2t recipe end to end on tiny synthetic data, resume, and its one-line errors."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import teachkit.recipes.context as context
import teachkit.recipes.l2t.recipe as l2t
from teachkit.cli import main
from teachkit.engine.checkpoint import sha256_file
from teachkit.errors import CheckpointError, ConfigError
from teachkit.recipes import RECIPES
from teachkit.recipes.common import load_data
from teachkit.recipes.l2t import NonFiniteHypergradientError, load_teacher

L2T = {"teacher_steps": 2, "inner_steps": 3, "warm_start_steps": 2, "dev_batch_size": 16, "teacher_lr": 0.01}


def cfg_of(tiny, name="l2t", sections=None, **l2t_options):
    """The tiny l2t config; ``sections`` merges into other sections (``{"optim": {"name": "adamw"}}``)."""
    sections = dict(sections or {})
    l2t_options = {**sections.pop("l2t", {}), **l2t_options}
    return tiny(name=name, train={"epochs": 1, "progress": False}, l2t={**L2T, **l2t_options}, **sections)


def test_recipe_end_to_end_writes_teacher_log_teacher_and_summary(tiny):
    assert RECIPES.get("l2t") is l2t.l2t_dlf
    result = l2t.l2t_dlf(cfg_of(tiny, episode_gap=1, memory="checkpoint"))
    d = result.run_dir
    log = [json.loads(x) for x in (d / "teacher_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    for r in log:
        assert r["memory"] == "checkpoint" and r["biased"] is False and r["objective"] == "smooth_error"
        assert 0 <= r["dev_objective"] <= 1 and r["hypergrad_norm"] > 0
        assert set(r["phi"]) >= {"W_diag_mean", "W_offdiag_mean", "b_mean"}
    teacher, state = load_teacher(d / "teacher.safetensors")
    assert state["teacher_steps_done"] == 2 and state["teacher"]["teacher_model"] == "gated"
    assert not torch.equal(teacher.W.detach(), torch.eye(4))  # Adam moved it
    summary = json.loads((d / "summary.json").read_text())
    assert summary["loss"] == "l2t-dlf" and summary["l2t"]["teacher_steps_done"] == 2
    assert 0 <= summary["test_acc"] <= 100 and summary["epochs"] == 1
    terms = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"dlf", "loss"}
    phi = [json.loads(x) for x in (d / "phi_log.jsonl").read_text().splitlines()]
    assert [p["epoch"] for p in phi] == [1]


def test_resume_reuses_a_finished_teacher(tiny):
    cfg = cfg_of(tiny, teacher_model="static", ce_alpha=0.5)
    first = l2t.l2t_dlf(cfg)
    digest = sha256_file(first.run_dir / "teacher.safetensors")
    log = (first.run_dir / "teacher_log.jsonl").read_text()
    again = l2t.l2t_dlf(cfg, resume=True)
    assert sha256_file(again.run_dir / "teacher.safetensors") == digest
    assert (again.run_dir / "teacher_log.jsonl").read_text() == log
    assert again.summary["test_acc"] == pytest.approx(first.summary["test_acc"])
    terms = json.loads((first.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"dlf", "ce", "loss"}


def test_non_finite_hypergradient_keeps_the_last_good_teacher(tiny, monkeypatch):
    real = l2t.hypergradient
    calls = []

    def poisoned(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second episode's dev batch is NaN
            dev = args[7]
            args = (*args[:7], dev._replace(x=torch.full_like(dev.x, float("nan"))), *args[8:])
        return real(*args, **kwargs)

    monkeypatch.setattr(l2t, "hypergradient", poisoned)
    cfg = cfg_of(tiny, teacher_steps=3)
    with pytest.raises(NonFiniteHypergradientError, match=r"teacher step 2/3 .*last good teacher \(after 1 step"):
        l2t.l2t_dlf(cfg)
    run_dir = Path(cfg.out_dir) / "l2t"
    _, state = load_teacher(run_dir / "teacher.safetensors")
    assert state["teacher_steps_done"] == 1
    assert len((run_dir / "teacher_log.jsonl").read_text().splitlines()) == 1
    with pytest.raises(CheckpointError, match="holds an unfinished teacher"):  # not usable by another run
        l2t.l2t_dlf(cfg_of(tiny, name="l2t-next", sections={"teacher": {"checkpoint": str(run_dir)}}))


def test_teacher_checkpoint_drives_a_new_student_without_a_teacher_phase(tiny, monkeypatch):
    first = l2t.l2t_dlf(cfg_of(tiny, teacher_model="static"))
    real, loaded = l2t.load_teacher, []

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        loaded.append(out[0])
        return out

    def no_teacher_phase(*args, **kwargs):
        raise AssertionError("the teacher phase ran although teacher.checkpoint names a finished teacher")

    monkeypatch.setattr(l2t, "load_teacher", spy)
    monkeypatch.setattr(l2t, "train_teacher", no_teacher_phase)
    second = l2t.l2t_dlf(cfg_of(tiny, name="l2t-student", teacher_model="static",
                                sections={"teacher": {"checkpoint": str(first.run_dir)}}))
    d = second.run_dir
    assert d != first.run_dir
    assert not (d / "teacher_log.jsonl").exists() and not (d / "teacher.safetensors").exists()
    want, _ = load_teacher(first.run_dir / "teacher.safetensors")
    assert len(loaded) == 1 and type(loaded[0]) is type(want)
    for (name, a), (_, b) in zip(loaded[0].state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a.cpu(), b), name
    assert second.summary["l2t"]["teacher_file"] == str(first.run_dir / "teacher.safetensors")
    assert second.summary["l2t"]["teacher_steps_done"] == 2 and second.summary["cost"]["teacher_steps_trained"] == 0
    assert first.summary["cost"]["teacher_steps_trained"] == 2
    # the same teacher and seed drive the same student
    assert (d / "phi_log.jsonl").read_text() == (first.run_dir / "phi_log.jsonl").read_text()
    assert second.summary["test_acc"] == first.summary["test_acc"]
    data = {"options": {"shape": [1, 8, 8], "num_classes": 3, "n_train": 240, "n_test": 80}}
    with pytest.raises(ConfigError, match="was trained for 4 classes but the student has 3"):
        l2t.l2t_dlf(cfg_of(tiny, name="l2t-3", sections={"data": data, "teacher": {"checkpoint": str(first.run_dir)}}))


@pytest.mark.parametrize("changes, match", [
    ({"l2t": {"teacher_model": "transformer"}}, "l2t.teacher_model"),
    ({"l2t": {"memory": "truncate:0"}}, r"l2t.memory='truncate:0' is not allowed"),
    ({"l2t": {"memory": "sqrt"}}, r"choose full, checkpoint or truncate:K"),
    ({"l2t": {"teacher_betas": [0.9, 1.0]}}, r"l2t.teacher_betas=\[0.9, 1.0\] must be two numbers in \[0, 1\)"),
    ({"optim": {"name": "adamw"}}, "optim.name='adamw' is not supported"),
    ({"optim": {"nesterov": True}}, "nesterov=true is not supported"),
])
def test_bad_config_is_one_line_error(tiny, changes, match):
    # l2t.memory fails when the config loads (the l2t section validates itself), the rest when the recipe starts
    with pytest.raises(ConfigError, match=match):
        l2t.l2t_dlf(cfg_of(tiny, sections=changes))


def test_empty_validation_split_and_frozen_student(tiny, monkeypatch):
    cfg = cfg_of(tiny)
    splits = load_data(cfg.data, torch.device("cpu"))
    empty = dataclasses.replace(splits, val=splits.val.subset(torch.arange(0)))
    with pytest.raises(ConfigError, match="teacher objective needs a validation split, but it is empty"):
        l2t.l2t_dlf(cfg, splits=empty)
    real = context.make_model

    def frozen(*args, **kwargs):
        return real(*args, **kwargs).requires_grad_(False)

    monkeypatch.setattr(context, "make_model", frozen)
    with pytest.raises(ConfigError, match="has no differentiable parameters"):
        l2t.l2t_dlf(cfg_of(tiny), run_dir=cfg.out_dir + "/frozen")


def test_cli_reports_bad_input_on_one_line(tmp_path, capsys):
    import yaml

    from tests.conftest import tiny_config

    path = tmp_path / "l2t.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, l2t={"attention_k": 0})))
    assert main(["run", "l2t", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "l2t.attention_k=0" in err


def test_teachers_start_at_identity_and_round_trip(tmp_path):
    from teachkit.recipes.l2t import build_teacher, save_teacher

    states = torch.rand(3, 5)
    for kind in ("static", "gated"):
        teacher = build_teacher(kind, 4, 5)
        W, b = teacher(states)
        assert W.shape == (3, 4, 4) and b.shape == (3, 4)
        assert torch.equal(W, torch.eye(4).expand(3, 4, 4)) and torch.equal(b, torch.zeros(3, 4))
        W1, b1 = teacher(states[0])
        assert W1.shape == (4, 4) and b1.shape == (4,)
        with torch.no_grad():
            for p in teacher.parameters():
                p.add_(torch.randn_like(p))
        save_teacher(tmp_path / f"{kind}.safetensors", teacher, {"teacher_steps_done": 1})
        loaded, state = load_teacher(tmp_path / f"{kind}.safetensors")
        assert state["teacher_steps_done"] == 1 and type(loaded) is type(teacher)
        for a, c in zip(loaded(states), teacher(states), strict=True):
            assert torch.equal(a, c)
