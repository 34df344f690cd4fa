"""No KD vs forward KL vs reverse KL vs on-policy GKD vs Pro-KD for a causal LM on generated addition problems
(``teachkit demo --task lm``).

Protocol: the offline ``addition`` task (3-digit operands, zero-padded, the answer written least-significant
digit first: a fixed format small transformers can learn in minutes), with **label noise**: a seeded share of the
training answers has one wrong digit, while validation and test answers are right. The references are therefore
an imperfect sample of the true answer, the regime in which a teacher's estimate of the answer distribution (the
ECCV 2024 argument: a teacher approximates the Bayes probabilities) is worth more to a student than the
references. One teacher -- a 6-layer GPT-2-style model trained from scratch with CE on all training rows, every
epoch recorded -- then, for every seed s, five 4-layer students with the same initialisation, batch order and
budget (``train.seed=s``) on a fixed subset of the training rows (the transfer set):

- no KD: CE on the (noisy) references;
- forward KL: (1 - alpha) NLL + alpha KL(teacher || student) per answer token, alpha 0.9, T 1 (Hinton's mix; the
  teacher's per-token distributions cached once);
- reverse KL: the same with KL(student || teacher) (mode-seeking, MiniLLM's divergence);
- GKD (Agarwal et al. 2024): half the batches answered by the student's own samples (temperature 0.9), every
  batch scored by the teacher with the generalised JSD (beta 0.5); TRL's defaults, no label term;
- Pro-KD: the student follows the teacher's recorded trajectory (one student epoch per teacher epoch, T_i^2 KL at a
  temperature annealed from the number of teacher epochs down to 1), then CE on the references.

Selection: each run's best epoch by validation exact match (greedy answers); test exact match and perplexity are
only reported. What the spread and the intervals cover: student seeds only (initialisation and batch order); the
teacher, the generated corpus, its noise and the transfer set are fixed.
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
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, mean_std, paired_interval
from teachkit.models import count_parameters, make_model
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes

METHODS = ("no-kd", "forward-kl", "reverse-kl", "gkd", "prokd")
LABELS = {"no-kd": "no KD (CE on the references)", "forward-kl": "forward KL (alpha 0.9, T 1)",
          "reverse-kl": "reverse KL (alpha 0.9, T 1)", "gkd": "GKD (lambda 0.5, JSD beta 0.5)",
          "prokd": "Pro-KD (teacher trajectory, annealed T, then CE)"}
COLORS = {"no-kd": "#999999", "forward-kl": "#4c72b0", "reverse-kl": "#55a868", "gkd": "#dd8452",
          "prokd": "#8172b3"}
INTERVAL_COVERS = ("student seeds only (initialisation and batch order: train.seed=s); one teacher, one generated "
                   "corpus with its noise, one transfer set")


def gpt2(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return {"name": "hf_causal_lm", "options": {"family": "gpt2", "layers": layers, "hidden": hidden, "heads": heads,
                                                "intermediate": 4 * hidden}}


@dataclass(frozen=True)
class LMSetting:
    """Data, models and budgets of the causal-LM study (sized for 2 CPU cores)."""

    digits: int = 3
    train: int = 20000
    valid: int = 300
    test: int = 500
    #: the share of training answers with one wrong digit (validation and test are clean)
    noise: float = 0.2
    #: the students' transfer set: this many of the training rows (the teacher trains on all of them)
    subset: int = 5000
    teacher_epochs: int = 5
    student_epochs: int = 12
    seeds: int = 3
    batch_size: int = 64
    teacher_lr: float = 2e-3
    student_lr: float = 3e-3
    alpha: float = 0.9
    teacher: dict[str, Any] = field(default_factory=lambda: gpt2(6, 128, 4))
    student: dict[str, Any] = field(default_factory=lambda: gpt2(4, 64, 2))
    options: dict[str, Any] = field(default_factory=dict)

    def quick(self) -> LMSetting:
        return replace(self, train=600, valid=40, test=40, subset=200, teacher_epochs=2, student_epochs=2, seeds=2,
                       teacher=gpt2(2, 32, 2), student=gpt2(1, 32, 2))


def base_config(s: LMSetting, out_dir: Path) -> RunConfig:
    """The students' config: addition with noisy training answers (the students' transfer set a seeded subset),
    AdamW at a constant learning rate after a half-epoch warm-up, gradient clipping 1; the teacher: its own
    learning rate with a linear decay; GKD and Pro-KD settings."""
    optim = {"name": "adamw", "lr": s.student_lr, "weight_decay": 0.0, "schedule": "constant", "warmup_epochs": 0.5,
             "grad_clip": 1.0}
    teacher_optim = {**optim, "lr": s.teacher_lr, "schedule": "linear", "warmup_epochs": 0.1}
    return from_dict({
        "out_dir": str(out_dir),
        "data": {"name": "addition", "batch_size": s.batch_size, "eval_batch_size": 500, "train_subset": s.subset,
                 "subset_seed": 0, "options": {"digits": s.digits, "reverse": True, "pad": True, "noise": s.noise,
                                               "train": s.train, "valid": s.valid, "test": s.test, **s.options}},
        "model": s.student, "optim": optim,
        "train": {"epochs": s.student_epochs, "progress": False},
        "teacher": {"model": s.teacher, "optim": teacher_optim, "epochs": s.teacher_epochs},
        "kd": {"method": "kd", "alpha": s.alpha, "temperature": 1.0},
        "gkd": {"lmbda": 0.5, "beta": 0.5, "temperature": 0.9, "max_new_tokens": s.digits + 2},
        "prokd": {"mode": "replay", "tau_max": float(s.teacher_epochs), "student_epochs": 1, "loss": "kl"},
    })


def method_runs() -> dict[str, Any]:
    """How each method trains one student: ``run(config, run_dir) -> RunResult``."""
    reverse = {"kd": {"divergence": "reverse_kl"}}
    return {"no-kd": lambda c, d: train_model(c, run_dir=d),
            "forward-kl": lambda c, d: distill(c, run_dir=d),
            "reverse-kl": lambda c, d: distill(with_changes(c, kd={"options": reverse}), run_dir=d),
            "gkd": lambda c, d: RECIPES.get("gkd")(c, run_dir=d),
            "prokd": lambda c, d: RECIPES.get("prokd")(c, run_dir=d)}


def run_lm_study(s: LMSetting, out: str | Path, seeds: int | None = None, title: str = "causal-LM demo") -> dict:
    """Train the teacher once (every epoch recorded), then per seed the five students; print, write and plot."""
    n_seeds = s.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    out_dir = Path(out) / f"addition-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base_config(s, out_dir)
    t0 = time.perf_counter()
    full = load_data(cfg.data, device_of(cfg), subset=False)  # the teacher's data: every training row
    splits = load_data(cfg.data, device_of(cfg))
    print(f"teachkit {title} on addition ({s.digits}-digit, {s.noise:.0%} of training answers with a wrong digit; "
          f"vocabulary {splits.num_classes}): {describe(s.teacher)} teacher {s.teacher_epochs} epochs on "
          f"{len(full.train)} rows, {describe(s.student)} students {s.student_epochs} epochs on {len(splits.train)} "
          f"of them; valid {len(splits.val)}, test {len(splits.test)} (clean); {n_seeds} seeds x {len(METHODS)} "
          f"methods -> {out_dir}")
    print(f"intervals cover: {INTERVAL_COVERS}")
    bar = RunsProgress(1 + n_seeds * len(METHODS))
    teacher_dir = out_dir / "teacher"
    teacher = train_model(with_changes(cfg, name="teacher", model=cfg.teacher.model, optim=cfg.teacher.optim,
                                       train={"epochs": s.teacher_epochs, "save_every": 1}),
                          splits=full, run_dir=teacher_dir)
    bar.done("teacher", teacher.summary)
    runs, histories = paired_seed_runs(with_changes(cfg, teacher={"checkpoint": str(teacher_dir)}), method_runs(),
                                       n_seeds, out_dir, "exact", bar.done)
    bar.close()
    sizes = {"teacher_train": len(full.train), "train": len(splits.train), "val": len(splits.val),
             "test": len(splits.test), "vocabulary": splits.num_classes,
             "teacher_parameters": count_parameters(teacher.model),
             "student_parameters": count_parameters(make_model(cfg.model, splits.input_shape, splits.num_classes))}
    results = summarize(s, n_seeds, teacher.summary, runs, histories, time.perf_counter() - t0, sizes)
    return publish(results, render(results, title), out_dir, plot)


def describe(model: dict[str, Any]) -> str:
    o = model["options"]
    return f"{o['family']} {o['layers']}x{o['hidden']}"


def summarize(s: LMSetting, n_seeds: int, teacher: dict, runs: dict[str, list[dict]],
              histories: dict[str, list[list[float]]], wall: float, sizes: dict[str, int]) -> dict:
    """Per method: test exact match at the best-on-val epoch and last, perplexity, paired differences to no KD."""
    base = [r["test_exact_at_best"] for r in runs["no-kd"]]
    students = {}
    for method, rs in runs.items():
        at_best = [r["test_exact_at_best"] for r in rs]
        entry = {"test_exact_at_best_val": at_best, "test_exact_last": [r["test_exact"] for r in rs],
                 "test_ppl_last": [r["test_ppl"] for r in rs], "test_gen_acc_last": [r["test_gen_acc"] for r in rs],
                 "best_val_exact": [r["best_val_exact"] for r in rs], "val_exact_per_epoch": histories[method],
                 "wall_time_s": sum(r["wall_time_s"] for r in rs),
                 "teacher_forward_rows": sum(r.get("cost", {}).get("teacher_forward_images", 0) for r in rs)}
        if method != "no-kd":
            entry["diff_vs_no_kd"] = paired_interval(at_best, base)
        if method == "gkd":
            entry["on_policy_batches"] = [r.get("gkd", {}).get("on_policy_batches") for r in rs]
        students[method] = entry
    return {"setting": {**{k: v for k, v in s.__dict__.items() if k != "options"}, "seeds": n_seeds},
            "sizes": sizes, "interval_covers": INTERVAL_COVERS, "wall_time_s": wall,
            "teacher": {"val_exact": teacher["val_exact"], "test_exact": teacher["test_exact"],
                        "test_ppl": teacher["test_ppl"], "wall_time_s": teacher["wall_time_s"]},
            "students": students}


def render(r: dict, title: str = "causal-LM demo") -> str:
    s, n, t = r["setting"], r["sizes"], r["teacher"]
    lines = [f"## teachkit {title}: addition, {s['seeds']} paired seeds (teacher trained on {n['teacher_train']} "
             f"rows, students on {n['train']} of them; {s['noise']:.0%} of training answers with a wrong digit; "
             f"valid {n['val']}, test {n['test']} clean)", "",
             f"Teacher ({describe(s['teacher'])}, {n['teacher_parameters']:,} parameters, {s['teacher_epochs']} "
             f"epochs): val exact {t['val_exact']:.2f}%, test exact {t['test_exact']:.2f}%, test perplexity "
             f"{t['test_ppl']:.3f}, {t['wall_time_s']:.0f} s. Greedy answers for every exact match.", "",
             f"| student ({describe(s['student'])}, {n['student_parameters']:,} parameters, {s['student_epochs']} "
             "epochs) | test exact at best val epoch | "
             "test exact last epoch | test perplexity last epoch | vs no KD [95% CI] | wall s |",
             "|---|---|---|---|---|---|"]
    for method, e in r["students"].items():
        lines.append(f"| {LABELS[method]} | {fmt_mean_std(e['test_exact_at_best_val'])} | "
                     f"{fmt_mean_std(e['test_exact_last'])} | {fmt_ppl(e['test_ppl_last'])} | "
                     f"{fmt_interval(e.get('diff_vs_no_kd'))} | {e['wall_time_s']:.0f} |")
    lines += ["", "mean +- std over seeds (sample std); intervals are paired 95% t intervals over seeds; they cover "
              f"{r['interval_covers']}. Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def fmt_ppl(values: list[float]) -> str:
    m, sd = mean_std(values)
    return f"{m:.3f} +- {sd:.3f}"


def plot(r: dict, path: Path) -> Path | None:
    """Validation exact match per epoch per method (mean over seeds, band = min..max); None without matplotlib."""
    return plot_epoch_bands({m: e["val_exact_per_epoch"] for m, e in r["students"].items()}, LABELS, COLORS, path,
                            ylabel="val exact match % (greedy)", reference=r["teacher"]["val_exact"],
                            title=f"addition: {describe(r['setting']['student'])} students, "
                                  f"{r['setting']['seeds']} seeds")
