"""``teachkit report RUNS_DIR``: run folders aggregated into one table (Markdown + CSV), with published numbers.

A row-level run is a folder under RUNS_DIR holding ``config.yaml`` none of whose ancestors (below RUNS_DIR)
holds one: the sub-runs a recipe nests inside its run folder (an in-command ``teacher/``, TAKD's ``student/``,
ESKD's ``from-epoch-*``, BAN's ``gen-*``) are not rows; folders named ``_*`` (caches) are skipped. A run is
finished when it also holds ``summary.json``; an unfinished one is listed, not reported.

Rows are the distinct values of the report keys (``by``), each resolved by :func:`value_of`: a sweep label
(``sweep.json``), a pseudo-key (``recipe``, ``teacher.loss``, ``teacher.model``, ``pair``) or a dotted config
key. Each row shows the test metric at the last epoch and at the best-validation epoch as mean +- sample std
over its runs, and, against a baseline row, the paired difference with its 95% t interval: a run is paired
with the baseline run that has the same value on every varying key that is not a report key (the seed among
them; a key a run does not have, None, matches anything). Teacher runs (``role: teacher`` in ``sweep.json``,
or a folder another run's ``teacher.checkpoint`` names) go to a small teachers table unless ``teachers=True``.

The Markdown table stays readable for a folder of mixed runs (:meth:`Report.markdown_table`): a ``run`` column
names each row's folders when the keys were not chosen, keys equal on every row move to an ``all runs:`` line,
and more than :data:`MAX_KEY_COLUMNS` varying keys share one ``settings`` column; the CSV keeps every key.

This module groups and writes; the parts it builds on import nothing back from it: runs and rows in
:mod:`~teachkit.experiments.report_rows`, the table in :mod:`~teachkit.experiments.report_table`, the figures
in :mod:`~teachkit.experiments.report_plots`. Their public names stay importable from here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from teachkit.engine.checkpoint import atomic_write
from teachkit.errors import ConfigError
from teachkit.experiments.published import Published, find_published
from teachkit.experiments.report_plots import write_plots
from teachkit.experiments.report_rows import (
    NOT_GROUPING,
    PSEUDO_KEYS,
    SEED_NAMES,
    ReportRow,
    RunNumbers,
    RunRecord,
    as_number,
    cell,
    collect_runs,
    finite_values,
    flat_keys,
    hashable,
    leaf_keys,
    load_run,
    method_of,
    pair_runs,
    read_history,
    run_numbers,
    value_of,
)
from teachkit.experiments.report_table import MAX_KEY_COLUMNS, SELECTS, Report
from teachkit.experiments.stats import paired_interval
from teachkit.registry import closest


def _order(values: tuple) -> tuple:
    return tuple((0, "", 0.0) if v is None else (1, "", float(v)) if isinstance(v, (int, float)) and
                 not isinstance(v, bool) else (2, cell(v), 0.0) for v in values)


def _is_seed(key: str) -> bool:
    return key.split(".")[-1] in SEED_NAMES


def _failed_jobs(root: Path) -> list[dict]:
    """Failed or blocked jobs of the sweeps whose ``sweep_status.json`` lies under ``root`` (unreadable: none)."""
    jobs = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("_"))
        if "config.yaml" in files:
            dirs[:] = []
        elif "sweep_status.json" in files:
            try:
                status = json.loads((Path(here) / "sweep_status.json").read_text())
            except (OSError, ValueError):
                continue
            jobs += [j for j in status.get("jobs") or [] if isinstance(j, dict)
                     and j.get("state") in ("failed", "blocked")]
    return jobs


def _check_root(root: Path) -> None:
    if not root.exists():
        raise ConfigError(f"runs folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise ConfigError(f"runs folder {str(root)!r} is not a folder")


def _pick_metric(runs: list[RunRecord], metric: str | None) -> str:
    if metric is None:
        chosen = sorted({str(r.summary.get("select_metric") or "acc") for r in runs})
        if len(chosen) > 1:
            raise ConfigError(f"the runs select on different metrics ({', '.join(chosen)}): pass --metric to "
                              "report one of them")
        return chosen[0]
    available = sorted({k[len("test_"):] for r in runs for k in r.summary if k.startswith("test_")
                        and not k.endswith("_at_best")})
    if metric not in available and not any(metric in (h.get("test") or {}) for r in runs for h in r.history[-1:]):
        raise ConfigError(f"no run records the test metric {metric!r}{closest(metric, available)}; the runs record: "
                          f"{', '.join(available) or 'none'}")
    return metric


def _candidate_keys(runs: list[RunRecord]) -> list[str]:
    """Keys that may distinguish runs: sweep labels when there are sweep runs, else recipe, teacher.model and
    every leaf config key (less :data:`NOT_GROUPING`)."""
    if any(r.sweep for r in runs):
        return list(dict.fromkeys(k for r in runs if r.sweep for k in (r.sweep.get("labels") or {})))
    keys = ["recipe", "teacher.model"] + [k for r in runs for k in leaf_keys(r.config)]
    return [k for k in dict.fromkeys(keys) if k not in NOT_GROUPING and k != "teacher.model.name"]


def _known_keys(runs: list[RunRecord]) -> list[str]:
    keys = [*PSEUDO_KEYS] + [k for r in runs for k in (r.sweep or {}).get("labels") or {}]
    keys += [k for r in runs for k in flat_keys(r.config)]
    return list(dict.fromkeys(keys))


def _baseline_row(text: str, by: list[str], rows: list[ReportRow]) -> ReportRow:
    """The one row ``key=value[,key=value]`` selects; a ConfigError naming the allowed keys and values."""
    wanted: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--baseline {text!r}: expected key=value[,key=value] over the report keys "
                              f"({', '.join(by) or 'none'})")
        if key not in by:
            raise ConfigError(f"--baseline key {key!r} is not a report key{closest(key, by)}; the rows are keyed by: "
                              f"{', '.join(by) or 'nothing (one row)'}")
        wanted[key] = value.strip()
    if not wanted:
        raise ConfigError(f"--baseline {text!r}: expected key=value[,key=value]")

    def matches(value: Any, given: str) -> bool:
        return cell(value) == given or str(value) == given or (value is None and given.lower() in ("none", "null"))

    chosen = [row for row in rows if all(matches(row.values[k], v) for k, v in wanted.items())]
    if not chosen:
        allowed = "; ".join(f"{k} takes {', '.join(dict.fromkeys(cell(r.values[k]) for r in rows))}" for k in wanted)
        raise ConfigError(f"--baseline {text!r} matches no row: {allowed}")
    if len(chosen) > 1:
        rest = [k for k in by if k not in wanted]
        raise ConfigError(f"--baseline {text!r} matches {len(chosen)} rows: add key=value for "
                          f"{', '.join(rest)} to pick one")
    return chosen[0]


def _published_for(row: ReportRow, metric: str) -> Published | None:
    found = {find_published(value_of(r, "data.name"), value_of(r, "teacher.model"), value_of(r, "model.name"),
                            method_of(r), value_of(r, "teacher.loss"), metric) for r in row.runs}
    return found.pop() if len(found) == 1 else None


def _teachers(runs: list[RunRecord], listed: list[RunRecord]) -> list[RunRecord]:
    """Teacher runs under the folder plus the teacher folders the runs read (deduplicated by folder)."""
    out: dict[Path, RunRecord] = {r.folder.resolve(): r for r in listed}
    for run in runs:
        teacher = run.teacher
        if teacher is not None and teacher.finished:
            out.setdefault(teacher.folder.resolve(), teacher)
    return list(out.values())


def _report_keys(runs: list[RunRecord], by: list[str] | None) -> tuple[list[str], list[str]]:
    """The report keys (``by`` checked, else the varying candidate keys less seeds) and the pairing keys (the
    varying keys that are not report keys)."""
    varying = [k for k in _candidate_keys(runs) if len({hashable(value_of(r, k)) for r in runs}) > 1]
    if by is None:
        by = [k for k in varying if not _is_seed(k)]
    else:
        known = _known_keys(runs)
        for key in by:
            if key not in known:
                raise ConfigError(f"unknown report key {key!r}{closest(key, known)}: use a sweep label, one of "
                                  f"{', '.join(PSEUDO_KEYS)}, or a dotted config key")
        by = list(dict.fromkeys(by))
    return by, [k for k in varying if k not in by]


def _group_rows(runs: list[RunRecord], by: list[str], metric: str) -> list[ReportRow]:
    """One row per distinct value of the report keys, in value order."""
    groups: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(tuple(hashable(value_of(run, k)) for k in by), []).append(run)
    rows = []
    for key in sorted(groups, key=_order):
        members = groups[key]
        rows.append(ReportRow({k: value_of(members[0], k) for k in by}, members,
                              [run_numbers(r, metric) for r in members]))
    return rows


def _total_wall_time(runs: list[RunRecord], teacher_runs: list[RunRecord]) -> float:
    """The runs' wall time plus that of the teachers trained in folders of their own (not a run, not inside one)."""
    wall = sum(finite_values(as_number(r.summary.get("wall_time_s")) for r in runs))
    wall += sum(finite_values(as_number(t.summary.get("wall_time_s")) for t in teacher_runs
                              if not any(t.folder.resolve() == r.folder.resolve() for r in runs)
                              and not any(r.folder in t.folder.parents for r in runs)))
    return wall


def build_report(root: Path, by: list[str] | None = None, baseline: str | None = None, select: str = "last",
                 metric: str | None = None, teachers: bool = False) -> Report:
    """Group the finished runs under ``root`` into rows by ``by`` (default: the varying sweep labels or config
    keys, less seeds) and aggregate them; see the module docstring. ``teachers``: teacher runs are rows too."""
    root = Path(root)
    _check_root(root)
    if select not in SELECTS:
        raise ConfigError(f"--select {select!r} is not allowed: use last or best")
    records = collect_runs(root)
    finished = [r for r in records if r.finished]
    if not finished:
        raise ConfigError(f"no run folders (config.yaml + summary.json) under {root}")
    read_by = {r.teacher_dir.resolve() for r in finished if r.teacher_dir is not None}
    is_teacher = [r.role == "teacher" or r.folder.resolve() in read_by for r in finished]
    runs = [r for r, t in zip(finished, is_teacher, strict=True) if teachers or not t]
    if not runs:
        raise ConfigError(f"only teacher runs under {root}: pass --teachers to report them")
    metric = _pick_metric(runs, metric)
    named = by is None
    by, pairing = _report_keys(runs, by)
    rows = _group_rows(runs, by, metric)
    base = _baseline_row(baseline, by, rows) if baseline else None
    if base is not None:
        rows = [base] + [r for r in rows if r is not base]
        for row in rows[1:]:
            a, b = pair_runs(row.runs, base.runs, pairing, lambda r: run_numbers(r, metric).selected(select))
            row.pairs = len(a)
            row.diff = paired_interval(a, b) if a else None
    for row in rows:
        row.published = _published_for(row, metric)
    listed_teachers = [r for r, t in zip(finished, is_teacher, strict=True) if t and not teachers]
    teacher_runs = _teachers(runs, listed_teachers)
    saved = sum(int(as_number((r.summary.get("cost") or {}).get("teacher_forwards_saved") or 0)) for r in runs)
    wall = _total_wall_time(runs, teacher_runs)
    selecting = [r for r in runs if r.summary.get("select_metric") == metric]  # they say whether it is in %
    percent = all(r.summary.get("select_metric_percent") for r in selecting) if selecting else metric == "acc"
    return Report(root, by, select, metric, rows, pairing, baseline, base,
                  unfinished=[r for r in records if not r.finished], failed=_failed_jobs(root),
                  teachers=teacher_runs, teacher_forwards_saved=saved, wall_time_s=wall, percent=percent,
                  named=named)


def write_report(report: Report, out: Path | None = None, plots: bool = True) -> list[Path]:
    """Write ``report.md``, ``report.csv`` and the plots (PNG + SVG) into ``out`` (default RUNS_DIR/report)."""
    out = Path(out) if out is not None else report.root / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"report folder {str(out)!r} cannot be made: {e.strerror or type(e).__name__}") from None
    markdown, table = report.to_markdown(), report.to_csv()
    paths = [out / "report.md", out / "report.csv"]
    atomic_write(paths[0], lambda tmp: Path(tmp).write_text(markdown, encoding="utf-8"))
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text(table, encoding="utf-8"))
    if plots:
        paths += write_plots(report, out)
    return paths


def run_report(root: Path, by: list[str] | None = None, baseline: str | None = None, select: str = "last",
               metric: str | None = None, out: Path | None = None, plots: bool = True,
               teachers: bool = False) -> Report:
    """``teachkit report``: build, write, print the table and a ``report: PATH ...`` line; returns the report."""
    report = build_report(Path(root), by, baseline, select, metric, teachers)
    paths = write_report(report, out, plots)
    print(report.markdown_table())
    print("report: " + ", ".join([str(paths[0]), *(p.name for p in paths[1:])]))
    return report


__all__ = ["RunRecord", "RunNumbers", "ReportRow", "Report", "collect_runs", "load_run", "value_of", "method_of",
           "run_numbers", "pair_runs", "build_report", "write_report", "run_report", "read_history", "cell",
           "hashable", "MAX_KEY_COLUMNS", "SELECTS"]
