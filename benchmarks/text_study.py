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

from teachkit.experiments.text_study import TextSetting, run_text_study, verdict


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
