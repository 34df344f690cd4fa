"""The student's full loss: CE on labels plus a weighted sum of distillation objectives.

ECCV 2024 supplement Eq. 24:  L = L_CE + gamma * L_distill, with each method's paper gamma; Hinton
KD alone uses 0.1 CE + 0.9 KL (T = 4). Methods combine by listing several (``kd.method=[crd, kd]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Batch
from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss, Progress, check_options
from teachkit.losses.registry import LOSSES
from teachkit.models.taps import Taps


class Distiller(nn.Module):
    """``ce_weight * CE(z_s, y) + sum_m gamma_m * L_m``; returns every weighted term by name.

    A method returning one term is logged under its own name (``kd``), several as ``method.term``.
    Holds the methods' auxiliary modules, so passing it to the engine as ``extra`` trains, saves and
    resumes them with the student.
    """

    def __init__(self, methods: dict[str, DistillLoss], weights: dict[str, float], ce_weight: float) -> None:
        super().__init__()
        self.methods = nn.ModuleDict(methods)
        self.weights = dict(weights)
        self.ce_weight = float(ce_weight)

    @property
    def needs(self) -> tuple[str, ...]:
        taps = {"logits"}
        for m in self.methods.values():
            taps.update(m.needs)
        return tuple(sorted(taps))

    def transform_batch(self, batch: Batch) -> Batch:
        for method in self.methods.values():
            batch = method.transform_batch(batch)
        return batch

    def prepare_teacher(self, teacher: nn.Module, splits: Any, cfg: Any, run_dir: Any) -> None:
        for method in self.methods.values():
            method.prepare_teacher(teacher, splits, cfg, run_dir)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        terms: dict[str, Tensor] = {}
        if self.ce_weight > 0 and not any(m.replaces_ce for m in self.methods.values()):
            terms["ce"] = self.ce_weight * F.cross_entropy(student.logits.float(), batch.y)
        for name, method in self.methods.items():
            weight = self.weights[name]
            if weight == 0:
                continue
            out = method(student, teacher, batch, progress)
            for term, value in out.items():
                terms[name if len(out) == 1 else f"{name}.{term}"] = weight * value
        return terms


def as_method_list(method: str | Sequence[str]) -> list[str]:
    names = [method] if isinstance(method, str) else list(method)
    if not names:
        raise ConfigError("kd.method is empty; name at least one distillation loss (teachkit list losses)")
    if len(set(names)) != len(names):
        raise ConfigError(f"kd.method={names!r} names a method twice")
    return names


def resolve_weights(names: list[str], gamma: dict[str, Any], alpha: float,
                    ce_weight: float | None) -> tuple[dict[str, float], float]:
    """Per-method gammas (paper defaults, ``kd`` -> alpha) and the CE weight (1 - alpha for KD alone)."""
    for key in gamma:
        if key not in names:
            raise ConfigError(f"kd.gamma.{key} names a method that is not in kd.method={names!r}")
    weights = {}
    for name in names:
        cls = LOSSES.get(name)
        value = gamma.get(name, alpha if name == "kd" else cls.default_weight)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"kd.gamma.{name}={value!r} is not allowed: must be a finite number >= 0")
        weights[name] = float(value)
    if ce_weight is None:
        ce_weight = 1.0 - alpha if names == ["kd"] else 1.0
    return weights, ce_weight


def build_distiller(method: str | Sequence[str], student: Taps, teacher: Taps, *, num_classes: int,
                    num_samples: int, alpha: float = 0.9, temperature: float = 4.0,
                    gamma: dict[str, Any] | None = None, options: dict[str, dict] | None = None,
                    ce_weight: float | None = None) -> Distiller:
    """Build the Distiller for ``method`` (one name or a list) from probed student/teacher taps."""
    names = as_method_list(method)
    options = dict(options or {})
    for key, value in options.items():
        if key not in names:
            raise ConfigError(f"kd.options.{key} names a method that is not in kd.method={names!r}")
        if not isinstance(value, dict):
            raise ConfigError(f"kd.options.{key} must be a mapping of option: value")
    weights, ce = resolve_weights(names, dict(gamma or {}), alpha, ce_weight)
    modules = {}
    for name in names:
        cls = LOSSES.get(name)
        opts = dict(options.get(name, {}))
        if name == "kd":
            opts.setdefault("temperature", temperature)
        check_options(name, cls, opts)
        modules[name] = cls(student, teacher, num_classes=num_classes, num_samples=num_samples, **opts)
    return Distiller(modules, weights, ce)
