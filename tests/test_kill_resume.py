"""kill -9 at random moments, then ``--resume`` until the run finishes: the final weights are bit-identical to
an uninterrupted run's, for plain training, distillation (CRD's memory bank, an in-command teacher) and
Pro-KD (a teacher trained online, interleaved with the student)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import tiny_config

CASES = {
    "train": (["train"], []),
    "distill-crd": (["distill"], ["kd.method=[crd, kd]", "teacher.epochs=3"]),
    "prokd-online": (["run", "prokd"], ["teacher.epochs=3", "prokd.tau_max=3"]),
}


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "teachkit.cli", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def weights(run_dir) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(run_dir / "checkpoints" / "last.safetensors")).items()
            if k.startswith("model/")}


@pytest.mark.parametrize("case", CASES)
def test_kill_at_random_moments_then_resume_is_exact(tmp_path, case):
    command, extra = CASES[case]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, train={"epochs": 5, "progress": False})))
    t0 = time.perf_counter()
    straight = start([*command, str(cfg), "name=straight", *extra])
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    duration = time.perf_counter() - t0
    rng = random.Random(case)
    kills = 0
    for _attempt in range(10):
        proc = start([*command, str(cfg), "name=killed", *extra, "--resume"])
        if kills < 2:
            time.sleep(rng.uniform(0.4, 0.95) * duration)
            if proc.poll() is None:
                proc.kill()
                kills += 1
        code = proc.wait(timeout=300)
        if code == 0:
            break
        assert code == -9, proc.stderr.read()  # only our kills may stop it
    else:
        pytest.fail("the run never finished")
    a, b = weights(tmp_path / "runs" / "straight"), weights(tmp_path / "runs" / "killed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
