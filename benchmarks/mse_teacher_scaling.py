"""MSE-teacher scaling study: does an MSE-trained teacher beat a CE-trained one as the transfer set grows?

"How to train the teacher" (ECCV 2024) at 50,000 images, on the offline ``mnist_full`` (50,000 train / 10,000
valid used as val / 10,000 test). Per seed s (default 5): a CE and an MSE teacher (LeNet 6/16/84) trained once
on all 50,000 training images (teacher seed s); MLP-100 students distilled on transfer sets of 1,000, 5,000 and
50,000 images (a stratified subset drawn with data.subset_seed=s; 50,000 is the whole split) with train.seed=s:
no KD, and from each teacher Hinton KD (kd), Decoupled KD (dkd) and relational KD on the penultimate embeddings
(rkd). Paired within a seed, so the MSE - CE intervals cover teacher, subset and student-init variation.
Protocol: :mod:`teachkit.experiments.scaling_study`.

It prints the plan first (every run, the data sizes, the predicted wall time from per-epoch times measured with
one thread, the command), then one line per finished run, then the tables, the headline and the verdict per
method. Full runs write benchmarks/results/mse_teacher_scaling.{md,json,png}; --quick (2 seeds, 1 epoch,
transfer sets 200/500/1000) writes only its run folder.

    OMP_NUM_THREADS=1 python benchmarks/mse_teacher_scaling.py [--seeds 5] [--threads 1] [--sizes 1000,5000,50000]
        [--out runs/mse_teacher_scaling] [--data mnist_full|mnist5k|digits] [--quick] [--plan]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
from pathlib import Path

import torch

from teachkit.experiments.scaling_study import ScalingSetting, plan, render_plan, run_scaling_study

SMALL_LENET = {"name": "lenet", "options": {"channels": [6, 16], "fc": 84}}
MLP_100 = {"name": "mlp", "options": {"hidden": [100]}}
#: student epochs per transfer-set size: 480, 632 and 1,564 SGD steps of batch 64 (the whole study: ~20 min on one
#: idle core, most of it RKD on 50,000 images)
STUDENT_EPOCHS = {1000: 30, 5000: 8, 50000: 2}
TEACHER_EPOCHS = 3
SIZES = (1000, 5000, 50000)
QUICK_SIZES = (200, 500, 1000)
DATASETS = ("mnist_full", "mnist5k", "digits")  # the small two: smoke tests only
RESULTS = Path(__file__).resolve().parent / "results"


def setting(args: argparse.Namespace) -> ScalingSetting:
    sizes = tuple(int(n) for n in args.sizes.split(",")) if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    s = ScalingSetting(args.data, teacher=SMALL_LENET, student=MLP_100, teacher_epochs=TEACHER_EPOCHS, sizes=sizes,
                       student_epochs=STUDENT_EPOCHS, seeds=5)
    if args.quick:
        s = dataclasses.replace(s, teacher_epochs=1, student_epochs={n: 1 for n in sizes}, seeds=2)
    return s


def command_line(args: argparse.Namespace) -> str:
    """The exact command, every option spelled out (so a log says how to rerun it)."""
    argv = ["--seeds", str(args.seeds), "--threads", str(args.threads), "--sizes", args.sizes_resolved,
            "--data", args.data, "--out", args.out] + (["--quick"] if args.quick else [])
    env = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}"
    return shlex.join([env, "python", "benchmarks/mse_teacher_scaling.py", *argv])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="paired seeds (default 5; --quick: 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--out", default="runs/mse_teacher_scaling", help="where the run folders go")
    ap.add_argument("--sizes", default=None, help="comma-separated transfer-set sizes (default 1000,5000,50000; "
                                                  "a size >= the training split is the whole split)")
    ap.add_argument("--data", choices=DATASETS, default="mnist_full", help="mnist5k / digits: for smoke tests")
    ap.add_argument("--quick", action="store_true", help="tiny: 2 seeds, 1 epoch each, transfer sets 200/500/1000; "
                                                         "writes nothing into benchmarks/results")
    ap.add_argument("--plan", action="store_true", help="print the plan and exit")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error(f"--threads={args.threads} is not allowed: must be >= 1")
    if args.sizes is not None and not all(n.strip().isdigit() and int(n) >= 1 for n in args.sizes.split(",")):
        ap.error(f"--sizes={args.sizes} is not allowed: comma-separated transfer-set sizes >= 1, e.g. 1000,5000,50000")
    torch.set_num_threads(args.threads)
    s = setting(args)
    args.seeds = s.seeds if args.seeds is None else args.seeds
    if args.seeds < 1:
        ap.error(f"--seeds={args.seeds} is not allowed: must be >= 1")
    args.sizes_resolved = ",".join(str(n) for n in s.sizes)
    command = command_line(args)
    if args.plan:
        from teachkit.config import from_dict
        from teachkit.recipes.common import load_data

        splits = load_data(from_dict({"data": {"name": args.data}}).data, "cpu")
        sizes = {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)}
        print(render_plan(s, plan(s, args.seeds, sizes["train"]), sizes, command, args.threads,
                          Path(args.out) / f"{args.data}-<time>"))
        return
    results = run_scaling_study(s, args.out, seeds=args.seeds, threads=args.threads, command=command)
    if args.quick:
        return
    out_dir = Path(results["out_dir"])
    stem = "mse_teacher_scaling" if args.data == "mnist_full" else f"mse_teacher_scaling_{args.data}"
    RESULTS.mkdir(exist_ok=True)
    written = []
    for ext in ("md", "json", "png"):
        if (out_dir / f"results.{ext}").is_file():
            shutil.copy(out_dir / f"results.{ext}", RESULTS / f"{stem}.{ext}")
            written.append(str(RESULTS / f"{stem}.{ext}"))
    print("kept: " + ", ".join(written))


if __name__ == "__main__":
    sys.exit(main())
