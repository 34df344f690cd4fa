"""Do the fast defaults change results? fp32 against ``train.precision=auto`` + ``channels_last=auto`` on a
CIFAR-shaped KD workload, paired seeds.

Data: the 5,000 offline MNIST images (``mnist5k``) made CIFAR-shaped: padded to 32x32 and repeated to 3
channels, with the CIFAR augmentation (4-pixel crop + flip, reflect-padded: ``data.augment_options.pad_mode=reflect``
as when the figures in docs/performance.md were measured); val and test are fixed slices
(``data.split_seed=0``). Per arm (``fp32``: ``train.precision=fp32 channels_last=false``; ``defaults``: the
package defaults, which resolve to bf16 + channels_last on CPUs with AVX512-BF16/AMX and GPUs with bf16): one
ResNet-20 teacher (seed 0) trained in that arm's precision, then ResNet-8 students distilled from it (0.1 CE
+ 0.9 Hinton KD, T=4) with ``train.seed=s`` for s in 0..seeds-1, so seed s of both arms shares
initialisation, batch order and augmentation. Reports each arm's test accuracy mean +- std, the paired
difference (defaults - fp32) with a 95% t interval, and the time per student epoch, the teacher's forward on every
batch included (``teacher.cache=off``: no view cache computed or read). The intervals cover student seeds only:
each arm has one teacher.

    python benchmarks/precision_study.py [--seeds 5] [--teacher-epochs 8] [--student-epochs 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from teachkit.config import from_dict
from teachkit.data import Splits
from teachkit.data.base import TensorSplit
from teachkit.engine.precision import resolve_precision
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import load_data

ARMS = {"fp32": {"precision": "fp32", "channels_last": False}, "defaults": {}}


def cifar_shaped(splits: Splits) -> Splits:
    """``splits`` (1x28x28 images) padded to 32x32 and repeated to 3 channels; statistics repeated too."""
    def shape(part: TensorSplit) -> TensorSplit:
        return TensorSplit(F.pad(part.x, (2, 2, 2, 2), mode="replicate").repeat(1, 3, 1, 1).contiguous(), part.y)

    def rep(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.repeat(3)

    return dataclasses.replace(splits, train=shape(splits.train), val=shape(splits.val), test=shape(splits.test),
                               mean=rep(splits.mean), std=rep(splits.std), default_augment="crop_flip",
                               name="mnist5k-32x32x3")


#: the data section of every run: CIFAR crop + flip, reflect-padded (as the documented figures were measured)
DATA = {"name": "mnist5k", "batch_size": 64, "augment": "crop_flip", "augment_options": {"pad_mode": "reflect"},
        "split_seed": 0}


def base_config(out: Path, name: str, arm: dict, epochs: int, seed: int, **sections) -> dict:
    cfg = {"name": name, "out_dir": str(out), "data": DATA,
           "model": {"name": "resnet8"},
           "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "schedule": "cosine"},
           "train": {"epochs": epochs, "seed": seed, "progress": False, **arm}}
    cfg.update(sections)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--teacher-epochs", type=int, default=8)
    ap.add_argument("--student-epochs", type=int, default=10)
    ap.add_argument("--out", default="runs/precision_study")
    ap.add_argument("--limit", type=int, default=None, help="keep only this many training images (smoke tests)")
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.perf_counter()
    raw = load_data(from_dict(base_config(out, "probe", {}, 1, 0)).data, "cpu")
    splits = cifar_shaped(raw)
    if args.limit:
        splits = dataclasses.replace(splits, train=splits.train.subset(torch.arange(args.limit)))
    resolved = resolve_precision("auto", torch.device("cpu"))
    results: dict[str, dict] = {}
    for arm_name, arm in ARMS.items():
        teacher = train_model(from_dict(base_config(out / arm_name, "teacher", arm, args.teacher_epochs, 0,
                                                    model={"name": "resnet20"})), splits=splits)
        students = []
        for seed in range(args.seeds):
            cfg = base_config(out / arm_name, f"student-seed{seed}", arm, args.student_epochs, seed,
                              teacher={"checkpoint": str(teacher.run_dir), "cache": "off"},  # time the teacher
                              kd={"method": "kd", "alpha": 0.9, "temperature": 4.0})
            result = distill(from_dict(cfg), splits=splits)
            epoch_times = [r["epoch_time_s"] for r in result.history]
            students.append({"seed": seed, "test_acc": result.summary["test_acc"],
                             "best_val_acc": result.summary["best_val_acc"],
                             "epoch_s": statistics.median(epoch_times[1:] or epoch_times),
                             "precision": result.summary["precision"],
                             "channels_last": result.summary["channels_last"]})
            print(f"{arm_name} seed {seed}: test {students[-1]['test_acc']:.2f}%  "
                  f"({students[-1]['epoch_s']:.2f} s/epoch, {students[-1]['precision']})", flush=True)
        results[arm_name] = {"teacher_test_acc": teacher.summary["test_acc"],
                             "teacher_precision": teacher.summary["precision"], "students": students}
    fp32 = [s["test_acc"] for s in results["fp32"]["students"]]
    fast = [s["test_acc"] for s in results["defaults"]["students"]]
    diff = paired_interval(fast, fp32)
    t_fp32 = statistics.median(s["epoch_s"] for s in results["fp32"]["students"])
    t_fast = statistics.median(s["epoch_s"] for s in results["defaults"]["students"])
    lines = [
        f"# fp32 vs the fast defaults (defaults resolve to {resolved.name}"
        f"{' + channels_last' if resolved.name != 'fp32' else ''} on this machine)",
        "",
        f"CIFAR-shaped mnist5k (3x32x32, crop+flip), ResNet-20 teacher ({args.teacher_epochs} epochs, seed 0, one "
        f"per arm) -> ResNet-8 students (KD 0.1 CE + 0.9 KD, T=4, {args.student_epochs} epochs), {args.seeds} paired "
        "student seeds; test accuracy at the last epoch; intervals cover student seeds only.",
        "",
        "| arm | teacher test | student test (mean +- std) | per seed | s / student epoch |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        accs = [s["test_acc"] for s in r["students"]]
        per = ", ".join(f"{a:.2f}" for a in accs)
        t = statistics.median(s["epoch_s"] for s in r["students"])
        lines.append(f"| {name} ({r['students'][0]['precision']}"
                     f"{', channels_last' if r['students'][0]['channels_last'] else ''}) | "
                     f"{r['teacher_test_acc']:.2f} | {fmt_mean_std(accs)} | {per} | {t:.2f} |")
    lines += ["", f"Paired difference defaults - fp32: {fmt_interval(diff)} points (95% t interval over "
                  f"{args.seeds} seeds); student epoch time ratio fp32 / defaults: {t_fp32 / t_fast:.2f}x.",
              f"Wall time {time.perf_counter() - t0:.0f} s."]
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"results": results, "diff": diff}, indent=2))
    if not args.limit:
        keep = Path(__file__).parent / "results"
        keep.mkdir(exist_ok=True)
        (keep / "precision_study.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
