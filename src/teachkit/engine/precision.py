"""Fast defaults: mixed precision, memory layout and ``torch.compile``, resolved for the device at hand.

- ``train.precision``: ``auto`` (default) runs bf16 autocast where the device does bf16 fast -- CUDA GPUs with
  bf16 (Ampere and later) and CPUs with AVX512-BF16 or AMX, except recurrent students on a CPU -- and fp32
  elsewhere; ``fp32``; ``bf16``; ``fp16``
  (autocast with a gradient scaler, for GPUs without bf16). A precision the device cannot run falls back with
  a one-line warning: fp16 on a CPU runs bf16 where that is fast, else fp32; bf16 on a GPU without it runs
  fp16. The resolved precision is recorded in the run summary.
- ``train.channels_last``: ``auto`` (default) puts 4-D weights and batches in channels_last layout when the
  precision is bf16/fp16, where oneDNN and cuDNN run NHWC convolutions faster (a no-op for models without
  4-D weights); ``true`` / ``false`` force it.
- ``train.compile``: ``torch.compile`` of the student and the frozen teacher (their ``forward``; weights and
  checkpoints are unchanged). A model that fails to compile runs eagerly, with a warning naming it. ``auto``
  compiles where it was measured to pay back its compile time (:func:`resolve_compile`).
"""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform`` where that cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fast_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 matmuls and convolutions faster than fp32: a CUDA GPU of compute
    capability >= 8 (bf16 tensor cores), or a CPU with AVX512-BF16 or AMX-BF16 instructions."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
    return False


@dataclass(frozen=True)
class Precision:
    """A resolved ``train.precision``: ``name`` (fp32, bf16 or fp16), what was ``requested`` and, when they
    differ because the device cannot run it, the one-line ``warning`` to print."""

    name: Literal["fp32", "bf16", "fp16"]
    requested: str
    warning: str = ""

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None for fp32)."""
        return _DTYPES[self.name]

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for a step on ``device`` (a no-op for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """A gradient scaler for fp16 (its small exponent range underflows gradients); None otherwise."""
        return torch.amp.GradScaler(device.type) if self.name == "fp16" else None


def has_recurrent(model: nn.Module) -> bool:
    """Whether ``model`` holds a recurrent layer (LSTM, GRU, RNN)."""
    return any(isinstance(m, nn.RNNBase) for m in model.modules())


def resolve_precision(requested: str, device: torch.device, recurrent: bool = False) -> Precision:
    """``train.precision`` for ``device`` (module docstring); ``recurrent``: the student holds LSTM/GRU layers,
    whose bf16 kernels are slower than fp32 on CPU (measured: a 64-unit LSTM-attention student's epoch 1.4x
    slower), so ``auto`` keeps fp32 for them there. An unknown name is a ValueError."""
    if requested not in PRECISIONS:
        raise ValueError(f"train.precision={requested!r} is not allowed; choose one of: {', '.join(PRECISIONS)}")
    fast = fast_bf16(device)
    if requested == "auto":
        return Precision("bf16" if fast and not (recurrent and device.type == "cpu") else "fp32", requested)
    if requested == "fp16" and device.type != "cuda":
        to = "bf16" if fast else "fp32"
        return Precision(to, requested, f"train.precision=fp16 needs a CUDA GPU (its gradient scaler and fast fp16 "
                                        f"kernels); running {to} on {device.type}")
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return Precision("fp16", requested, "train.precision=bf16 is not supported by this GPU; running fp16 with "
                                            "a gradient scaler")
    return Precision(requested, requested)  # type: ignore[arg-type]


def resolve_channels_last(setting: bool | str, precision: Precision) -> bool:
    """``train.channels_last``: ``auto`` is on in bf16/fp16, where NHWC convolutions run faster (4-D weights
    and batches only: a no-op for other models)."""
    if setting == "auto":
        return precision.dtype is not None
    return bool(setting)


#: ``train.compile=auto`` compiles a CPU conv-net run of at least this many optimiser steps. Measured (1 thread,
#: 2-core AMD EPYC without AVX512-BF16, fp32, batch 128, ResNet-56 -> ResNet-20 KD): compiling the student's
#: training step and the teacher's forward took ~91 s and the step went from ~1.87 s to ~1.38 s, so it paid back
#: after ~190 steps; the margin covers the evaluation graph's compile and smaller students' smaller gains.
COMPILE_AUTO_MIN_STEPS = 2000


def resolve_compile(setting: bool | str, device: torch.device, model: nn.Module, steps_planned: int) -> bool:
    """``train.compile``: ``true`` / ``false`` as given; ``auto`` compiles where it was measured to win over the
    run: on a CPU, for a convolutional student without recurrent layers (the measured ResNets; fp32 here, bf16 in
    the throughput table), when the run plans at least :data:`COMPILE_AUTO_MIN_STEPS` steps. Off on CUDA (not
    measured: ``benchmarks/throughput.py --levers`` measures it) and for every other model."""
    if setting != "auto":
        return bool(setting)
    conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return compile_may_pay(device, steps_planned) and conv and not has_recurrent(model)


def compile_may_pay(device: torch.device, steps_planned: int) -> bool:
    """The part of ``train.compile=auto``'s rule that does not look at the model: a CPU, and a run of at least
    :data:`COMPILE_AUTO_MIN_STEPS` steps."""
    return device.type == "cpu" and steps_planned >= COMPILE_AUTO_MIN_STEPS


def compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed ``torch.compile`` raises at its first call (dynamo and backend failures)."""
    errors: list[type[BaseException]] = []
    with contextlib.suppress(ImportError, AttributeError):
        from torch._dynamo import exc

        errors += [exc.TorchDynamoException, exc.BackendCompilerFailed]
    with contextlib.suppress(ImportError, AttributeError):
        from torch._inductor import exc as inductor_exc

        errors.append(inductor_exc.InductorError)
    return tuple(errors) or (RuntimeError,)


class Compiled:
    """Modules whose ``forward`` is ``torch.compile``-d in place (state dicts and checkpoints are unchanged),
    by name, with :meth:`revert` to run them eagerly again after a compile failure."""

    def __init__(self) -> None:
        self.names: dict[str, nn.Module] = {}

    def add(self, name: str, module: nn.Module, compile_fn: Callable[..., Any] | None = None) -> None:
        if name in self.names or "forward" in vars(module):
            return
        module.forward = (compile_fn or torch.compile)(module.forward)  # type: ignore[method-assign]
        self.names[name] = module

    def revert(self) -> list[str]:
        """Run every compiled module eagerly again; returns their names."""
        names = list(self.names)
        for module in self.names.values():
            if "forward" in vars(module):
                del module.forward
        self.names.clear()
        return names

    def __bool__(self) -> bool:
        return bool(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)
