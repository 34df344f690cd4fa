"""No KD vs Hinton KD vs Pro-KD on text, >= 5 paired seeds: does Pro-KD's ordering (Pro-KD > KD > no KD) show?

The protocol of ``teachkit demo --task text`` (:mod:`teachkit.experiments.text_study`): one MiniLM-L6 teacher
fine-tuned on a tweet subset with its trajectory recorded, then per seed a 2-layer MiniLM student per method
with shared initialisation and batch order; selection on a validation split carved from training data. The
intervals cover student seeds only (one teacher, one subset). Prints the table and an explicit verdict.

    python benchmarks/text_study.py [--seeds 5] [--tweets 1600] [--teacher-epochs 2] [--student-epochs 3]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from teachkit.experiments.text_study import TextSetting, run_text_study


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tweets", type=int, default=1600)
    ap.add_argument("--teacher-epochs", type=int, default=2)
    ap.add_argument("--student-epochs", type=int, default=3)
    ap.add_argument("--out", default="runs/text_study")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    setting = replace(TextSetting(), tweets=args.tweets, teacher_epochs=args.teacher_epochs,
                      student_epochs=args.student_epochs, seeds=args.seeds)
    if args.quick:
        setting = setting.quick()
    results = run_text_study(setting, args.out, seeds=args.seeds, title="text study")
    print("verdict (paired 95% intervals over student seeds): " + verdict(results))


if __name__ == "__main__":
    main()
