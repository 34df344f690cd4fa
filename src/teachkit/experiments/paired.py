"""Paired-seed studies: every method trained once per seed from the same base config, and their curves plotted.

The studies (text, translation) compare methods with *paired* seeds: for seed s every method gets
``train.seed=s`` (same initialisation, batch order and augmentation), so the per-seed differences cancel what
the seed moves and :func:`~teachkit.experiments.stats.paired_interval` gives the intervals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from teachkit.config import RunConfig
from teachkit.experiments.stats import legend_outside, pyplot, quiet_plotting, save_figure
from teachkit.recipes.common import RunResult, with_changes

#: ``run(config, run_dir) -> RunResult``: how one method trains a student
MethodRun = Callable[[RunConfig, Path], RunResult]


def paired_seed_runs(base: RunConfig, methods: Mapping[str, MethodRun], seeds: int, out_dir: Path, metric: str,
                     advance: Callable[[str, dict], Any] = lambda name, summary: None
                     ) -> tuple[dict[str, list[dict]], dict[str, list[list[float]]]]:
    """For each seed s in ``range(seeds)`` and each method: ``train.seed=s``, run name ``seed{s}-{method}``, run
    folder ``out_dir/seed{s}/{method}``. Returns the runs' summaries and their per-epoch validation ``metric``,
    by method in seed order; ``advance(name, summary)`` is called after each run (the progress)."""
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    curves: dict[str, list[list[float]]] = {m: [] for m in methods}
    for seed in range(seeds):
        student = with_changes(base, train={"seed": seed})
        for method, run in methods.items():
            result = run(with_changes(student, name=f"seed{seed}-{method}"), out_dir / f"seed{seed}" / method)
            runs[method].append(result.summary)
            curves[method].append([r["val"][metric] for r in result.history])
            advance(f"seed{seed}-{method}", result.summary)
    return runs, curves


def plot_epoch_bands(curves: Mapping[str, list[list[float]]], labels: Mapping[str, str],
                     colors: Mapping[str, str], path: Path, *, ylabel: str, title: str,
                     reference: float | None = None, reference_label: str = "teacher (val)") -> Path | None:
    """Per method, a validation metric per epoch: the mean over seeds as a line and the min..max band; a dashed
    ``reference`` line (the teacher). Written to ``path``; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    with quiet_plotting():
        return save_figure(plt, _bands_figure(plt, curves, labels, colors, ylabel, title, reference, reference_label),
                           path)


def _bands_figure(plt: Any, curves: Mapping[str, list[list[float]]], labels: Mapping[str, str],
                  colors: Mapping[str, str], ylabel: str, title: str, reference: float | None,
                  reference_label: str) -> Any:
    """The figure :func:`plot_epoch_bands` saves; its legend right of the axes, clear of the curves."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    for method, runs in curves.items():
        epochs = range(1, len(runs[0]) + 1)
        columns = list(zip(*runs, strict=True))
        ax.plot(epochs, [sum(c) / len(c) for c in columns], marker="o", color=colors[method], label=labels[method])
        ax.fill_between(epochs, [min(c) for c in columns], [max(c) for c in columns], color=colors[method],
                        alpha=0.2)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", linewidth=1, label=reference_label)
    ax.set_xlabel("student epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    legend_outside(ax)
    return fig


def publish(results: dict, text: str, out_dir: Path, plot: Callable[[dict, Path], Path | None]) -> dict:
    """Print the study's table ``text``, write ``results.md``, ``results.json`` and the plot ``results.png`` into
    ``out_dir`` and say where; returns ``results`` with ``out_dir`` added."""
    print(text)
    (out_dir / "results.md").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_path = plot(results, out_dir / "results.png")
    print(f"results: {out_dir / 'results.md'}" + (f", plot: {plot_path}" if plot_path else ""))
    results["out_dir"] = str(out_dir)
    return results
