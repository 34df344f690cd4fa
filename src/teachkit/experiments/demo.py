"""``teachkit demo``: CE vs MSE teacher (ECCV 2024) and Hinton KD vs no KD, several paired seeds.

Protocol: the teachers train on the full training split; the students learn from a fixed,
stratified subset of it (the regime where distillation is known to matter: the teacher has seen
more data than the student). Students of every method share the init and the batch order of a
seed (paired design), so the paired difference against the no-KD student isolates the method.
Selection uses the validation split carved from training data; test is only reported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from teachkit.config import RunConfig, from_dict
from teachkit.experiments.stats import mean_std, paired_interval
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes


@dataclass(frozen=True)
class DemoSetting:
    """Models, data sizes and budgets of the demo on one dataset (chosen for ~3 min on 2 cores)."""

    teacher: dict[str, Any]
    student: dict[str, Any]
    teacher_epochs: int
    student_epochs: int
    train_subset: int | None
    seeds: int
    teacher_optim: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.05})
    student_optim: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.05})
    batch_size: int = 64
    alpha: float = 0.9
    temperature: float = 4.0
    options: dict[str, Any] = field(default_factory=dict)


SETTINGS: dict[str, DemoSetting] = {
    "mnist5k": DemoSetting(teacher={"name": "lenet"}, student={"name": "mlp", "options": {"hidden": [100]}},
                           teacher_epochs=15, student_epochs=30, train_subset=500, seeds=10),
    "digits": DemoSetting(teacher={"name": "lenet"}, student={"name": "mlp", "options": {"hidden": [32]}},
                          teacher_epochs=20, student_epochs=30, train_subset=200, seeds=10),
    "mnist1d": DemoSetting(teacher={"name": "cnn1d"}, student={"name": "mlp", "options": {"hidden": [100]}},
                           teacher_epochs=30, student_epochs=40, train_subset=1000, seeds=10),
}

METHODS = ("no KD", "KD from CE teacher", "KD from MSE teacher")


def base_config(data: str, s: DemoSetting, out_dir: Path) -> RunConfig:
    return from_dict({
        "out_dir": str(out_dir),
        "data": {"name": data, "train_subset": s.train_subset, "batch_size": s.batch_size, "options": s.options},
        "model": s.student,
        "optim": {**s.student_optim, "weight_decay": 5e-4, "schedule": "cosine"},
        "train": {"epochs": s.student_epochs, "progress": False},
        "teacher": {"model": s.teacher, "optim": {**s.teacher_optim, "weight_decay": 5e-4, "schedule": "cosine"},
                    "epochs": s.teacher_epochs},
        "kd": {"alpha": s.alpha, "temperature": s.temperature},
    })


def _fmt(values: list[float]) -> str:
    m, sd = mean_std(values)
    return f"{m:.2f} +- {sd:.2f}"


def run_demo(data: str = "mnist5k", seeds: int | None = None, out: str = "runs/demo", quick: bool = False) -> dict:
    """Run the demo protocol on ``data`` and print/write the results table; returns the results."""
    s = SETTINGS[data]
    if quick:
        s = DemoSetting(**{**s.__dict__, "teacher_epochs": 2, "student_epochs": 2, "seeds": 2})
    n_seeds = seeds if seeds is not None else s.seeds
    if n_seeds < 1:
        from teachkit.errors import ConfigError

        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out_dir = Path(out) / f"{data}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base_config(data, s, out_dir)
    device = device_of(cfg)
    t0 = time.perf_counter()
    teacher_splits = load_data(with_changes(cfg, data={"train_subset": None}).data, device)
    student_splits = load_data(cfg.data, device)
    total = 2 + 3 * n_seeds
    print(f"teachkit demo on {data}: teachers {s.teacher['name']} on {len(teacher_splits.train)} training examples "
          f"(CE and MSE); students {s.student['name']} on a stratified subset of {len(student_splits.train)}; "
          f"val {len(student_splits.val)}, test {len(student_splits.test)}; {n_seeds} seeds; {total} runs -> {out_dir}")
    bar = tqdm(total=total, desc="demo runs", dynamic_ncols=True)
    teachers = {}
    for loss in ("ce", "mse"):
        tcfg = with_changes(cfg, name=f"teacher-{loss}", model=cfg.teacher.model, optim=cfg.teacher.optim,
                            train={"epochs": s.teacher_epochs, "loss": loss, "seed": 0},
                            data={"train_subset": None})
        teachers[loss] = train_model(tcfg, splits=teacher_splits)
        bar.update(1)
    rows: dict[str, list[dict]] = {m: [] for m in METHODS}
    for seed in range(n_seeds):
        student = with_changes(cfg, train={"seed": seed})
        rows["no KD"].append(train_model(with_changes(student, name=f"seed{seed}/no-kd"),
                                         splits=student_splits).summary)
        bar.update(1)
        for loss, method in (("ce", METHODS[1]), ("mse", METHODS[2])):
            run = with_changes(student, name=f"seed{seed}/kd-{loss}-teacher",
                               teacher={"checkpoint": str(teachers[loss].run_dir)})
            rows[method].append(distill(run, splits=student_splits).summary)
            bar.update(1)
    bar.close()
    results = summarize(data, s, n_seeds, teachers, rows, time.perf_counter() - t0,
                        len(teacher_splits.train), len(student_splits.train))
    text = render(results)
    print(text)
    (out_dir / "results.md").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_path = plot(results, out_dir / "results.png")
    print(f"results: {out_dir / 'results.md'}" + (f", plot: {plot_path}" if plot_path else ""))
    return results


def summarize(data: str, s: DemoSetting, n_seeds: int, teachers: dict, rows: dict, wall: float,
              n_teacher: int, n_student: int) -> dict:
    base = [r["test_acc"] for r in rows["no KD"]]
    out: dict[str, Any] = {"dataset": data, "seeds": n_seeds, "teacher_train_size": n_teacher,
                           "student_train_size": n_student, "wall_time_s": wall, "teachers": {}, "students": {}}
    for loss, t in teachers.items():
        out["teachers"][loss] = {"val_acc": t.summary["val_acc"], "test_acc": t.summary["test_acc"],
                                 "wall_time_s": t.summary["wall_time_s"], "model": s.teacher["name"]}
    for method, runs in rows.items():
        test = [r["test_acc"] for r in runs]
        entry = {"val_acc": [r["val_acc"] for r in runs], "test_acc": test,
                 "test_acc_at_best_val": [r["test_acc_at_best"] for r in runs],
                 "wall_time_s": sum(r["wall_time_s"] for r in runs)}
        if method != "no KD":
            entry["paired_diff_test"] = paired_interval(test, base)
        out["students"][method] = entry
    return out


def render(r: dict) -> str:
    lines = [f"## teachkit demo: {r['dataset']} ({r['seeds']} seeds; teachers on {r['teacher_train_size']} examples, "
             f"students on {r['student_train_size']})", "",
             "| model | val acc % (last epoch) | test acc % (last epoch) | test % at best val epoch "
             "| test diff vs no KD [95% CI] | wall s |", "|---|---|---|---|---|---|"]
    for loss, t in r["teachers"].items():
        lines.append(f"| teacher {t['model']} ({loss.upper()}) | {t['val_acc']:.2f} | {t['test_acc']:.2f} | | | "
                     f"{t['wall_time_s']:.1f} |")
    for method, e in r["students"].items():
        diff = ""
        if "paired_diff_test" in e:
            m, lo, hi = e["paired_diff_test"]
            diff = f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        lines.append(f"| student: {method} | {_fmt(e['val_acc'])} | {_fmt(e['test_acc'])} | "
                     f"{_fmt(e['test_acc_at_best_val'])} | {diff} | {e['wall_time_s']:.1f} |")
    lines += ["", f"mean +- std over seeds (sample std); paired: same init and batch order per seed. "
              f"Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> Path | None:
    """A bar chart of student test accuracy per method (mean +- std, seeds as dots); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    methods = list(r["students"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, m in enumerate(methods):
        vals = r["students"][m]["test_acc"]
        mu, sd = mean_std(vals)
        ax.bar(i, mu, yerr=sd, capsize=4, color=["#999999", "#4c72b0", "#dd8452"][i % 3])
        ax.scatter([i] * len(vals), vals, color="black", s=10, zorder=3)
    for loss, t in r["teachers"].items():
        ax.axhline(t["test_acc"], ls="--", lw=1, color="#4c72b0" if loss == "ce" else "#dd8452",
                   label=f"{loss.upper()} teacher")
    ax.set_xticks(range(len(methods)), [m.replace(" from ", "\nfrom ") for m in methods])
    ax.set_ylabel("test accuracy %")
    lo = min(min(r["students"][m]["test_acc"]) for m in methods)
    ax.set_ylim(max(0, lo - 5), 100)
    ax.set_title(f"{r['dataset']}: students on {r['student_train_size']} images")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
