"""Do the speed levers change results? The KD step as before them against the step with them, paired seeds.

The levers (issue "Closer to the machine's limit"): the frozen teacher as an inference model
(``teacher.inference=fold``: BatchNorm folded into its convolutions, weights in the compute dtype,
``torch.inference_mode``) and the optimiser's multi-tensor kernels (``optim.implementation=foreach``, bit-identical
to the per-parameter loop, so only folding can move a result). Arms:

    before   teacher.inference=plain, optim.implementation=loop
    levers   teacher.inference=fold,  optim.implementation=foreach

Workload as ``benchmarks/precision_study.py``: the 5,000 offline MNIST images made CIFAR-shaped (32x32, 3
channels) with the CIFAR crop + flip; one ResNet-20 teacher (seed 0, shared by both arms: folding changes how the
teacher runs, not how it was trained), ResNet-8 students (0.1 CE + 0.9 Hinton KD, T=4) with ``train.seed=s`` for s in
0..seeds-1, so seed s of both arms shares initialisation, batch order and augmentation; ``teacher.cache=off`` so
every batch runs the teacher (and its time counts). Reports test accuracy (last epoch) per arm, the paired
difference (levers - before) with a 95% t interval over student seeds (one teacher: the interval covers student
seeds only), the largest gap between the two arms' teacher logits, and the time per student epoch.

    python benchmarks/levers_study.py [--seeds 5] [--teacher-epochs 8] [--student-epochs 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from precision_study import DATA, cifar_shaped  # a sibling script (benchmarks/ is on sys.path)

from teachkit.config import from_dict
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import load_data

ARMS = {"before": {"teacher": {"inference": "plain"}, "optim": {"implementation": "loop"}},
        "levers": {"teacher": {"inference": "fold"}, "optim": {"implementation": "foreach"}}}
OPTIM = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "schedule": "cosine"}


def config(out: Path, name: str, epochs: int, seed: int, model: str, **sections: dict) -> dict:
    """A run's config: the study's data, ``model``, SGD + cosine, ``epochs``, ``seed``; ``sections`` merged in."""
    cfg = {"name": name, "out_dir": str(out), "data": DATA, "model": {"name": model}, "optim": dict(OPTIM),
           "train": {"epochs": epochs, "seed": seed, "progress": False}}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def student(out: Path, arm: str, teacher_dir: Path, seed: int, epochs: int, splits) -> dict:
    """One student of ``arm``: test accuracy, median epoch time (first epoch excluded), the teacher's mode."""
    changes = ARMS[arm]
    cfg = config(out / arm, f"student-seed{seed}", epochs, seed, "resnet8",
                 teacher={"checkpoint": str(teacher_dir), "cache": "off", **changes["teacher"]},
                 optim=changes["optim"], kd={"method": "kd", "alpha": 0.9, "temperature": 4.0})
    result = distill(from_dict(cfg), splits=splits)
    times = [r["epoch_time_s"] for r in result.history]
    return {"seed": seed, "test_acc": result.summary["test_acc"], "epoch_s": statistics.median(times[1:] or times),
            "teacher_inference": (result.summary.get("teacher") or {}).get("inference")}


def table(results: dict, args: argparse.Namespace, teacher_acc: float, wall: float) -> str:
    before = [s["test_acc"] for s in results["before"]]
    levers = [s["test_acc"] for s in results["levers"]]
    diff = paired_interval(levers, before)
    t_before = statistics.median(s["epoch_s"] for s in results["before"])
    t_levers = statistics.median(s["epoch_s"] for s in results["levers"])
    lines = ["# The speed levers against the step before them (paired seeds)", "",
             f"CIFAR-shaped mnist5k (3x32x32, crop+flip), one ResNet-20 teacher ({args.teacher_epochs} epochs, seed 0, "
             f"test {teacher_acc:.2f}%) -> ResNet-8 students (0.1 CE + 0.9 KD, T=4, {args.student_epochs} epochs, "
             f"teacher on every batch), {args.seeds} paired student seeds; test accuracy at the last epoch; the "
             "interval covers student seeds only (one teacher). Machine: "
             f"{torch.get_num_threads()} threads, torch {torch.__version__}.", "",
             "| arm | settings | student test (mean +- std) | per seed | s / student epoch |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        accs = [s["test_acc"] for s in rows]
        settings = ", ".join(f"{sec}.{k}={v}" for sec, kv in ARMS[name].items() for k, v in kv.items())
        lines.append(f"| {name} | {settings} | {fmt_mean_std(accs)} | {', '.join(f'{a:.2f}' for a in accs)} | "
                     f"{statistics.median(s['epoch_s'] for s in rows):.2f} |")
    lines += ["", f"Paired difference levers - before: {fmt_interval(diff)} points (95% t interval over {args.seeds} "
                  f"seeds); student epoch time before / levers: {t_before / t_levers:.2f}x.",
              f"Teacher as run by the levers arm: {results['levers'][0]['teacher_inference']}.",
              f"Wall time {wall:.0f} s."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--teacher-epochs", type=int, default=8)
    ap.add_argument("--student-epochs", type=int, default=10)
    ap.add_argument("--out", default="runs/levers_study")
    ap.add_argument("--limit", type=int, default=None, help="keep only this many training images (smoke tests)")
    args = ap.parse_args()
    out, t0 = Path(args.out), time.perf_counter()
    splits = cifar_shaped(load_data(from_dict(config(out, "probe", 1, 0, "resnet8")).data, "cpu"))
    if args.limit:
        splits = dataclasses.replace(splits, train=splits.train.subset(torch.arange(args.limit)))
    teacher = train_model(from_dict(config(out, "teacher", args.teacher_epochs, 0, "resnet20")), splits=splits)
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):  # arms interleaved per seed: machine noise hits both alike
        for arm in ARMS:
            results[arm].append(student(out, arm, teacher.run_dir, seed, args.student_epochs, splits))
            row = results[arm][-1]
            print(f"{arm} seed {seed}: test {row['test_acc']:.2f}% ({row['epoch_s']:.2f} s/epoch)", flush=True)
    text = table(results, args, teacher.summary["test_acc"], time.perf_counter() - t0)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    if not args.limit:
        keep = Path(__file__).parent / "results"
        keep.mkdir(exist_ok=True)
        (keep / "levers_study.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
