"""The report's figures (PNG + SVG each), drawn only when their data exist and matplotlib is installed.

- ``curves``: validation metric per epoch per row, mean line and min..max band over the row's runs;
- ``teacher_vs_student``: the teacher's validation metric per epoch (its run folder's metrics.jsonl) beside the
  student's, for rows whose runs have one;
- ``temperature``: the per-epoch temperature the runs log (``info.T``: Pro-KD, Annealing-KD);
- ``compute``: the selected test figure against images forwarded (student images seen + teacher forward
  images, :func:`~teachkit.experiments.report.run_numbers`) and against wall time, one point per row with
  std error bars;
- ``mse_vs_ce``: when ``teacher.loss`` is a report key taking ``ce`` and ``mse``, the paired MSE-minus-CE
  difference for each combination of the other report keys (method, pair), with its 95% t interval.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from teachkit.engine.checkpoint import atomic_write
from teachkit.experiments.report import Report, ReportRow, cell, pair_runs, run_numbers
from teachkit.experiments.stats import mean_std, paired_interval, pyplot


def _per_epoch(histories: list[list[dict]], get: Any) -> tuple[list[int], list[list[float]]]:
    """Epochs and, per epoch, the finite values ``get(line)`` takes over the histories."""
    by_epoch: dict[int, list[float]] = {}
    for history in histories:
        for line in history:
            value = get(line)
            if isinstance(value, (int, float)) and math.isfinite(value) and isinstance(line.get("epoch"), int):
                by_epoch.setdefault(line["epoch"], []).append(float(value))
    epochs = sorted(by_epoch)
    return epochs, [by_epoch[e] for e in epochs]


def _val(metric: str) -> Any:
    return lambda line: (line.get("val") or {}).get(metric)


def _save(plt: Any, fig: Any, out: Path, stem: str) -> list[Path]:
    fig.tight_layout()
    paths = [out / f"{stem}.{ext}" for ext in ("png", "svg")]
    for path in paths:
        atomic_write(path, lambda tmp, ext=path.suffix[1:]: fig.savefig(tmp, format=ext, dpi=120, bbox_inches="tight"))
    plt.close(fig)
    return paths


def _finish(plt: Any, fig: Any, ax: Any, drawn: bool, out: Path, stem: str, ylabel: str, title: str) -> list[Path]:
    """Label, legend and save a per-epoch plot; nothing (the figure closed) when no line was drawn."""
    if not drawn:
        plt.close(fig)
        return []
    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    ax.legend(fontsize="small")
    return _save(plt, fig, out, stem)


def _curves(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for row in report.rows:
        epochs, values = _per_epoch([r.history for r in row.runs], _val(report.metric))
        if not epochs:
            continue
        line, = ax.plot(epochs, [sum(v) / len(v) for v in values], label=row.label())
        ax.fill_between(epochs, [min(v) for v in values], [max(v) for v in values], color=line.get_color(),
                        alpha=0.2)
        drawn = True
    return _finish(plt, fig, ax, drawn, out, "curves", f"val {report.metric}",
                   "validation per epoch (mean, min..max over runs)")


def _teacher_vs_student(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for row in report.rows:
        teachers = [r.teacher.history for r in row.runs if r.teacher is not None and r.teacher.history]
        t_epochs, t_values = _per_epoch(teachers, _val(report.metric))
        if not t_epochs:
            continue
        s_epochs, s_values = _per_epoch([r.history for r in row.runs], _val(report.metric))
        line, = ax.plot(s_epochs, [sum(v) / len(v) for v in s_values], label=f"student {row.label()}")
        ax.plot(t_epochs, [sum(v) / len(v) for v in t_values], linestyle="--", color=line.get_color(),
                label=f"teacher of {row.label()}")
        drawn = True
    return _finish(plt, fig, ax, drawn, out, "teacher_vs_student", f"val {report.metric}",
                   "teacher trajectory vs student (mean over runs)")


def _temperature(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for row in report.rows:
        epochs, values = _per_epoch([r.history for r in row.runs], lambda line: (line.get("info") or {}).get("T"))
        if epochs:
            ax.step(epochs, [sum(v) / len(v) for v in values], where="mid", label=row.label())
            drawn = True
    return _finish(plt, fig, ax, drawn, out, "temperature", "temperature T", "temperature schedule")


def _compute(plt: Any, report: Report, out: Path) -> list[Path]:
    points = []
    for row in report.rows:
        numbers = [run_numbers(r, report.metric) for r in row.runs]
        y = [n.selected(report.select) for n in numbers]
        images = [n.images for n in numbers if math.isfinite(n.images)]
        wall = [n.wall_time_s for n in numbers if math.isfinite(n.wall_time_s)]
        finite_y = [v for v in y if math.isfinite(v)]
        if finite_y and (images or wall):
            m, sd = mean_std(finite_y)
            points.append((row, m, sd, mean_std(images)[0] if images else None, mean_std(wall)[0] if wall else None))
    if not points:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, index, xlabel in ((axes[0], 3, "images forwarded (student + teacher)"), (axes[1], 4, "wall time (s)")):
        for point in points:
            if point[index] is not None:
                ax.errorbar([point[index]], [point[1]], yerr=[point[2]], fmt="o", capsize=3, label=point[0].label())
        ax.set(xlabel=xlabel)
        xs = [p[index] for p in points if p[index] is not None and p[index] > 0]
        if xs and max(xs) > 10 * min(xs):
            ax.set_xscale("log")
    axes[0].set(ylabel=f"test {report.metric} ({report.select})")
    axes[1].legend(fontsize="small")
    fig.suptitle("accuracy vs compute (mean +- std over runs)")
    return _save(plt, fig, out, "compute")


def mse_minus_ce(report: Report) -> list[tuple[str, tuple[float, float, float], int]]:
    """(label, paired MSE - CE difference with its 95% interval, pairs) for each combination of the other
    report keys where both an ``mse`` and a ``ce`` teacher row exist."""
    if "teacher.loss" not in report.by:
        return []
    others = [k for k in report.by if k != "teacher.loss"]
    rows: dict[tuple, dict[str, ReportRow]] = {}
    for row in report.rows:
        rows.setdefault(tuple(cell(row.values[k]) for k in others), {})[str(row.values["teacher.loss"])] = row
    results = []
    for key, losses in rows.items():
        if "mse" in losses and "ce" in losses:
            a, b = pair_runs(losses["mse"].runs, losses["ce"].runs, report.pairing_keys,
                             lambda r: run_numbers(r, report.metric).selected(report.select))
            if a:
                label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or "all"
                results.append((label, paired_interval(a, b), len(a)))
    return results


def _mse_vs_ce(plt: Any, report: Report, out: Path) -> list[Path]:
    gains = mse_minus_ce(report)
    if not gains:
        return []
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(gains) + 2), 4.5))
    xs = list(range(len(gains)))
    means = [g[1][0] for g in gains]
    errors = [[m - lo if math.isfinite(lo) else 0 for m, (_, lo, _) in zip(means, (g[1] for g in gains),
                                                                          strict=True)],
              [hi - m if math.isfinite(hi) else 0 for m, (_, _, hi) in zip(means, (g[1] for g in gains),
                                                                          strict=True)]]
    ax.bar(xs, means, yerr=errors, capsize=4)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(xs, [f"{g[0]}\n({g[2]} pairs)" for g in gains], fontsize="small")
    ax.set(ylabel=f"MSE - CE teacher, test {report.metric} ({report.select})",
           title="MSE-teacher gain (paired, 95% t interval)")
    return _save(plt, fig, out, "mse_vs_ce")


def write_plots(report: Report, out: Path) -> list[Path]:
    """Every figure whose data exist, as PNG and SVG in ``out``; none without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    paths: list[Path] = []
    for draw in (_curves, _teacher_vs_student, _temperature, _compute, _mse_vs_ce):
        paths += draw(plt, report, out)
    return paths


__all__ = ["write_plots", "mse_minus_ce"]
