"""CE vs MSE teachers (ECCV 2024) across distillation methods, with paired seeds.

Protocol: for every seed s, a CE and an MSE teacher train on the full training split (teacher seed s:
init and batch order), and the students learn from a stratified subset of it drawn with
``data.subset_seed=s`` (the regime where distillation matters: the teacher has seen more data than the
student). Val and test are fixed by ``data.split_seed`` for every seed, so no teacher ever trains on them.
Within a seed the no-KD student and every (method, teacher) student share the subset, the init and the
batch order, and the CE and MSE teachers share theirs (paired design): paired differences isolate the method
and the teacher's loss, and their intervals cover teacher, subset and student-initialisation variation
(:data:`INTERVAL_COVERS`). Selection uses the validation split; test is only reported.
``teachkit demo`` is this protocol with Hinton KD alone; ``benchmarks/mse_teacher_study.py`` runs
every method.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from teachkit.config import RunConfig, from_dict
from teachkit.errors import ConfigError
from teachkit.experiments.paired import publish
from teachkit.experiments.progress import RunsProgress
from teachkit.experiments.stats import (
    MAX_FIGURE_WIDTH_IN,
    fmt_interval,
    fmt_mean_std,
    legend_outside,
    mean_std,
    paired_interval,
    pyplot,
    quiet_plotting,
    save_figure,
)
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes

TEACHER_LOSSES = ("ce", "mse")
#: what the spread and the intervals of a study cover (printed under its table and kept in results.json)
INTERVAL_COVERS = ("per seed s, a new CE and MSE teacher (teacher seed s: init and batch order), a new student "
                   "subset (data.subset_seed=s) and a new student init and batch order (train.seed=s); val/test "
                   "fixed (data.split_seed={split_seed}); paired within a seed")


@dataclass(frozen=True)
class StudySetting:
    """Models, data sizes and budgets of one study (chosen to fit the time on 2 CPU cores)."""

    data: str
    teacher: dict[str, Any]
    student: dict[str, Any]
    teacher_epochs: int
    student_epochs: int
    train_subset: int | None
    seeds: int
    lr: float = 0.05
    student_lr: float | None = None  # default: ``lr``
    batch_size: int = 64
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def quick(self) -> StudySetting:
        return replace(self, teacher_epochs=2, student_epochs=2, seeds=min(self.seeds, 2))


def base_config(s: StudySetting, out_dir: Path) -> RunConfig:
    optim = {"name": "sgd", "lr": s.lr, "weight_decay": 5e-4, "schedule": "cosine"}
    student_optim = {**optim, "lr": s.student_lr if s.student_lr is not None else s.lr}
    return from_dict({
        "out_dir": str(out_dir),
        "data": {"name": s.data, "train_subset": s.train_subset, "batch_size": s.batch_size, "options": s.options},
        "model": s.student, "optim": student_optim, "train": {"epochs": s.student_epochs, "progress": False},
        "teacher": {"model": s.teacher, "optim": optim, "epochs": s.teacher_epochs},
    })


def teacher_config(cfg: RunConfig, s: StudySetting, loss: str, seed: int) -> RunConfig:
    """Seed ``seed``'s teacher with ``loss``: the full training split, its own init and batch order."""
    return with_changes(cfg, name=f"seed{seed}-teacher-{loss}", model=cfg.teacher.model, optim=cfg.teacher.optim,
                        train={"epochs": s.teacher_epochs, "loss": loss, "seed": seed},
                        data={"train_subset": None, "subset_seed": None})


def run_study(s: StudySetting, methods: list[str], out: str | Path, seeds: int | None = None,
              title: str = "teacher study") -> dict:
    """For each seed: train the two teachers and draw the student subset, then no-KD and every (method,
    teacher) student."""
    n_seeds = s.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    out_dir = Path(out) / f"{s.data}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base_config(s, out_dir)
    device = device_of(cfg)
    t0 = time.perf_counter()
    teacher_splits = load_data(cfg.data, device, subset=False)
    covers = INTERVAL_COVERS.format(split_seed=cfg.data.split_seed)
    per_seed = len(TEACHER_LOSSES) + 1 + len(methods) * len(TEACHER_LOSSES)
    total = n_seeds * per_seed
    subset = s.train_subset if s.train_subset is not None else len(teacher_splits.train)
    print(f"teachkit {title} on {s.data}: per seed, CE and MSE teachers {s.teacher['name']} on "
          f"{len(teacher_splits.train)} training examples and students {s.student['name']} on a stratified subset "
          f"of {subset}; val {len(teacher_splits.val)}, test {len(teacher_splits.test)}; methods {', '.join(methods)}; "
          f"{n_seeds} seeds; {total} runs -> {out_dir}")
    print(f"intervals cover: {covers}")
    bar = RunsProgress(total)
    teachers: dict[str, list[dict]] = {loss: [] for loss in TEACHER_LOSSES}
    students: dict[str, list[dict]] = {"none": []}
    student_size = 0
    for seed in range(n_seeds):
        for loss in TEACHER_LOSSES:
            teachers[loss].append(train_model(teacher_config(cfg, s, loss, seed), splits=teacher_splits,
                                              run_dir=out_dir / f"seed{seed}" / f"teacher-{loss}").summary)
            bar.done(f"seed{seed}-teacher-{loss}", teachers[loss][-1])
        student = with_changes(cfg, train={"seed": seed}, data={"subset_seed": seed})
        student_splits = load_data(student.data, device)
        student_size = len(student_splits.train)
        students["none"].append(train_model(with_changes(student, name=f"seed{seed}-no-kd"), splits=student_splits,
                                            run_dir=out_dir / f"seed{seed}" / "no-kd").summary)
        bar.done(f"seed{seed}-no-kd", students["none"][-1])
        for method in methods:
            for loss in TEACHER_LOSSES:
                run = with_changes(student, name=f"seed{seed}-{method}-{loss}-teacher",
                                   teacher={"checkpoint": str(out_dir / f"seed{seed}" / f"teacher-{loss}")},
                                   kd={"method": method,
                                       "options": {method: s.method_options[method]} if method in s.method_options
                                       else {}})
                folder = out_dir / f"seed{seed}" / f"{method}-{loss}-teacher"
                students.setdefault(f"{method}/{loss}", []).append(distill(run, splits=student_splits,
                                                                           run_dir=folder).summary)
                bar.done(run.name, students[f"{method}/{loss}"][-1])
    bar.close()
    results = {"title": title, "dataset": s.data, "seeds": n_seeds, "methods": methods,
               "teacher_model": s.teacher["name"], "student_model": s.student["name"],
               "teacher_train_size": len(teacher_splits.train), "student_train_size": student_size,
               "teacher_epochs": s.teacher_epochs, "student_epochs": s.student_epochs,
               "interval_covers": covers, "wall_time_s": time.perf_counter() - t0,
               "teachers": {loss: {"val_acc": [r["val_acc"] for r in runs], "test_acc": [r["test_acc"] for r in runs],
                                   "wall_time_s": sum(r["wall_time_s"] for r in runs)}
                            for loss, runs in teachers.items()},
               "students": {k: summarize_runs(v, students["none"]) for k, v in students.items()}}
    results["teachers"]["mse"]["mse_minus_ce"] = paired_interval(results["teachers"]["mse"]["test_acc"],
                                                                 results["teachers"]["ce"]["test_acc"])
    for method in methods:
        ce, mse = students[f"{method}/ce"], students[f"{method}/mse"]
        results["students"][f"{method}/mse"]["mse_minus_ce"] = paired_interval(
            [r["test_acc"] for r in mse], [r["test_acc"] for r in ce])
    text = render(results)
    return publish(results, text, out_dir, plot)


def summarize_runs(runs: list[dict], baseline: list[dict]) -> dict:
    test = [r["test_acc"] for r in runs]
    entry = {"val_acc": [r["val_acc"] for r in runs], "test_acc": test,
             "test_acc_at_best_val": [r["test_acc_at_best"] for r in runs],
             "wall_time_s": sum(r["wall_time_s"] for r in runs)}
    if runs is not baseline:
        entry["diff_vs_no_kd"] = paired_interval(test, [r["test_acc"] for r in baseline])
    return entry






def row_label(key: str) -> str:
    if key == "none":
        return "no KD"
    method, loss = key.split("/")
    return f"{method} from {loss.upper()} teacher"


def render(r: dict) -> str:
    lines = [f"## teachkit {r['title']}: {r['dataset']} ({r['seeds']} seeds; per seed, {r['teacher_model']} teachers "
             f"on {r['teacher_train_size']} examples and {r['student_model']} students on a subset of "
             f"{r['student_train_size']})", "",
             "| model | val acc % (last epoch) | test acc % (last epoch) | test % at best val epoch "
             "| test diff vs no KD [95% CI] | MSE - CE teacher [95% CI] | wall s |",
             "|---|---|---|---|---|---|---|"]
    for loss, t in r["teachers"].items():
        mse_ce = fmt_interval(t["mse_minus_ce"]) if "mse_minus_ce" in t else ""
        lines.append(f"| teacher ({loss.upper()}) | {fmt_mean_std(t['val_acc'])} | {fmt_mean_std(t['test_acc'])} "
                     f"| | | {mse_ce} | {t['wall_time_s']:.1f} |")
    for key, e in r["students"].items():
        diff = fmt_interval(e["diff_vs_no_kd"]) if "diff_vs_no_kd" in e else ""
        mse_ce = fmt_interval(e["mse_minus_ce"]) if "mse_minus_ce" in e else ""
        lines.append(f"| student: {row_label(key)} | {fmt_mean_std(e['val_acc'])} | {fmt_mean_std(e['test_acc'])} | "
                     f"{fmt_mean_std(e['test_acc_at_best_val'])} | {diff} | {mse_ce} | {e['wall_time_s']:.1f} |")
    lines += ["", "mean +- std over seeds (sample std); intervals are paired 95% t intervals over seeds. What varies "
              f"with the seed (so what the spread and the intervals cover): {r['interval_covers']}. "
              f"Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def bar_figure(plt: Any, r: dict) -> Any:
    """Student test accuracy per method and teacher: bars (mean +- std) from 0, seeds as dots, the mean above
    each bar, the legend right of the axes (clear of the bars)."""
    groups = ["none", *r["methods"]]
    fig, ax = plt.subplots(figsize=(min(MAX_FIGURE_WIDTH_IN, max(5.0, 1.1 * len(groups) + 2)), 3.6),
                           layout="constrained")
    colors = {"none": "#999999", "ce": "#4c72b0", "mse": "#dd8452"}
    names = {"none": "no KD", "ce": "CE teacher", "mse": "MSE teacher"}
    for i, g in enumerate(groups):
        keys = [("none", "none")] if g == "none" else [(f"{g}/{loss}", loss) for loss in TEACHER_LOSSES]
        for j, (key, color) in enumerate(keys):
            vals = r["students"][key]["test_acc"]
            mu, sd = mean_std(vals)
            x = i + (0 if g == "none" else (j - 0.5) * 0.38)
            ax.bar(x, mu, width=0.36, yerr=sd, capsize=3, color=colors[color], label=names[color] if i < 2 else None)
            ax.scatter([x] * len(vals), vals, color="black", s=8, zorder=3)
            ax.annotate(f"{mu:.1f}", (x, max([mu + sd, *vals])), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=7)
    ax.set_xticks(range(len(groups)), ["no KD" if g == "none" else g for g in groups])
    ax.set_ylabel("student test accuracy %")
    hi = max(max(e["test_acc"]) for e in r["students"].values())
    ax.set_ylim(0, hi * 1.1 if hi > 0 else 1.0)  # from 0: the bars' heights compare as the accuracies do
    ax.set_title(f"{r['dataset']}: {r['student_model']} students on {r['student_train_size']} examples")
    legend_outside(ax)
    return fig


def plot(r: dict, path: Path) -> Path | None:
    """:func:`bar_figure` written to ``path``; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    with quiet_plotting():
        return save_figure(plt, bar_figure(plt, r), path)
