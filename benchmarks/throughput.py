"""Throughput of the KD step against its parts, measured in one process (ratios, not absolute times).

(a) ResNet-20 student train step, (b) ResNet-110 teacher forward (eval, no_grad), (c) teachkit's KD
step through the real engine (``fit`` over one epoch: lr schedule, FrozenTeacher, per-side taps, the
distillation objective (0.1 CE + 0.9 Hinton KD), NaN guard, device-side metrics), and (d) a hand-written
plain PyTorch KD loop for reference. Synthetic CIFAR-shaped data, batch 128, fp32 (or bf16 autocast and
channels_last for all four). Targets: (c) / (d) <= 1.02, (c) / ((a) + (b)) <= 1.10.

Then (e) the host syncs per step of a CRD + KD step through the engine, counted (not timed) with
:class:`teachkit.engine.syncs.HostSyncCounter` as the difference between an epoch of 2S and one of S steps
(so per-epoch reads such as evaluation cancel out).

    python benchmarks/throughput.py [--steps 10] [--batch 128] [--device cpu] [--student resnet20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from teachkit.data import BatchLoader, load_splits
from teachkit.engine import EVALUATORS, LoopConfig, OptimConfig, build_optimizer, fit
from teachkit.engine.syncs import HostSyncCounter
from teachkit.losses import build_objective, needs_of
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.types import StepOutput


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
    ap.add_argument("--sync-steps", type=int, default=4, help="steps S of the host-sync count (e)")
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
    opt = build_optimizer(list(student.parameters()), OptimConfig())

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
    loop = LoopConfig(epochs=1, progress=False, precision=args.precision, channels_last=args.channels_last)
    evaluator = EVALUATORS.get("classification")(splits, 1000)
    frozen = FrozenTeacher(teacher)
    step_times: list[float] = []

    def engine_step(methods: list[str], timed_steps: list[float] | None):
        s_needs, t_needs = needs_of(methods)
        s_tap, t_tap = Tapped(student, want=s_needs), Tapped(frozen, want=t_needs)
        with torch.no_grad():
            student.eval()
            probe = splits.train.x[:2]
            objective = build_objective(methods, s_tap(probe), t_tap(probe), num_classes=classes,
                                        num_samples=len(splits.train)).to(device)
            student.train()

        def step(batch, progress):
            if timed_steps is not None:
                sync(device)
                timed_steps.append(time.perf_counter())
            t_out, s_out = t_tap(batch.x), s_tap(batch.x)
            return StepOutput(objective(s_out, t_out, batch, progress), s_out.logits)

        return {"model": student, "objective": objective}, step

    def engine_epoch(methods: list[str], batches, run_dir: str, timed_steps: list[float] | None = None) -> None:
        modules, step = engine_step(methods, timed_steps)
        fit(modules, step, batches, OptimConfig(), evaluator, run_dir, loop=loop)

    rounds = {"a": [], "b": [], "c": [], "d": []}
    loader = BatchLoader(splits.train, b, shuffle=True, seed=0)
    for r in range(2):  # interleave rounds so drift in machine load hits all four alike
        rounds["a"].append(timed(student_step, args.steps, device))
        rounds["b"].append(timed(teacher_forward, args.steps, device))
        rounds["d"].append(timed(plain_kd_step, args.steps, device))
        step_times.clear()
        with tempfile.TemporaryDirectory() as tmp:
            engine_epoch(["kd"], loader, f"{tmp}/run{r}", step_times)
        gaps = [t1 - t0 for t0, t1 in zip(step_times[2:-1], step_times[3:], strict=False)]
        rounds["c"].append(statistics.median(gaps))

    # (e) host syncs per step of a CRD + KD step through the engine (counted, not timed)
    syncs = {}
    for steps in (args.sync_steps, 2 * args.sync_steps):
        part = BatchLoader(splits.train.subset(torch.arange(steps * b)), b, shuffle=True, seed=0)
        with tempfile.TemporaryDirectory() as tmp, HostSyncCounter() as counter:
            engine_epoch(["crd", "kd"], part, f"{tmp}/crd{steps}")
        syncs[steps] = counter
    per_step = (syncs[2 * args.sync_steps].total - syncs[args.sync_steps].total) / args.sync_steps
    kinds = syncs[2 * args.sync_steps].counts - syncs[args.sync_steps].counts
    a, bt, c, d = (min(rounds[k]) for k in "abcd")
    layout = ", channels_last" if args.channels_last else ""
    print(f"device {device}, batch {b}, {args.precision}{layout}, threads {torch.get_num_threads()}, "
          f"{args.steps} steps, best of 2 interleaved rounds of medians")
    print(f"(a) {args.student} train step      {a * 1e3:8.1f} ms  {b / a:8.0f} img/s")
    print(f"(b) {args.teacher} teacher forward {bt * 1e3:8.1f} ms  {b / bt:8.0f} img/s")
    print(f"(c) teachkit KD step (engine)  {c * 1e3:8.1f} ms  {b / c:8.0f} img/s")
    print(f"(d) plain PyTorch KD loop      {d * 1e3:8.1f} ms  {b / d:8.0f} img/s")
    print(f"ratio (c) / ((a) + (b)) = {c / (a + bt):.3f}   (target <= 1.10)")
    print(f"ratio (c) / (d)         = {c / d:.3f}   (target <= 1.02)")
    print(f"(e) CRD + KD step through the engine: {per_step:.2f} host syncs per step "
          f"({', '.join(f'{k} {v / args.sync_steps:g}' for k, v in sorted(kinds.items())) or 'none'})")


if __name__ == "__main__":
    main()
