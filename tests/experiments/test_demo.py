"""The demo protocol end to end in its quick setting (digits: the fastest embedded data)."""

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
    assert (folder / "results.md").read_text().startswith("## teachkit demo: digits")
