"""DOT (the Distillation-Oriented Trainer, Zhao et al., ICCV 2023) against momentum SGD on the zoo study's setting.

Protocol (``benchmarks/zoo_study.py``'s, whose setup this script imports): for every seed s, a ResNet-20 CE
teacher trains on the full training split of ``digits`` (teacher seed s); per KD method, two ResNet-8 students
learn from the same stratified subset (``data.subset_seed=s``) with the same init, batch order and augmentation
(``train.seed=s``): one with ``optim.name=sgd`` (momentum 0.9), one with ``optim.name=dot`` (task momentum
0.9 - 0.075, distillation momentum 0.9 + 0.075); same lr (0.05), weight decay, cosine schedule and epochs.
Only the last epoch's test accuracy is compared (no selection on test). Rows: mean +- sample std over seeds of
each arm, the paired difference DOT - SGD with a 95% t interval over seeds (it covers teacher, subset and
student-init variation, not the variation of a fixed setting's run-to-run noise alone), the paired difference of
the last epoch's training distillation loss (the weighted non-label terms; DOT's claim is that it optimises
this loss further), and DOT's training time per epoch relative to SGD's (its extra backward of the
distillation terms).

    python benchmarks/dot_study.py [--seeds 5] [--methods kd,dkd,fitnet] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from zoo_study import ARMS, base, epoch_seconds, kd_section

from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import load_data, with_changes

#: the optimisers compared: name -> optim fields over the zoo study's SGD section
OPTIMISERS: dict[str, dict[str, Any]] = {"sgd": {"name": "sgd"}, "dot": {"name": "dot", "dot_delta": 0.075}}
#: the label terms of the KD objective (the rest of a step's terms is the distillation loss)
LABEL_TERMS = ("ce", "l2")


def distillation_loss(record: dict[str, Any]) -> float:
    """The weighted distillation terms of an epoch record's training means (every term but the loss and labels)."""
    return sum(v for k, v in record["train"].items() if k != "loss" and k not in LABEL_TERMS)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="digits")
    ap.add_argument("--teacher", default="resnet20")
    ap.add_argument("--student", default="resnet8")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--teacher-epochs", type=int, default=30)
    ap.add_argument("--subset", type=int, default=300)
    ap.add_argument("--methods", default="kd,dkd,fitnet", help="comma-separated zoo arms (see zoo_study.ARMS)")
    ap.add_argument("--out", default="runs/dot_study")
    ap.add_argument("--quick", action="store_true", help="2 epochs, 2 seeds: a smoke test")
    a = ap.parse_args()
    if a.quick:
        a.epochs, a.teacher_epochs, a.seeds = 2, 2, min(a.seeds, 2)
    a.methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = [m for m in a.methods if m not in ARMS or ARMS[m].get("stage")]
    if unknown or a.seeds < 2 or not a.methods:
        raise SystemExit(f"dot_study: unknown method {unknown[0]!r} (allowed: zoo arms without a pre-training "
                         f"stage)" if unknown else f"dot_study: --seeds={a.seeds} must be >= 2 (paired intervals) "
                         "and --methods non-empty")
    return a


def main() -> None:
    a = parse()
    out_dir = Path(a.out) / f"{a.data}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base(out_dir, a)
    t0 = time.perf_counter()
    teacher_splits = load_data(cfg.data, "cpu", subset=False)
    print(f"teachkit DOT study on {a.data}: per seed, a CE {a.teacher} teacher on {len(teacher_splits.train)} "
          f"examples ({a.teacher_epochs} epochs) and {a.student} students on a stratified subset of {a.subset} "
          f"({a.epochs} epochs) with SGD and with DOT; {a.seeds} seeds; methods: {', '.join(a.methods)}", flush=True)
    runs: dict[str, dict[str, list[dict]]] = {m: {o: [] for o in OPTIMISERS} for m in a.methods}
    teachers: list[float] = []
    for seed in range(a.seeds):
        t_cfg = with_changes(cfg, name=f"seed{seed}-teacher", model=cfg.teacher.model, optim=cfg.teacher.optim,
                             train={"epochs": a.teacher_epochs, "seed": seed},
                             data={"train_subset": None, "subset_seed": None})
        teacher_dir = out_dir / f"seed{seed}" / "teacher"
        teachers.append(train_model(t_cfg, splits=teacher_splits, run_dir=teacher_dir).summary["test_acc"])
        student = with_changes(cfg, train={"seed": seed}, data={"subset_seed": seed},
                               teacher={"checkpoint": str(teacher_dir)})
        splits = load_data(student.data, "cpu")
        for method in a.methods:
            for opt, fields in OPTIMISERS.items():
                run = with_changes(student, name=f"seed{seed}-{method}-{opt}", optim=fields,
                                   kd=kd_section(ARMS[method], 0))
                result = distill(run, splits=splits, run_dir=out_dir / f"seed{seed}" / f"{method}-{opt}")
                runs[method][opt].append({"test_acc": result.summary["test_acc"],
                                          "kd_loss": distillation_loss(result.history[-1]),
                                          "epoch_s": epoch_seconds(result.summary, len(splits.train))})
                print(f"  seed {seed} {method:8s} {opt}  test {result.summary['test_acc']:.2f}  "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = render(a, runs, teachers, time.perf_counter() - t0)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.md").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps({"teachers_test_acc": teachers, "runs": runs}, indent=2) + "\n")
    if not a.quick:
        keep = Path(__file__).parent / "results"
        keep.mkdir(exist_ok=True)
        shutil.copy(out_dir / "results.md", keep / f"dot_study_{a.data}.md")
        shutil.copy(out_dir / "results.json", keep / f"dot_study_{a.data}.json")


def render(a: argparse.Namespace, runs: dict[str, dict[str, list[dict]]], teachers: list[float], wall: float) -> str:
    lines = [f"## teachkit DOT study: {a.data}, {a.teacher} -> {a.student}, {a.seeds} seeds, {a.epochs} epochs", "",
             f"Teachers (CE): test {fmt_mean_std(teachers)}.", "",
             "| method | SGD test acc % | DOT test acc % | DOT - SGD [95% CI] | train distillation loss SGD -> DOT "
             "| DOT - SGD loss [95% CI] | time/epoch DOT vs SGD |", "|---|---|---|---|---|---|---|"]
    for method, arms in runs.items():
        acc = {o: [r["test_acc"] for r in rs] for o, rs in arms.items()}
        loss = {o: [r["kd_loss"] for r in rs] for o, rs in arms.items()}
        ratio = sum(r["epoch_s"] for r in arms["dot"]) / sum(r["epoch_s"] for r in arms["sgd"])
        mean_loss = {o: sum(v) / len(v) for o, v in loss.items()}
        lines.append(f"| {method} | {fmt_mean_std(acc['sgd'])} | {fmt_mean_std(acc['dot'])} "
                     f"| {fmt_interval(paired_interval(acc['dot'], acc['sgd']))} "
                     f"| {mean_loss['sgd']:.4f} -> {mean_loss['dot']:.4f} "
                     f"| {fmt_interval4(paired_interval(loss['dot'], loss['sgd']))} | {ratio:.2f}x |")
    lines += ["", "mean +- sample std over seeds; intervals: paired 95% t intervals of DOT - SGD over seeds, covering "
              "per seed a new teacher (init, batch order), a new student subset (data.subset_seed) and student init / "
              "batch order (train.seed), which both arms of a seed share; val/test fixed (data.split_seed=0). Test "
              "accuracy of the last epoch. Distillation loss: the mean over the last epoch's training steps of the "
              "weighted non-label terms. time/epoch: training steps only (student samples / images per s), measured "
              f"in this one run on this machine. DOT: delta 0.075, lr 0.05 as SGD. Total wall time {wall:.0f} s."]
    return "\n".join(lines)


def fmt_interval4(triple: tuple[float, float, float]) -> str:
    """``+d [lo, hi]`` with four decimals (losses)."""
    m, lo, hi = triple
    return f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]"


if __name__ == "__main__":
    main()
