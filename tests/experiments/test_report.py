"""``teachkit report``: aggregation of hand-made run folders checked against numbers computed here by hand."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from teachkit.errors import ConfigError
from teachkit.experiments.published import PUBLISHED, find_published
from teachkit.experiments.report import build_report, collect_runs, run_report, value_of, write_report

T_975_DF2 = 4.303  # Student t_{0.975, 2}: three pairs


def make_run(folder: Path, *, last: float, best: float, seed: int = 0, method: str = "kd", recipe: str | None = None,
             labels: dict[str, Any] | None = None, metric: str = "acc", teacher: dict | None = None,
             config: dict | None = None, epochs: int = 3, temperatures: list[float] | None = None,
             role: str = "student") -> Path:
    """A finished run folder: config.yaml, summary.json, metrics.jsonl and, with ``labels``, sweep.json."""
    folder.mkdir(parents=True)
    tree = {"name": folder.name, "out_dir": str(folder.parent), "data": {"name": "mnist", "train_subset": 100,
            "subset_seed": seed}, "model": {"name": "mlp", "options": {}}, "train": {"epochs": epochs, "seed": seed},
            "teacher": {"checkpoint": None, "model": {"name": "lenet"}, "loss": "ce"},
            "kd": {"method": method, "alpha": 0.9}}
    for section, values in (config or {}).items():
        tree[section] = {**tree.get(section, {}), **values} if isinstance(values, dict) else values
    (folder / "config.yaml").write_text(yaml.safe_dump(tree))
    summary = {"select_metric": metric, "select_metric_percent": True, f"val_{metric}": last + 1,
               f"test_{metric}": last, "best_epoch": 2, f"best_val_{metric}": best + 1, f"test_{metric}_at_best": best,
               "wall_time_s": 2.0, "epochs": epochs, "last_epoch": epochs,
               "cost": {"teacher_epochs_trained": 0, "student_epochs": epochs, "teacher_forward_images": 0,
                        "teacher_forwards_saved": 10, "wall_time_s": 2.0}}
    if teacher is not None:
        summary["teacher"] = teacher
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = []
    for epoch in range(1, epochs + 1):
        line = {"epoch": epoch, "lr": 0.1, "train": {"loss": 1.0}, "val": {metric: last - epochs + epoch},
                "test": {metric: last}, "epoch_time_s": 0.5, "images_per_s": 200.0}
        if temperatures:
            line["info"] = {"phase": "I", "teacher_epoch": epoch, "T": temperatures[epoch - 1]}
        lines.append(json.dumps(line))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if labels is not None:
        marker = {"sweep": "s", "run": folder.name, "role": role, "recipe": recipe or "kd", "labels": labels,
                  "seed_keys": ["train.seed"], "depends_on": []}
        (folder / "sweep.json").write_text(json.dumps(marker))
    return folder


#: test accuracy at the last epoch / at the best-validation epoch, per (method, seed)
LAST = {("none", 0): 80.0, ("none", 1): 82.0, ("none", 2): 84.0, ("kd", 0): 83.0, ("kd", 1): 86.0, ("kd", 2): 86.5}
BEST = {("none", 0): 79.0, ("none", 1): 81.5, ("none", 2): 83.0, ("kd", 0): 82.0, ("kd", 1): 85.0, ("kd", 2): 87.0}


def sweep_grid(root: Path) -> Path:
    """Six sweep runs: method (none = recipe train, kd) x train.seed 0..2."""
    for (method, seed), last in LAST.items():
        make_run(root / f"{method}-seed{seed}", last=last, best=BEST[method, seed], seed=seed, method=method,
                 recipe="train" if method == "none" else "kd", labels={"method": method, "train.seed": seed})
    return root


def sample_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_rows_hold_mean_sample_std_and_the_paired_t_interval(tmp_path: Path) -> None:
    report = build_report(sweep_grid(tmp_path), baseline="method=none", select="last")
    assert report.by == ["method"] and report.pairing_keys == ["train.seed"]
    base, kd = report.rows
    assert base.values == {"method": "none"} and kd.values == {"method": "kd"}
    kd_last = [LAST["kd", s] for s in range(3)]
    assert sum(kd.column("last")) / 3 == pytest.approx(sum(kd_last) / 3)
    differences = [LAST["kd", s] - LAST["none", s] for s in range(3)]  # 3, 4, 2.5
    mean = sum(differences) / 3
    half = T_975_DF2 * sample_std(differences) / math.sqrt(3)
    assert kd.diff == pytest.approx((mean, mean - half, mean + half), abs=1e-9)
    assert kd.pairs == 3
    table = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert [r["method"] for r in table] == ["none", "kd"]
    assert float(table[1]["test_last_mean"]) == pytest.approx(sum(kd_last) / 3, abs=1e-6)
    assert float(table[1]["test_last_std"]) == pytest.approx(sample_std(kd_last), abs=1e-6)
    kd_best = [BEST["kd", s] for s in range(3)]
    assert float(table[1]["test_best_std"]) == pytest.approx(sample_std(kd_best), abs=1e-6)
    assert float(table[1]["diff_low"]) == pytest.approx(mean - half, abs=1e-6)
    assert table[0]["diff"] == "" and table[1]["pairs"] == "3"
    markdown = report.to_markdown()
    assert "mean ± sample std over the runs of a row (seeds); paired 95% t intervals over runs paired by train.seed" \
        in markdown
    assert f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]" in markdown
    assert "Teacher forwards saved by cached teacher outputs: 60" in markdown  # 6 runs x 10


def test_best_select_pairs_the_best_validation_column(tmp_path: Path) -> None:
    report = build_report(sweep_grid(tmp_path), baseline="method=none", select="best")
    differences = [BEST["kd", s] - BEST["none", s] for s in range(3)]
    assert report.rows[1].diff[0] == pytest.approx(sum(differences) / 3)


def test_a_run_without_baseline_partner_is_dropped_from_the_pairing(tmp_path: Path) -> None:
    sweep_grid(tmp_path)
    make_run(tmp_path / "kd-seed3", last=99.0, best=99.0, seed=3, labels={"method": "kd", "train.seed": 3})
    kd = build_report(tmp_path, baseline="method=none").rows[1]
    assert len(kd.runs) == 4 and kd.pairs == 3
    assert kd.diff[0] == pytest.approx(sum(LAST["kd", s] - LAST["none", s] for s in range(3)) / 3)


def test_bad_baselines_name_what_is_allowed(tmp_path: Path) -> None:
    sweep_grid(tmp_path)
    with pytest.raises(ConfigError, match=r"'metod' is not a report key \(did you mean 'method'\?\).*method"):
        build_report(tmp_path, baseline="metod=none")
    with pytest.raises(ConfigError, match="matches no row: method takes kd, none"):
        build_report(tmp_path, baseline="method=dkd")


def test_unknown_by_key_suggests_the_closest(tmp_path: Path) -> None:
    sweep_grid(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown report key 'kd.methd' \(did you mean 'kd.method'\?\)"):
        build_report(tmp_path, by=["kd.methd"])
    assert [row.values for row in build_report(tmp_path, by=["kd.method"]).rows] == [{"kd.method": "kd"},
                                                                                      {"kd.method": "none"}]


def test_corrupt_summary_is_one_line_naming_the_file(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", last=1.0, best=1.0)
    (run / "summary.json").write_text('{"test_acc": 1,')
    with pytest.raises(ConfigError) as error:
        collect_runs(tmp_path)
    assert str(run / "summary.json") in str(error.value) and "\n" not in str(error.value)
    assert "not valid JSON" in str(error.value)


def test_bad_folders_and_mixed_metrics_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        build_report(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"no run folders \(config.yaml \+ summary.json\) under"):
        build_report(tmp_path)
    make_run(tmp_path / "a", last=1.0, best=1.0, metric="acc")
    make_run(tmp_path / "b", last=1.0, best=1.0, metric="f1")
    with pytest.raises(ConfigError, match="different metrics.*--metric"):
        build_report(tmp_path)
    assert build_report(tmp_path, metric="f1").metric == "f1"


def test_unfinished_runs_are_listed_and_nested_sub_runs_are_not_rows(tmp_path: Path) -> None:
    parent = make_run(tmp_path / "takd", last=70.0, best=70.0, config={"kd": {"alpha": 0.5}})
    make_run(parent / "teacher", last=99.0, best=99.0)  # an in-command teacher inside the run folder
    make_run(parent / "student", last=10.0, best=10.0)
    make_run(tmp_path / "_cache" / "x", last=5.0, best=5.0)
    make_run(tmp_path / "kd", last=60.0, best=60.0)
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "config.yaml").write_text(yaml.safe_dump({"name": "late", "train": {"epochs": 9}}))
    (tmp_path / "late" / "teacher").mkdir()  # a finished sub-run of an unfinished run is no row either
    make_run(tmp_path / "late" / "teacher" / "inner", last=1.0, best=1.0)
    records = collect_runs(tmp_path)
    assert sorted(r.folder.name for r in records) == ["kd", "late", "takd"]
    report = build_report(tmp_path)
    assert report.by == ["kd.alpha"] and [len(row.runs) for row in report.rows] == [1, 1]
    markdown = report.to_markdown()
    assert "## Unfinished runs" in markdown and "- late: unfinished (no summary.json), 0/9 epochs" in markdown
    assert any(t.folder == parent / "teacher" for t in report.teachers)  # listed as its teacher, not as a row


def test_value_of_resolves_labels_pseudo_keys_and_config(tmp_path: Path) -> None:
    teacher = make_run(tmp_path / "teachers" / "t", last=90.0, best=90.0, config={"model": {"name": "resnet56"}})
    student = make_run(tmp_path / "runs" / "s", last=70.0, best=70.0, teacher={"loss": "mse", "test_acc": 90.0},
                       config={"teacher": {"checkpoint": str(teacher)}, "model": {"name": "resnet20"}})
    plain = make_run(tmp_path / "runs" / "p", last=60.0, best=60.0)
    runs = {r.folder.name: r for r in collect_runs(tmp_path / "runs")}
    assert runs["s"].teacher_dir == teacher
    assert value_of(runs["s"], "teacher.loss") == "mse"  # the summary's, not the config's "ce"
    assert value_of(runs["s"], "teacher.model") == "resnet56" and value_of(runs["s"], "pair") == "resnet56-resnet20"
    assert value_of(runs["s"], "recipe") == "kd" and value_of(runs["p"], "recipe") == "train"
    assert value_of(runs["p"], "teacher.loss") is None and value_of(runs["s"], "kd.alpha") == 0.9
    assert plain.exists() and student.exists()
    report = build_report(tmp_path / "runs")
    assert report.by == ["recipe", "teacher.model", "model.name", "teacher.loss"]  # resolved, None for the train run
    assert [row.values["teacher.loss"] for row in report.rows] == ["mse", None]
    assert [t.folder for t in report.teachers] == [teacher]


def test_a_matching_row_shows_the_published_number_and_gap(tmp_path: Path) -> None:
    teacher = make_run(tmp_path / "teacher-resnet110", last=71.0, best=71.0, seed=0,
                       config={"model": {"name": "resnet110"}, "data": {"name": "cifar100"}})
    for seed, last in enumerate((62.0, 63.0, 64.5)):
        make_run(tmp_path / f"prokd-{seed}", last=last, best=last - 0.5, seed=seed, recipe="prokd",
                 labels={"recipe": "prokd", "train.seed": seed}, teacher={"loss": "ce"},
                 config={"model": {"name": "resnet8"}, "data": {"name": "cifar100"},
                         "teacher": {"checkpoint": str(teacher)}}, temperatures=[3.0, 2.0, 1.0])
    report = build_report(tmp_path, by=["recipe"])
    (row,) = report.rows
    assert row.published is not None and row.published.value == 63.43
    gap = (62.0 + 63.0 + 64.5) / 3 - 63.43
    assert row.gap("last") == pytest.approx(gap)
    markdown = report.to_markdown()
    assert f"| 63.43 | {gap:+.2f} |" in markdown and "Rezagholizadeh et al. 2022" in markdown
    assert "maximum test accuracy over epochs" in markdown  # the protocol footnote
    table = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert float(table[0]["published"]) == 63.43 and float(table[0]["gap"]) == pytest.approx(gap, abs=1e-6)
    assert teacher not in [r.folder for r in report.runs]  # a folder a run reads as teacher is no row


def test_published_table_holds_the_documented_figures() -> None:
    assert find_published("cifar100", "resnet110", "resnet8", "prokd", "ce").value == 63.43
    assert find_published("cifar10", None, "resnet8", "train", None).value == 88.44
    assert find_published("cifar100", "resnet32x4", "resnet8x4", "dkd", "ce").value == 76.32
    assert find_published("cifar100", "wrn_40_2", "wrn_16_2", "reviewkd", "ce").value == 76.12
    assert find_published("cifar100", "resnet110", "resnet20", "dkd", "ce") is None  # an empty cell stays empty
    assert find_published("cifar100", "resnet110", "resnet8", "prokd", "mse") is None
    assert all(entry.protocol and entry.source for entry in PUBLISHED)


def test_write_report_writes_tables_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    root = tmp_path / "runs"
    teacher = make_run(root / "teachers" / "t-ce", last=95.0, best=95.0, labels={}, recipe="train", role="teacher")
    for loss, shift in (("ce", 0.0), ("mse", 1.0)):
        for seed in range(2):
            make_run(root / f"kd-{loss}-{seed}", last=80 + shift + seed, best=79 + shift + seed, seed=seed,
                     labels={"teacher.loss": loss, "train.seed": seed}, teacher={"loss": loss},
                     config={"teacher": {"checkpoint": str(teacher)}}, temperatures=[4.0, 2.0, 1.0])
    report = run_report(root, baseline="teacher.loss=ce", out=tmp_path / "out")
    printed = capsys.readouterr().out
    assert "| teacher.loss |" in printed and f"report: {tmp_path / 'out' / 'report.md'}" in printed
    assert [t.folder for t in report.teachers] == [teacher]
    names = {p.name for p in (tmp_path / "out").iterdir()}
    for stem in ("curves", "teacher_vs_student", "temperature", "compute", "mse_vs_ce"):
        for ext in ("png", "svg"):
            assert f"{stem}.{ext}" in names and (tmp_path / "out" / f"{stem}.{ext}").stat().st_size > 0
    assert not any(name.endswith(".tmp") for name in names)
    paths = write_report(report, tmp_path / "bare", plots=False)
    assert [p.name for p in paths] == ["report.md", "report.csv"]
    assert (tmp_path / "bare" / "report.csv").read_text() == report.to_csv()


def test_default_rows_name_their_runs_and_equal_keys_go_above_the_table(tmp_path: Path) -> None:
    report = build_report(sweep_grid(tmp_path))
    lines = report.markdown_table().splitlines()
    assert lines[0].startswith("| run | method | n |")
    assert lines[2].startswith("| kd-seed0, kd-seed1, kd-seed2 | kd | 3 |")
    table = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert table[1]["run"] == "none-seed0;none-seed1;none-seed2" and table[1]["method"] == "none"
    chosen = build_report(tmp_path, by=["method", "data.name"])  # data.name is mnist in every run
    lines = chosen.markdown_table().splitlines()
    assert lines[:2] == ["all runs: data.name=mnist", ""]
    assert lines[2].startswith("| method | n |") and "run" not in lines[2]
    assert [r["data.name"] for r in csv.DictReader(io.StringIO(chosen.to_csv()))] == ["mnist", "mnist"]


def test_a_mixed_folder_gives_one_settings_column(tmp_path: Path) -> None:
    changes = {"a": {}, "b": {"kd": {"alpha": 0.5}}, "c": {"optim": {"lr": 0.2}, "model": {"name": "lenet"}},
               "d": {"train": {"epochs": 4}, "data": {"train_subset": 50, "name": "digits"},
                     "kd": {"method": "dist"}, "optim": {"lr": 0.1, "momentum": 0.5}}}
    for name, config in changes.items():
        make_run(tmp_path / "mixed" / name, last=80.0, best=80.0, config={"optim": {"lr": 0.1}, **config})
    report = build_report(tmp_path)
    assert len(report.by) == 8  # more varying keys than MAX_KEY_COLUMNS (6)
    lines = report.markdown_table().splitlines()
    usual = "usual values (the settings column lists a row's others): "
    assert lines[0].startswith(usual) and "kd.alpha=0.9" in lines[0] and "optim.lr=0.1" in lines[0]
    assert lines[2].split(" | ")[:3] == ["| run", "settings", "n"] and len(lines[2].split(" | ")) == 7
    cells = {line.split(" | ")[0][2:]: set(line.split(" | ")[1].split(", ")) for line in lines[4:]}
    assert cells == {"mixed/a": {"usual"}, "mixed/b": {"kd.alpha=0.5"}, "mixed/c": {"model.name=lenet", "optim.lr=0.2"},
                     "mixed/d": {"data.name=digits", "data.train_subset=50", "kd.method=dist", "optim.momentum=0.5",
                                 "train.epochs=4"}}
    header = next(csv.reader(io.StringIO(report.to_csv())))
    assert header[0] == "run" and set(report.by) <= set(header)  # the CSV keeps one column per key


def test_report_help_documents_by(capsys: pytest.CaptureFixture[str]) -> None:
    from teachkit.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "e.g. --by kd.method teacher.loss" in text and "mean +- sample std" in text and "95% t interval" in text
