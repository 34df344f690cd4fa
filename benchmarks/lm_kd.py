"""Causal-LM distillation: tokens/s of a KD step against plain fine-tuning, and the memory of the chunked divergence.

Two parts, both by default (``--throughput`` / ``--memory`` pick one):

Throughput. One optimiser step (forward, backward, AdamW step) of a randomly initialised ``hf_causal_lm`` student
on one fixed batch of prompt/response rows (:class:`teachkit.data.lm.LMText`: ``--batch`` rows of ``--length``
tokens, the loss on the last ``--response`` fraction of each row; the model returns packed (N_tokens, V) logits),
for each setting

    plain            language-model fine-tuning: token cross-entropy on the packed targets
    kd-teacher       0.5 CE + 0.5 Hinton forward KL at T=1 (``teachkit.losses.kd.kd_kl``) with the frozen teacher
                     (eval mode, ``torch.no_grad``) run on every batch
    kd-cached-topk   the same KD from a cached teacher: its top-k logits and the rest's mass
                     (``TopKLogits.from_logits``, computed once before timing, what ``teacher.cache_topk`` gives),
                     read through the bucketed divergence (``logit_divergence`` -> ``bucket_divergence``)

and the teacher's forward alone. A setting's step time is the median over ``--steps`` steps after 2 warm-up steps;
the settings are interleaved over ``--rounds`` rounds and each keeps its BEST (lowest) median. Printed: tokens/s
(all ``batch x length`` input tokens; the target tokens/s beside), each setting's ratio to ``plain`` (the issue's
"tokens/s of a KD step relative to plain language-model fine-tuning of the student"), the teacher forward's share
of the KD step and KD / (plain + teacher forward). The divergences chunk automatically above
``teachkit.losses.chunked.CHUNK_THRESHOLD`` rows x vocabulary (the path taken is printed).

Memory. The peak memory of the divergence's forward + backward, forward KL at T=1, for each ``--vocabs`` entry at
``--tokens`` rows, through a synthetic head: the student's logits are ``hidden (N, H) @ W (H, V)`` with
``requires_grad`` on W only (so the logits, their gradient and W's gradient all count, as in a model's output
head), the teacher's logits a fixed (N, V) tensor, both in ``--dtype``. Variants:

    naive     an unchunked reference written here: log_softmax of both in float32, the KL summed over the
              vocabulary, mean over rows, backward (autograd keeps the (N, V) float32 intermediates)
    chunked   ``teachkit.losses.divergences.forward_kl``, its default automatic path (``--chunk-rows`` forces a
              block size; below CHUNK_THRESHOLD it does not chunk and the table says so)

On a CPU each variant runs in a FRESH subprocess (this script with a hidden flag), with ``MALLOC_MMAP_THRESHOLD_``
set to 65536 so freed blocks go back to the system (and every free updates the kernel's high-water mark), and its
peak is the rise of the peak RSS over a baseline read once the inputs are allocated, the peak first reset to the
current RSS (``/proc/self/clear_refs``). The peak is ``VmHWM`` (``/proc/self/status``), which is ``ru_maxrss`` of
the process's own memory: ``ru_maxrss`` itself carries the parent's peak into a child at exec, a floor that hid
the chunked pass's whole rise in a first version of this script. On CUDA, in this process,
``torch.cuda.max_memory_allocated`` over the allocated baseline after ``reset_peak_memory_stats``. A tiny warm-up
pass runs first in either case. A pass's time is measured in this process (the default allocator; the child's
small mmap threshold would charge every block's temporaries fresh pages), best of ``--mem-passes`` after one
warm-up. The size of one (N, V) float32 copy is printed so a reader can see the peak in copies, and the two variants
are checked to agree: the relative difference of the loss and of the gradient norm, and max |grad_chunked -
grad_naive| / max |grad_naive| over W's gradient.

The header records the time, the load averages, the thread environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``)
and the CPU time the hypervisor stole during the run. On a small shared virtual machine, OpenMP's spinning threads
can slow a step many times over while another process competes for the cores (every parallel region then waits
for a descheduled thread); ``OMP_WAIT_POLICY=PASSIVE`` or ``OMP_NUM_THREADS=1`` avoids that.

    python benchmarks/lm_kd.py [--throughput] [--memory] [--device auto|cpu|cuda] [--json results.json]
        [--teacher llama-small] [--student llama-mini] [--vocab 512] [--batch 16] [--length 64] [--response 0.5]
        [--topk 32] [--steps 10] [--rounds 3] [--precision fp32|bf16]
        [--vocabs 32768 131072] [--tokens 2048] [--hidden 256] [--dtype auto|float32|bfloat16] [--chunk-rows N]
        [--mem-passes 2]

A GPU run (one command):

    python benchmarks/lm_kd.py --device cuda --teacher llama-small --student llama-mini --vocab 32768 --batch 16
        --length 512 --precision bf16 --steps 20 --tokens 8192 --json lm_kd_cuda.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from throughput import sync, timed  # a sibling script (benchmarks/ is on sys.path)
from torch import Tensor, nn

from teachkit.engine.precision import cpu_model
from teachkit.losses.chunked import CHUNK_THRESHOLD, chunk_plan
from teachkit.losses.divergences import TopKLogits, forward_kl, logit_divergence
from teachkit.losses.kd import kd_kl

SETTINGS = ("plain", "kd-teacher", "kd-cached-topk")
VARIANTS = ("naive", "chunked")
WARMUP = 2
#: the KD mix: 0.5 CE + 0.5 forward KL at T = 1
KD_WEIGHT, TEMPERATURE = 0.5, 1.0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: freed blocks of 64 KiB and more go back to the system, so the peak RSS is the real peak of a pass
MMAP_THRESHOLD = "65536"
MIB = 2**20
#: the environment variables that change how the CPU threads run (recorded in the header)
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "KMP_BLOCKTIME")


# ----------------------------------------------------------------------------------------------- shared
def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def progress(message: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.0f} s] {message}", file=sys.stderr, flush=True)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def machine(device: torch.device) -> dict[str, Any]:
    """What the figures were measured on, and when (the machine may be shared: the load averages say how busy)."""
    try:
        import transformers
        hf = transformers.__version__
    except ImportError:
        hf = None
    return {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "transformers": hf, "python": platform.python_version(),
            "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_average_start": os.getloadavg(),
            "cpu_steal_s_start": cpu_steal_s(),
            "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}


def cpu_steal_s() -> float | None:
    """Seconds of CPU time the hypervisor gave to others since boot (``steal`` in ``/proc/stat``; None where
    unreadable): its rise over the run says how much the host took away from this (virtual) machine."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def print_header(info: dict[str, Any]) -> None:
    gpu = f", GPU {info['gpu']}" if info["gpu"] else ""
    print(f"CPU {info['cpu_model']} ({info['logical_cpus']} logical CPUs), torch {info['torch']} with "
          f"{info['torch_threads']} threads, transformers {info['transformers']}{gpu}")
    load = ", ".join(f"{x:.2f}" for x in info["load_average_start"])
    env = ", ".join(f"{k}={v}" for k, v in info["env"].items()) or "none set"
    print(f"device {info['device']}; started {info['started']}; load average at start {load} (1/5/15 min; "
          f"the machine may be shared); thread environment: {env}")


# ----------------------------------------------------------------------------------------------- throughput
def lm_batch(batch: int, length: int, response: float, vocab: int, seed: int) -> Any:
    """One prompt/response batch: ``batch`` full rows of ``length`` random tokens, the targets the last
    ``response`` fraction of each row (``starts`` = the prompt's length)."""
    from teachkit.data.lm import LMInfo, LMText

    targets = max(1, min(length - 1, round(length * response)))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g, dtype=torch.int32)
    info = LMInfo(tokenizer=None, tokenizers={"": {"name": "synthetic", "sha256": ""}}, pad_id=0, eos_id=vocab - 1,
                  bos_id=None, kind="prompt_response", max_length=length)
    full = torch.full((batch,), length, dtype=torch.int64)
    x = LMText(ids, full, full - targets, torch.arange(batch), info)
    x.validate()
    return x


def lm_model(preset: str, vocab: int, length: int, seed: int) -> nn.Module:
    from teachkit.models import build_model

    torch.manual_seed(seed)
    return build_model("hf_causal_lm", (length,), vocab, preset=preset)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Setting:
    """One setting's student (a copy of the shared initial weights), its AdamW and its step."""

    def __init__(self, name: str, student: nn.Module, bench: Throughput) -> None:
        self.name, self.bench = name, bench
        self.student = copy.deepcopy(student).train()
        self.opt = torch.optim.AdamW(self.student.parameters(), lr=bench.lr)
        self.medians: list[float] = []

    def loss(self, zs: Tensor) -> Tensor:
        b = self.bench
        ce = F.cross_entropy(zs.float(), b.targets)
        if self.name == "plain":
            return ce
        if self.name == "kd-teacher":
            with torch.no_grad(), b.autocast():
                zt = b.teacher(b.x)
            kl = kd_kl(zs, zt, TEMPERATURE)
        else:
            kl = logit_divergence(zs, b.topk, TEMPERATURE)
        return (1 - KD_WEIGHT) * ce + KD_WEIGHT * kl

    def step(self) -> None:
        with self.bench.autocast():
            zs = self.student(self.bench.x)
        loss = self.loss(zs)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


class Throughput:
    """The models, the batch, the cached top-k teacher and the settings of the throughput part."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.device, self.lr, self.steps = device, args.lr, args.steps
        self.precision = torch.bfloat16 if args.precision == "bf16" else None
        self.x = lm_batch(args.batch, args.length, args.response, args.vocab, args.seed).to(device)
        self.targets = self.x.token_targets()
        self.teacher = lm_model(args.teacher, args.vocab, args.length, args.seed).to(device).eval()
        self.teacher.requires_grad_(False)
        student = lm_model(args.student, args.vocab, args.length, args.seed + 1).to(device)
        t = time.perf_counter()
        with torch.no_grad(), self.autocast():
            self.topk = TopKLogits.from_logits(self.teacher(self.x), args.topk)
        sync(device)
        self.topk_s = time.perf_counter() - t
        self.settings = [Setting(name, student, self) for name in SETTINGS]
        self.teacher_medians: list[float] = []
        self.info = {"teacher": args.teacher, "student": args.student, "teacher_params": n_params(self.teacher),
                     "student_params": n_params(student), "vocab": args.vocab, "batch": args.batch,
                     "length": args.length, "input_tokens": args.batch * args.length,
                     "target_tokens": int(self.targets.numel()), "topk": args.topk, "lr": args.lr,
                     "precision": args.precision, "steps": args.steps, "warmup_steps": WARMUP,
                     "rounds": args.rounds, "kept": "best (lowest) of the rounds' medians",
                     "divergence_path": path_of(int(self.targets.numel()), args.vocab)}

    def autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=self.precision or torch.float32,
                              enabled=self.precision is not None)

    def teacher_forward(self) -> None:
        with torch.no_grad(), self.autocast():
            self.teacher(self.x)

    def measure(self) -> None:
        """One round: every setting, then the teacher forward alone."""
        for s in self.settings:
            s.medians.append(timed(s.step, self.steps, self.device, WARMUP))
        self.teacher_medians.append(timed(self.teacher_forward, self.steps, self.device, WARMUP))


def path_of(rows: int, vocab: int, chunk_rows: int | None = None) -> str:
    plan = chunk_plan(rows, vocab, chunk_rows)
    if plan is None:
        return f"unchunked ({rows:,} x {vocab:,} <= CHUNK_THRESHOLD {CHUNK_THRESHOLD:,})"
    return f"chunked, {plan} rows per block"


def throughput_results(bench: Throughput) -> dict[str, Any]:
    tokens, targets = bench.info["input_tokens"], bench.info["target_tokens"]
    best = {s.name: min(s.medians) for s in bench.settings}
    teacher = min(bench.teacher_medians)
    rows = {name: {"step_ms": t * 1e3, "tokens_per_s": tokens / t, "target_tokens_per_s": targets / t,
                   "vs_plain": ratio(best["plain"], t),
                   "rounds_ms": [m * 1e3 for m in next(s for s in bench.settings if s.name == name).medians]}
            for name, t in best.items()}
    return {**bench.info, "settings": rows, "teacher_forward_ms": teacher * 1e3,
            "teacher_forward_rounds_ms": [m * 1e3 for m in bench.teacher_medians],
            "teacher_share_of_kd_step": ratio(teacher, best["kd-teacher"]),
            "kd_over_plain_plus_teacher": ratio(best["kd-teacher"], best["plain"] + teacher),
            "cached_over_plain": ratio(best["kd-cached-topk"], best["plain"]),
            "topk_precompute_s": bench.topk_s}


def print_throughput(res: dict[str, Any]) -> None:
    print(f"\n### throughput: {res['teacher']} ({res['teacher_params'] / 1e6:.2f}M) -> {res['student']} "
          f"({res['student_params'] / 1e6:.2f}M), vocabulary {res['vocab']}, batch {res['batch']} x {res['length']} "
          f"tokens ({res['target_tokens']} target tokens), {res['precision']}")
    print(f"step = forward + backward + AdamW step; median of {res['steps']} steps after {res['warmup_steps']} "
          f"warm-up, {res['kept']} over {res['rounds']} interleaved round(s); KD = {1 - KD_WEIGHT} CE + {KD_WEIGHT} "
          f"forward KL (T={TEMPERATURE:g}); top-k: k={res['topk']} + rest bucket; divergence path: "
          f"{res['divergence_path']}\n")
    print("| setting | step ms | tokens/s | target tokens/s | vs plain |")
    print("|---|---|---|---|---|")
    for name, r in res["settings"].items():
        print(f"| {name} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | {r['target_tokens_per_s']:.0f} | "
              f"{r['vs_plain']:.3f} |")
    print(f"| teacher forward alone | {res['teacher_forward_ms']:.1f} | - | - | - |")
    print()
    print(f"teacher forward share of the kd-teacher step: {100 * res['teacher_share_of_kd_step']:.1f}%")
    print(f"kd-teacher step / (plain step + teacher forward): {res['kd_over_plain_plus_teacher']:.3f}")
    print(f"kd-cached-topk step / plain step: {res['cached_over_plain']:.3f}")
    print(f"top-k teacher precomputed once (teacher forward + TopKLogits.from_logits): "
          f"{res['topk_precompute_s']:.2f} s")


def run_throughput(args: argparse.Namespace, device: torch.device, t0: float) -> dict[str, Any]:
    progress(f"building {args.teacher} -> {args.student}", t0)
    bench = Throughput(args, device)
    for r in range(args.rounds):  # interleaved: drift in the machine's load hits every setting alike
        progress(f"throughput round {r + 1}/{args.rounds}", t0)
        bench.measure()
    res = throughput_results(bench)
    print_throughput(res)
    return res


# ----------------------------------------------------------------------------------------------- memory
def naive_forward_kl(zs: Tensor, zt: Tensor) -> Tensor:
    """The unchunked reference: KL(p_t || p_s) at T = 1 from float32 log-probabilities, summed over the
    vocabulary, mean over rows (autograd keeps the (N, V) intermediates)."""
    log_q, log_p = F.log_softmax(zs.float(), dim=-1), F.log_softmax(zt.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).mean()


def head_inputs(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, device: torch.device,
                seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """The synthetic head's inputs, the same for every variant: hidden (N, H), W (H, V) with requires_grad (the
    student's logits ``hidden @ W`` have std ~2) and the teacher's logits (N, V) (std 3). Filled in place, so no
    temporary raises the baseline."""
    g = torch.Generator(device).manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g, dtype=dtype, device=device)
    w = torch.randn(hidden, vocab, generator=g, dtype=dtype, device=device).mul_(2 / hidden**0.5).requires_grad_()
    zt = torch.randn(tokens, vocab, generator=g, dtype=dtype, device=device).mul_(3)
    return h, w, zt


def divergence_pass(variant: str, h: Tensor, w: Tensor, zt: Tensor, chunk_rows: int | None) -> float:
    """One forward + backward of the divergence (W's gradient left in ``w.grad``); the loss."""
    w.grad = None
    zs = h @ w
    loss = naive_forward_kl(zs, zt) if variant == "naive" else forward_kl(zs, zt, TEMPERATURE, chunk_rows=chunk_rows)
    loss.backward()
    return float(loss.detach())


def peak_rss() -> tuple[int, str]:
    """This process's peak resident set so far in bytes, and its source: ``VmHWM`` of ``/proc/self/status`` (the
    high-water mark of this process's own memory), else ``ru_maxrss`` (Linux reports KiB). ``ru_maxrss`` alone
    would not do in a child: Linux carries the parent's peak into it at exec (``signal->maxrss``), a floor that
    hides any rise below the parent's own peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "VmHWM"
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"


def reset_peak_rss() -> bool:
    """Reset the peak resident set to the current one (Linux: ``5`` into ``/proc/self/clear_refs``), so a peak
    reached earlier (importing, filling the inputs) cannot hide the pass's; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_variant(args: argparse.Namespace, variant: str, vocab: int, device: torch.device,
                    grad_out: Path | None) -> dict[str, Any]:
    """Peak memory of one pass over the baseline (CPU: the peak RSS; CUDA: max_memory_allocated), after a tiny
    warm-up pass (kernels, autograd); W's gradient saved to ``grad_out`` for the agreement check."""
    dtype = resolve_dtype(args.dtype, device)
    divergence_pass(variant, *head_inputs(8, 4, 64, dtype, device, args.seed), 4)
    h, w, zt = head_inputs(args.tokens, args.hidden, vocab, dtype, device, args.seed)
    sync(device)
    reset, source = True, "torch.cuda.max_memory_allocated"
    if device.type == "cuda":
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset = reset_peak_rss()
        baseline, source = peak_rss()
    loss = divergence_pass(variant, h, w, zt, args.chunk_rows)
    sync(device)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss()[0]) - baseline
    grad = w.grad.detach()
    if grad_out is not None:
        torch.save(grad.float().cpu(), grad_out)
    return {"variant": variant, "vocab": vocab, "peak_bytes": peak, "baseline_bytes": baseline,
            "peak_reset_at_baseline": reset, "peak_source": source, "loss": loss,
            "grad_norm": float(grad.float().norm()),
            "path": "naive (unchunked reference)" if variant == "naive" else
            path_of(args.tokens, vocab, args.chunk_rows)}


def time_variant(args: argparse.Namespace, variant: str, vocab: int, device: torch.device) -> list[float]:
    """Seconds of ``--mem-passes`` passes after one warm-up, in this process (the default allocator: the child's
    small mmap threshold makes every block's temporaries fresh pages, which a real run does not pay)."""
    h, w, zt = head_inputs(args.tokens, args.hidden, vocab, resolve_dtype(args.dtype, device), device, args.seed)
    divergence_pass(variant, h, w, zt, args.chunk_rows)
    times = []
    for _ in range(args.mem_passes):
        sync(device)
        t = time.perf_counter()
        divergence_pass(variant, h, w, zt, args.chunk_rows)
        sync(device)
        times.append(time.perf_counter() - t)
    return times


def child_command(args: argparse.Namespace, variant: str, vocab: int, grad_out: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", variant, "--_vocab", str(vocab),
           "--_grad-out", str(grad_out), "--tokens", str(args.tokens), "--hidden", str(args.hidden), "--dtype",
           args.dtype, "--seed", str(args.seed), "--device", "cpu"]
    return cmd + (["--chunk-rows", str(args.chunk_rows)] if args.chunk_rows else [])


def measure_in_child(args: argparse.Namespace, variant: str, vocab: int, grad_out: Path) -> dict[str, Any]:
    """:func:`measure_variant` in a fresh process (CPU): its peak RSS is this pass's alone."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    proc = subprocess.run(child_command(args, variant, vocab, grad_out), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {variant} V={vocab} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(rows: dict[str, dict[str, Any]], grads: dict[str, Path]) -> dict[str, float]:
    """Relative differences of the chunked figures against the naive ones: loss, gradient norm, and the largest
    entry of W's gradient difference over the largest entry of the naive gradient."""
    naive, chunked = rows["naive"], rows["chunked"]
    gn, gc_ = (torch.load(grads[v], weights_only=True) for v in ("naive", "chunked"))
    return {"loss_rel_diff": abs(chunked["loss"] - naive["loss"]) / abs(naive["loss"]),
            "grad_norm_rel_diff": abs(chunked["grad_norm"] - naive["grad_norm"]) / naive["grad_norm"],
            "grad_max_abs_diff_rel": float((gc_ - gn).abs().max() / gn.abs().max())}


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def how_measured(device: torch.device) -> str:
    if device.type == "cuda":
        return ("torch.cuda.max_memory_allocated over the allocated baseline after reset_peak_memory_stats, "
                "a tiny warm-up pass first")
    return ("a fresh subprocess per variant, a tiny warm-up pass, the inputs allocated, the peak RSS reset to the "
            "current (/proc/self/clear_refs), then the rise of the peak RSS (VmHWM: ru_maxrss of the process's own "
            f"memory) over it; MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}")


def run_memory(args: argparse.Namespace, device: torch.device, t0: float) -> dict[str, Any]:
    dtype = str(resolve_dtype(args.dtype, device)).removeprefix("torch.")
    out: dict[str, Any] = {"tokens": args.tokens, "hidden": args.hidden, "dtype": dtype,
                           "chunk_rows": args.chunk_rows, "how": how_measured(device),
                           "grad_on": "W of the synthetic head (logits = hidden @ W)", "vocabs": {}}
    with tempfile.TemporaryDirectory(prefix="teachkit-lm-kd-") as tmp:
        for vocab in args.vocabs:
            rows, grads = {}, {}
            for variant in VARIANTS:
                progress(f"memory: V={vocab} {variant}", t0)
                grads[variant] = Path(tmp) / f"{variant}-{vocab}.pt"
                if device.type == "cpu":
                    rows[variant] = measure_in_child(args, variant, vocab, grads[variant])
                else:
                    rows[variant] = measure_variant(args, variant, vocab, device, grads[variant])
                    release(device)
                rows[variant]["passes_s"] = time_variant(args, variant, vocab, device)
                rows[variant]["pass_s"] = min(rows[variant]["passes_s"])
                release(device)
            out["vocabs"][str(vocab)] = {"copy_mib": args.tokens * vocab * 4 / MIB, "variants": rows,
                                         "agreement": agreement(rows, grads)}
    print_memory(out, device)
    return out


def print_memory(res: dict[str, Any], device: torch.device) -> None:
    n, what = res["tokens"], "peak RSS rise" if device.type == "cpu" else "peak allocated"
    print(f"\n### memory: forward KL (T=1) forward + backward, {n} rows, logits = hidden ({n}, {res['hidden']}) @ "
          f"W ({res['hidden']}, V), requires_grad on W, {res['dtype']} logits; {what} ({res['how']})")
    print("copies: the peak over one (N, V) float32 tensor's size; pass s: one forward + backward (the head's matmul "
          "included), best of the passes after a warm-up, timed in this process\n")
    print("| V | variant | path | one (N, V) fp32 copy MiB | peak MiB | copies | pass s (best) | loss |")
    print("|---|---|---|---|---|---|---|---|")
    for vocab, v in res["vocabs"].items():
        for name, r in v["variants"].items():
            peak = r["peak_bytes"] / MIB
            print(f"| {vocab} | {name} | {r['path']} | {v['copy_mib']:.1f} | {peak:.1f} | "
                  f"{peak / v['copy_mib']:.2f} | {r['pass_s']:.3f} | {r['loss']:.6f} |")
    print()
    if not all(r["peak_reset_at_baseline"] and r["peak_source"] != "ru_maxrss"
               for v in res["vocabs"].values() for r in v["variants"].values()):
        print("note: the peak RSS could not be reset at the baseline or was read from ru_maxrss (which carries the "
              "parent's peak): a peak reached before the pass may hide part of its rise")
    for vocab, v in res["vocabs"].items():
        a, rows = v["agreement"], v["variants"]
        saving = ratio(rows["naive"]["peak_bytes"], rows["chunked"]["peak_bytes"])
        print(f"V={vocab}: naive / chunked peak {saving:.2f}x; chunked vs naive: loss rel diff "
              f"{a['loss_rel_diff']:.2e}, grad norm rel diff {a['grad_norm_rel_diff']:.2e}, max |grad diff| / max "
              f"|grad| {a['grad_max_abs_diff_rel']:.2e}")


def child_main(args: argparse.Namespace) -> None:
    res = measure_variant(args, args._child, args._vocab, torch.device("cpu"), args._grad_out)
    print(json.dumps(res))


# ----------------------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    from teachkit.models.causal_lm import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--throughput", action="store_true", help="run the throughput part (default: both parts)")
    ap.add_argument("--memory", action="store_true", help="run the memory part (default: both parts)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:N]")
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    ap.add_argument("--seed", type=int, default=0)
    t = ap.add_argument_group("throughput")
    t.add_argument("--teacher", default="llama-small", choices=list(PRESETS), help="teacher preset (random init)")
    t.add_argument("--student", default="llama-mini", choices=list(PRESETS), help="student preset (random init)")
    t.add_argument("--vocab", type=int, default=512, help="vocabulary of both models")
    t.add_argument("--batch", type=int, default=16, help="rows per batch")
    t.add_argument("--length", type=int, default=64, help="tokens per row (prompt + response)")
    t.add_argument("--response", type=float, default=0.5, help="fraction of each row that is target (the loss)")
    t.add_argument("--topk", type=int, default=32, help="k of the cached top-k teacher")
    t.add_argument("--steps", type=int, default=10, help="timed steps per median (after 2 warm-up steps)")
    t.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best median of each is kept")
    t.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    t.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="models' forward under autocast")
    m = ap.add_argument_group("memory")
    m.add_argument("--vocabs", type=int, nargs="+", default=[32768, 131072], help="vocabularies measured")
    m.add_argument("--tokens", type=int, default=2048, help="rows N of the (N, V) logits")
    m.add_argument("--hidden", type=int, default=256, help="H of the synthetic head hidden (N, H) @ W (H, V)")
    m.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="logits' dtype (auto: float32 on CPU, bfloat16 on CUDA)")
    m.add_argument("--mem-passes", type=int, default=2,
                   help="timed passes per variant (after one warm-up, in this process); the best is printed")
    m.add_argument("--chunk-rows", type=int, default=None, help="force the chunked variant's block rows "
                   "(default: automatic, chunks only above CHUNK_THRESHOLD)")
    ap.add_argument("--_child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--_vocab", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_grad-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.steps, args.rounds, args.batch, args.tokens, args.hidden, args.topk, args.mem_passes,
           *args.vocabs) < 1:
        ap.error("--steps, --rounds, --batch, --tokens, --hidden, --topk, --mem-passes and --vocabs must be >= 1")
    if args.length < 2 or not 0 < args.response < 1 or args.topk >= args.vocab:
        ap.error("--length must be >= 2, --response in (0, 1), --topk below --vocab")
    if not (args.throughput or args.memory):
        args.throughput = args.memory = True
    return args


def main() -> None:
    args = parse_args()
    if args._child:
        child_main(args)
        return
    device = resolve_device(args.device)
    t0 = time.perf_counter()
    header = machine(device)
    print_header(header)
    record: dict[str, Any] = {"header": header}
    if args.throughput:
        record["throughput"] = run_throughput(args, device, t0)
    if args.memory:
        record["memory"] = run_memory(args, device, t0)
    header["total_s"] = time.perf_counter() - t0
    header["load_average_end"] = os.getloadavg()
    steal = cpu_steal_s()
    header["cpu_steal_s"] = None if steal is None or header["cpu_steal_s_start"] is None else \
        steal - header["cpu_steal_s_start"]
    stolen = "" if header["cpu_steal_s"] is None else \
        f"; CPU time stolen by the hypervisor during the run {header['cpu_steal_s']:.1f} s"
    print(f"\ntotal {header['total_s']:.0f} s; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in header['load_average_end'])}{stolen}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
