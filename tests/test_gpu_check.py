"""The GPU kit's CPU part (scripts/gpu_check.py --device cpu --quick): the report it writes as checks finish, the
checks that run on a CPU passing within their recorded tolerances, the CUDA-only parts skipped with a reason."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def kit():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def quick(kit, tmp_path, name):
    work = tmp_path / name
    work.mkdir()
    return kit.Context(torch.device("cpu"), True, work, time.monotonic() + 120)


def test_the_script_writes_json_and_markdown_with_pass_and_skip(tmp_path):
    """End to end, each check in its worker process: the L2T-DLF hypergradient passes on the CPU."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick", "--only",
                           "l2t_hypergradient"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["environment"]["device"] == "cpu" and report["environment"]["cpu"]
    checks = report["checks"]
    assert list(checks) == ["l2t_hypergradient"]
    l2t = checks["l2t_hypergradient"]
    assert l2t["status"] == "pass" and l2t["seconds"] > 0
    for key, tol in l2t["tolerances"].items():
        assert l2t["values"][key] <= tol, key
    assert l2t["values"]["teacher_parameters"] == 70  # gated teacher, 5 state features, 3 classes, hidden 4, rank 2
    md = (out / "gpu_check.md").read_text()
    assert "| l2t_hypergradient | **pass** |" in md and "- float64_vs_fd: " in md
    assert report["summary"] == "1 pass, 0 fail, 0 skip"
    assert (out / "logs" / "l2t_hypergradient.log").is_file()


def test_cuda_marked_tests_skip_without_cuda_with_the_reason(kit, tmp_path):
    res = kit.check_cuda_tests(quick(kit, tmp_path, "cuda"))
    assert res["status"] == "skip" and "no CUDA" in res["reason"]
    assert res["values"]["skipped"] == res["values"]["tests"] == 6  # every test of tests/engine/test_cuda.py
    assert "tests/engine/test_cuda.py" in res["values"]["files"]


def test_train_steps_on_cpu_pass_and_cuda_only_modes_skip(kit, tmp_path):
    res = kit.check_train_step(quick(kit, tmp_path, "train"))
    modes = res["values"]["modes"]
    assert set(modes) == set(kit.TRAIN_MODES)
    assert modes["fp16+scaler"]["status"] == "skip" and "needs CUDA" in modes["fp16+scaler"]["reason"]
    assert modes["fp32+compile"]["status"] == "skip"
    assert modes["fp32"]["status"] == "pass" and modes["fp32"]["values"]["loss_rel_gap"] == 0  # the same CPU steps
    nhwc = modes["fp32+channels_last"]
    assert nhwc["status"] == "pass" and nhwc["values"]["runs_as"] == "fp32+channels_last"
    assert nhwc["values"]["update_rel_gap"] <= nhwc["tolerances"]["update_rel"]
    assert len(nhwc["values"]["losses"]) == res["values"]["steps"] == 2
    assert res["status"] == "pass"


def test_teacher_cache_beam_search_and_minilm_pass_on_cpu(kit, tmp_path):
    cache = kit.check_teacher_cache(quick(kit, tmp_path, "cache"))
    static = cache["values"]["cases"]["static fp32"]["values"]
    assert cache["status"] == "pass" and static["cache_status"] == "computed" and static["bit_identical"]
    beam = kit.check_beam_search(quick(kit, tmp_path, "beam"))
    assert beam["status"] == "pass" and beam["values"]["beam_same_tokens"] == beam["values"]["sentences"] == 24
    text = kit.check_minilm(quick(kit, tmp_path, "minilm"))
    assert text["status"] == "pass", text
    assert text["values"]["layers_returned"] == 6 and text["values"]["fp32_step_ms"] > 0


def test_report_lists_every_check_and_a_spent_budget_skips(kit, tmp_path):
    report = {"environment": {"device": "cpu", "cpu": "x"}, "quick": True, "budget_s": 10.0, "started": "now",
              "seconds": 12.0, "checks": {c.name: kit.skip("the kit's budget of 10 s is spent") | {"seconds": 0.0}
                                          for c in kit.CHECKS}}
    kit.write_report(tmp_path, report)
    md = (tmp_path / "gpu_check.md").read_text()
    for name in ("cuda_tests", "train_step", "teacher_cache", "l2t_hypergradient", "minilm", "beam_search",
                 "torchrun_nccl", "throughput"):
        assert f"| {name} | **skip** (the kit's budget of 10 s is spent) |" in md
    assert json.loads((tmp_path / "gpu_check.json").read_text())["summary"] == "0 pass, 0 fail, 8 skip"


def test_throughput_digest_reads_both_benchmark_layouts(kit):
    settings = {"teacher": "t", "student": "s", "settings": {"default": {"images_per_s": 300.0,
                "plain_same_layout": "bf16+channels_last", "speedup_vs_plain_fp32": 3.0}},
                "plain": {"fp32": {"images_per_s": 100.0}}, "targets": []}
    levers = {"teacher": "t", "student": "s", "levers": {"default": {"images_per_s": 300.0, "runs_as": "bf16",
              "vs_plain_fp32": 3.0}, "plain fp32 loop": {"images_per_s": 100.0}}}
    for pair in (settings, levers):
        digest = kit.pair_digest(pair)
        assert digest["default_images_per_s"] == 300.0 and digest["plain_fp32_images_per_s"] == 100.0
        assert digest["default_vs_plain_fp32"] == 3.0


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu"], "--device 'tpu' is not allowed"),
    (["--only", "train_step,nope"], "--only nope: no such check"),
    (["--budget", "0"], "--budget 0 must be > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(kit, tmp_path, capsys, args, message):
    assert kit.main([str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
