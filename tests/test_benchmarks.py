"""Smoke runs of every benchmark script in its smallest setting, so none of them rots unnoticed.

They check that the scripts run and print their tables, not any timing (speed is measured by running the
benchmarks alone, never asserted in tests).
"""

import json
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
    """One tiny pair, every eager setting: the table's rows and columns, finite ratios, the targets, the host-sync
    count and the JSON record (no timing is asserted)."""
    import json
    import math

    out = run("throughput.py", "--steps", "1", "--batch", "8", "--student", "resnet8", "--teacher", "resnet8",
              "--no-compile", "--rounds", "1", "--sync-steps", "1", "--peak-size", "128",
              "--json", str(tmp_path / "t.json"), cwd=tmp_path)
    assert "torch " in out and "threads" in out and "CPU flags" in out and "batch 8" in out
    assert "setting default: LoopConfig defaults -> runs " in out and "matmul peak (128x128" in out
    assert "### resnet8 -> resnet8" in out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["setting", "runs as", "KD step ms", "img/s"]
    assert {"x plain fp32", "x plain same", "KD / (no-KD + teacher)", "cached KD / no-KD", "GFLOP/s",
            "% of peak"} <= set(header)
    rows = {cells[0]: dict(zip(header, cells, strict=True))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    settings = ["default", "fp32", "bf16", "bf16+channels_last"]
    assert [name for name in rows if not name.startswith("plain ")] == settings  # --no-compile: no compile row
    assert {"plain fp32", "plain bf16", "plain bf16+channels_last"} <= set(rows)
    assert rows["fp32"]["runs as"] == "fp32" and rows["bf16+channels_last"]["runs as"] == "bf16+channels_last"
    for name in settings:
        for column in ("KD step ms", "img/s", "x plain fp32", "x plain same", "KD / (no-KD + teacher)",
                       "cached KD / no-KD", "GFLOP/s", "% of peak"):
            value = float(rows[name][column])
            assert math.isfinite(value) and value > 0, (name, column, value)
    assert float(rows["plain fp32"]["x plain fp32"]) == 1.0
    targets = [line for line in out.splitlines() if line.startswith("target: ")]
    assert len(targets) == 3 and all(line.endswith(("-> met", "-> not met")) for line in targets)
    assert ">= 2.4" in targets[0] and "<= 1.05" in targets[1] and "<= 1.15" in targets[2]
    assert "(e) CRD + KD step through the engine" in out and "host syncs per step" in out
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["header"]["batch"] == 8 and record["header"]["torch"] and record["header"]["threads"] >= 1
    assert set(record["header"]["settings"]) == set(settings)
    (pair,) = record["pairs"]
    assert set(pair["settings"]) == set(settings) and pair["kd_step_gflop"] > 0
    assert all(math.isfinite(r["speedup_vs_plain_fp32"]) for r in pair["settings"].values())
    assert math.isfinite(record["host_syncs"]["per_step"])


def test_throughput_levers_and_profile(tmp_path):
    """--levers on a tiny pair: the machine line, one row per lever (the folded teacher, the optimiser kernels that
    are not the default; compile is skipped, its warm-up takes a minute) and the plain fp32 loop with finite ratios,
    the AMX targets; --profile: the per-op table and the data share of a step, all in the JSON record (no timing is
    asserted)."""
    import math

    out = run("throughput.py", "--levers", "--profile", "--profile-rows", "5", "--steps", "1", "--batch", "8",
              "--student", "resnet8", "--teacher", "resnet8", "--rounds", "1", "--peak-size", "128", "--no-compile",
              "--json", str(tmp_path / "l.json"), cwd=tmp_path)
    machine = out.splitlines()[0]
    assert machine.startswith("CPU ") and "logical CPUs" in machine
    assert "AMX: " in machine and "AVX512-BF16: " in machine
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["setting", "runs as", "KD step ms", "img/s", "vs default", "vs plain fp32 loop", "GFLOP/s",
                      "% of peak"]
    rows = {cells[0]: dict(zip(header, cells, strict=True))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    levers = ["default", "folded_teacher", "optim_loop", "optim_fused", "plain fp32 loop"]
    assert list(rows) == levers
    assert float(rows["default"]["vs default"]) == 1.0 and float(rows["plain fp32 loop"]["vs plain fp32 loop"]) == 1.0
    for name in levers:
        for column in header[2:]:
            assert math.isfinite(float(rows[name][column])) and float(rows[name][column]) > 0, (name, column)
    targets = [line for line in out.splitlines() if line.startswith("target (AMX machines): ")]
    assert len(targets) == 2 and ">= 35.0" in targets[0] and ">= 3.5" in targets[1]
    assert "### profile: resnet8 -> resnet8, default setting" in out and "Self CPU" in out
    assert "data (batch gather + on-device augmentation" in out and "% of the step" in out
    record = json.loads((tmp_path / "l.json").read_text())
    assert record["header"]["mode"] == "levers" and set(record["header"]["machine"]) >= {
        "cpu_model", "logical_cpus", "torch", "torch_threads", "amx", "avx512_bf16", "gpu"}
    (pair,) = record["pairs"]
    assert list(pair["levers"]) == levers and pair["kd_step_gflop"] > 0
    prof = record["profile"]
    assert len(prof["top_ops"]) == 5 and prof["steps"] == 4 and 0 < prof["data_percent_of_step"] < 100
    assert all(op["self_cpu_ms_per_step"] >= 0 for op in prof["top_ops"])


def test_prokd_study_quick(tmp_path):
    out = run("prokd_study.py", "--quick", "--out", str(tmp_path / "p"), cwd=tmp_path)
    assert "| Pro-KD |" in out and "| Annealing-KD |" in out
    assert list((tmp_path / "p").glob("*/curves.png"))


def test_prokd_mnist_full_quick(tmp_path):
    """The full-MNIST Pro-KD study's smoke run (mnist5k, 2 seeds): plan, tables, verdict, JSON and plot; nothing
    is written into benchmarks/results."""
    kept = BENCH / "results" / "prokd_mnist_full.json"
    before = kept.stat().st_mtime_ns if kept.exists() else None
    out = run("prokd_mnist_full.py", "--quick", "--out", "p", cwd=tmp_path)
    assert out.startswith("plan: Pro-KD on mnist5k") and "epoch budget: Pro-KD phase I" in out
    assert "expected wall time:" in out and "command: OMP_NUM_THREADS=1 python benchmarks/prokd_mnist_full.py" in out
    assert "[26/26] seed 1 MLP-30 Pro-KD online: test " in out
    header = ("| method | val % (last) | test % (last) | test % at best val | test diff vs KD [95% CI] "
              "| diff vs no KD [95% CI] | teacher epochs trained | teacher forward images | wall s |")
    assert out.count(header) == 2 and "### student MLP-100" in out and "### student MLP-30" in out
    for method in ("no KD", "KD", "Annealing-KD", "RCO", "Pro-KD replay", "Pro-KD online"):
        assert out.count(f"| {method} |") == 2
    verdicts = [line for line in out.splitlines() if line.startswith("Verdict MLP-")]
    assert len(verdicts) == 2
    for claim in ("Pro-KD > KD", "Pro-KD > no KD", "KD > no KD", "Pro-KD > Annealing-KD"):
        assert all(any(f"{claim}: {word} (" in line for word in ("reproduced", "reversed", "not resolved"))
                   for line in verdicts), claim
    (folder,) = (tmp_path / "p").glob("mnist5k-*")
    assert (folder / "curves.png").is_file() and (folder / "results.md").read_text().startswith("## Pro-KD")
    results = json.loads((folder / "results.json").read_text())
    assert results["quick"] and results["seeds"] == 2 and results["setting"]["budget"] == 3
    assert "train.epochs = 2 + 1 = 3" in results["budget_rule"] and "paired within a seed" in results["interval_covers"]
    assert len(results["teacher"]["test_acc"]) == 2 and results["predicted_wall_time_s"] > 0
    for h in ("100", "30"):
        c = results["capacities"][h]
        assert set(c["verdict"]) == {"Pro-KD > KD", "Pro-KD > no KD", "KD > no KD", "Pro-KD > Annealing-KD"}
        assert all(v["outcome"] in ("reproduced", "reversed", "not resolved") for v in c["verdict"].values())
        kd, online = c["students"]["KD"], c["students"]["Pro-KD online"]
        assert kd["diff_vs_kd"] is None and len(kd["diff_vs_no_kd"]) == 3 and len(kd["test_acc"]) == 2
        assert all(len(curve) == 3 for curve in online["curve"])
        assert online["cost"]["teacher_epochs_trained"] == 2 and c["students"]["Pro-KD replay"]["cost"][
            "teacher_epochs_trained"] == 0
    assert (kept.stat().st_mtime_ns if kept.exists() else None) == before


def test_mse_teacher_study_quick(tmp_path):
    out = run("mse_teacher_study.py", "--quick", "--data", "digits", "--methods", "kd,sp", "--seeds", "1",
              "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert "| student: sp from MSE teacher |" in out


def test_mse_teacher_scaling_quick(tmp_path):
    """The scaling study's protocol end to end on digits (1 epoch, 2 seeds, 3 transfer sets): the plan, one line
    per run, the per-size tables, the headline with its verdicts, and the JSON record; nothing kept in
    benchmarks/results."""
    kept = sorted((BENCH / "results").glob("mse_teacher_scaling*"))
    out = run("mse_teacher_scaling.py", "--quick", "--seeds", "2", "--data", "digits", "--out", str(tmp_path / "s"),
              cwd=tmp_path)
    assert out.startswith("plan: MSE-teacher scaling study on digits")
    assert "total 46 runs (4 teachers, 42 students); expected wall time ~" in out
    assert "command: OMP_NUM_THREADS=1 python benchmarks/mse_teacher_scaling.py --seeds 2" in out
    assert sum(line.startswith("[") and "/46] seed" in line for line in out.splitlines()) == 46
    for size in (200, 500, 1000):
        assert f"### transfer set {size} images (1 epoch per student, stratified subset" in out
    assert out.count("| model | test acc % (last epoch) | test % at best val epoch | test diff vs no KD [95% CI] "
                     "| MSE - CE teacher [95% CI] | wall s |") == 3
    assert "| student: rkd from MSE teacher |" in out and "| teacher (MSE) |" in out
    assert "| method | 200 images | 500 images | 1000 images |" in out
    verdicts = [line for line in out.splitlines() if line.startswith(("- kd: ", "- dkd: ", "- rkd: "))]
    assert len(verdicts) == 3
    assert all(v.count(" at ") == 3 and all(w in ("holds", "reversed", "not resolved") for w in
                                            (p.split(": ")[-1].rsplit(" at ", 1)[0] for p in v.split("; ")))
               for v in verdicts)
    (folder,) = (tmp_path / "s").iterdir()
    assert (folder / "results.md").is_file() and (folder / "results.png").is_file()
    r = json.loads((folder / "results.json").read_text())
    assert r["seeds"] == 2 and r["sizes"] == [200, 500, 1000] and r["methods"] == ["kd", "dkd", "rkd"]
    assert r["runs"] == {"teachers": 4, "students": 42} and r["teacher_train_size"] == 1294
    assert len(r["teachers"]["ce"]["test_acc"]) == 2 and len(r["teachers"]["mse"]["mse_minus_ce"]) == 3
    for size in ("200", "500", "1000"):
        b = r["by_size"][size]
        assert b["student_train_size"] == int(size) and set(b["students"]) == {
            "none", "kd/ce", "kd/mse", "dkd/ce", "dkd/mse", "rkd/ce", "rkd/mse"}
        assert len(b["students"]["rkd/mse"]["mse_minus_ce"]) == 3 and "diff_vs_no_kd" in b["students"]["kd/ce"]
        for method in r["methods"]:
            cell = r["headline"][method][size]
            assert len(cell["mse_minus_ce"]) == 3 and cell["verdict"] in ("holds", "reversed", "not resolved")
    assert sorted((BENCH / "results").glob("mse_teacher_scaling*")) == kept


def test_mse_teacher_scaling_plan_and_verdict(tmp_path):
    """The plan's run list and time estimate (no training), and the verdict read off an interval."""
    from teachkit.experiments.scaling_study import ScalingSetting, epoch_seconds, plan, verdict

    s = ScalingSetting("mnist_full", teacher={"name": "lenet"}, student={"name": "mlp"}, teacher_epochs=3,
                       sizes=(1000, 5000, 50000), student_epochs={1000: 30, 5000: 8, 50000: 2})
    runs = plan(s, 5, 50_000)
    assert len(runs) == 5 * (2 + 3 * 7) and sum(r.kind == "teacher" for r in runs) == 10
    assert [r.name for r in runs[:4]] == ["seed0/teacher-ce", "seed0/teacher-mse", "seed0/n1000/no-kd",
                                          "seed0/n1000/kd-ce-teacher"]
    assert {r.images for r in runs if r.size == 50000} == {50000} and all(r.seconds > 0 for r in runs)
    assert s.epochs_for(2000) == 30 and s.epochs_for(20000) == 2 and s.options_for("dkd", 1000)["warmup"] == 2.5
    assert epoch_seconds("kd", 1000) < epoch_seconds("kd", 3000) < epoch_seconds("kd", 5000)
    assert verdict((0.5, 0.1, 0.9)) == "holds" and verdict((-0.5, -0.9, -0.1)) == "reversed"
    assert verdict((0.1, -0.2, 0.4)) == "not resolved" and verdict((0.1, float("nan"), float("nan"))) == "not resolved"
    out = run("mse_teacher_scaling.py", "--plan", "--data", "digits", "--sizes", "100,5000", cwd=tmp_path)
    assert "total 80 runs (10 teachers, 70 students)" in out and "on 1294 images (the whole training split)" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script, args", [
    ("l2t_unroll.py", ["--steps", "2", "4", "--repeats", "1"]),
    ("l2t_study.py", ["--quick", "--seeds", "0", "--epochs", "1"]),
])
def test_l2t_benchmarks_quick(tmp_path, script, args):
    out = run(script, *args, "--out", str(tmp_path / "r.md"), cwd=tmp_path)
    assert (tmp_path / "r.md").is_file() and out


def test_l2t_mnist_full_quick(tmp_path):
    """The paper-scale L2T-DLF study on a 1,000-image transfer set: plan, the four methods, verdicts, files."""
    out = run("l2t_mnist_full.py", "--quick", "--models", "mlp", "--seeds", "1", "--out", str(tmp_path / "r"),
              cwd=tmp_path)
    assert "expected total:" in out and "60 teacher steps" not in out
    for method in ("CE", "DLF fixed at Phi_0", "L2T-DLF static", "L2T-DLF gated", "L2T-DLF attention"):
        assert f"| {method} |" in out
    assert "Verdict (paired 95% intervals over seeds):" in out
    written = list((tmp_path / "r").glob("*/l2t_mnist_full_mlp.json"))
    assert written and len(__import__("json").loads(written[0].read_text())["runs"]) == 5
    again = run("l2t_mnist_full.py", "--quick", "--models", "mlp", "--seeds", "1", "--methods", "DLF fixed at Phi_0",
                "--merge", str(written[0]), "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert "| CE |" in again and "| L2T-DLF gated |" in again and "come from" in again


def test_teacher_cache_benchmark_small(tmp_path):
    out = run("teacher_cache.py", "--data", "digits", "--epochs", "2", "--teacher-epochs", "1", "--hidden", "16",
              cwd=tmp_path)
    assert "ratio cached KD / no KD" in out and "bit-identical: True" in out


def test_text_throughput_small(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    out = run("text_throughput.py", "--tweets", "60", "--epochs", "2", "--layers", "1", cwd=tmp_path)
    assert "| KD, cached teacher |" in out and "| no KD |" in out


def test_prokd_tweets_plan_measures_then_chooses(tmp_path, monkeypatch):
    """The tweet study's plan: throughput measured on a probe, the whole corpus's predicted cost, a chosen size."""
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    out = run("prokd_tweets.py", "--plan", "--probe-tweets", "80", "--max-length", "16", "--threads", "1",
              "--budget-min", "5", cwd=tmp_path)
    assert "training examples/s" in out and "the whole corpus (37,243 tweets" in out and "chosen: " in out


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


def test_precision_study_small(tmp_path):
    out = run("precision_study.py", "--seeds", "2", "--teacher-epochs", "1", "--student-epochs", "1", "--limit", "128",
              "--out", str(tmp_path / "p"), cwd=tmp_path)
    assert "| fp32 (fp32) |" in out and "| defaults (" in out
    assert "Paired difference defaults - fp32:" in out and "student epoch time ratio fp32 / defaults:" in out
    results = json.loads((tmp_path / "p" / "results.json").read_text())
    assert [s["seed"] for s in results["results"]["fp32"]["students"]] == [0, 1]
    assert all(s["precision"] == "fp32" for s in results["results"]["fp32"]["students"])


def test_levers_study_small(tmp_path):
    out = run("levers_study.py", "--seeds", "2", "--teacher-epochs", "1", "--student-epochs", "1", "--limit", "128",
              "--out", str(tmp_path / "l"), cwd=tmp_path)
    assert "| before | teacher.inference=plain, optim.implementation=loop |" in out
    assert "Paired difference levers - before:" in out
    results = json.loads((tmp_path / "l" / "results.json").read_text())
    assert [s["seed"] for s in results["levers"]] == [0, 1]
    assert results["levers"][0]["teacher_inference"]["mode"] == "fold"
    assert results["before"][0]["teacher_inference"] == {"mode": "plain"}


def test_ddp_scaling_one_and_two_processes(tmp_path):
    out = run("ddp_scaling.py", "--procs", "1", "2", "--student", "resnet8", "--teacher", "resnet8", "--batch", "8",
              "--steps", "2", "--epochs", "2", "--device", "cpu", "--json", str(tmp_path / "d.json"), cwd=tmp_path)
    records = json.loads((tmp_path / "d.json").read_text())
    assert [r["processes"] for r in records] == [1, 2]
    assert all(r["images_per_s"] > 0 for r in records)
    assert "| 2 | " in out and "speed-up vs 1" in out
    assert "--batch 7 does not divide among 2 processes" in subprocess.run(
        [sys.executable, str(BENCH / "ddp_scaling.py"), "--procs", "1", "2", "--batch", "7"], capture_output=True,
        text=True).stderr


def test_zoo_study_quick(tmp_path):
    arms = "kd,kd TV,dist,nst,fsp,ofd,mlkd"
    out = run("zoo_study.py", "--quick", "--arms", arms, "--out", str(tmp_path / "z"), cwd=tmp_path)
    for arm in arms.split(","):
        assert f"| {arm} |" in out
    assert "| no KD |" in out and "not run in this setting" not in out


def test_lm_kd_small(tmp_path):
    """Both parts of the causal-LM KD benchmark at their tiniest: the throughput table (plain, KD with the teacher,
    KD from a cached top-k teacher, the teacher alone) with finite ratios to plain, and the memory table (naive and
    chunked, a forced block size so the chunked path runs) with the agreement line, all in the JSON record (no
    timing or memory figure is asserted)."""
    import math

    out = run("lm_kd.py", "--teacher", "llama-tiny", "--student", "llama-tiny", "--vocab", "64", "--batch", "2",
              "--length", "8", "--topk", "4", "--steps", "1", "--rounds", "1", "--vocabs", "4096", "--tokens", "64",
              "--hidden", "16", "--chunk-rows", "16", "--mem-passes", "1", "--device", "cpu",
              "--json", str(tmp_path / "lm.json"), cwd=tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("CPU ") and "logical CPUs" in lines[0] and "threads" in lines[0]
    assert lines[1].startswith("device cpu; started ") and "may be shared" in lines[1]
    tables = [[line for line in block.splitlines() if line.startswith("|")] for block in out.split("###")[1:]]
    header = [c.strip() for c in tables[0][0].strip("|").split("|")]
    assert header == ["setting", "step ms", "tokens/s", "target tokens/s", "vs plain"]
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in tables[0][2:])}
    assert list(rows) == ["plain", "kd-teacher", "kd-cached-topk", "teacher forward alone"]
    assert float(rows["plain"][4]) == 1.0
    assert all(math.isfinite(float(rows[s][i])) and float(rows[s][i]) > 0 for s in list(rows)[:3] for i in (1, 2, 4))
    assert "teacher forward share of the kd-teacher step: " in out and "kd-teacher step / (plain step + " in out
    mem = [[c.strip() for c in line.strip("|").split("|")] for line in tables[1][2:]]
    assert [(r[0], r[1]) for r in mem] == [("4096", "naive"), ("4096", "chunked")]
    assert mem[1][2] == "chunked, 16 rows per block" and float(mem[0][3]) == 1.0  # 64 x 4096 x 4 bytes = 1 MiB
    assert "V=4096: naive / chunked peak " in out and "loss rel diff " in out
    record = json.loads((tmp_path / "lm.json").read_text())
    assert set(record) == {"header", "throughput", "memory"}
    assert {"cpu_model", "logical_cpus", "torch", "torch_threads", "device", "started"} <= set(record["header"])
    thr = record["throughput"]
    assert set(thr["settings"]) == {"plain", "kd-teacher", "kd-cached-topk"} and thr["target_tokens"] == 8
    assert 0 < thr["teacher_share_of_kd_step"] < 1 and thr["settings"]["plain"]["vs_plain"] == 1.0
    v = record["memory"]["vocabs"]["4096"]
    assert set(v["variants"]) == {"naive", "chunked"}
    if sys.platform == "linux":  # the child's own high-water mark, reset at the baseline
        assert all(r["peak_reset_at_baseline"] and r["peak_source"] == "VmHWM" for r in v["variants"].values())
    assert v["agreement"]["loss_rel_diff"] < 1e-5 and v["agreement"]["grad_max_abs_diff_rel"] < 1e-4
