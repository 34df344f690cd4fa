"""Cost of one L2T-DLF teacher step (unroll + reverse-mode hypergradient) against the plain unroll.

For T in {8, 16, 32, 64} inner steps and memory modes ``full`` and ``checkpoint``: the median wall time of
one teacher step (``teachkit.recipes.l2t.hypergrad.hypergradient``: T forward momentum-SGD steps, the dev
gradient, T adjoint steps with Hessian-vector products, the teacher VJP) and of the plain forward unroll
of the same T steps (``unroll``: forward + backward + update per step, the same functional student), their
ratio (target <= 4x for ``full``; the three are timed in interleaved rounds so that they
share the machine's load), and the peak memory allocated during the teacher step.

Memory: on CUDA ``torch.cuda.max_memory_allocated`` (after ``reset_peak_memory_stats``) minus the memory
held before the call. On CPU (no allocator statistics in torch) the peak of the running sum of tensor
allocations and frees recorded by ``torch.profiler`` with ``profile_memory=True`` during the call (a
separate, untimed run): memory the call holds at its peak beyond what existed before it. Student: the MLP
784-500-10 of the MNIST experiments of Wu et al. 2018 (397,510 parameters, 1.59 MB in fp32), gated teacher,
synthetic MNIST-shaped batches. One process, one run.

    python benchmarks/l2t_unroll.py [--batch 20] [--repeats 7] [--steps 8 16 32 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from teachkit.models import build_model
from teachkit.recipes.l2t import (
    FunctionalStudent,
    InnerOptimizer,
    StudentStateTracker,
    build_teacher,
    hypergradient,
    l2t_student_loss,
    smooth_error,
    unroll,
)
from teachkit.types import Batch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds per call of each function; rounds call them in turn (after one warm-up round)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            if r:
                times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by ``fn`` beyond what was allocated before it (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=20, help="inner batch size (the paper's MNIST MLP uses 20)")
    ap.add_argument("--dev-batch", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "l2t_unroll.md"))
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    C = 10
    model = build_model("mlp", (1, 28, 28), C, hidden=[500]).to(device)
    student = FunctionalStudent(model)
    start = student.initial_state()
    teacher = build_teacher("gated", C, StudentStateTracker.dim).to(device)
    with torch.no_grad():
        teacher.W2.normal_(std=0.01)
    opt = InnerOptimizer(0.01, 0.9)
    dev = Batch(torch.randn(args.dev_batch, 1, 28, 28, device=device),
                torch.randint(0, C, (args.dev_batch,), device=device), torch.arange(args.dev_batch))

    def objective(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return smooth_error(z, y, 50.0)

    n_params = sum(p.numel() for p in start.params)
    w_mb = n_params * 4 / 2**20
    rows = []
    for T in args.steps:
        batches = [Batch(torch.randn(args.batch, 1, 28, 28, device=device),
                         torch.randint(0, C, (args.batch,), device=device), torch.arange(args.batch))
                   for _ in range(T)]
        states = torch.rand(T, StudentStateTracker.dim, device=device)

        def plain(batches: list[Batch] = batches, states: torch.Tensor = states) -> object:
            return unroll(student, start, batches, l2t_student_loss, opt, teacher, states)

        def step(mode: str, batches: list[Batch] = batches, states: torch.Tensor = states) -> Any:
            return hypergradient(student, start, teacher, states, batches, l2t_student_loss, opt, dev, objective,
                                 mode)

        fns = {"plain": plain, "full": lambda: step("full"), "checkpoint": lambda: step("checkpoint")}
        times = interleaved(fns, args.repeats, device)  # the three alternate, so they share the machine's load
        for mode in ("full", "checkpoint"):
            mem = peak_bytes(fns[mode], device) / 2**20
            stored = step(mode).peak_stored_weights
            t_plain, t_step = times["plain"], times[mode]
            rows.append((T, mode, t_plain, t_step, t_step / t_plain, mem, stored))
            print(f"T={T:3d} {mode:<10} plain {1e3 * t_plain:8.1f} ms  teacher step {1e3 * t_step:8.1f} ms  "
                  f"ratio {t_step / t_plain:4.2f}  peak {mem:7.1f} MiB  stored w-sized tensors {stored}", flush=True)

    where = "torch.cuda.max_memory_allocated" if device.type == "cuda" else \
        "torch.profiler CPU allocation accounting (peak of running alloc - free)"
    lines = [
        "# L2T-DLF teacher step vs plain unroll",
        "",
        f"Device {device} ({torch.get_num_threads()} threads), torch {torch.__version__}; MLP 784-500-10 student "
        f"({n_params:,} parameters = {w_mb:.2f} MiB), gated teacher, inner batch {args.batch}, dev batch "
        f"{args.dev_batch}, median of {args.repeats} interleaved rounds after a warm-up round. "
        f"Peak memory: {where}, beyond what "
        f"existed before the call.",
        "",
        "| T | memory | plain unroll (ms) | teacher step (ms) | ratio | peak memory (MiB) | stored w-sized tensors |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {T} | {mode} | {1e3 * tp:.1f} | {1e3 * ts:.1f} | {r:.2f} | {m:.1f} | {s} |"
              for T, mode, tp, ts, r, m, s in rows]
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
