"""Smoke runs of every benchmark script in its smallest setting, so none of them rots unnoticed.

They check that the scripts run and print their tables, not any timing (speed is measured by running the
benchmarks alone, never asserted in tests).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_throughput_small_models(tmp_path):
    out = run("throughput.py", "--steps", "2", "--batch", "8", "--student", "resnet8", "--teacher", "resnet14",
              cwd=tmp_path)
    assert "ratio (c) / ((a) + (b))" in out and "ratio (c) / (d)" in out


def test_prokd_study_quick(tmp_path):
    out = run("prokd_study.py", "--quick", "--out", str(tmp_path / "p"), cwd=tmp_path)
    assert "| Pro-KD |" in out and "| Annealing-KD |" in out
    assert list((tmp_path / "p").glob("*/curves.png"))


def test_mse_teacher_study_quick(tmp_path):
    out = run("mse_teacher_study.py", "--quick", "--data", "digits", "--methods", "kd,sp", "--seeds", "1",
              "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert "| student: sp from MSE teacher |" in out


@pytest.mark.parametrize("script, args", [
    ("l2t_unroll.py", ["--steps", "2", "4", "--repeats", "1"]),
    ("l2t_study.py", ["--quick", "--seeds", "0", "--epochs", "1"]),
])
def test_l2t_benchmarks_quick(tmp_path, script, args):
    out = run(script, *args, "--out", str(tmp_path / "r.md"), cwd=tmp_path)
    assert (tmp_path / "r.md").is_file() and out


def test_teacher_cache_benchmark_small(tmp_path):
    out = run("teacher_cache.py", "--data", "digits", "--epochs", "2", "--teacher-epochs", "1", "--hidden", "16",
              cwd=tmp_path)
    assert "ratio cached KD / no KD" in out and "bit-identical: True" in out


def test_text_throughput_small(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    out = run("text_throughput.py", "--tweets", "60", "--epochs", "2", "--layers", "1", cwd=tmp_path)
    assert "| KD, cached teacher |" in out and "| no KD |" in out


def test_text_study_verdict_reads_the_intervals():
    """The study's protocol runs in tests/tasks/test_text_kd.py (the text demo); here its verdict."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("text_study_bench", BENCH / "text_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {"students": {"kd": {"diff_vs_no_kd": [1.0, 0.2, 1.8]},
                            "prokd": {"diff_vs_no_kd": [0.5, -0.5, 1.5], "diff_vs_kd": [-1.0, -1.5, -0.5]}}}
    text = module.verdict(results)
    assert "KD > no KD: yes (+1.00 [+0.20, +1.80])" in text
    assert "Pro-KD > no KD: not resolved at this scale" in text and "Pro-KD > KD: reversed" in text


def test_nmt_throughput_small(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    out = run("nmt_throughput.py", "--pairs", "120", "--test", "20", "--epochs", "2", "--hidden", "16",
              "--teacher-width", "16", "--inner-steps", "2", cwd=tmp_path)
    assert "word-KD, cached teacher" in out and "beam 5 sentences/s" in out and "| checkpoint |" in out
