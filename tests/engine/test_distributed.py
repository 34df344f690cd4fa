"""Multi-process data parallelism: a 2-process gloo job under torchrun equals the 1-process run with the same
global batch (to float tolerance), rank 0 alone writes the run folder, and the pieces it is made of."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from teachkit import distributed
from teachkit.engine import load_checkpoint
from tests.conftest import tiny_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(nproc: int, *args: str) -> subprocess.CompletedProcess:
    """``teachkit`` with ``nproc`` processes (torchrun, gloo, one thread each) or plainly for 1."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, "-m", "teachkit.cli", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), "-m", "teachkit.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(("rows", "world"), [(8, 2), (7, 2), (1, 2), (10, 3), (64, 4)])
def test_shards_cover_the_batch_once_in_order(rows, world):
    bounds = [distributed.shard_bounds(rows, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_one_process_collectives_are_identities():
    t = torch.arange(6.0).view(3, 2)
    assert distributed.world_size() == 1 and distributed.is_main()
    assert distributed.all_reduce_sum(t) is t
    assert distributed.all_gather_cat(t) is t


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same KD run (teacher trained first, then the student) with 1 and with 2 processes."""
    tmp = tmp_path_factory.mktemp("ddp")
    cfg = tiny_config(tmp, data={"batch_size": 32, "options": {"shape": [1, 8, 8], "num_classes": 4,
                                                                 "n_train": 256, "n_test": 80}},
                      train={"epochs": 2, "progress": False, "precision": "fp32"},
                      kd={"method": "kd"}, teacher={"cache": "off"})  # the teacher runs on every batch
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = {}
    for n in (1, 2):
        proc = launch(n, "distill", str(path), f"name=p{n}", "--quiet")
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[n] = (tmp / "runs" / f"p{n}", proc)
    return out


def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(two_runs):
    (one, _), (two, _) = two_runs[1], two_runs[2]
    for part in ("teacher/checkpoints/last.safetensors", "checkpoints/last.safetensors"):
        a, _ = load_checkpoint(one / part)
        b, state = load_checkpoint(two / part)
        weights = [k for k in a if k.startswith("model/")]
        assert weights
        for k in weights:  # float tolerance: the gradient is summed in another order
            gap = float((b[k] - a[k]).abs().max())
            assert gap < 1e-5, f"{part} {k} differs by {gap}"
    assert state["world_size"] == 2
    s1 = json.loads((one / "summary.json").read_text())
    s2 = json.loads((two / "summary.json").read_text())
    assert s2["test_acc"] == pytest.approx(s1["test_acc"], abs=1e-9)
    m1 = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in m2] == [1, 2]  # rank 0 alone wrote the log: one line per epoch
    for r1, r2 in zip(m1, m2, strict=True):
        assert r2["train"]["loss"] == pytest.approx(r1["train"]["loss"], rel=1e-5)
        for split in ("val", "test"):  # each process evaluated half of each split; the gathered outputs scored
            assert r2[split]["acc"] == pytest.approx(r1[split]["acc"], abs=1e-9)
            assert r2[split]["loss"] == pytest.approx(r1[split]["loss"], rel=1e-4)
    # teacher forwards over both processes (each ran the teacher on its half of every batch)
    assert s1["cost"]["teacher_forward_images"] == 2 * 230  # 2 epochs x 230 training rows (256 less val)
    assert s2["cost"]["teacher_forward_images"] == s1["cost"]["teacher_forward_images"]


def test_every_process_random_stream_is_checkpointed(two_runs):
    two, _ = two_runs[2]
    tensors, _ = load_checkpoint(two / "checkpoints" / "last.safetensors")
    assert "rng/torch" in tensors and "rng/rank1/torch" in tensors
    assert not torch.equal(tensors["rng/torch"], tensors["rng/rank1/torch"])  # distinct streams per process


def test_resuming_with_two_processes_continues_the_run(two_runs, tmp_path):
    two, _ = two_runs[2]
    cfg = yaml.safe_load((two / "config.yaml").read_text())
    path = tmp_path / "more.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = launch(2, "distill", str(path), f"out_dir={two.parent}", f"name={two.name}", "train.epochs=3",
                  "--resume", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (two / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]


def test_a_batch_that_does_not_divide_among_processes_is_one_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, data={"batch_size": 33})))
    proc = launch(2, "train", str(path), "--quiet")
    assert proc.returncode != 0
    assert "data.batch_size=33 does not divide among the 2 processes" in proc.stderr
    assert "e.g. 32 or 34" in proc.stderr


def nmt_config(tmp) -> dict:
    from tests.tasks.test_translation import nmt_config as base

    cfg = base(tmp)
    cfg["train"] = {**cfg["train"], "precision": "fp32"}
    for part in (cfg["model"], cfg["teacher"]["model"]):  # dropout masks come from each process's own stream
        part["options"] = {**part["options"], "dropout": 0.0}
    return cfg


@pytest.mark.parametrize("case", ["prokd-online", "translation-kd"])
def test_other_recipes_and_token_batches_equal_one_process(tmp_path, case):
    """Pro-KD online interleaves a teacher's and a student's trainer; translation batches hold a varying number
    of sentences, split unevenly and weighted by target tokens."""
    if case == "prokd-online":
        cfg = tiny_config(tmp_path, data={"batch_size": 32, "options": {"shape": [1, 8, 8], "num_classes": 4,
                                                                          "n_train": 256, "n_test": 80}},
                          train={"epochs": 3, "progress": False, "precision": "fp32"},
                          prokd={"mode": "online", "tau_max": 2.0})
        args = ["run", "prokd"]
    else:
        cfg, args = nmt_config(tmp_path), ["distill"]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for n in (1, 2):
        proc = launch(n, *args, str(path), f"name=p{n}", "--quiet")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count("finished") == 1  # rank 0 alone prints
    a, _ = load_checkpoint(tmp_path / "runs" / "p1" / "checkpoints" / "last.safetensors")
    b, _ = load_checkpoint(tmp_path / "runs" / "p2" / "checkpoints" / "last.safetensors")
    weights = [k for k in a if k.startswith("model/")]
    assert weights
    for k in weights:
        gap = float((b[k].float() - a[k].float()).abs().max())
        assert gap < 1e-4, f"{k} differs by {gap}"


def test_l2t_teacher_phase_is_refused_under_torchrun_in_one_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, l2t={"teacher_steps": 1, "inner_steps": 2})))
    proc = launch(2, "run", "l2t", str(path), "--quiet")
    assert proc.returncode != 0
    assert "recipe l2t: the teacher phase" in proc.stderr and "teacher.checkpoint=" in proc.stderr
