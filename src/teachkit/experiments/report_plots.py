"""The report's figures (PNG + SVG each), drawn only when their data exist and matplotlib is installed.

- ``curves``: validation metric per epoch per row, mean line and min..max band over the row's runs;
- ``teacher_vs_student``: the teacher's validation metric per epoch (its run folder's metrics.jsonl) beside the
  student's, for rows whose runs have one;
- ``temperature``: the per-epoch temperature the runs log (``info.T``: Pro-KD, Annealing-KD);
- ``compute``: the selected test figure against images forwarded (student images seen + teacher forward
  images, :func:`~teachkit.experiments.report_rows.run_numbers`) and against wall time, one point per row with
  std error bars;
- ``mse_vs_ce``: when ``teacher.loss`` is a report key taking ``ce`` and ``mse``, the paired MSE-minus-CE
  difference for each combination of the other report keys (method, pair), with its 95% t interval.

Every figure has a bounded size whatever the number of rows: the legend sits right of the axes, one entry per
row up to :data:`MAX_LEGEND` rows; beyond, rows are coloured by the first report key that splits them into at
most that many groups (one entry per group), or, when none does, drawn on a colour scale and summarised as
``N rows``. Library warnings are kept out of the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teachkit.engine.checkpoint import atomic_write
from teachkit.experiments.report_rows import ReportRow, cell, pair_runs, run_numbers
from teachkit.experiments.report_table import Report
from teachkit.experiments.stats import (
    MAX_FIGURE_WIDTH_IN,
    legend_outside,
    mean_std,
    paired_interval,
    pyplot,
    quiet_plotting,
    save_figure,
)

#: legend entries at most; more rows are grouped by colour or summarised
MAX_LEGEND = 12
#: characters of a legend label at most (the rest cut, ``...``)
LABEL_CHARS = 40


@dataclass(frozen=True)
class Styles:
    """A colour and a legend label (None: no entry) per row, and a note naming how the rows are summarised."""

    colours: dict[int, Any]
    labels: dict[int, str | None]
    note: str | None = None

    def colour(self, row: ReportRow) -> Any:
        return self.colours[id(row)]

    def label(self, row: ReportRow) -> str | None:
        return self.labels[id(row)]


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 3] + "..."


def _palette(plt: Any, count: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if count <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(count)]


def row_styles(plt: Any, rows: list[ReportRow], by: list[str]) -> Styles:
    """One legend entry per row up to :data:`MAX_LEGEND`; else colours by the first key of ``by`` taking 2 to
    :data:`MAX_LEGEND` values over the rows (an entry per value); else a colour scale and an ``N rows`` note."""
    if len(rows) <= MAX_LEGEND:
        colours = _palette(plt, len(rows))
        return Styles({id(r): c for r, c in zip(rows, colours, strict=True)}, {id(r): _short(r.label()) for r in rows})
    for key in by:
        groups = list(dict.fromkeys(cell(r.values[key]) for r in rows))
        if 1 < len(groups) <= MAX_LEGEND:
            colours = _palette(plt, len(groups))
            values = [cell(r.values[key]) for r in rows]
            first = {value: index for index, value in reversed(list(enumerate(values)))}
            labels = {id(r): _short(f"{key}={v}") + f" ({values.count(v)} rows)" if first[v] == i else None
                      for i, (r, v) in enumerate(zip(rows, values, strict=True))}
            return Styles({id(r): colours[groups.index(v)] for r, v in zip(rows, values, strict=True)}, labels,
                          f"{len(rows)} rows, coloured by {key}")
    cmap = plt.get_cmap("viridis")
    return Styles({id(r): cmap(i / (len(rows) - 1)) for i, r in enumerate(rows)}, {id(r): None for r in rows},
                  f"{len(rows)} rows (named in report.md)")


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
    paths = [out / f"{stem}.{ext}" for ext in ("png", "svg")]
    for path in paths[:-1]:
        atomic_write(path, lambda tmp, ext=path.suffix[1:]: save_figure(plt, fig, tmp, ext, close=False))
    atomic_write(paths[-1], lambda tmp: save_figure(plt, fig, tmp, "svg"))
    return paths


def _legend(ax: Any, styles: Styles) -> None:
    """The legend right of the axes, titled by the styles' note; the note alone when no row is labelled."""
    if legend_outside(ax, title=styles.note) is None and styles.note:
        ax.text(1.01, 1.0, styles.note, transform=ax.transAxes, va="top", fontsize="small")


def _finish(plt: Any, fig: Any, ax: Any, styles: Styles | None, out: Path, stem: str, ylabel: str,
            title: str) -> list[Path]:
    """Label, legend and save a per-epoch plot; nothing (the figure closed) when no line was drawn (no styles)."""
    if styles is None:
        plt.close(fig)
        return []
    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    _legend(ax, styles)
    return _save(plt, fig, out, stem)


def _figure(plt: Any, height: float = 4.5) -> tuple[Any, Any]:
    return plt.subplots(figsize=(7, height), layout="constrained")


def _curves(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = _figure(plt)
    drawn = [(row, *_per_epoch([r.history for r in row.runs], _val(report.metric))) for row in report.rows]
    drawn = [d for d in drawn if d[1]]
    styles = row_styles(plt, [d[0] for d in drawn], report.by) if drawn else None
    for row, epochs, values in drawn:
        colour = styles.colour(row)
        ax.plot(epochs, [sum(v) / len(v) for v in values], color=colour, label=styles.label(row))
        ax.fill_between(epochs, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2)
    return _finish(plt, fig, ax, styles, out, "curves", f"val {report.metric}",
                   "validation per epoch (mean, min..max over runs)")


def _teacher_vs_student(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = _figure(plt)
    drawn = []
    for row in report.rows:
        teachers = [r.teacher.history for r in row.runs if r.teacher is not None and r.teacher.history]
        t_epochs, t_values = _per_epoch(teachers, _val(report.metric))
        if t_epochs:
            drawn.append((row, t_epochs, t_values, *_per_epoch([r.history for r in row.runs], _val(report.metric))))
    styles = row_styles(plt, [d[0] for d in drawn], report.by) if drawn else None
    for row, t_epochs, t_values, s_epochs, s_values in drawn:
        colour = styles.colour(row)
        ax.plot(s_epochs, [sum(v) / len(v) for v in s_values], color=colour, label=styles.label(row))
        ax.plot(t_epochs, [sum(v) / len(v) for v in t_values], linestyle="--", color=colour)
    if drawn:
        ax.plot([], [], linestyle="--", color="grey", label="its teacher (dashed)")
    return _finish(plt, fig, ax, styles, out, "teacher_vs_student", f"val {report.metric}",
                   "teacher trajectory vs student (mean over runs)")


def _temperature_of(line: dict) -> Any:
    return (line.get("info") or {}).get("T")


def _temperature(plt: Any, report: Report, out: Path) -> list[Path]:
    fig, ax = _figure(plt, 4.0)
    drawn = [(row, *_per_epoch([r.history for r in row.runs], _temperature_of)) for row in report.rows]
    drawn = [d for d in drawn if d[1]]
    styles = row_styles(plt, [d[0] for d in drawn], report.by) if drawn else None
    for row, epochs, values in drawn:
        ax.step(epochs, [sum(v) / len(v) for v in values], where="mid", color=styles.colour(row),
                label=styles.label(row))
    return _finish(plt, fig, ax, styles, out, "temperature", "temperature T", "temperature schedule")


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
    styles = row_styles(plt, [p[0] for p in points], report.by)
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.5), sharey=True, layout="constrained")
    for ax, index, xlabel in ((axes[0], 3, "images forwarded (student + teacher)"), (axes[1], 4, "wall time (s)")):
        for point in points:
            if point[index] is not None:
                ax.errorbar([point[index]], [point[1]], yerr=[point[2]], fmt="o", capsize=3,
                            color=styles.colour(point[0]), label=styles.label(point[0]) if ax is axes[1] else None)
        ax.set(xlabel=xlabel)
        xs = [p[index] for p in points if p[index] is not None and p[index] > 0]
        if xs and max(xs) > 10 * min(xs):
            ax.set_xscale("log")
    axes[0].set(ylabel=f"test {report.metric} ({report.select})")
    _legend(axes[1], styles)
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
    fig, ax = plt.subplots(figsize=(min(MAX_FIGURE_WIDTH_IN, max(5, 1.2 * len(gains) + 2)), 4.5),
                           layout="constrained")
    xs = list(range(len(gains)))
    means = [g[1][0] for g in gains]
    errors = [[m - lo if math.isfinite(lo) else 0 for m, (_, lo, _) in zip(means, (g[1] for g in gains),
                                                                          strict=True)],
              [hi - m if math.isfinite(hi) else 0 for m, (_, _, hi) in zip(means, (g[1] for g in gains),
                                                                          strict=True)]]
    ax.bar(xs, means, yerr=errors, capsize=4)
    ax.axhline(0, color="black", linewidth=0.8)
    many = len(gains) > 6
    ax.set_xticks(xs, [f"{_short(g[0])}\n({g[2]} pairs)" for g in gains], fontsize="small",
                  rotation=45 if many else 0, ha="right" if many else "center")
    ax.set(ylabel=f"MSE - CE teacher, test {report.metric} ({report.select})",
           title="MSE-teacher gain (paired, 95% t interval)")
    return _save(plt, fig, out, "mse_vs_ce")


def write_plots(report: Report, out: Path) -> list[Path]:
    """Every figure whose data exist, as PNG and SVG in ``out``; none without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    paths: list[Path] = []
    with quiet_plotting():
        for draw in (_curves, _teacher_vs_student, _temperature, _compute, _mse_vs_ce):
            paths += draw(plt, report, out)
    return paths


__all__ = ["write_plots", "mse_minus_ce", "row_styles", "MAX_LEGEND"]
