"""Throughput of the KD step against its parts, measured in one process (ratios, not absolute times).

(a) ResNet-20 student train step, (b) ResNet-110 teacher forward (eval, no_grad), (c) teachkit's KD
step through the real engine (``fit`` over one epoch: lr schedule, FrozenTeacher, taps, Hinton KD,
NaN guard, metrics), and (d) a hand-written plain PyTorch KD loop for reference. Synthetic
CIFAR-shaped data, batch 128, fp32. Target: (c) / ((a) + (b)) <= 1.10.

    python benchmarks/throughput.py [--steps 10] [--batch 128] [--device cpu] [--student resnet20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.engine.trainer import build_optimizer, fit
from teachkit.losses.kd import HintonKD
from teachkit.models import Tapped, build_model
from teachkit.recipes.common import FrozenTeacher


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, steps: int, device: torch.device, warmup: int = 2) -> float:
    """Median seconds per call of ``fn`` over ``steps`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--student", default="resnet20")
    ap.add_argument("--teacher", default="resnet110")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16 autocast for all four")
    ap.add_argument("--channels-last", action="store_true", help="channels_last models and batches for all four")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    shape, classes, b = (3, 32, 32), 100, args.batch
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    student = build_model(args.student, shape, classes).to(device, memory_format=fmt)
    teacher = build_model(args.teacher, shape, classes).to(device, memory_format=fmt).eval()
    x = torch.randn(b, *shape, device=device).contiguous(memory_format=fmt)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    y = torch.randint(0, classes, (b,), device=device)
    opt = build_optimizer(list(student.parameters()), from_dict({}).optim)

    def student_step() -> None:
        with autocast:
            loss = F.cross_entropy(student(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    @torch.no_grad()
    def teacher_forward() -> None:
        with autocast:
            teacher(x)

    def plain_kd_step() -> None:
        with autocast:
            with torch.no_grad():
                zt = teacher(x).float()
            zs = student(x).float()
        kl = F.kl_div(F.log_softmax(zs / 4, 1), F.softmax(zt / 4, 1), reduction="batchmean") * 16
        loss = 0.1 * F.cross_entropy(zs, y) + 0.9 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # (c) the real engine: one epoch of `steps` batches through fit(); eval/checkpoint cost kept tiny
    n = b * (args.steps + 2)
    splits = load_splits("synthetic", val_fraction=0.02, options={
        "shape": list(shape), "num_classes": classes, "n_train": int(n / 0.98) + classes, "n_test": classes,
        "seed": 0}).to(device)
    cfg = from_dict({"data": {"name": "synthetic", "batch_size": b, "augment": "none"},
                     "train": {"epochs": 1, "progress": False, "precision": args.precision,
                               "channels_last": args.channels_last}})
    frozen = FrozenTeacher(teacher)
    s_tap, t_tap, kd = Tapped(student), Tapped(frozen), HintonKD(0.9, 4.0)
    step_times: list[float] = []

    def step(batch, progress):
        sync(device)
        step_times.append(time.perf_counter())
        t_out, s_out = t_tap(batch.x), s_tap(batch.x)
        return kd(s_out, t_out, batch, progress), s_out.logits

    rounds = {"a": [], "b": [], "c": [], "d": []}
    for r in range(2):  # interleave rounds so drift in machine load hits all four alike
        rounds["a"].append(timed(student_step, args.steps, device))
        rounds["b"].append(timed(teacher_forward, args.steps, device))
        rounds["d"].append(timed(plain_kd_step, args.steps, device))
        step_times.clear()
        with tempfile.TemporaryDirectory() as tmp:
            fit(student, step, splits, cfg, f"{tmp}/run{r}")
        gaps = [t1 - t0 for t0, t1 in zip(step_times[2:-1], step_times[3:], strict=False)]
        rounds["c"].append(statistics.median(gaps))
    a, bt, c, d = (min(rounds[k]) for k in "abcd")
    layout = ", channels_last" if args.channels_last else ""
    print(f"device {device}, batch {b}, {args.precision}{layout}, threads {torch.get_num_threads()}, "
          f"{args.steps} steps, best of 2 interleaved rounds of medians")
    print(f"(a) {args.student} train step      {a * 1e3:8.1f} ms  {b / a:8.0f} img/s")
    print(f"(b) {args.teacher} teacher forward {bt * 1e3:8.1f} ms  {b / bt:8.0f} img/s")
    print(f"(c) teachkit KD step (engine)  {c * 1e3:8.1f} ms  {b / c:8.0f} img/s")
    print(f"(d) plain PyTorch KD loop      {d * 1e3:8.1f} ms  {b / d:8.0f} img/s")
    print(f"ratio (c) / ((a) + (b)) = {c / (a + bt):.3f}   (target <= 1.10)")
    print(f"ratio (c) / (d)         = {c / d:.3f}")


if __name__ == "__main__":
    main()
