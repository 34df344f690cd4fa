"""Data-parallel scaling: the KD step through teachkit's engine with 1 and with N processes (torchrun; gloo on
CPU, NCCL on GPUs), the same global batch, measured in one invocation (ratios, not absolute times).

Each setting is a fresh ``torchrun`` job running :func:`worker`: synthetic CIFAR-shaped data (3x32x32, 100
classes) in memory, on-device crop + flip augmentation, a frozen teacher and a student, objective 0.1 CE +
0.9 Hinton KD, ``fit`` for ``--epochs`` epochs of ``--steps`` steps; the last epoch's images/s (the first
pays one-time costs) is reported by rank 0. On CPU the cores are split between the processes (threads per
process = cores / processes), so the comparison is data parallelism against intra-op threading on the same
cores; on GPUs each process drives one GPU.

    python benchmarks/ddp_scaling.py [--procs 1 2] [--student resnet20 --teacher resnet56] [--batch 128]
        [--steps 8] [--device cpu|cuda] [--precision auto|fp32|bf16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(args: argparse.Namespace) -> None:
    """One process of a (possibly single-process) torchrun job: trains and, on rank 0, writes the record."""
    import torch.nn.functional as F

    from teachkit import distributed
    from teachkit.data import BatchLoader
    from teachkit.data.augment import Augment
    from teachkit.data.base import TensorSplit
    from teachkit.engine import LoopConfig, OptimConfig, fit
    from teachkit.engine.trainer import resolve_device
    from teachkit.models import FrozenTeacher, build_model
    from teachkit.types import Evaluator, StepOutput

    device = resolve_device(args.device)  # joins the process group under torchrun
    torch.manual_seed(0)
    shape, classes = (3, 32, 32), 100
    n = args.batch * args.steps
    gen = torch.Generator().manual_seed(0)
    split = TensorSplit(torch.randn(n, *shape, generator=gen).to(device),
                        torch.randint(0, classes, (n,), generator=gen).to(device))
    student = build_model(args.student, shape, classes).to(device)
    teacher = FrozenTeacher(build_model(args.teacher, shape, classes).to(device))
    augment = Augment(crop_pad=4, flip=True, pad_mode="zeros")  # torchvision's RandomCrop(32, padding=4) + flip
    batches = BatchLoader(split, args.batch, shuffle=True, seed=0, augment=augment)

    def step(batch, progress):
        logits = student(batch.x)
        t = teacher(batch.x)
        kd = F.kl_div(F.log_softmax(logits.float() / 4, 1), F.softmax(t.float() / 4, 1), reduction="batchmean") * 16
        return StepOutput({"ce": 0.1 * F.cross_entropy(logits.float(), batch.y), "kd": 0.9 * kd}, logits)

    class NoEval(Evaluator):
        primary = "acc"

        def metric_names(self):
            return ("acc",)

        def evaluate(self, model):
            return {"val": {"acc": 0.0}}

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run_dir or tmp)
        result = fit(student, step, batches, OptimConfig(), NoEval(), run,
                     loop=LoopConfig(epochs=args.epochs, precision=args.precision, progress=False),
                     frozen={"teacher": teacher})
    last = result.history[-1]
    if distributed.is_main():
        record = {"processes": distributed.world_size(), "images_per_s": last["images_per_s"],
                  "step_ms": 1000 * last["epoch_time_s"] / args.steps, "precision": result.summary["precision"],
                  "threads_per_process": torch.get_num_threads(), "device": str(device)}
        if device.type == "cuda":
            record["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        Path(args.out).write_text(json.dumps(record))


def launch(args: argparse.Namespace, procs: int, cores: int) -> dict:
    """``procs`` processes of :func:`worker` under torchrun; returns rank 0's record."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        threads = max(1, cores // procs) if args.device == "cpu" else int(os.environ.get("OMP_NUM_THREADS", "1"))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), __file__, "--worker", "--out", str(out),
               "--student", args.student, "--teacher", args.teacher, "--batch", str(args.batch), "--steps",
               str(args.steps), "--epochs", str(args.epochs), "--device", args.device, "--precision", args.precision]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"the {procs}-process job failed:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--student", default="resnet20")
    ap.add_argument("--teacher", default="resnet56")
    ap.add_argument("--batch", type=int, default=128, help="global batch (divided among the processes)")
    ap.add_argument("--steps", type=int, default=8, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=2, help="the last epoch is timed")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="CPU cores shared by the processes")
    ap.add_argument("--json", help="also write the records here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.device == "cuda" and max(args.procs) > torch.cuda.device_count():
        sys.exit(f"--procs {max(args.procs)} needs that many GPUs; {torch.cuda.device_count()} visible")
    bad = [p for p in args.procs if args.batch % p]
    if bad:
        sys.exit(f"--batch {args.batch} does not divide among {bad[0]} processes; use a multiple of {bad[0]}")
    records = [launch(args, p, args.cores) for p in args.procs]
    base = records[0]
    print(f"# data-parallel scaling: {args.teacher} -> {args.student} KD step, global batch {args.batch}, "
          f"{args.steps} steps/epoch, device {args.device}, torch {torch.__version__}, {args.cores} cores")
    print()
    print("| processes | threads/process | precision | step ms | img/s | speed-up vs "
          f"{base['processes']} | efficiency |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        speed = r["images_per_s"] / base["images_per_s"]
        eff = speed * base["processes"] / r["processes"]
        print(f"| {r['processes']} | {r['threads_per_process']} | {r['precision']} | {r['step_ms']:.1f} | "
              f"{r['images_per_s']:.0f} | {speed:.2f}x | {eff:.0%} |")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
