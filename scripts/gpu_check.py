"""The GPU kit (issue 26): one command that checks teachkit on a CUDA GPU and records the numbers.

    scripts/gpu_check.sh OUT_DIR [--device auto|cuda|cpu] [--quick] [--only NAME,...] [--budget S]
        [--compile-throughput]

Each check runs in its own worker process (``--worker NAME``) with its own timeout, so a hung or crashed
check (a CUDA error poisons its process) leaves the others running; the whole kit stops starting checks once
``--budget`` seconds (default 450, under the 8 minutes a lent GPU allows) are spent. After every check
``OUT_DIR/gpu_check.json`` and ``OUT_DIR/gpu_check.md`` are rewritten (atomically), so a kit cut short still
leaves the finished checks. Each check reports ``pass``, ``fail`` or ``skip`` (with the reason), its seconds, the
values it measured and the tolerances it compared them with. Nothing is downloaded.

Checks (see docs/gpu.md):

- ``cuda_tests``: the suite's ``pytest.mark.cuda`` tests (they skip without CUDA);
- ``train_step``: KD steps (ResNet-20 -> ResNet-8, CIFAR shapes) through the engine in fp32, bf16, fp16 with the
  gradient scaler, fp32 channels_last, the device default and fp32 + torch.compile, each against the same steps on
  the CPU in fp32 (same initial weights, same batches): per-step loss and the weight update;
- ``teacher_cache``: KD students with ``teacher.cache`` auto vs off on the device;
- ``l2t_hypergradient``: the L2T-DLF hypergradient on the device against float64 central finite differences;
- ``minilm``: a MiniLM-L6 text model (bundled weights, else a MiniLM-L6-shaped BERT with random weights) forward
  and backward through ``HFTextModel``, logits against the CPU's, time per step;
- ``beam_search``: translation beam search (toy translation task, small Transformer) on the device vs the CPU;
- ``torchrun_nccl``: ``torchrun --nproc_per_node 1 -m teachkit.cli train`` on the device, and an NCCL (gloo on
  CPU) all-reduce in a world-1 process group;
- ``throughput``: ``benchmarks/throughput.py`` (teachkit's default setting vs a plain PyTorch loop) for
  ResNet-56 -> ResNet-20 and ResNet-32x4 -> ResNet-8x4 on CIFAR-shaped synthetic data.

fp32 comparisons run with TF32 off (``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32``), so a
CUDA fp32 result is held to float32 rounding, not TF32's 10-bit mantissa.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from teachkit.config import from_dict
from teachkit.data import BatchLoader, load_raw
from teachkit.data.base import TensorSplit
from teachkit.data.parallel import PAD, shift_right
from teachkit.engine import ClassificationEvaluator, LoopConfig, OptimConfig, Trainer
from teachkit.engine.checkpoint import atomic_write
from teachkit.engine.precision import cpu_model, fast_bf16
from teachkit.errors import ConfigError
from teachkit.losses import build_objective, needs_of
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.models.decoding import beam_search, greedy
from teachkit.models.text import HFTextModel
from teachkit.recipes import distill, train_model
from teachkit.recipes.l2t.hypergrad import (
    FunctionalStudent,
    InnerOptimizer,
    hypergradient,
    teacher_params,
    unroll,
)
from teachkit.recipes.l2t.loss import dev_cross_entropy, l2t_student_loss
from teachkit.recipes.l2t.teachers import build_teacher
from teachkit.types import Batch, StepOutput

ROOT = Path(__file__).resolve().parents[1]
#: the default wall-clock budget of the whole kit, seconds (a lent GPU gives 15 minutes in all; 8 for the kit)
BUDGET_S = 450.0
#: a check is not started with less than this many seconds of the budget left
MIN_START_S = 20.0
SHAPE, CLASSES = (3, 32, 32), 10


# ----------------------------------------------------------------------------------------------- results
def result(status: str, values: dict[str, Any] | None = None, tolerances: dict[str, Any] | None = None,
           reason: str = "") -> dict[str, Any]:
    """A check's outcome: ``pass``, ``fail`` or ``skip``, what it measured, what it compared against, why."""
    out: dict[str, Any] = {"status": status, "values": values or {}, "tolerances": tolerances or {}}
    if reason:
        out["reason"] = reason
    return out


def skip(reason: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    return result("skip", values, reason=reason)


def combine(parts: dict[str, dict[str, Any]]) -> str:
    """The status of a check made of parts: fail if any failed, pass if any passed, else skip."""
    statuses = {p["status"] for p in parts.values()}
    return "fail" if "fail" in statuses else "pass" if "pass" in statuses else "skip"


def rel(a: float, b: float) -> float:
    """|a - b| / max(|b|, 1e-12)."""
    return abs(a - b) / max(abs(b), 1e-12)


@dataclass
class Context:
    """What a check gets: the device, quick mode (CPU CI), a scratch folder and its seconds left."""

    device: torch.device
    quick: bool
    work: Path
    deadline: float
    compile_throughput: bool = False

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self, margin: float = 5.0) -> float:
        """Seconds left for a subprocess of this check (its own timeout, less ``margin``)."""
        return max(1.0, self.deadline - time.monotonic() - margin)


def run_command(cmd: list[str], ctx: Context, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``cmd`` from the repository root with the check's remaining time as timeout (output captured)."""
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=ctx.left(),
                          env={**os.environ, **(env or {})})


def tail(text: str, n: int = 1500) -> str:
    return text[-n:]


# ----------------------------------------------------------------------------------------------- cuda_tests
def junit_counts(path: Path) -> dict[str, int]:
    """Tests, failures, errors and skips of a pytest ``--junitxml`` file, summed over its suites."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def check_cuda_tests(ctx: Context) -> dict[str, Any]:
    """``pytest -m cuda`` over the test files that mark tests ``cuda`` (they skip without CUDA)."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if "mark.cuda" in p.read_text(encoding="utf-8"))
    if not files:
        return result("fail", reason="no test file marks tests with pytest.mark.cuda")
    xml = ctx.work / "cuda_tests.xml"
    proc = run_command([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-o",
                        "addopts=", f"--junitxml={xml}", *files], ctx)
    if not xml.is_file():
        return result("fail", {"output": tail(proc.stdout + proc.stderr)}, reason=f"pytest exited {proc.returncode}")
    counts = junit_counts(xml)
    values = {**counts, "files": files, "returncode": proc.returncode, "output": tail(proc.stdout, 800)}
    if counts["failures"] or counts["errors"] or proc.returncode not in (0, 5):
        return result("fail", values, reason=f"{counts['failures']} failed, {counts['errors']} errors")
    if counts["passed"] == 0:
        return skip(f"all {counts['skipped']} cuda-marked tests skipped (no CUDA)", values)
    return result("pass", values)


# ----------------------------------------------------------------------------------------------- train_step
#: LoopConfig changes per mode, and (loss, update) relative tolerances against the CPU's fp32 steps
TRAIN_MODES: dict[str, tuple[dict[str, Any], tuple[float, float]]] = {
    "fp32": ({"precision": "fp32", "channels_last": False}, (1e-4, 1e-3)),
    "bf16": ({"precision": "bf16", "channels_last": False}, (2e-2, 1e-1)),
    "fp16+scaler": ({"precision": "fp16", "channels_last": False}, (2e-2, 5e-2)),
    "fp32+channels_last": ({"precision": "fp32", "channels_last": True}, (1e-4, 1e-3)),
    "default": ({}, (2e-2, 1e-1)),
    "fp32+compile": ({"precision": "fp32", "channels_last": False, "compile": True}, (1e-4, 1e-3)),
}


class NoEval(ClassificationEvaluator):
    """The classification evaluator's training metrics without a per-epoch evaluation (no part of a step)."""

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {}


def kd_steps(device: torch.device, changes: dict[str, Any], init: dict[str, dict[str, Tensor]],
             data: tuple[Tensor, Tensor], batch: int, run_dir: Path) -> dict[str, Any]:
    """KD steps (0.1 CE + 0.9 Hinton KD, T=4, through ``Trainer``) of ResNet-20 -> ResNet-8 from ``init`` on
    ``device``: per-step losses, the student's final parameters (CPU), and what the engine resolved."""
    teacher, student = build_model("resnet20", SHAPE, CLASSES), build_model("resnet8", SHAPE, CLASSES)
    teacher.load_state_dict(init["teacher"])
    student.load_state_dict(init["student"])
    teacher, student = teacher.to(device), student.to(device)
    frozen = FrozenTeacher(teacher)
    s_needs, t_needs = needs_of(["kd"])
    s_tap, t_tap = Tapped(student, want=s_needs), Tapped(frozen, want=t_needs)
    x, y = data[0].to(device), data[1].to(device)
    with torch.no_grad():
        student.eval()
        objective = build_objective(["kd"], s_tap(x[:2]), t_tap(x[:2]), num_classes=CLASSES, num_samples=len(y))
        student.train()
    objective = objective.to(device)
    losses: list[Tensor] = []

    def step(b: Any, progress: Any) -> StepOutput:
        s_out, t_out = s_tap(b.x), t_tap(b.x)
        terms = objective(s_out, t_out, b, progress)
        losses.append(sum(terms.values()).detach().float())
        return StepOutput(terms, s_out.logits)

    loop = LoopConfig(epochs=1, progress=False, **changes)
    batches = BatchLoader(TensorSplit(x, y), batch, shuffle=False, seed=0)
    trainer = Trainer({"model": student, "objective": objective}, step, batches, OptimConfig(), NoEval({}, CLASSES),
                      run_dir, loop=loop, frozen={"teacher": frozen})
    while not trainer.done:
        trainer.run_epoch()
    summary = trainer.finish().summary
    return {"losses": [float(v) for v in losses],
            "params": {k: v.detach().float().cpu() for k, v in student.named_parameters()},
            "precision": trainer.precision.name, "channels_last": trainer.channels_last,
            "compiled": list(trainer.compiled), "warnings": summary.get("warnings", []),
            "scaler_scale": float(trainer.scaler.get_scale()) if trainer.scaler is not None else None}


def update_gap(run: dict[str, Any], ref: dict[str, Any], start: dict[str, Tensor]) -> tuple[float, float]:
    """||update - reference update|| / ||reference update|| over the student's parameters, and their cosine."""
    du = torch.cat([(run["params"][k] - start[k].float()).flatten() for k in ref["params"]])
    dr = torch.cat([(ref["params"][k] - start[k].float()).flatten() for k in ref["params"]])
    return float((du - dr).norm() / dr.norm().clamp_min(1e-30)), float(F.cosine_similarity(du, dr, 0))


def train_mode_skip(ctx: Context, mode: str) -> str:
    """Why ``mode`` is not run on this device ('' when it is)."""
    if ctx.cuda:
        if mode == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16"
        return ""
    if mode == "bf16" and ctx.quick and not fast_bf16(ctx.device):
        return "this CPU has no fast bf16 (seconds per step): not in --quick"
    if mode == "fp16+scaler":
        return "fp16 with the gradient scaler needs CUDA (the engine runs bf16/fp32 on a CPU)"
    if mode == "fp32+compile" and ctx.quick:
        return "torch.compile is slow on a CPU: not in --quick"
    return ""


def check_train_step(ctx: Context) -> dict[str, Any]:
    """KD training steps on the device in each mode against the same steps on the CPU in fp32."""
    steps, batch = (2, 16) if ctx.quick else (3, 32)
    torch.manual_seed(0)
    init = {"teacher": build_model("resnet20", SHAPE, CLASSES).state_dict(),
            "student": build_model("resnet8", SHAPE, CLASSES).state_dict()}
    data = (torch.randn(steps * batch, *SHAPE), torch.randint(0, CLASSES, (steps * batch,)))
    ref = kd_steps(torch.device("cpu"), TRAIN_MODES["fp32"][0], init, data, batch, ctx.work / "cpu-fp32")
    parts: dict[str, dict[str, Any]] = {}
    for mode, (changes, (tol_loss, tol_update)) in TRAIN_MODES.items():
        why = train_mode_skip(ctx, mode)
        if why:
            parts[mode] = skip(why)
            continue
        t0 = time.perf_counter()
        run = kd_steps(ctx.device, changes, init, data, batch, ctx.work / mode.replace("+", "-"))
        loss_gap = max(rel(a, b) for a, b in zip(run["losses"], ref["losses"], strict=True))
        gap, cosine = update_gap(run, ref, init["student"])
        ok = loss_gap <= tol_loss and gap <= tol_update and all(map(math.isfinite, run["losses"]))
        if changes.get("compile") and not run["compiled"]:
            ok = False  # the engine fell back to eager: compile did not work here
        values = {"losses": run["losses"], "cpu_losses": ref["losses"], "loss_rel_gap": loss_gap,
                  "update_rel_gap": gap, "update_cosine": cosine, "runs_as": run["precision"]
                  + ("+channels_last" if run["channels_last"] else ""), "compiled": run["compiled"],
                  "scaler_scale": run["scaler_scale"], "warnings": run["warnings"],
                  "seconds": time.perf_counter() - t0}
        parts[mode] = result("pass" if ok else "fail", values, {"loss_rel": tol_loss, "update_rel": tol_update})
    values = {"pair": "resnet20 -> resnet8", "steps": steps, "batch": batch, "modes": parts}
    tolerances = {m: {"loss_rel": t[0], "update_rel": t[1]} for m, (_, t) in TRAIN_MODES.items()}
    failed = [m for m, p in parts.items() if p["status"] == "fail"]
    return result(combine(parts), values, tolerances, reason=f"failed: {', '.join(failed)}" if failed else "")


# ----------------------------------------------------------------------------------------------- teacher_cache
def tiny_kd_config(ctx: Context, name: str, **sections: Any) -> dict[str, Any]:
    """A config dict for a seconds-long run on 8x8 synthetic images (MLPs) on the kit's device."""
    cfg: dict[str, Any] = {
        "name": name, "out_dir": str(ctx.work / "runs"),
        "data": {"name": "synthetic", "batch_size": 32,
                 "options": {"shape": [1, 8, 8], "num_classes": 4, "n_train": 240, "n_test": 80}},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "optim": {"name": "sgd", "lr": 0.05, "schedule": "cosine"},
        "train": {"epochs": 3, "progress": False, "device": ctx.device.type},
        "teacher": {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


def weight_gap(a: nn.Module, b: nn.Module) -> tuple[float, bool]:
    """max |a - b| / max |b| over the state dicts, and whether they are bit-identical."""
    pairs = list(zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    same = all(torch.equal(x, y) for x, y in pairs)
    gap = max(float((x.double() - y.double()).abs().max()) for x, y in pairs if x.is_floating_point())
    scale = max(float(y.double().abs().max()) for _, y in pairs if y.is_floating_point())
    return gap / max(scale, 1e-30), same


def check_teacher_cache(ctx: Context) -> dict[str, Any]:
    """Students distilled with the teacher-output cache on (``auto``) and ``off`` on the device agree."""
    teacher = train_model(from_dict(tiny_kd_config(ctx, "teacher", model={"name": "mlp",
                                                                          "options": {"hidden": [32]}})))
    cases = {"static fp32": ({"precision": "fp32"}, {}, "computed", 1e-4)}
    if not ctx.quick:
        cases["static default precision"] = ({}, {}, "computed", 2e-2)
        cases["views (augmented) default precision"] = ({}, {"augment": "flip"}, "views", 2e-2)
    parts: dict[str, dict[str, Any]] = {}
    for i, (case, (train, data, expected, tol)) in enumerate(cases.items()):
        runs = {}
        for mode in ("off", "auto"):
            cfg = tiny_kd_config(ctx, f"kd{i}-{mode}", kd={"method": "kd"}, train=train, data=data,
                                 teacher={"checkpoint": str(teacher.run_dir), "cache": mode})
            runs[mode] = distill(from_dict(cfg))
        gap, same = weight_gap(runs["auto"].model, runs["off"].model)
        info = json.loads((runs["auto"].run_dir / "summary.json").read_text())
        status = info.get("teacher_cache", {}).get("status")
        ok = gap <= tol and status == expected
        parts[case] = result("pass" if ok else "fail", {"weights_rel_gap": gap, "bit_identical": same,
                                                        "cache_status": status, "precision": info.get("precision")},
                             {"weights_rel": tol, "cache_status": expected})
    return result(combine(parts), {"cases": parts}, {k: v["tolerances"] for k, v in parts.items()})


# ----------------------------------------------------------------------------------------------- l2t
def l2t_problem(steps: int = 4, seed: int = 0) -> tuple[nn.Module, list[tuple[Tensor, Tensor]], tuple[Tensor, Tensor],
                                                       Tensor, nn.Module]:
    """A tiny float64 MLP student (5 -> 6 -> 3), ``steps`` batches of 8, a dev batch of 16, teacher states and a
    gated L2T-DLF teacher moved off its identity start (as the CPU test does)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    student = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    batches = [(torch.randn(8, 5, dtype=torch.float64, generator=g), torch.randint(0, 3, (8,), generator=g))
               for _ in range(steps)]
    dev = (torch.randn(16, 5, dtype=torch.float64, generator=g), torch.randint(0, 3, (16,), generator=g))
    states = torch.rand(steps, 5, dtype=torch.float64, generator=g)
    torch.manual_seed(seed + 1)
    teacher = build_teacher("gated", 3, 5, hidden=4, rank=2).double()
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return student, batches, dev, states, teacher


class L2TRun:
    """The problem on one device and dtype: the hypergradient and the dev objective after the unroll."""

    def __init__(self, problem: tuple, device: torch.device, dtype: torch.dtype) -> None:
        student, batches, dev, states, teacher = problem
        self.student = FunctionalStudent(copy.deepcopy(student).to(device, dtype))
        self.teacher = copy.deepcopy(teacher).to(device, dtype)
        self.batches = [Batch(x.to(device, dtype), y.to(device), torch.arange(len(y), device=device))
                        for x, y in batches]
        self.dev = Batch(dev[0].to(device, dtype), dev[1].to(device), torch.arange(len(dev[1]), device=device))
        self.states = states.to(device, dtype)
        self.opt = InnerOptimizer(lr=lambda s: 0.5 / (1 + s), momentum=0.9, weight_decay=0.01)

    @staticmethod
    def inner_loss(logits: Tensor, y: Tensor, W: Tensor, b: Tensor) -> Tensor:
        return l2t_student_loss(logits, y, W, b, ce_alpha=0.2)

    def hypergradient(self, memory: str) -> Tensor:
        res = hypergradient(self.student, self.student.initial_state(), self.teacher, self.states, self.batches,
                            self.inner_loss, self.opt, self.dev, dev_cross_entropy, memory)
        return torch.cat([g.detach().double().cpu().flatten() for g in res.grads])

    def objective(self) -> float:
        end = unroll(self.student, self.student.initial_state(), self.batches, self.inner_loss, self.opt,
                     self.teacher, self.states).end
        with torch.no_grad(), self.student.modes():
            logits, _ = self.student(end.params, end.buffers, self.dev.x, "dev")
            return float(dev_cross_entropy(logits, self.dev.y))

    def finite_differences(self, eps: float = 1e-6) -> Tensor:
        """Central differences of the dev objective in every teacher parameter (float64 runs only)."""
        out = []
        for p in teacher_params(self.teacher):
            flat = p.view(-1)
            for i in range(p.numel()):
                vals = []
                for sign in (1, -1):
                    with torch.no_grad():
                        flat[i] += sign * eps
                    vals.append(self.objective())
                    with torch.no_grad():
                        flat[i] -= sign * eps
                out.append((vals[0] - vals[1]) / (2 * eps))
        return torch.tensor(out, dtype=torch.float64)


def check_l2t_hypergradient(ctx: Context) -> dict[str, Any]:
    """The L2T-DLF teacher gradient (reverse mode through 4 momentum-SGD steps) on the device, in float64 and
    float32, against float64 central finite differences on the CPU; checkpoint memory mode equals full."""
    problem = l2t_problem()
    fd = L2TRun(problem, torch.device("cpu"), torch.float64).finite_differences()
    gaps: dict[str, float] = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        run = L2TRun(problem, ctx.device, dtype)
        full = run.hypergradient("full")
        gaps[f"{name}_vs_fd"] = float((full - fd).norm() / fd.norm())
        gaps[f"{name}_checkpoint_vs_full"] = float((run.hypergradient("checkpoint") - full).norm() / full.norm())
    tolerances = {"float64_vs_fd": 1e-4, "float64_checkpoint_vs_full": 1e-10, "float32_vs_fd": 1e-2,
                  "float32_checkpoint_vs_full": 1e-5}
    ok = all(gaps[k] <= t for k, t in tolerances.items()) and float(fd.norm()) > 1e-3
    values = {**gaps, "fd_norm": float(fd.norm()), "teacher_parameters": int(fd.numel()), "inner_steps": 4,
              "fd": "float64 central differences on the CPU, eps 1e-6"}
    return result("pass" if ok else "fail", values, tolerances)


# ----------------------------------------------------------------------------------------------- minilm
#: MiniLM-L6's shape (sentence-transformers/all-MiniLM-L6-v2): layers, hidden, heads, intermediate, vocabulary
MINILM_SHAPE = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536,
                "vocab_size": 30522}


def minilm_model(length: int) -> tuple[nn.Module, str]:
    """The bundled MiniLM-L6 through ``hf_text``, else a MiniLM-L6-shaped BERT with random weights wrapped in
    :class:`HFTextModel`; and which one it is."""
    torch.manual_seed(0)
    try:
        return build_model("hf_text", (length,), 2, path="minilm-l6", dropout=0.0), "bundled minilm-l6 weights"
    except ConfigError as e:
        import transformers

        config = transformers.BertConfig(**MINILM_SHAPE, max_position_embeddings=512, type_vocab_size=2,
                                         num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        hf = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
        return HFTextModel(hf, "sequence"), f"random init from a MiniLM-L6-shaped BertConfig (bundled model: {e})"


def text_batch(batch: int, length: int, vocab: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, min(vocab, 30000), (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[batch // 2:, length // 2:] = 0  # half the rows padded to half length
    ids[:, 0] = 101  # [CLS]
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def timed_steps(model: nn.Module, x: dict[str, Tensor], y: Tensor, device: torch.device, dtype: torch.dtype | None,
                steps: int) -> tuple[float, float]:
    """Median seconds of a forward + backward (cross-entropy) under autocast to ``dtype``, and the last loss."""
    times, loss = [], torch.zeros(())
    for i in range(steps + 1):  # the first one warms up
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times), float(loss)


def check_minilm(ctx: Context) -> dict[str, Any]:
    """MiniLM-L6 forward + backward on the device: logits against the CPU's (fp32), finite gradients, attention
    probabilities (teachkit's attention implementation) summing to 1, time per step in fp32 and bf16."""
    batch, length, steps = (4, 32, 2) if ctx.quick else (32, 128, 10)
    model, source = minilm_model(length)
    model.eval()  # no dropout: the device and the CPU compute the same function
    x = text_batch(batch, length, model.vocab_size)
    with torch.no_grad():
        cpu_logits = model(x).double()
    model.to(ctx.device)
    xd = {k: v.to(ctx.device) for k, v in x.items()}
    y = torch.arange(batch, device=ctx.device) % 2
    with torch.no_grad():
        logits = model(xd).double().cpu()
    logits_gap = float((logits - cpu_logits).abs().max() / cpu_logits.abs().max().clamp_min(1e-12))
    loss = F.cross_entropy(model(xd).float(), y)
    loss.backward()
    grads_finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    model.request_outputs(["attentions", "hidden_states"])
    with torch.no_grad():
        out = model(xd)
    model.request_outputs([])
    att = torch.stack(out["attentions"]).double()
    att_gap = float((att.sum(-1) - 1).abs().max())
    values: dict[str, Any] = {"model": source, "batch": batch, "tokens": length, "logits_rel_gap_vs_cpu": logits_gap,
                              "loss": float(loss.detach()), "grads_finite": grads_finite,
                              "attention_row_sum_gap": att_gap, "layers_returned": len(out["attentions"])}
    dtypes = {"fp32": None, **({"bf16": torch.bfloat16} if fast_bf16(ctx.device) else {})}  # bf16: where it is fast
    for name, dtype in dtypes.items():
        seconds, last = timed_steps(model, xd, y, ctx.device, dtype, steps)
        values[f"{name}_step_ms"] = 1e3 * seconds
        values[f"{name}_sequences_per_s"] = batch / seconds
        values[f"{name}_loss_finite"] = math.isfinite(last)
    tolerances = {"logits_rel_gap_vs_cpu": 1e-4, "attention_row_sum_gap": 1e-5}
    ok = (logits_gap <= 1e-4 and att_gap <= 1e-5 and grads_finite and math.isfinite(float(loss))
          and all(values[f"{n}_loss_finite"] for n in dtypes))
    return result("pass" if ok else "fail", values, tolerances)


# ----------------------------------------------------------------------------------------------- beam_search
def check_beam_search(ctx: Context) -> dict[str, Any]:
    """Beam search (beam 5) and greedy decoding of a small Transformer trained briefly on the toy translation
    task: the same token ids on the device as on the CPU (fp32), scores within 1e-4."""
    raw = load_raw("toy_translation", None, {"train": 256 if ctx.quick else 1024, "valid": 8, "test": 24})
    train, test = raw.train_x, raw.test_x
    torch.manual_seed(0)
    model = build_model("transformer_seq2seq", (train.src.shape[1],), raw.num_classes, d_model=32, heads=2, ffn=64,
                        encoder_layers=2, decoder_layers=2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for i in range(20 if ctx.quick else 80):  # a little training: outputs that end before the length limit
        rows = torch.arange(i * 32, (i + 1) * 32) % train.num_rows
        part = train.rows(rows)
        src, tgt = part.src.long(), part.tgt.long()
        loss = F.cross_entropy(model(src, shift_right(tgt)), tgt[tgt != PAD])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src = test.src.long()
    cpu_beam, cpu_greedy = beam_search(model, src, beam=5), greedy(model, src)
    model.to(ctx.device)
    dev_beam, dev_greedy = beam_search(model, src.to(ctx.device), beam=5), greedy(model, src.to(ctx.device)).cpu()
    same_tokens = sum(a[0].tokens.cpu().tolist() == b[0].tokens.tolist() for a, b in zip(dev_beam, cpu_beam,
                                                                                          strict=True))
    score_gap = max(abs(a[0].score - b[0].score) for a, b in zip(dev_beam, cpu_beam, strict=True))
    lengths = [len(h[0].tokens) for h in cpu_beam]
    values = {"sentences": len(cpu_beam), "beam_same_tokens": same_tokens, "beam_score_max_gap": score_gap,
              "greedy_equal": bool(torch.equal(dev_greedy, cpu_greedy)), "train_loss": float(loss.detach()),
              "mean_output_tokens": sum(lengths) / len(lengths), "vocabulary": raw.num_classes}
    ok = same_tokens == len(cpu_beam) and score_gap <= 1e-4 and values["greedy_equal"]
    return result("pass" if ok else "fail", values, {"beam_same_tokens": len(cpu_beam), "beam_score_max_gap": 1e-4,
                                                     "greedy_equal": True})


# ----------------------------------------------------------------------------------------------- torchrun
PROBE = '''"""A world-1 process group under torchrun: init, all-reduce, read back (the kit's NCCL / gloo probe)."""
import json, os, sys
import torch
import torch.distributed as dist

backend = sys.argv[1]
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group(backend)
t = torch.arange(4.0, device=device)
dist.all_reduce(t)
print(json.dumps({"backend": dist.get_backend(), "world": dist.get_world_size(), "sum": t.tolist()}))
dist.destroy_process_group()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(ctx: Context, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 1`` of ``args`` (one process, a free local port)."""
    return run_command([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                        "127.0.0.1", "--master_port", str(free_port()), *args], ctx, env={"OMP_NUM_THREADS": "1"})


def check_torchrun(ctx: Context) -> dict[str, Any]:
    """``torchrun --nproc_per_node 1 -m teachkit.cli train`` on the device writes summary.json; a world-1
    process group (NCCL on CUDA, gloo on CPU) all-reduces. teachkit joins a process group only when WORLD_SIZE
    > 1, so the probe is what exercises NCCL itself."""
    cfg = tiny_kd_config(ctx, "torchrun")
    path = ctx.work / "torchrun.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = torchrun(ctx, "-m", "teachkit.cli", "train", str(path), "--quiet")
    summary_path = ctx.work / "runs" / "torchrun" / "summary.json"
    values: dict[str, Any] = {"train_returncode": proc.returncode, "summary_written": summary_path.is_file()}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        values.update({k: summary.get(k) for k in ("test_acc", "precision", "wall_time_s")})
    else:
        values["train_output"] = tail(proc.stdout + proc.stderr)
    backend = "nccl" if ctx.cuda else "gloo"
    if ctx.quick:  # CI: the teachkit run alone (tests/engine/test_distributed.py runs gloo groups)
        ok = proc.returncode == 0 and summary_path.is_file()
        return result("pass" if ok else "fail", values, reason="" if ok else "the torchrun training run failed")
    probe = ctx.work / "pg_probe.py"
    probe.write_text(PROBE)
    pg = torchrun(ctx, str(probe), backend)
    lines = [line for line in pg.stdout.splitlines() if line.startswith("{")]
    values["probe"] = json.loads(lines[-1]) if lines else {"returncode": pg.returncode,
                                                            "output": tail(pg.stdout + pg.stderr)}
    probe_ok = values["probe"].get("sum") == [0.0, 1.0, 2.0, 3.0] and values["probe"].get("backend") == backend
    ok = proc.returncode == 0 and summary_path.is_file() and probe_ok
    return result("pass" if ok else "fail", values, {"probe_sum": [0.0, 1.0, 2.0, 3.0], "backend": backend})


# ----------------------------------------------------------------------------------------------- throughput
def throughput_runs(ctx: Context) -> dict[str, list[str]]:
    """The benchmark's command lines by name: both pairs on a GPU (its settings, then ``--levers`` when the
    benchmark offers it), tiny models on a CPU in --quick (one run: ``--levers`` when offered)."""
    script = str(ROOT / "benchmarks" / "throughput.py")
    base = [sys.executable, script, "--pairs", "resnet56-resnet20,resnet32x4-resnet8x4", "--device", str(ctx.device),
            "--rounds", "1"]
    if ctx.quick:
        base += ["--teacher", "resnet8", "--student", "resnet8", "--steps", "2", "--batch", "16", "--no-compile",
                 "--sync-steps", "1", "--peak-size", "128"]
    else:
        base += ["--steps", "20"] + ([] if ctx.compile_throughput else ["--no-compile"])
    usage = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    levers = "--levers" in usage.stdout
    runs = {} if ctx.quick and levers else {"settings": base}
    if levers:
        runs["levers"] = [*base, "--levers"]
    return runs


def pair_digest(pair: dict[str, Any]) -> dict[str, Any]:
    """teachkit's default setting against the plain fp32 loop, from either JSON layout of the benchmark (its
    settings table, or ``--levers``)."""
    rows = pair.get("settings") or pair.get("levers") or {}
    default = rows.get("default", {})
    plain = pair.get("plain", {}).get("fp32") or rows.get("plain fp32 loop", {})
    return {"default_images_per_s": default.get("images_per_s"),
            "default_runs_as": default.get("plain_same_layout", default.get("runs_as")),
            "plain_fp32_images_per_s": plain.get("images_per_s"),
            "default_vs_plain_fp32": default.get("speedup_vs_plain_fp32", default.get("vs_plain_fp32")),
            "targets": {t["what"]: f"{fmt(t['measured'])} ({t['verdict']})" for t in pair.get("targets", [])}}


def check_throughput(ctx: Context) -> dict[str, Any]:
    """The throughput benchmark (teachkit's default setting vs a plain PyTorch loop, in one run); its JSON."""
    values: dict[str, Any] = {}
    tables, failed = [], []
    for name, cmd in throughput_runs(ctx).items():
        json_path = ctx.work / f"throughput_{name}.json"
        proc = run_command([*cmd, "--json", str(json_path)], ctx)
        run: dict[str, Any] = {"command": " ".join(["python", *cmd[1:]]), "returncode": proc.returncode}
        if proc.returncode != 0 or not json_path.is_file():
            run["output"] = tail(proc.stdout + proc.stderr)
            failed.append(name)
        else:
            bench = json.loads(json_path.read_text())
            run["pairs"] = {f"{p['teacher']}->{p['student']}": pair_digest(p) for p in bench.get("pairs", [])}
            run["benchmark_json"] = bench
            tables.append(f"{name}:\n" + "\n".join(line for line in proc.stdout.splitlines()
                                                   if line.startswith(("|", "###", "target"))))
        values[name] = run
    values["table"] = "\n\n".join(tables)
    if failed:
        return result("fail", values, reason=f"benchmarks/throughput.py failed: {', '.join(failed)}")
    return result("pass", values)


# ----------------------------------------------------------------------------------------------- the kit
@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], dict[str, Any]]
    #: timeout on a GPU / in --quick, seconds
    timeout_s: float
    quick_timeout_s: float


CHECKS = [
    Check("cuda_tests", check_cuda_tests, 150, 60),
    Check("train_step", check_train_step, 180, 90),
    Check("teacher_cache", check_teacher_cache, 90, 60),
    Check("l2t_hypergradient", check_l2t_hypergradient, 60, 60),
    Check("minilm", check_minilm, 90, 60),
    Check("beam_search", check_beam_search, 60, 60),
    Check("torchrun_nccl", check_torchrun, 90, 60),
    Check("throughput", check_throughput, 200, 90),
]
BY_NAME = {c.name: c for c in CHECKS}


def environment(device: torch.device) -> dict[str, Any]:
    """The machine: GPU (name, capability, memory, driver, CUDA), CPU, torch and library versions."""
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                            "python": platform.python_version(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                            "platform": platform.platform(), "torch_threads": torch.get_num_threads()}
    for lib in ("transformers", "numpy"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            info[lib] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                       "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
                       "bf16": torch.cuda.is_bf16_supported(), "cudnn": torch.backends.cudnn.version(),
                       "driver": nvidia_driver()}
    return info


def nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def worker(name: str, device: torch.device, quick: bool, out: Path, timeout: float, compile_tp: bool) -> None:
    """Run one check in this process and write its outcome to ``out/checks/<name>.json``."""
    t0 = time.monotonic()
    if device.type == "cuda":  # fp32 held to float32 rounding (see the module docstring)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    work = out / "work" / name
    shutil.rmtree(work, ignore_errors=True)  # the kit's own scratch folder, from an earlier run into ``out``
    work.mkdir(parents=True)
    ctx = Context(device, quick, work, t0 + timeout, compile_tp)
    try:
        outcome = BY_NAME[name].run(ctx)
    except Exception as e:  # noqa: BLE001 - a failing check is reported, the kit goes on
        traceback.print_exc()
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        outcome = result("fail", reason=f"{type(e).__name__}: {first}")
    outcome["seconds"] = round(time.monotonic() - t0, 2)
    text = json.dumps(outcome, indent=2, default=str) + "\n"
    atomic_write(out / "checks" / f"{name}.json", lambda p: Path(p).write_text(text))


def spawn(name: str, args: argparse.Namespace, timeout: float) -> dict[str, Any]:
    """Run ``name`` in a worker process (its own session, killed whole on timeout); its outcome."""
    out = args.out
    cmd = [sys.executable, str(Path(__file__).resolve()), str(out), "--worker", name, "--device", args.device,
           "--timeout", str(timeout)] + (["--quick"] if args.quick else []) + (
        ["--compile-throughput"] if args.compile_throughput else [])
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    path = out / "checks" / f"{name}.json"
    path.unlink(missing_ok=True)
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout + 15)  # the worker stops its subprocesses itself at ``timeout``
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return result("fail", reason=f"timed out after {timeout:.0f} s (log: logs/{name}.log)") | {
                "seconds": round(time.monotonic() - t0, 2)}
    if not path.is_file():
        return result("fail", reason=f"worker exited {code} without a result (log: logs/{name}.log)") | {
            "seconds": round(time.monotonic() - t0, 2)}
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------- the report
#: values kept in the JSON only (the markdown shows the benchmark's tables instead)
LONG_VALUES = frozenset({"benchmark_json", "table", "output"})


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if v and (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items() if k not in LONG_VALUES) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v[:8]) + (", ..." if len(v) > 8 else "") + "]"
    return str(v)


def key_values(check: dict[str, Any]) -> str:
    """The summary table's one-cell digest of a check's numbers."""
    v = check.get("values", {})
    if "modes" in v:
        return "; ".join(f"{m}: {p['status']}" + (f" (loss {p['values']['loss_rel_gap']:.1e}, update "
                                                   f"{p['values']['update_rel_gap']:.1e})" if p["values"] else "")
                         for m, p in v["modes"].items())
    if "cases" in v:
        return "; ".join(f"{c}: {p['values']['weights_rel_gap']:.1e} ({p['values']['cache_status']})"
                         for c, p in v["cases"].items())
    runs = [r for r in v.values() if isinstance(r, dict) and "pairs" in r]
    if runs:
        return "; ".join(f"{k}: default {fmt(p['default_images_per_s'])} img/s = {fmt(p['default_vs_plain_fp32'])}x "
                         f"plain fp32" for k, p in runs[0]["pairs"].items())
    keep = {k: x for k, x in v.items() if isinstance(x, (int, float, bool)) and not isinstance(x, dict)}
    return ", ".join(f"{k} {fmt(x)}" for k, x in list(keep.items())[:6])


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    gpu = env.get("gpu")
    lines = ["# teachkit GPU kit", "",
             f"- device: {env.get('device')}" + (f" -- {gpu['name']}, capability {gpu['capability']}, "
                                                 f"{gpu['memory_gib']} GiB, driver {gpu['driver']}, CUDA "
                                                 f"{env.get('cuda_runtime')}, cuDNN {gpu['cudnn']}" if gpu else ""),
             f"- CPU: {env.get('cpu')} ({env.get('cpu_count')} cores); torch {env.get('torch')}, Python "
             f"{env.get('python')}, transformers {env.get('transformers')}",
             f"- mode: {'quick' if report['quick'] else 'full'}; started {report['started']}; "
             f"{report['seconds']:.0f} s so far of a {report['budget_s']:.0f} s budget",
             f"- result: {report['summary']}", "",
             "| check | status | seconds | measured |", "|---|---|---|---|"]
    for name, c in report["checks"].items():
        why = f" ({c['reason']})" if c.get("reason") else ""
        lines.append(f"| {name} | **{c['status']}**{why} | {c.get('seconds', 0):.1f} | {key_values(c)} |")
    for name, c in report["checks"].items():
        lines += ["", f"## {name}: {c['status']}", ""]
        if c.get("reason"):
            lines.append(f"- reason: {c['reason']}")
        for k, v in c.get("values", {}).items():
            if k in LONG_VALUES:
                continue
            lines.append(f"- {k}: {fmt(v)}")
        if c.get("tolerances"):
            lines.append(f"- tolerances: {fmt(c['tolerances'])}")
        if c.get("values", {}).get("table"):
            lines += ["", c["values"]["table"]]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict[str, Any]) -> None:
    counts = {s: sum(c["status"] == s for c in report["checks"].values()) for s in ("pass", "fail", "skip")}
    report["summary"] = ", ".join(f"{n} {s}" for s, n in counts.items())
    text = json.dumps(report, indent=2, default=str) + "\n"
    atomic_write(out / "gpu_check.json", lambda p: Path(p).write_text(text))
    md = markdown(report)
    atomic_write(out / "gpu_check.md", lambda p: Path(p).write_text(md))


def run_kit(args: argparse.Namespace) -> int:
    """Every chosen check in turn, each in its own worker within the budget; the report after each."""
    t0 = time.monotonic()
    names = [n.strip() for n in args.only.split(",")] if args.only else [c.name for c in CHECKS]
    env = environment(torch.device(args.device))
    report: dict[str, Any] = {"environment": env, "quick": args.quick, "budget_s": args.budget,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": 0.0, "checks": {}}
    for name in names:
        spec, left = BY_NAME[name], args.budget - (time.monotonic() - t0)
        if left < MIN_START_S:
            report["checks"][name] = skip(f"the kit's budget of {args.budget:.0f} s is spent") | {"seconds": 0.0}
        else:
            print(f"[{time.monotonic() - t0:5.0f} s] {name} ...", flush=True)
            timeout = min(spec.quick_timeout_s if args.quick else spec.timeout_s, left)
            report["checks"][name] = spawn(name, args, timeout)
        report["seconds"] = time.monotonic() - t0
        c = report["checks"][name]
        print(f"[{report['seconds']:5.0f} s] {name}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else ""),
              flush=True)
        write_report(args.out, report)
    print(f"{report['summary']} in {report['seconds']:.0f} s; report: {args.out / 'gpu_check.md'}")
    return 1 if any(c["status"] == "fail" for c in report["checks"].values()) else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for gpu_check.json, gpu_check.md, logs/ and work/")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes (the CPU run in CI)")
    ap.add_argument("--only", help=f"comma-separated checks among {', '.join(BY_NAME)}")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help=f"seconds for the whole kit (default {BUDGET_S:.0f})")
    ap.add_argument("--compile-throughput", action="store_true",
                    help="also time the benchmark's torch.compile setting (adds 1-3 min on a GPU)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def resolve(args: argparse.Namespace) -> str:
    """A one-line problem with the arguments ('' when none); sets ``args.device`` and ``args.out``."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu") and not re.fullmatch(r"cuda:\d+", args.device):
        return f"--device {args.device!r} is not allowed; use auto, cuda or cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} but CUDA is not available here; use --device cpu"
    unknown = [n for n in (args.only or "").split(",") if n.strip() and n.strip() not in BY_NAME]
    if unknown:
        return f"--only {','.join(unknown)}: no such check; choose among {', '.join(BY_NAME)}"
    if args.budget <= 0:
        return f"--budget {args.budget:g} must be > 0 seconds"
    args.out = args.out.resolve()
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = resolve(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.worker:
        worker(args.worker, torch.device(args.device), args.quick, args.out, args.timeout, args.compile_throughput)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    return run_kit(args)


if __name__ == "__main__":
    sys.exit(main())
