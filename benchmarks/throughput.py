"""Throughput of teachkit's KD step against a plain PyTorch loop and against its own parts, all in one process.

For each teacher -> student pair (``--pairs``; default ResNet-56 -> ResNet-20 and ResNet-32x4 -> ResNet-8x4) on
CIFAR-100 shapes (3x32x32, 100 classes, synthetic data held in memory) and each setting of the engine

    default              LoopConfig's defaults (precision=auto, channels_last=auto; compile off: its own setting),
                         resolved for the device and printed (auto: bf16 autocast + channels_last on CPUs with
                         AVX512-BF16 or AMX and on CUDA GPUs with bf16, else fp32); the teacher run plain
    fp32                 precision=fp32, channels_last=false
    bf16                 precision=bf16, NCHW
    bf16+channels_last   precision=bf16, channels_last=true
    compile              the defaults + compile=true (student and frozen teacher; ``--no-compile`` skips it)

it times, through teachkit's real engine (``fit`` over one epoch: ``BatchLoader`` with the on-device
``Augment(crop_pad=4, flip=True, pad_mode="zeros")``, the lr schedule, the autocast and memory layout the setting
resolves to, the NaN guard, device-side metrics; the teacher a ``FrozenTeacher`` passed as ``frozen=``, its fp32
weights run inside the step's autocast; the per-epoch evaluation is skipped, it is no part of a step):

    KD        0.1 CE + 0.9 Hinton KD (T=4) with the teacher's forward on every batch
    no-KD     the student's CE step alone (teachkit's label step)
    cached    the KD step with the teacher's logits read from a precomputed tensor (rows ``batch.index``, as the
              teacher-output cache serves them): a cached view, no teacher forward
    teacher   the frozen teacher's forward alone (eval, no_grad, the setting's precision and layout)

and the reference: a plain PyTorch KD loop written here -- a ``torch.utils.data.DataLoader`` (num_workers=0) over
a Dataset doing per-sample transforms (random crop with 4-pixel zero padding, as torchvision's
``RandomCrop(32, padding=4)``, and a horizontal flip, in plain tensor ops), the teacher under ``torch.no_grad()``,
the same batch and SGD -- at fp32 and at the precision and layout of every setting. Both pad with zeros (the common
CIFAR recipe; teachkit's ``data.augment_options.pad_mode`` default), so both do the same augmentation work.

A step's time is the gap between the starts of successive steps (so data loading, augmentation, backward and the
optimiser step all count; on CUDA the device is synchronised first), median over ``--steps`` steps after 2
warm-up steps; the compile setting first runs a warm-up epoch that compiles (tens of seconds on a CPU), untimed.
``--rounds`` interleaves every measurement over rounds and keeps each one's best median (noisy machines).
FLOPs of one KD step (student forward + backward, teacher forward) are counted with ``FlopCounterMode``; the
matmul peak (a square matmul of ``--peak-size``, median of 5) is measured per precision in the same process.

Targets (issue "Scale and speed"), checked on the default setting: >= 2.4x the plain fp32 loop's img/s; KD step
<= 1.05x (no-KD step + teacher forward); cached-view KD step <= 1.15x the no-KD step.

Then (e; not with ``--levers``) the host syncs per step of a CRD + KD step through the engine (default settings,
first pair), counted (not timed) with :class:`teachkit.engine.syncs.HostSyncCounter` as the difference between an
epoch of 2S and one of S steps (so per-epoch reads cancel out).

``--levers`` measures instead each lever on its own on top of the default setting, KD step only, interleaved over
the rounds: ``folded_teacher`` (the frozen teacher from ``teachkit.models.inference.inference_teacher``: BatchNorm
folded, weights cast to the setting's precision and layout once; skipped with a note where that module is
missing), ``optim_loop`` and ``optim_fused`` (``optim.implementation``; the default is ``foreach``), ``compile``
(``train.compile=true``; the compiling warm-up epoch's time is printed), and the plain fp32 loop: img/s, vs the
default, vs the plain fp32 loop, GFLOP/s and % of the matmul peak of its precision, with issue 26's AMX targets
(default >= 35% of the peak, >= 3.5x the plain fp32 loop). ``--profile`` adds a ``torch.profiler`` table of the
default KD step (top ``--profile-rows`` ops by self CPU time, self CUDA time on a GPU) and the share of a step spent
fetching and augmenting its batch. The header names the machine (CPU model, logical CPUs, torch threads, AMX and
AVX512-BF16, GPU), in ``--json`` too.

    python benchmarks/throughput.py [--pairs resnet56-resnet20,resnet32x4-resnet8x4] [--steps 10] [--rounds 2]
        [--batch 128 (also try 256)] [--no-compile] [--device cpu|cuda] [--json results.json]
        [--levers] [--profile [--profile-rows 20]]

Issue 26's table on a machine with AMX, in one command:

    python benchmarks/throughput.py --levers --profile --pairs resnet56-resnet20 --steps 30 --rounds 3 --json amx.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode

from teachkit.config import TrainConfig
from teachkit.data import Augment, BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import LoopConfig, OptimConfig, fit
from teachkit.engine.evaluate import ClassificationEvaluator
from teachkit.engine.precision import cpu_flags, cpu_model, fast_bf16, resolve_channels_last, resolve_precision
from teachkit.engine.syncs import HostSyncCounter
from teachkit.engine.trainer import batch_channels_last, channels_last
from teachkit.losses import build_objective, needs_of
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.recipes.standalone import label_step
from teachkit.types import Batch, StepOutput, Taps

PAIRS = {"resnet56-resnet20": ("resnet56", "resnet20"), "resnet32x4-resnet8x4": ("resnet32x4", "resnet8x4")}
#: LoopConfig changes per setting (``default``: none)
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "fp32": {"precision": "fp32", "channels_last": False},
    "bf16": {"precision": "bf16", "channels_last": False},
    "bf16+channels_last": {"precision": "bf16", "channels_last": True},
    "compile": {"compile": True},
}
#: ``--levers``: each lever on its own against the default (LoopConfig changes; ``optim``: OptimConfig changes;
#: ``teacher: folded``: the frozen teacher from ``models.inference.inference_teacher``, BatchNorm folded, weights
#: cast to the setting's precision and layout once)
LEVERS: dict[str, dict[str, Any]] = {
    "default": {},
    "folded_teacher": {"teacher": "folded"},
    "optim_loop": {"optim": {"implementation": "loop"}},
    "optim_fused": {"optim": {"implementation": "fused"}},
    "compile": {"compile": True},
}
#: the profiler's label around each batch fetch (index, gather, on-device augmentation)
DATA_LABEL = "data: BatchLoader batch + Augment"
SHAPE, CLASSES, WARMUP = (3, 32, 32), 100, 2
#: what each setting measures: the KD step, the no-KD step, the cached-view KD step, the teacher forward alone
KINDS = ("kd", "ce", "cached", "teacher")
#: the crop's padding in teachkit and in the plain loop alike: zeros, torchvision's RandomCrop(32, padding=4)
PAD_MODE = "zeros"
#: the issue's targets, checked on the default setting
TARGET_SPEEDUP, TARGET_KD_PARTS, TARGET_CACHED = 2.4, 1.05, 1.15
#: issue 26's targets on a CPU with AMX (``--levers``): % of the matmul peak and speed-up over the plain fp32 loop
TARGET_PEAK_AMX, TARGET_SPEEDUP_AMX = 35.0, 3.5
#: CPU flags that decide which precision runs fast (recorded in the header)
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
DTYPE_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], steps: int, device: torch.device, warmup: int = WARMUP) -> float:
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


class Clock:
    """Start times of successive steps (device synchronised first); :meth:`step_time` is the median gap after
    the warm-up steps."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stamps = device, []

    def tick(self) -> None:
        sync(self.device)
        self.stamps.append(time.perf_counter())

    def step_time(self) -> float:
        stamps = self.stamps[WARMUP:]
        if len(stamps) < 2:
            raise RuntimeError(f"only {len(self.stamps)} steps ran; need at least {WARMUP + 2}")
        return statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def layout_name(precision: str, nhwc: bool) -> str:
    return precision + ("+channels_last" if nhwc else "")


def hinton_kd(zs: Tensor, zt: Tensor, y: Tensor, temperature: float = 4.0) -> Tensor:
    """0.1 CE + 0.9 Hinton KD (T^2-scaled KL), in fp32: the plain loop's objective."""
    zs, zt = zs.float(), zt.float()
    kl = F.kl_div(F.log_softmax(zs / temperature, 1), F.softmax(zt / temperature, 1), reduction="batchmean")
    return 0.1 * F.cross_entropy(zs, y) + 0.9 * kl * temperature**2


# ----------------------------------------------------------------------------------------------- the reference
class CropFlip(Dataset):
    """CIFAR-style per-sample augmentation in plain tensor ops: zero-pad by ``pad``, random crop back to the
    original size, horizontal flip with probability 0.5 (torchvision's RandomCrop(padding=4) +
    RandomHorizontalFlip, which do not import here)."""

    def __init__(self, x: Tensor, y: Tensor, pad: int = 4) -> None:
        self.x, self.y, self.pad = x, y, pad

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        img, p = self.x[i], self.pad
        h, w = img.shape[-2:]
        padded = F.pad(img, (p, p, p, p))
        top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
        img = padded[:, top:top + h, left:left + w]
        if torch.rand(1).item() < 0.5:
            img = img.flip(-1)
        return img, self.y[i]


class PlainLoop:
    """The hand-written KD loop: DataLoader (num_workers=0) over :class:`CropFlip`, teacher forward under
    ``torch.no_grad()``, the student under autocast to ``dtype`` (None: fp32), ``nhwc``: models and batches in
    channels_last, SGD as teachkit's default (lr 0.1, momentum 0.9, weight decay 5e-4)."""

    def __init__(self, student: nn.Module, teacher: nn.Module, data: TensorSplit, batch: int,
                 dtype: torch.dtype | None, nhwc: bool, device: torch.device) -> None:
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        self.student = copy.deepcopy(student).to(device, memory_format=fmt).train()
        self.teacher = copy.deepcopy(teacher).to(device, memory_format=fmt).eval()
        self.opt = torch.optim.SGD(self.student.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        self.scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        self.loader = DataLoader(CropFlip(data.x.cpu(), data.y.cpu()), batch_size=batch, shuffle=True,
                                 num_workers=0, drop_last=True, pin_memory=device.type == "cuda")
        self.dtype, self.nhwc, self.device = dtype, nhwc, device

    def step(self, x: Tensor, y: Tensor) -> None:
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.nhwc:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            with torch.no_grad():
                zt = self.teacher(x)
            zs = self.student(x)
        loss = hinton_kd(zs, zt, y)
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()

    def epoch(self) -> float:
        """Median seconds per step over one epoch of the loader (the batch fetch counts)."""
        clock = Clock(self.device)
        for x, y in self.loader:
            clock.tick()
            self.step(x, y)
        clock.tick()
        return clock.step_time()


# ----------------------------------------------------------------------------------------------- the engine
class StepsOnly(ClassificationEvaluator):
    """The classification evaluator's training metrics (train accuracy, accumulated on the device), without the
    per-epoch evaluation: no part of a step (and no eval-mode graph to compile)."""

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {}


class Arm:
    """One setting of the engine: its own student (the pair's initial weights) and frozen teacher (the pair's
    weights, in the setting's layout; the step's autocast casts them), the KD objective and the cached view's
    logits."""

    def __init__(self, name: str, changes: dict[str, Any], bench: Bench, kinds: tuple[str, ...] = KINDS) -> None:
        self.name, self.bench, self.kinds, device = name, bench, kinds, bench.device
        changes = dict(changes)
        self.optim = OptimConfig(**changes.pop("optim", {}))
        self.folded = changes.pop("teacher", None) == "folded"
        # compile only in the compile setting: train.compile=auto resolves off for runs this short anyway
        self.loop = LoopConfig(epochs=1, progress=False, **{"compile": False, **changes})
        self.compile = self.loop.compile
        self.precision = resolve_precision(self.loop.precision, device)
        self.nhwc = resolve_channels_last(self.loop.channels_last, self.precision)
        self.layout = layout_name(self.precision.name, self.nhwc)
        self.student = bench.fresh_student()
        self.frozen = FrozenTeacher(self.teacher_module())
        s_needs, t_needs = needs_of(["kd"])
        self.s_tap, self.t_tap = Tapped(self.student, want=s_needs), Tapped(self.frozen, want=t_needs)
        probe = bench.data.x[:2]
        with torch.no_grad():
            self.student.eval()
            self.objective = build_objective(["kd"], self.s_tap(probe), self.t_tap(probe), num_classes=CLASSES,
                                             num_samples=len(bench.data)).to(device)
            self.student.train()
        self.cache = self.teacher_logits(bench.data.x) if "cached" in kinds else None
        self.x = self.input(bench.data.x[:bench.batch])
        self.compiled: list[str] = []
        self.compile_s = float("nan")  # the compiling warm-up epoch's wall time (WARMUP steps, compile included)
        self.warnings: list[str] = []
        self.times: dict[str, list[float]] = {k: [] for k in kinds}
        self.peak_mem: list[int] = []

    def teacher_module(self) -> nn.Module:
        """The pair's teacher in the setting's layout, or (``teacher: folded``) the inference teacher: BatchNorm
        folded, weights cast once (an ImportError where ``teachkit.models.inference`` is missing)."""
        if not self.folded:
            return channels_last(copy.deepcopy(self.bench.teacher), self.nhwc)
        from teachkit.models.inference import inference_teacher  # lazily: absent from older checkouts

        example = self.input(self.bench.data.x[:2])
        return inference_teacher(self.bench.teacher, example, dtype=self.precision.dtype, channels_last=self.nhwc,
                                 fold_bn=True)

    def input(self, x: Tensor) -> Tensor:
        return batch_channels_last(x) if self.nhwc else x

    @torch.no_grad()
    def teacher_logits(self, x: Tensor) -> Tensor:
        """The teacher's logits for every sample, in order (the cached view's table)."""
        b = self.bench.batch
        with self.precision.autocast(self.bench.device):
            return torch.cat([self.t_tap(self.input(x[i:i + b])).logits for i in range(0, len(x), b)])

    def step_fn(self, kind: str, clock: Clock | None) -> Callable:
        objective, s_tap, t_tap, cache = self.objective, self.s_tap, self.t_tap, self.cache
        ce = label_step(self.student, TrainConfig())

        def step(batch, progress):
            if clock is not None:
                clock.tick()
            if kind == "ce":
                return ce(batch, progress)
            if kind == "kd":
                t_out = t_tap(batch.x)
            else:  # the cached view: the teacher's rows for this batch's samples
                t_out = Taps(cache[batch.index.to(cache.device)])
            s_out = s_tap(batch.x)
            return StepOutput(objective(s_out, t_out, batch, progress), s_out.logits)

        return step

    def epoch(self, kind: str, batches: BatchLoader, clock: Clock | None = None) -> dict[str, Any]:
        """One epoch of ``kind`` (kd, ce, cached) through ``fit``; returns its summary."""
        modules = {"model": self.student} if kind == "ce" else {"model": self.student, "objective": self.objective}
        frozen = {"teacher": self.frozen} if kind == "kd" else None
        run_dir = Path(self.bench.tmp) / self.name / kind
        result = fit(modules, self.step_fn(kind, clock), batches, self.optim, self.bench.evaluator, run_dir,
                     loop=self.loop, frozen=frozen)
        for warning in result.summary.get("warnings", []):
            if warning not in self.warnings:
                self.warnings.append(warning)
        return result.summary

    def warm_up(self) -> None:
        """The compile setting: compile (student train graph, teacher forward) in an untimed epoch per kind."""
        warm = BatchLoader(TensorSplit(self.bench.data.x[:WARMUP * self.bench.batch],
                                       self.bench.data.y[:WARMUP * self.bench.batch]),
                           self.bench.batch, shuffle=False, seed=0, augment=self.bench.augment)
        for kind in ("kd", "ce", "cached"):
            if kind not in self.kinds:
                continue
            start = time.perf_counter()
            summary = self.epoch(kind, warm)
            if kind == "kd":
                self.compile_s = time.perf_counter() - start
                self.compiled = list(summary.get("compiled", []))
                if not self.compiled:  # the engine fell back to eager (its warning is kept): no more attempts
                    self.loop = dataclasses.replace(self.loop, compile=False)

    def measure(self) -> None:
        """One round: the KD, no-KD and cached-view steps through the engine and the teacher forward alone."""
        device = self.bench.device
        for kind in ("kd", "ce", "cached"):
            if kind not in self.kinds:
                continue
            if device.type == "cuda" and kind == "kd":
                torch.cuda.reset_peak_memory_stats(device)
            clock = Clock(device)
            self.epoch(kind, self.bench.loader, clock)
            self.times[kind].append(clock.step_time())
            if device.type == "cuda" and kind == "kd":
                self.peak_mem.append(torch.cuda.max_memory_allocated(device))
        if "teacher" not in self.kinds:
            return

        def teacher_forward() -> None:
            with self.precision.autocast(device):
                self.t_tap(self.x)

        self.times["teacher"].append(timed(teacher_forward, self.bench.steps, device))

    def best(self, kind: str) -> float:
        return min(self.times[kind])


class Bench:
    """One teacher -> student pair: the synthetic data, the initial weights, the settings and the plain loops."""

    def __init__(self, teacher: str, student: str, args: argparse.Namespace, device: torch.device, tmp: str) -> None:
        self.teacher_name, self.student_name = teacher, student
        self.device, self.batch, self.steps, self.tmp = device, args.batch, args.steps, f"{tmp}/{teacher}-{student}"
        torch.manual_seed(0)
        n = (args.steps + WARMUP + 1) * args.batch
        n_all = max(n, 2 * args.sync_steps * args.batch)
        x, y = torch.randn(n_all, *SHAPE), torch.randint(0, CLASSES, (n_all,))
        self.data = TensorSplit(x[:n].to(device), y[:n].to(device))  # the timed epochs: steps + warm-up + 1 batches
        self.all = TensorSplit(x.to(device), y.to(device))  # also the host-sync count's epochs
        self.augment = Augment(crop_pad=4, flip=True, pad_mode=PAD_MODE)  # as the plain loop's CropFlip
        self.loader = BatchLoader(self.data, args.batch, shuffle=True, seed=0, augment=self.augment)
        self.evaluator = StepsOnly({}, CLASSES)
        self.teacher = build_model(teacher, SHAPE, CLASSES).to(device).eval()
        self.student_init = build_model(student, SHAPE, CLASSES).state_dict()
        self.notes: list[str] = []
        self.arms = self.build_arms(args)
        wanted = {("fp32", False)} if args.levers else {("fp32", False), *((a.precision.name, a.nhwc)
                                                                          for a in self.arms)}
        self.plain = {layout_name(p, nhwc): PlainLoop(self.fresh_student(), self.teacher, self.data, args.batch,
                                                      None if p == "fp32" else DTYPES[p], nhwc, device)
                      for p, nhwc in sorted(wanted, key=lambda k: (k[0] != "fp32", k))}
        self.plain_times: dict[str, list[float]] = {k: [] for k in self.plain}
        self.flops = kd_flops(self.fresh_student(), self.teacher, self.data.x[:args.batch], self.data.y[:args.batch])

    def build_arms(self, args: argparse.Namespace) -> list[Arm]:
        """The settings (``--levers``: the levers, KD step only); a lever that cannot be built here (the folded
        teacher without ``teachkit.models.inference``) is skipped with a note."""
        table, kinds = (LEVERS, ("kd",)) if args.levers else (SETTINGS, KINDS)
        arms = []
        for name, changes in table.items():
            if args.no_compile and changes.get("compile"):
                continue
            try:
                arms.append(Arm(name, changes, self, kinds))
            except ImportError as e:
                self.notes.append(f"setting {name} skipped: {e}")
        return arms

    def fresh_student(self) -> nn.Module:
        model = build_model(self.student_name, SHAPE, CLASSES)
        model.load_state_dict(self.student_init)
        return model.to(self.device).train()

    def warm_up(self) -> None:
        for arm in self.arms:
            if arm.compile:
                arm.warm_up()

    def measure(self) -> None:
        """One round: every plain loop, then every setting."""
        for name, plain in self.plain.items():
            self.plain_times[name].append(plain.epoch())
        for arm in self.arms:
            arm.measure()

    def plain_best(self, layout: str) -> float:
        return min(self.plain_times[layout])


def kd_flops(student: nn.Module, teacher: nn.Module, x: Tensor, y: Tensor) -> int:
    """FLOPs of one KD step: the student's forward and backward and the teacher's forward (FlopCounterMode counts
    matmuls and convolutions; the same in any precision)."""
    student, teacher = copy.deepcopy(student).train(), copy.deepcopy(teacher).eval()
    with FlopCounterMode(display=False) as counter:
        with torch.no_grad():
            zt = teacher(x)
        hinton_kd(student(x), zt, y).backward()
    return int(counter.get_total_flops())


def matmul_peak(precision: str, size: int, device: torch.device, repeats: int = 5) -> float:
    """GFLOP/s of a ``size`` x ``size`` matmul in ``precision``, median of ``repeats`` after one warm-up."""
    dtype = DTYPES[precision]
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    return 2 * size**3 / timed(lambda: a @ b, repeats, device, warmup=1) / 1e9


def host_syncs(bench: Bench, sync_steps: int) -> tuple[float, dict[str, float]]:
    """Host syncs per step of a CRD + KD step through the engine with the default settings: the difference
    between an epoch of 2S and one of S steps, per step; and per kind of read."""
    arm = next(a for a in bench.arms if a.name == "default")
    methods = ["crd", "kd"]
    s_needs, t_needs = needs_of(methods)
    counts = {}
    for steps in (sync_steps, 2 * sync_steps):  # each run built afresh, so one-time reads cancel out too
        student = bench.fresh_student()
        s_tap, t_tap = Tapped(student, want=s_needs), Tapped(arm.frozen, want=t_needs)
        with torch.no_grad():
            student.eval()
            probe = bench.all.x[:2]
            objective = build_objective(methods, s_tap(probe), t_tap(probe), num_classes=CLASSES,
                                        num_samples=len(bench.all)).to(bench.device)
            student.train()

        def step(batch, progress, s_tap=s_tap, t_tap=t_tap, objective=objective):
            t_out, s_out = t_tap(batch.x), s_tap(batch.x)
            return StepOutput(objective(s_out, t_out, batch, progress), s_out.logits)

        part = BatchLoader(bench.all.subset(torch.arange(steps * bench.batch, device=bench.device)), bench.batch,
                           shuffle=True, seed=0, augment=bench.augment)
        with HostSyncCounter() as counter:
            fit({"model": student, "objective": objective}, step, part, OptimConfig(), bench.evaluator,
                f"{bench.tmp}/crd{steps}", loop=arm.loop, frozen={"teacher": arm.frozen})
        counts[steps] = counter
    per_step = (counts[2 * sync_steps].total - counts[sync_steps].total) / sync_steps
    kinds = counts[2 * sync_steps].counts - counts[sync_steps].counts
    return per_step, {k: v / sync_steps for k, v in sorted(kinds.items())}


# ----------------------------------------------------------------------------------------------- profile
class LabelledLoader(BatchLoader):
    """A :class:`BatchLoader` whose every batch fetch (index, gather, augmentation) runs under ``DATA_LABEL``."""

    def batches(self, epoch: int) -> Iterator[Batch]:
        batches = super().batches(epoch)
        while True:
            with record_function(DATA_LABEL):
                batch = next(batches, None)
            if batch is None:
                return
            yield batch


def profile_default(bench: Bench, rows: int) -> dict[str, Any]:
    """``torch.profiler`` over one epoch of the default setting's KD step through the engine: the top ``rows`` ops
    by self CPU time (self CUDA time on a GPU), and the share of a step spent fetching and augmenting its batch."""
    arm = next(a for a in bench.arms if a.name == "default")
    cuda = bench.device.type == "cuda"
    loader = LabelledLoader(bench.data, bench.batch, shuffle=True, seed=0, augment=bench.augment)
    clock = Clock(bench.device)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        arm.epoch("kd", loader, clock)
    events = prof.key_averages()
    device_key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    sort_key = device_key if cuda else "self_cpu_time_total"
    steps, step_ms = len(loader), clock.step_time() * 1e3
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    ranked = sorted((e for e in events if e.key != DATA_LABEL), key=lambda e: getattr(e, sort_key), reverse=True)
    top = [{"op": e.key, "calls_per_step": e.count / steps, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "self_cpu_percent": 100 * e.self_cpu_time_total / total, "cpu_total_ms_per_step": e.cpu_time_total / 1e3
            / steps, **({"self_cuda_ms_per_step": getattr(e, device_key) / 1e3 / steps} if cuda else {})}
           for e in ranked[:rows]]
    data = next((e for e in events if e.key == DATA_LABEL), None)
    data_ms = data.cpu_time_total / 1e3 / data.count if data is not None and data.count else float("nan")
    return {"setting": "default", "pair": f"{bench.teacher_name} -> {bench.student_name}", "steps": steps,
            "step_ms_profiled": step_ms, "sorted_by": sort_key, "top_ops": top, "data_ms_per_step": data_ms,
            "data_percent_of_step": 100 * ratio(data_ms, step_ms),
            "table": events.table(sort_by=sort_key, row_limit=rows)}


def print_profile(prof: dict[str, Any]) -> None:
    print(f"\n### profile: {prof['pair']}, default setting, {prof['steps']} KD steps through the engine "
          f"(median step {prof['step_ms_profiled']:.1f} ms under the profiler), top {len(prof['top_ops'])} ops by "
          f"{prof['sorted_by']}\n")
    print(prof["table"])
    print(f"data (batch gather + on-device augmentation, label {DATA_LABEL!r}): {prof['data_ms_per_step']:.2f} ms per "
          f"step = {prof['data_percent_of_step']:.1f}% of the step")


# ----------------------------------------------------------------------------------------------- report
def progress(message: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.0f} s] {message}", file=sys.stderr, flush=True)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model, logical CPUs, torch and its threads, AMX and AVX512-BF16 (the
    instructions that make CPU bf16 fast), and the GPU where CUDA is available; so figures from different machines
    are never mixed."""
    flags = cpu_flags()
    info: dict[str, Any] = {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
                            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                            "amx": bool({"amx_bf16", "amx_tile"} & flags), "avx512_bf16": "avx512_bf16" in flags,
                            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    return info


def machine_line(info: dict[str, Any]) -> str:
    yes = {True: "yes", False: "no"}
    gpu = f", GPU {info['gpu']}" if info["gpu"] else ""
    return (f"CPU {info['cpu_model']} ({info['logical_cpus']} logical CPUs), torch {info['torch']} with "
            f"{info['torch_threads']} threads, AMX: {yes[info['amx']]}, AVX512-BF16: {yes[info['avx512_bf16']]}{gpu}")


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def verdict(value: float, target: float, at_least: bool) -> str:
    if not math.isfinite(value):
        return "not measured"
    return "met" if (value >= target if at_least else value <= target) else "not met"


def results_of(bench: Bench, peaks: dict[str, float]) -> dict[str, Any]:
    """Every figure of one pair (best median per measurement over the rounds)."""
    b, plain_fp32 = bench.batch, bench.plain_best("fp32")
    out: dict[str, Any] = {"teacher": bench.teacher_name, "student": bench.student_name,
                           "kd_step_gflop": bench.flops / 1e9, "settings": {}, "plain": {}}
    for arm in bench.arms:
        kd, ce, cached, teacher = (arm.best(k) for k in ("kd", "ce", "cached", "teacher"))
        plain_same = bench.plain_best(arm.layout)
        gflops = bench.flops / kd / 1e9
        row = {"precision": arm.precision.name, "channels_last": arm.nhwc, "compile": arm.compile,
               "compiled": arm.compiled, "kd_step_ms": kd * 1e3, "images_per_s": b / kd,
               "no_kd_step_ms": ce * 1e3, "teacher_forward_ms": teacher * 1e3, "cached_kd_step_ms": cached * 1e3,
               "speedup_vs_plain_fp32": ratio(plain_fp32, kd), "plain_same_layout": arm.layout,
               "speedup_vs_plain_same": ratio(plain_same, kd), "kd_over_parts": ratio(kd, ce + teacher),
               "cached_over_no_kd": ratio(cached, ce), "gflop_per_s": gflops,
               "percent_of_peak": 100 * ratio(gflops, peaks[arm.precision.name])}
        if arm.peak_mem:
            row["cuda_peak_mib"] = max(arm.peak_mem) / 2**20
        if arm.warnings:
            row["warnings"] = arm.warnings
        out["settings"][arm.name] = row
    for layout in bench.plain:
        t = bench.plain_best(layout)
        gflops = bench.flops / t / 1e9
        out["plain"][layout] = {"kd_step_ms": t * 1e3, "images_per_s": b / t,
                                "speedup_vs_plain_fp32": ratio(plain_fp32, t), "gflop_per_s": gflops,
                                "percent_of_peak": 100 * ratio(gflops, peaks[layout.split("+")[0]])}
    default = out["settings"].get("default", {})
    nan = float("nan")
    out["targets"] = [
        {"what": "default setting vs the plain fp32 loop (img/s ratio)", "target": f">= {TARGET_SPEEDUP}",
         "measured": default.get("speedup_vs_plain_fp32", nan),
         "verdict": verdict(default.get("speedup_vs_plain_fp32", nan), TARGET_SPEEDUP, True)},
        {"what": "default setting: KD step / (no-KD step + teacher forward)", "target": f"<= {TARGET_KD_PARTS}",
         "measured": default.get("kd_over_parts", nan),
         "verdict": verdict(default.get("kd_over_parts", nan), TARGET_KD_PARTS, False)},
        {"what": "default setting: cached-view KD step / no-KD step", "target": f"<= {TARGET_CACHED}",
         "measured": default.get("cached_over_no_kd", nan),
         "verdict": verdict(default.get("cached_over_no_kd", nan), TARGET_CACHED, False)},
    ]
    return out


def levers_of(bench: Bench, peaks: dict[str, float]) -> dict[str, Any]:
    """The ``--levers`` figures of one pair: each lever's KD step against the default and the plain fp32 loop."""
    b, plain_fp32 = bench.batch, bench.plain_best("fp32")
    default = next(a for a in bench.arms if a.name == "default").best("kd")
    out: dict[str, Any] = {"teacher": bench.teacher_name, "student": bench.student_name,
                           "kd_step_gflop": bench.flops / 1e9, "levers": {}, "notes": bench.notes}
    for arm in bench.arms:
        kd = arm.best("kd")
        gflops = bench.flops / kd / 1e9
        row = {"runs_as": arm.layout, "kd_step_ms": kd * 1e3, "images_per_s": b / kd,
               "vs_default": ratio(default, kd), "vs_plain_fp32": ratio(plain_fp32, kd), "gflop_per_s": gflops,
               "percent_of_peak": 100 * ratio(gflops, peaks[arm.precision.name]), "precision": arm.precision.name}
        if arm.compile:
            row.update(compiled=arm.compiled, compile_warmup_s=arm.compile_s)
        if arm.warnings:
            row["warnings"] = arm.warnings
        out["levers"][arm.name] = row
    gflops = bench.flops / plain_fp32 / 1e9
    out["levers"]["plain fp32 loop"] = {
        "runs_as": "fp32", "kd_step_ms": plain_fp32 * 1e3, "images_per_s": b / plain_fp32,
        "vs_default": ratio(default, plain_fp32), "vs_plain_fp32": 1.0, "gflop_per_s": gflops,
        "percent_of_peak": 100 * ratio(gflops, peaks["fp32"]), "precision": "fp32"}
    return out


def print_levers(res: dict[str, Any], batch: int) -> None:
    print(f"\n### levers, {res['teacher']} -> {res['student']}: batch {batch}, {res['kd_step_gflop']:.1f} GFLOP per "
          "KD step; each lever alone on top of the default\n")
    print("| setting | runs as | KD step ms | img/s | vs default | vs plain fp32 loop | GFLOP/s | % of peak |")
    print("|---" * 8 + "|")
    for name, r in res["levers"].items():
        runs = r["runs_as"] + (" + compile" if "compiled" in r else "")
        if "compiled" in r and not r["compiled"]:
            runs += " (eager fallback)"
        cells = [name, runs, f"{r['kd_step_ms']:.1f}", f"{r['images_per_s']:.0f}", f"{r['vs_default']:.3f}",
                 f"{r['vs_plain_fp32']:.2f}", f"{r['gflop_per_s']:.1f}", f"{r['percent_of_peak']:.1f}"]
        print("| " + " | ".join(cells) + " |")
    for name, r in res["levers"].items():
        if "compile_warmup_s" in r:
            print(f"{name}: the compiling warm-up epoch ({WARMUP} steps) took {r['compile_warmup_s']:.1f} s")
        for warning in r.get("warnings", []):
            print(f"note: {name}: {warning}")
    for note in res["notes"]:
        print(f"note: {note}")


def print_lever_targets(res: dict[str, Any]) -> None:
    """The issue's targets for the default setting (meant for a machine with AMX): >= 35% of its precision's matmul
    peak and >= 3.5x the plain fp32 loop."""
    default = res["levers"]["default"]
    res["targets"] = [
        {"what": f"default setting: % of the {default['precision']} matmul peak", "target": f">= {TARGET_PEAK_AMX}",
         "measured": default["percent_of_peak"], "verdict": verdict(default["percent_of_peak"], TARGET_PEAK_AMX, True)},
        {"what": "default setting vs the plain fp32 loop (img/s ratio)", "target": f">= {TARGET_SPEEDUP_AMX}",
         "measured": default["vs_plain_fp32"], "verdict": verdict(default["vs_plain_fp32"], TARGET_SPEEDUP_AMX, True)},
    ]
    amx = "amx_bf16" in cpu_flags()
    for t in res["targets"]:
        if not amx:  # recorded, but the targets are the AMX machine's: no verdict here
            t["verdict"] = "n/a (no AMX here)"
        print(f"target (AMX machines): {t['what']} {t['target']}: measured {t['measured']:.3f} -> {t['verdict']}")


def print_pair(res: dict[str, Any], batch: int, cuda: bool) -> None:
    print(f"\n### {res['teacher']} -> {res['student']}: batch {batch}, {res['kd_step_gflop']:.1f} GFLOP per KD step "
          f"(student forward + backward, teacher forward)\n")
    mem = " peak MiB |" if cuda else ""
    print("| setting | runs as | KD step ms | img/s | x plain fp32 | x plain same | KD / (no-KD + teacher) "
          "| cached KD / no-KD | no-KD ms | teacher ms | cached KD ms | GFLOP/s | % of peak |" + mem)
    print("|---" * (13 + cuda) + "|")
    for name, r in res["settings"].items():
        runs = r["plain_same_layout"] + (" + compile" if r["compile"] else "")
        if r["compile"] and not r["compiled"]:
            runs += " (eager fallback)"
        cells = [name, runs, f"{r['kd_step_ms']:.1f}", f"{r['images_per_s']:.0f}",
                 f"{r['speedup_vs_plain_fp32']:.2f}", f"{r['speedup_vs_plain_same']:.2f}",
                 f"{r['kd_over_parts']:.3f}", f"{r['cached_over_no_kd']:.3f}", f"{r['no_kd_step_ms']:.1f}",
                 f"{r['teacher_forward_ms']:.1f}", f"{r['cached_kd_step_ms']:.1f}", f"{r['gflop_per_s']:.1f}",
                 f"{r['percent_of_peak']:.1f}"]
        if cuda:
            cells.append(f"{r.get('cuda_peak_mib', float('nan')):.0f}")
        print("| " + " | ".join(cells) + " |")
    for layout, r in res["plain"].items():
        cells = [f"plain {layout}", layout, f"{r['kd_step_ms']:.1f}", f"{r['images_per_s']:.0f}",
                 f"{r['speedup_vs_plain_fp32']:.2f}", "1.00", "-", "-", "-", "-", "-", f"{r['gflop_per_s']:.1f}",
                 f"{r['percent_of_peak']:.1f}"] + (["-"] if cuda else [])
        print("| " + " | ".join(cells) + " |")
    print()
    for t in res["targets"]:
        print(f"target: {t['what']} {t['target']}: measured {t['measured']:.3f} -> {t['verdict']}")
    for name, r in res["settings"].items():
        for warning in r.get("warnings", []):
            print(f"note: {name}: {warning}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default=",".join(PAIRS),
                    help=f"comma-separated teacher-student pairs among {', '.join(PAIRS)} (default: both)")
    ap.add_argument("--teacher", help="override the teacher of every pair (any teachkit model name)")
    ap.add_argument("--student", help="override the student of every pair (e.g. resnet8 for a smoke run)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per median (after 2 warm-up steps)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best median of each is kept")
    ap.add_argument("--batch", type=int, default=128, help="batch size (default 128; also try 256)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu or cuda[:N] (default: cuda when available)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile setting (torch.compile)")
    ap.add_argument("--peak-size", type=int, default=0,
                    help="side of the square matmul measuring the peak (default: 2048 on CPU, 4096 on CUDA)")
    ap.add_argument("--sync-steps", type=int, default=4, help="steps S of the host-sync count (e); 0 skips it")
    ap.add_argument("--json", type=Path, help="also write every figure and the settings to this JSON file")
    ap.add_argument("--levers", action="store_true",
                    help="measure each lever alone against the default (folded teacher, optimiser kernels, compile) "
                         "and the plain fp32 loop, KD step only, instead of the settings")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the default KD step (torch.profiler): top ops and the data share of a step")
    ap.add_argument("--profile-rows", type=int, default=20, help="ops in the --profile table (default 20)")
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.batch < 1 or args.sync_steps < 0 or args.profile_rows < 1:
        ap.error("--steps, --rounds, --batch and --profile-rows must be >= 1, --sync-steps >= 0")
    names = [p.strip() for p in args.pairs.split(",") if p.strip()]
    unknown = [p for p in names if p not in PAIRS]
    if unknown or not names:
        ap.error(f"unknown pair(s) {', '.join(unknown) or '(none)'}; choose among {', '.join(PAIRS)}")
    pairs = list(dict.fromkeys((args.teacher or PAIRS[p][0], args.student or PAIRS[p][1]) for p in names))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available")
    peak_size = args.peak_size or (4096 if device.type == "cuda" else 2048)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="teachkit-throughput-") as tmp:
        benches = [Bench(t, s, args, device, tmp) for t, s in pairs]
        arms0 = benches[0].arms
        precisions = list(dict.fromkeys(["fp32", *(a.precision.name for a in arms0)]))
        flags = sorted(set(FLAGS) & cpu_flags())
        table = LEVERS if args.levers else SETTINGS
        header = {"machine": machine(), "mode": "levers" if args.levers else "settings",
                  "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "cpu_flags": flags, "fast_bf16": fast_bf16(device),
                  "batch": args.batch, "steps": args.steps, "warmup_steps": WARMUP, "rounds": args.rounds,
                  "peak_matmul_size": peak_size,
                  "data": f"synthetic 3x32x32, 100 classes, Augment(crop_pad=4, flip=True, pad_mode={PAD_MODE!r}) "
                          "(the plain loop: the same zero-padded crop + flip per sample)",
                  "objective": "0.1 CE + 0.9 Hinton KD (T=4)",
                  "teacher": "FrozenTeacher, fp32 weights under the step's autocast",
                  "settings": {a.name: {"loop": table[a.name], "precision": a.precision.name,
                                        "channels_last": a.nhwc, "compile": a.compile} for a in arms0}}
        if device.type == "cuda":  # fp32 matmuls and convolutions may run in TF32 (then % of the fp32 peak > 100)
            header["tf32"] = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                              "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
        print(machine_line(header["machine"]))
        print(f"device {device} ({header['device_name']}), torch {torch.__version__}, {header['threads']} threads, "
              f"CPU flags: {' '.join(flags) or 'none of ' + ' '.join(FLAGS)}, fast bf16: {header['fast_bf16']}")
        print(f"batch {args.batch}, median over {args.steps} steps after {WARMUP} warm-up steps, best of "
              f"{args.rounds} interleaved round(s); {header['data']}; {header['objective']}; teacher: "
              f"{header['teacher']}")
        for a in arms0:
            loop = ", ".join(f"{k}={v}" for k, v in table[a.name].items()) or "LoopConfig defaults"
            print(f"setting {a.name}: {loop} -> runs {a.layout}{' + torch.compile' if a.compile else ''}")
        if "tf32" in header:
            print(f"fp32 matmul precision {header['tf32']['float32_matmul_precision']} (high: TF32), cuDNN TF32 "
                  f"{header['tf32']['cudnn_allow_tf32']}")

        for bench in benches:
            if any(a.compile for a in bench.arms):
                progress(f"compiling {bench.teacher_name} -> {bench.student_name} (untimed warm-up)", t0)
            bench.warm_up()
        peak_runs: dict[str, list[float]] = {p: [] for p in precisions}
        for r in range(args.rounds):  # interleaved, so drift in machine load hits every measurement alike
            for p in precisions:
                peak_runs[p].append(matmul_peak(p, peak_size, device))
            for bench in benches:
                progress(f"round {r + 1}/{args.rounds}: {bench.teacher_name} -> {bench.student_name}", t0)
                bench.measure()
        peaks = {p: max(v) for p, v in peak_runs.items()}
        header["peak_gflop_per_s"] = peaks
        print(f"matmul peak ({peak_size}x{peak_size}, median of 5, best of {args.rounds}): "
              + ", ".join(f"{p} {v:.1f} GFLOP/s" for p, v in peaks.items()))
        if not args.levers:
            print("x plain fp32 / x plain same: img/s over the plain PyTorch loop's at fp32 / at the setting's "
                  "precision and layout; KD / (no-KD + teacher) and cached KD / no-KD: step-time ratios")
        if args.levers:
            results = [levers_of(bench, peaks) for bench in benches]
            for res in results:
                print_levers(res, args.batch)
                print_lever_targets(res)
        else:
            results = [results_of(bench, peaks) for bench in benches]
            for res in results:
                print_pair(res, args.batch, device.type == "cuda")
        prof = None
        if args.profile:
            progress("profiling the default KD step", t0)
            prof = profile_default(benches[0], args.profile_rows)
            print_profile(prof)

        syncs = None
        if args.sync_steps and not args.levers:
            per_step, kinds = host_syncs(benches[0], args.sync_steps)
            syncs = {"per_step": per_step, "by_kind": kinds}
            print(f"\n(e) CRD + KD step through the engine ({benches[0].teacher_name} -> {benches[0].student_name}, "
                  f"default setting): {per_step:.2f} host syncs per step "
                  f"({', '.join(f'{k} {v:g}' for k, v in kinds.items()) or 'none'})")
        header["total_s"] = time.perf_counter() - t0
        print(f"\ntotal {header['total_s']:.0f} s (set-up, compilation and every measurement)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"header": header, "pairs": results, "host_syncs": syncs, "profile": prof}
        args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
