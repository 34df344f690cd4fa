"""CE vs MSE teachers as the transfer set grows: the "How to train the teacher" (ECCV 2024) claim at several sizes.

Protocol (:func:`run_scaling_study`), the paired design of :mod:`teachkit.experiments.teacher_study` repeated over
transfer-set sizes: for every seed s, a CE and an MSE teacher train once on the whole training split (teacher
seed s: init and batch order); for every transfer-set size n the students learn from a stratified subset of n
training images drawn with ``data.subset_seed=s`` (the whole split when n reaches its size), with
``train.seed=s``: no KD, and every (method, teacher) pair. Val and test are fixed (``data.split_seed``), so no
teacher trains on them; selection uses val, test is only reported. Within a (seed, size) every student shares the
subset, the init and the batch order, so the MSE - CE differences are paired; their 95% t intervals over seeds
cover teacher, subset and student-initialisation variation (:data:`~teachkit.experiments.teacher_study.
INTERVAL_COVERS`).

Before running, :func:`plan` lists every run and predicts the wall time from per-epoch seconds measured on the
development machine (:data:`EPOCH_SECONDS`); ``benchmarks/mse_teacher_scaling.py`` is the driver.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teachkit.errors import ConfigError
from teachkit.experiments.paired import publish
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval, pyplot
from teachkit.experiments.teacher_study import (
    INTERVAL_COVERS,
    TEACHER_LOSSES,
    StudySetting,
    base_config,
    row_label,
    summarize_runs,
    teacher_config,
)
from teachkit.losses.objective import needs_of
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes

#: mdistiller's DKD warm-up on CIFAR: 20 of 240 epochs; the study ramps DKD over the same share of its budget
DKD_WARMUP_SHARE = 20 / 240

#: Seconds per epoch (training + the per-epoch val/test evaluation of 20,000 images) on mnist_full with one thread
#: (OMP_NUM_THREADS=1, torch.set_num_threads(1)), fp32, batch 64, measured on the 2-core development machine as
#: the process's CPU time (what an otherwise idle core takes; that machine was shared, and there the wall time was
#: ~1.5x). ``teacher``: LeNet 6/16/84 on the 50,000 training images; the others: the MLP-100 student per method
#: and transfer-set size, reading the teacher's cached outputs (kd, dkd: logits; rkd: logits and penultimate
#: embeddings). Sizes in between are interpolated linearly in the number of images (extrapolated from the nearest
#: two outside).
EPOCH_SECONDS: dict[str, Any] = {
    "teacher": 10.3,
    "none": {1000: 0.12, 5000: 0.23, 50000: 1.5},
    "kd": {1000: 0.13, 5000: 0.28, 50000: 2.65},
    "dkd": {1000: 0.16, 5000: 0.42, 50000: 3.16},
    "rkd": {1000: 0.35, 5000: 1.23, 50000: 13.8},
}
#: seconds every run costs besides its epochs (folder, checkpoints, loading the teacher)
RUN_SECONDS = {"teacher": 0.5, "student": 0.1}
#: seconds per 1,000 transfer-set images to fill a teacher's output cache (once per teacher, transfer set and set
#: of taps: kd fills the logits, dkd reads them, rkd fills logits + embeddings)
CACHE_SECONDS_PER_1K = 0.05
#: what the constants above were measured on (printed with the plan)
MEASURED_ON = "mnist_full, 1 thread, as CPU time on the 2-core development machine: an idle core's wall time"


@dataclass(frozen=True)
class ScalingSetting:
    """Models, sizes and budgets of a scaling study. ``student_epochs`` maps a transfer-set size to its epochs
    (a size not listed takes the epochs of the nearest listed size on a log scale)."""

    data: str
    teacher: dict[str, Any]
    student: dict[str, Any]
    teacher_epochs: int
    sizes: tuple[int, ...]
    student_epochs: dict[int, int]
    seeds: int = 5
    methods: tuple[str, ...] = ("kd", "dkd", "rkd")
    lr: float = 0.05
    student_lr: float = 0.01
    batch_size: int = 64
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def epochs_for(self, size: int) -> int:
        if size in self.student_epochs:
            return self.student_epochs[size]
        nearest = min(self.student_epochs, key=lambda n: abs(math.log(n) - math.log(size)))
        return self.student_epochs[nearest]

    def options_for(self, method: str, size: int) -> dict[str, Any]:
        """The method's options at this size: DKD's warm-up scaled to the student's epochs
        (:data:`DKD_WARMUP_SHARE`), then ``method_options``."""
        opts: dict[str, Any] = {"warmup": DKD_WARMUP_SHARE * self.epochs_for(size)} if method == "dkd" else {}
        return {**opts, **self.method_options.get(method, {})}

    def teacher_setting(self) -> StudySetting:
        """The :class:`StudySetting` the teachers are configured from (the whole training split)."""
        return StudySetting(self.data, teacher=self.teacher, student=self.student, teacher_epochs=self.teacher_epochs,
                            student_epochs=1, train_subset=None, seeds=self.seeds, lr=self.lr,
                            student_lr=self.student_lr, batch_size=self.batch_size)

    def study_setting(self, size: int, train_size: int) -> StudySetting:
        """The :class:`StudySetting` of the students on ``size`` images (the whole split: ``train_subset`` None)."""
        return StudySetting(self.data, teacher=self.teacher, student=self.student, teacher_epochs=self.teacher_epochs,
                            student_epochs=self.epochs_for(size),
                            train_subset=None if size >= train_size else size, seeds=self.seeds, lr=self.lr,
                            student_lr=self.student_lr, batch_size=self.batch_size,
                            method_options={m: self.options_for(m, size) for m in self.methods})


@dataclass(frozen=True)
class PlannedRun:
    """One run of the study: its kind (``teacher``, ``none`` or a method), teacher loss, seed, images, epochs and
    the predicted wall seconds."""

    kind: str
    loss: str | None
    seed: int
    size: int | None  # transfer-set size (students); None for teachers
    images: int
    epochs: int
    seconds: float

    @property
    def name(self) -> str:
        if self.kind == "teacher":
            return f"seed{self.seed}/teacher-{self.loss}"
        what = "no-kd" if self.kind == "none" else f"{self.kind}-{self.loss}-teacher"
        return f"seed{self.seed}/n{self.size}/{what}"


def epoch_seconds(kind: str, images: int, table: dict[str, Any] | None = None) -> float:
    """Predicted wall seconds of one epoch of ``kind`` (``teacher``, ``none``, a method) on ``images`` images,
    from :data:`EPOCH_SECONDS` (linear in the images between and beyond the measured sizes; a method without
    a measurement is priced as ``rkd``, the dearest)."""
    table = EPOCH_SECONDS if table is None else table
    if kind == "teacher":
        return float(table["teacher"]) * images / 50_000
    points = sorted(table.get(kind, table["rkd"]).items())
    xs = [n for n, _ in points]
    i = min(max(bisect.bisect_left(xs, images), 1), len(xs) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    value = y0 + (y1 - y0) * (images - x0) / (x1 - x0)
    return max(value, 0.5 * points[0][1])


def plan(s: ScalingSetting, seeds: int, train_size: int,
         table: dict[str, Any] | None = None) -> list[PlannedRun]:
    """Every run of the study in the order it runs: per seed, the two teachers, then per size no KD and every
    (method, teacher loss). The first run reading a teacher's taps on a transfer set also pays the cache fill."""
    runs = []
    for seed in range(seeds):
        for loss in TEACHER_LOSSES:
            runs.append(PlannedRun("teacher", loss, seed, None, train_size, s.teacher_epochs,
                                   s.teacher_epochs * epoch_seconds("teacher", train_size, table)
                                   + RUN_SECONDS["teacher"]))
        for size in s.sizes:
            images, epochs = min(size, train_size), s.epochs_for(size)
            kinds = [("none", None)] + [(m, loss) for m in s.methods for loss in TEACHER_LOSSES]
            cached: set[tuple[str | None, frozenset[str]]] = set()
            for kind, loss in kinds:
                seconds = epochs * epoch_seconds(kind, images, table) + RUN_SECONDS["student"]
                if kind != "none" and (loss, taps := frozenset(needs_of([kind])[1])) not in cached:
                    cached.add((loss, taps))
                    seconds += CACHE_SECONDS_PER_1K * images / 1000
                runs.append(PlannedRun(kind, loss, seed, size, images, epochs, seconds))
    return runs


def epochs_text(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def fmt_seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def render_plan(s: ScalingSetting, runs: list[PlannedRun], sizes: dict[str, int], command: str,
                threads: int, out: str | Path) -> str:
    """The plan as text: the data, every kind of run with its count, epochs and predicted time, the total and the
    command line."""
    teachers = [r for r in runs if r.kind == "teacher"]
    seeds = len({r.seed for r in runs})
    lines = [f"plan: MSE-teacher scaling study on {s.data} (train {sizes['train']}, val {sizes['val']}, "
             f"test {sizes['test']}); {seeds} seeds; methods {', '.join(s.methods)}; {threads} thread(s); "
             f"runs -> {out}",
             f"  teachers {s.teacher['name']} {s.teacher.get('options', {})}: CE and MSE x {seeds} seeds = "
             f"{len(teachers)} runs x {epochs_text(s.teacher_epochs)} on {sizes['train']} images "
             f"(~{epoch_seconds('teacher', sizes['train']):.1f} s/epoch) -> "
             f"{fmt_seconds(sum(r.seconds for r in teachers))}"]
    lines.append("  teacher outputs: computed once per teacher, transfer set and taps, then read from the cache "
                 "(teacher.cache=auto; no augmentation)")
    for size in s.sizes:
        group = [r for r in runs if r.size == size]
        images, epochs = group[0].images, group[0].epochs
        steps = epochs * math.ceil(images / s.batch_size)
        whole = " (the whole training split)" if size >= sizes["train"] else " (stratified subset, subset_seed=s)"
        lines.append(f"  students {s.student['name']} {s.student.get('options', {})} on {images} images{whole}: "
                     f"{epochs_text(epochs)}, {steps} SGD steps per run -> "
                     f"{fmt_seconds(sum(r.seconds for r in group))}")
        for kind in ["none", *s.methods]:
            of_kind = [r for r in group if r.kind == kind]
            label = "no KD" if kind == "none" else f"{kind} (from CE and MSE teachers)"
            cost = fmt_seconds(sum(r.seconds for r in of_kind))
            lines.append(f"    {label:<34} {len(of_kind):>3} runs x {epochs_text(epochs)} "
                         f"(~{epoch_seconds(kind, images):.2f} s/epoch) -> {cost}")
    total = sum(r.seconds for r in runs)
    lines += [f"  total {len(runs)} runs ({len(teachers)} teachers, {len(runs) - len(teachers)} students); expected "
              f"wall time ~{fmt_seconds(total)} (from per-epoch times measured on {MEASURED_ON}"
              + ("; more threads may be faster" if threads > 1 else "")
              + ("" if s.data == "mnist_full" else f"; an upper bound for {s.data}") + ")",
              f"  command: {command}"]
    return "\n".join(lines)


def verdict(interval: Sequence[float]) -> str:
    """``holds`` when the paired interval of MSE - CE is above 0, ``reversed`` below, else ``not resolved``."""
    _, lo, hi = interval
    if lo > 0:
        return "holds"
    if hi < 0:
        return "reversed"
    return "not resolved"


def run_scaling_study(s: ScalingSetting, out: str | Path, seeds: int | None = None, threads: int = 1,
                      command: str = "", on_plan: Callable[[str], None] = print,
                      title: str = "MSE-teacher scaling study") -> dict:
    """Print the plan, then for each seed train the two teachers and, per transfer-set size, the no-KD and every
    (method, teacher) student; one progress line per finished run. Returns the results (also written by
    :func:`~teachkit.experiments.paired.publish` into the study's folder)."""
    n_seeds = s.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    if not s.sizes or any(n < 1 for n in s.sizes):
        raise ConfigError(f"--sizes={','.join(map(str, s.sizes))} is not allowed: transfer-set sizes must be >= 1")
    out_dir = Path(out) / f"{s.data}-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.perf_counter()
    cfg = base_config(s.teacher_setting(), out_dir)
    device = device_of(cfg)
    teacher_splits = load_data(cfg.data, device, subset=False)
    sizes = {"train": len(teacher_splits.train), "val": len(teacher_splits.val), "test": len(teacher_splits.test)}
    runs = plan(s, n_seeds, sizes["train"])
    on_plan(render_plan(s, runs, sizes, command, threads, out_dir))
    covers = INTERVAL_COVERS.format(split_seed=cfg.data.split_seed)
    print(f"intervals cover: {covers}", flush=True)
    progress = Progress(runs)

    teachers: dict[str, list[dict]] = {loss: [] for loss in TEACHER_LOSSES}
    students: dict[int, dict[str, list[dict]]] = {size: {"none": []} for size in s.sizes}
    images: dict[int, int] = {}
    for seed in range(n_seeds):
        for loss in TEACHER_LOSSES:
            t = time.perf_counter()
            result = train_model(teacher_config(cfg, s.teacher_setting(), loss, seed),
                                 splits=teacher_splits, run_dir=out_dir / f"seed{seed}" / f"teacher-{loss}")
            teachers[loss].append(result.summary)
            progress.done(result.summary, time.perf_counter() - t)
        for size in s.sizes:
            setting = s.study_setting(size, sizes["train"])
            base = base_config(setting, out_dir)
            drawn = setting.train_subset is not None
            student = with_changes(base, train={"seed": seed}, data={"subset_seed": seed if drawn else None})
            splits = load_data(student.data, device) if drawn else teacher_splits
            images[size] = len(splits.train)
            folder = out_dir / f"seed{seed}" / f"n{size}"
            t = time.perf_counter()
            result = train_model(with_changes(student, name=f"seed{seed}-n{size}-no-kd"), splits=splits,
                                 run_dir=folder / "no-kd")
            students[size]["none"].append(result.summary)
            progress.done(result.summary, time.perf_counter() - t)
            for method in s.methods:
                for loss in TEACHER_LOSSES:
                    run = with_changes(student, name=f"seed{seed}-n{size}-{method}-{loss}-teacher",
                                       teacher={"checkpoint": str(out_dir / f"seed{seed}" / f"teacher-{loss}")},
                                       kd={"method": method, "options": {method: setting.method_options[method]}
                                           if setting.method_options.get(method) else {}})
                    t = time.perf_counter()
                    result = distill(run, splits=splits, run_dir=folder / f"{method}-{loss}-teacher")
                    students[size].setdefault(f"{method}/{loss}", []).append(result.summary)
                    progress.done(result.summary, time.perf_counter() - t)

    results = summarize(s, n_seeds, teachers, students, images, sizes, covers)
    results.update(title=title, command=command, threads=threads, wall_time_s=time.perf_counter() - t0,
                   predicted_wall_time_s=sum(r.seconds for r in runs),
                   runs={"teachers": sum(r.kind == "teacher" for r in runs),
                         "students": sum(r.kind != "teacher" for r in runs)})
    return publish(results, render(results), out_dir, plot)


class Progress:
    """One line per finished run (name, test accuracy, seconds, elapsed, predicted time left), flushed: suits a
    terminal and a log file."""

    def __init__(self, runs: list[PlannedRun]) -> None:
        self.runs, self.i, self.t0 = runs, 0, time.perf_counter()

    def done(self, summary: dict, seconds: float) -> None:
        run = self.runs[self.i]
        self.i += 1
        elapsed = time.perf_counter() - self.t0
        predicted_done = sum(r.seconds for r in self.runs[:self.i])
        left = sum(r.seconds for r in self.runs[self.i:]) * (elapsed / max(predicted_done, 1e-9))
        width = len(str(len(self.runs)))
        print(f"[{self.i:>{width}}/{len(self.runs)}] {run.name:<30} test {summary['test_acc']:6.2f}%  "
              f"{seconds:6.1f} s  (elapsed {fmt_seconds(elapsed)}, ~{fmt_seconds(left)} left)", flush=True)


def summarize(s: ScalingSetting, seeds: int, teachers: dict[str, list[dict]],
              students: dict[int, dict[str, list[dict]]], images: dict[int, int], sizes: dict[str, int],
              covers: str) -> dict:
    """The results record: teachers, per size the students (:func:`~teachkit.experiments.teacher_study.
    summarize_runs`, plus the paired MSE - CE interval per method) and the headline (per method and size, MSE - CE
    and its verdict). Sizes are string keys (JSON)."""
    results: dict[str, Any] = {
        "dataset": s.data, "seeds": seeds, "methods": list(s.methods), "sizes": list(s.sizes),
        "teacher_model": s.teacher, "student_model": s.student, "teacher_train_size": sizes["train"],
        "val_size": sizes["val"], "test_size": sizes["test"], "teacher_epochs": s.teacher_epochs,
        "batch_size": s.batch_size, "lr": {"teacher": s.lr, "student": s.student_lr}, "interval_covers": covers,
        "teachers": {loss: {"val_acc": [r["val_acc"] for r in runs], "test_acc": [r["test_acc"] for r in runs],
                            "wall_time_s": sum(r["wall_time_s"] for r in runs)} for loss, runs in teachers.items()},
        "by_size": {}, "headline": {m: {} for m in s.methods}}
    results["teachers"]["mse"]["mse_minus_ce"] = paired_interval(results["teachers"]["mse"]["test_acc"],
                                                                 results["teachers"]["ce"]["test_acc"])
    for size, runs in students.items():
        entry = {k: summarize_runs(v, runs["none"]) for k, v in runs.items()}
        for method in s.methods:
            interval = paired_interval([r["test_acc"] for r in runs[f"{method}/mse"]],
                                       [r["test_acc"] for r in runs[f"{method}/ce"]])
            entry[f"{method}/mse"]["mse_minus_ce"] = interval
            results["headline"][method][str(size)] = {"mse_minus_ce": interval, "verdict": verdict(interval)}
        results["by_size"][str(size)] = {
            "student_train_size": images[size], "whole_split": size >= sizes["train"],
            "student_epochs": s.epochs_for(size),
            "method_options": s.study_setting(size, sizes["train"]).method_options, "students": entry}
    return results


def _model(spec: dict[str, Any]) -> str:
    opts = spec.get("options") or {}
    return spec["name"] + (" " + ", ".join(f"{k}={v}" for k, v in opts.items()) if opts else "")


def render(r: dict) -> str:
    """The per-size tables, the headline (MSE - CE per method and size) and the verdicts."""
    teacher_rows = []
    for loss, t in r["teachers"].items():
        mse_ce = fmt_interval(t["mse_minus_ce"]) if "mse_minus_ce" in t else ""
        teacher_rows.append(f"| teacher ({loss.upper()}) | {fmt_mean_std(t['test_acc'])} | | | {mse_ce} "
                            f"| {t['wall_time_s']:.1f} |")
    lines = [f"## teachkit {r['title']}: {r['dataset']}", "",
             f"{r['seeds']} seeds; per seed, a CE and an MSE teacher ({_model(r['teacher_model'])}, "
             f"{epochs_text(r['teacher_epochs'])} on all {r['teacher_train_size']} training images) and students "
             f"({_model(r['student_model'])}) on transfer sets of {', '.join(str(n) for n in r['sizes'])} images; "
             f"val {r['val_size']} and test {r['test_size']} fixed; batch {r['batch_size']}, SGD momentum 0.9, "
             f"cosine, lr {r['lr']['teacher']} (teachers) / {r['lr']['student']} (students).", ""]
    for size in r["sizes"]:
        b = r["by_size"][str(size)]
        whole = ", the whole training split" if b["whole_split"] else ", stratified subset drawn with subset_seed=s"
        budget = epochs_text(b["student_epochs"])
        lines += [f"### transfer set {b['student_train_size']} images ({budget} per student{whole})", "",
                  "| model | test acc % (last epoch) | test % at best val epoch | test diff vs no KD [95% CI] "
                  "| MSE - CE teacher [95% CI] | wall s |",
                  "|---|---|---|---|---|---|", *teacher_rows]
        for key, e in b["students"].items():
            diff = fmt_interval(e["diff_vs_no_kd"]) if "diff_vs_no_kd" in e else ""
            mse_ce = fmt_interval(e["mse_minus_ce"]) if "mse_minus_ce" in e else ""
            lines.append(f"| student: {row_label(key)} | {fmt_mean_std(e['test_acc'])} | "
                         f"{fmt_mean_std(e['test_acc_at_best_val'])} | {diff} | {mse_ce} | {e['wall_time_s']:.1f} |")
        lines.append("")
    lines += headline(r)
    lines += ["", "mean +- std over seeds (sample std); intervals are paired 95% t intervals over seeds. What varies "
              f"with the seed (so what the spread and the intervals cover): {r['interval_covers']}. "
              f"Total wall time {r['wall_time_s']:.0f} s (predicted {r['predicted_wall_time_s']:.0f} s), "
              f"{r['threads']} thread(s)."]
    if r.get("command"):
        lines.append(f"Command: `{r['command']}`")
    return "\n".join(lines)


def headline(r: dict) -> list[str]:
    """The MSE - CE student test-accuracy gain per method and transfer-set size, and the verdict in words."""
    sizes = [str(n) for n in r["sizes"]]
    images = [str(r["by_size"][n]["student_train_size"]) for n in sizes]
    lines = ["### headline: student test acc, MSE teacher - CE teacher (paired 95% t interval over seeds)", "",
             "| method | " + " | ".join(f"{n} images" for n in images) + " |",
             "|---|" + "---|" * len(sizes)]
    for method, by_size in r["headline"].items():
        cells = [f"{fmt_interval(by_size[n]['mse_minus_ce'])} {by_size[n]['verdict']}" for n in sizes]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    t = r["teachers"]["mse"]["mse_minus_ce"]
    lines += ["", f"Teachers themselves, MSE - CE test acc: {fmt_interval(t)} ({verdict(t)}).", "",
              "Verdict on the claim (an MSE-trained teacher gives a better student than a CE-trained one): "
              "holds = interval above 0, reversed = below 0, not resolved = contains 0."]
    for method, by_size in r["headline"].items():
        parts = [f"{by_size[n]['verdict']} at {img} images" for n, img in zip(sizes, images, strict=True)]
        lines.append(f"- {method}: " + "; ".join(parts))
    return lines


def plot(r: dict, path: Path) -> Path | None:
    """MSE - CE student gain vs transfer-set size (log x), one line per method with its 95% interval as error
    bars, and the zero line; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.8, 3.8))
    methods = list(r["headline"])
    for i, method in enumerate(methods):
        sizes = r["sizes"]
        xs = [r["by_size"][str(n)]["student_train_size"] * (1.06 ** (i - (len(methods) - 1) / 2)) for n in sizes]
        triples = [r["headline"][method][str(n)]["mse_minus_ce"] for n in sizes]
        ys = [m for m, _, _ in triples]
        err = [[0.0 if math.isnan(lo) else m - lo for m, lo, _ in triples],
               [0.0 if math.isnan(hi) else hi - m for m, _, hi in triples]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=method)
    ax.axhline(0.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ticks = [r["by_size"][str(n)]["student_train_size"] for n in r["sizes"]]
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("transfer-set size (images, log scale)")
    ax.set_ylabel("student test acc: MSE - CE teacher (pp)")
    ax.set_title(f"{r['dataset']}: MSE - CE teacher gain, {r['seeds']} seeds, 95% paired t intervals", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["EPOCH_SECONDS", "PlannedRun", "ScalingSetting", "epoch_seconds", "headline", "plan",
           "plot", "render", "render_plan", "run_scaling_study", "summarize", "verdict"]
