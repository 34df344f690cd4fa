"""The demo protocol end to end in its quick setting (digits: the fastest embedded data): a teacher pair and a
student subset per seed, val/test fixed, and the table says what its intervals cover."""

import json

from teachkit.experiments.demo import run_demo


def test_quick_demo_writes_table_and_results(tmp_path, capsys):
    results = run_demo("digits", seeds=2, out=str(tmp_path), quick=True)
    out = capsys.readouterr().out
    assert "| student: kd from MSE teacher |" in out and "| teacher (CE) |" in out
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "results.json").read_text())
    assert saved["seeds"] == 2 and set(saved["students"]) == set(results["students"])
    for method, entry in saved["students"].items():
        assert len(entry["test_acc"]) == 2
        assert all(0 <= a <= 100 for a in entry["test_acc"])
        if method != "none":
            m, lo, hi = entry["diff_vs_no_kd"]
            assert lo <= m <= hi
    m, lo, hi = saved["students"]["kd/mse"]["mse_minus_ce"]
    assert lo <= m <= hi
    # paired design: the no-KD student of a seed is reproducible exactly
    assert (folder / "seed0" / "no-kd" / "summary.json").is_file()
    text = (folder / "results.md").read_text()
    assert text.startswith("## teachkit demo: digits") and "what the spread and the intervals cover" in text
    assert "data.subset_seed=s" in saved["interval_covers"] and "data.split_seed=0" in saved["interval_covers"]
    assert "intervals cover: per seed s, a new CE and MSE teacher" in out
    # every seed trains its own teachers and draws its own subset; val and test never move
    teachers = saved["teachers"]
    assert len(teachers["ce"]["test_acc"]) == len(teachers["mse"]["test_acc"]) == 2
    assert len(teachers["mse"]["mse_minus_ce"]) == 3
    subsets = []
    for seed in (0, 1):
        summary = json.loads((folder / f"seed{seed}" / "teacher-ce" / "summary.json").read_text())
        assert summary["data"]["train_subset"] is None and summary["data"]["split_seed"] == 0
        student = json.loads((folder / f"seed{seed}" / "kd-mse-teacher" / "summary.json").read_text())
        assert student["data"]["subset_seed"] == seed and "teacher_overlap_allowed" not in student
        subsets.append(student["data"])
    assert subsets[0]["train_subset"] == subsets[1]["train_subset"] == 200
