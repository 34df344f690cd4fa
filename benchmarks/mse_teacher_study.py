"""Small-scale "How to train the teacher" study: CE vs MSE teacher under every distillation method.

On an offline dataset (default mnist5k: LeNet teachers on 3,600 images, LeNet-5-sized students on a
stratified 500-image subset), >= 3 paired seeds, every method of the ECCV 2024 paper plus FitNet. Every
seed trains its own CE and MSE teachers and draws its own student subset (``data.subset_seed``), with
val/test fixed by ``data.split_seed``, so the intervals cover teacher, subset and student-init variation.
Prints a mean +- std table and writes it (Markdown + JSON + plot) under --out. Sized for <= 20
minutes on 2 CPU cores; report the numbers whatever they show.

    python benchmarks/mse_teacher_study.py [--data mnist5k|digits] [--seeds 3] [--methods kd,at,...]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from teachkit.experiments.teacher_study import StudySetting, run_study

METHODS = ["kd", "fitnet", "at", "pkt", "sp", "cc", "rkd", "vid", "crd", "dkd", "reviewkd", "hsakd"]
SMALL_LENET = {"name": "lenet", "options": {"channels": [6, 16], "fc": 84}}
SETTINGS = {
    "mnist5k": StudySetting("mnist5k", teacher={"name": "lenet"}, student=SMALL_LENET,
                            teacher_epochs=15, student_epochs=20, train_subset=500, seeds=3, student_lr=0.01,
                            method_options={"hsakd": {"teacher_head_epochs": 3}}),
    "digits": StudySetting("digits", teacher={"name": "lenet"}, student=SMALL_LENET,
                           teacher_epochs=20, student_epochs=30, train_subset=300, seeds=3, student_lr=0.01),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=sorted(SETTINGS), default="mnist5k")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated distillation losses")
    ap.add_argument("--out", default="runs/mse_teacher_study")
    ap.add_argument("--quick", action="store_true", help="2 epochs, for a smoke test")
    args = ap.parse_args()
    setting = SETTINGS[args.data].quick() if args.quick else SETTINGS[args.data]
    results = run_study(setting, args.methods.split(","), args.out, seeds=args.seeds, title="MSE-teacher study")
    keep = Path(__file__).parent / "results"
    keep.mkdir(exist_ok=True)
    if not args.quick:
        shutil.copy(Path(results["out_dir"]) / "results.md", keep / f"mse_teacher_study_{args.data}.md")


if __name__ == "__main__":
    main()
