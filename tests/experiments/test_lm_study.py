"""The causal-LM demo end to end in its quick setting (``teachkit demo --task lm --quick``): one teacher with its
recorded trajectory, five students per seed with paired seeds, and a table that says what its intervals cover."""

import json

from teachkit.cli import main
from teachkit.experiments.lm_study import METHODS, LMSetting, base_config


def test_quick_demo_writes_the_table_and_results(tmp_path, capsys):
    assert main(["demo", "--task", "lm", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| GKD (lambda 0.5, JSD beta 0.5) |" in out and "intervals cover: student seeds only" in out
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "results.json").read_text())
    assert saved["setting"]["seeds"] == 2 and list(saved["students"]) == list(METHODS)
    for method, entry in saved["students"].items():
        assert len(entry["test_exact_at_best_val"]) == 2 and all(0 <= a <= 100 for a in entry["test_exact_last"])
        if method != "no-kd":
            m, lo, hi = entry["diff_vs_no_kd"]
            assert lo <= m <= hi
    assert saved["sizes"]["teacher_parameters"] > saved["sizes"]["student_parameters"]
    # the teacher's trajectory is recorded (Pro-KD replays it) and every student reads that teacher
    assert len(list((folder / "teacher" / "trajectory").glob("epoch_*.safetensors"))) >= 2
    prokd = json.loads((folder / "seed1" / "prokd" / "summary.json").read_text())
    assert prokd["plan"]["mode"] == "replay" and prokd["data"]["train_subset"] == 200
    gkd = json.loads((folder / "seed0" / "gkd" / "summary.json").read_text())
    assert gkd["gkd"]["batches"] > 0 and gkd["teacher_cache"]["status"] in ("computed", "loaded")
    assert (folder / "results.md").read_text().startswith("## teachkit causal-LM demo: addition")


def test_the_students_reference_answers_are_noisy_and_val_test_clean(tmp_path):
    cfg = base_config(LMSetting(), tmp_path)
    options = cfg.data.options
    assert options["noise"] == 0.2 and options["pad"] and options["reverse"]
    assert cfg.kd.alpha == 0.9 and cfg.gkd.lmbda == 0.5 and cfg.prokd.mode == "replay"
