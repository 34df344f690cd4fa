"""The Pro-KD claim on text at the largest tweet subset this machine fits: no KD vs KD vs Pro-KD, >= 5 paired seeds.

The protocol of :mod:`teachkit.experiments.text_study` (the text demo): one MiniLM-L6 teacher fine-tuned with its
trajectory recorded (one checkpoint per epoch), then per seed three 2-layer students initialised from the
pretrained MiniLM (embeddings and layers 0 and 3) with a new head: no KD, Hinton KD (alpha 0.5, T 2) from the
final teacher, and Pro-KD replaying the trajectory (tau_max = teacher epochs: one epoch per teacher checkpoint at
a falling temperature, then one CE epoch). Budget rule of the paper: every student gets Pro-KD's epochs
(teacher epochs + 1). Selection on a validation split carved from the training data; test at the best-val epoch.

Planning for the machine: the script first *measures* teacher and student training examples/s on 1,000 tweets,
prints what the whole 37,243-tweet corpus would cost, and picks the largest subset (multiple of 1,000) whose
predicted time fits ``--budget-min`` (default 40), unless ``--tweets`` is given. Writes
``benchmarks/results/prokd_tweets.{md,json,png}``. The intervals cover student seeds only (one teacher, one subset).

    python benchmarks/prokd_tweets.py [--budget-min 40] [--tweets N] [--seeds 5] [--teacher-epochs 3] [--plan]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from teachkit.experiments.text_study import METHODS, TextSetting, base_config, run_text_study, verdict
from teachkit.recipes import train_model
from teachkit.recipes.common import device_of, load_data, with_changes

RESULTS = Path(__file__).parent / "results"
CORPUS = 37_243
#: fractions of the tweets that train (the rest: 20% test, then 10% of the remainder as val)
TRAIN_FRACTION = 0.8 * 0.9
PROBE_TWEETS = 1_000


def measure(setting: TextSetting, work: Path, tweets: int = PROBE_TWEETS) -> dict[str, float]:
    """Seconds per training example for the teacher (6 layers) and a student (2 layers), from one epoch each on
    ``tweets`` tweets (their training split)."""
    probe = replace(setting, tweets=tweets, teacher_epochs=1, student_epochs=1)
    cfg = base_config(probe, work)
    splits = load_data(cfg.data, device_of(cfg))
    out = {}
    for who, model in (("teacher", cfg.teacher.model), ("student", cfg.model)):
        run = with_changes(cfg, name=f"probe-{who}", model=model, train={"epochs": 1})
        t0 = time.perf_counter()
        result = train_model(run, splits=splits, run_dir=work / who)
        out[f"{who}_s_per_example"] = 1.0 / result.summary["images_per_s"]  # training steps only
        out[f"{who}_total_s"] = time.perf_counter() - t0
    return out


def predicted_s(tweets: int, speed: dict[str, float], setting: TextSetting, seeds: int) -> float:
    """Teacher epochs + seeds x methods x student epochs over ``tweets * TRAIN_FRACTION`` examples, plus 30%
    for evaluation, caching and checkpoints (measured overhead of the demo)."""
    n = tweets * TRAIN_FRACTION
    teacher = setting.teacher_epochs * n * speed["teacher_s_per_example"]
    students = seeds * len(METHODS) * setting.student_epochs * n * speed["student_s_per_example"]
    return 1.3 * (teacher + students)


def choose(args: argparse.Namespace, setting: TextSetting, speed: dict[str, float]) -> int:
    if args.tweets:
        return args.tweets
    fits = [k * 1000 for k in range(1, CORPUS // 1000 + 1)
            if predicted_s(k * 1000, speed, setting, args.seeds) <= args.budget_min * 60]
    return max(fits, default=1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tweets", type=int, help="subset size (default: the largest that fits --budget-min)")
    ap.add_argument("--budget-min", type=float, default=40.0)
    ap.add_argument("--teacher-epochs", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/prokd_tweets")
    ap.add_argument("--plan", action="store_true", help="measure, print the plan and exit")
    ap.add_argument("--probe-tweets", type=int, default=PROBE_TWEETS, help="tweets of the throughput probe")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    setting = replace(TextSetting(), teacher_epochs=args.teacher_epochs, student_epochs=args.teacher_epochs + 1,
                      seeds=args.seeds, max_length=args.max_length)
    work = Path(tempfile.mkdtemp(prefix="prokd_tweets_probe_"))
    try:
        speed = measure(setting, work, args.probe_tweets)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tweets = choose(args, setting, speed)
    whole = predicted_s(CORPUS, speed, setting, args.seeds)
    plan = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "threads": args.threads,
            "teacher_examples_per_s": 1 / speed["teacher_s_per_example"],
            "student_examples_per_s": 1 / speed["student_s_per_example"],
            "whole_corpus_predicted_min": whole / 60, "tweets": tweets,
            "predicted_min": predicted_s(tweets, speed, setting, args.seeds) / 60,
            "teacher_epochs": setting.teacher_epochs, "student_epochs": setting.student_epochs,
            "seeds": args.seeds, "max_length": setting.max_length}
    print(f"command: {plan['command']}\nmeasured on {args.probe_tweets:,} tweets, {args.threads} thread(s): teacher "
          f"(MiniLM-L6) {plan['teacher_examples_per_s']:.1f} training examples/s, 2-layer student "
          f"{plan['student_examples_per_s']:.1f} examples/s\nthe whole corpus ({CORPUS:,} tweets, "
          f"{int(CORPUS * TRAIN_FRACTION):,} training): {whole / 3600:.1f} h for a {setting.teacher_epochs}-epoch "
          f"teacher and {args.seeds} seeds x {len(METHODS)} students x {setting.student_epochs} epochs\n"
          f"chosen: {tweets:,} tweets ({int(tweets * TRAIN_FRACTION):,} training), predicted "
          f"{plan['predicted_min']:.0f} min (budget {args.budget_min:.0f} min)", flush=True)
    if args.plan:
        return
    results = run_text_study(replace(setting, tweets=tweets), args.out, seeds=args.seeds, title="Pro-KD tweet study")
    results["plan"] = plan
    results["verdict"] = verdict(results)
    print("verdict (paired 95% intervals over student seeds): " + results["verdict"])
    RESULTS.mkdir(exist_ok=True)
    out_dir = Path(results["out_dir"])
    with open(out_dir / "results.md", "a") as f:
        f.write(f"\nPlan: measured {plan['teacher_examples_per_s']:.1f} teacher / {plan['student_examples_per_s']:.1f} "
                f"student training examples/s ({plan['threads']} threads); the whole corpus would take "
                f"{plan['whole_corpus_predicted_min'] / 60:.1f} h, so {plan['tweets']:,} tweets were chosen "
                f"(predicted {plan['predicted_min']:.0f} min). Command: `{plan['command']}`.\n\n"
                f"Verdict (paired 95% intervals over student seeds): {results['verdict']}\n")
    for suffix in ("md", "json", "png"):
        src = out_dir / f"results.{suffix}"
        if src.is_file():
            shutil.copy(src, RESULTS / f"prokd_tweets.{suffix}")
    (RESULTS / "prokd_tweets.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"results: {RESULTS / 'prokd_tweets.md'}")


if __name__ == "__main__":
    main()
