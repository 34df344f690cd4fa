"""The student's full loss: CE on labels plus a weighted sum of distillation losses.

How to Train the Teacher (ECCV 2024) supplement, Eq. 24:  L = L_CE + gamma * L_distill, with each
method's paper gamma; Hinton KD alone uses 0.1 CE + 0.9 KL (T = 4). Methods combine by listing several
(``kd.method=[crd, kd]``). The ``kd`` section of a run config (:class:`KDConfig`) says which methods,
their weights and their typed options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.label_losses import squared_error
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, from_mapping, option
from teachkit.types import Batch, Progress, Taps, TrainingStage, upcast


@dataclass
class KDConfig(Options):
    """Student loss = ce_weight * CE + sum_m gamma_m * L_m (How to Train the Teacher, supplement Eq. 24).

    ``method`` is one distillation loss or a list (``[crd, kd]``); ``gamma`` overrides the paper's
    weights by method; ``alpha`` is Hinton KD's weight (with CE at 1 - alpha when KD is alone) and
    ``temperature`` its T; ``options`` sets per-method options (``{crd: {feat_dim: 128}}``), validated
    against each method's registered options dataclass (every method's resolved options are kept here).
    """

    method: str | list[str] = "kd"
    alpha: float = option(0.9, ge=0.0, le=1.0)
    temperature: float = option(4.0, gt=0.0)
    gamma: dict[str, Any] = option(factory=dict)
    ce_weight: float | None = option(None, ge=0.0)
    options: dict[str, Any] = option(factory=dict)

    @property
    def methods(self) -> list[str]:
        return [self.method] if isinstance(self.method, str) else list(self.method)

    def validate(self) -> None:
        names = self.methods
        if not names:
            raise ConfigError(f"{self.key('method')} is empty; name at least one distillation loss "
                              "(teachkit list losses)")
        if len(set(names)) != len(names):
            raise ConfigError(f"{self.key('method')}={names!r} names a method twice")
        for name in names:
            LOSSES.entry(name)  # unknown names: one line with did-you-mean
        for key, value in self.gamma.items():
            if key not in names:
                raise ConfigError(f"{self.key('gamma')}.{key} names a method that is not in "
                                  f"{self.key('method')}={names!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                    or value == float("inf"):
                raise ConfigError(f"{self.key('gamma')}.{key}={value!r} is not allowed: must be a finite number >= 0")
        for key in self.options:
            if key not in names:
                raise ConfigError(f"{self.key('options')}.{key} names a method that is not in "
                                  f"{self.key('method')}={names!r}")
        typed = {}
        for name in names:
            cls = LOSSES.options_of(name)
            given = self.options.get(name, {})
            if cls is None:
                if given:
                    raise ConfigError(f"{self.key('options')}.{name}: method {name!r} takes no options")
                continue
            if isinstance(given, cls):
                typed[name] = given
            elif isinstance(given, dict):
                typed[name] = from_mapping(cls, given, f"{self.key('options')}.{name}")
            else:
                raise ConfigError(f"{self.key('options')}.{name} must be a mapping of option: value")
        object.__setattr__(self, "options", typed)

    def weights(self) -> tuple[dict[str, float], float]:
        """Per-method gammas (paper defaults, ``kd`` -> alpha) and the CE weight (1 - alpha for KD alone)."""
        names = self.methods
        weights = {name: float(self.gamma.get(name, self.alpha if name == "kd" else LOSSES.get(name).default_weight))
                   for name in names}
        ce = self.ce_weight if self.ce_weight is not None else (1.0 - self.alpha if names == ["kd"] else 1.0)
        return weights, ce


def needs_of(methods: Sequence[str]) -> tuple[set[str], set[str]]:
    """The taps (student, teacher) that the listed methods read; logits always."""
    student, teacher = {"logits"}, {"logits"}
    for name in methods:
        cls = LOSSES.get(name)
        student.update(cls.student_needs)
        teacher.update(cls.teacher_needs)
    return student, teacher


class DistillObjective(nn.Module):
    """``ce_weight * CE(z_s, y) + sum_m gamma_m * ramp_m * sum_t w_mt * L_mt``; returns every weighted term.

    A method returning one term is logged under its own name (``kd``), several as ``method.term``. Holds
    the methods' auxiliary modules, so handing it to the engine as a trainable module trains, saves and
    resumes them with the student.
    """

    def __init__(self, methods: dict[str, DistillLoss], weights: dict[str, float], ce_weight: float) -> None:
        super().__init__()
        self.methods = nn.ModuleDict(methods)
        self.weights = dict(weights)
        self.ce_weight = float(ce_weight)

    @property
    def student_needs(self) -> set[str]:
        return needs_of_modules(self.methods.values(), "student_needs")

    @property
    def teacher_needs(self) -> set[str]:
        return needs_of_modules(self.methods.values(), "teacher_needs")

    def transform_batch(self, batch: Batch) -> Batch:
        for method in self.methods.values():
            batch = method.transform_batch(batch)
        return batch

    def training_stages(self, teacher: nn.Module, student: nn.Module | None = None) -> list[TrainingStage]:
        """The training stages the methods need before the student trains (HSAKD's teacher heads, FT's
        paraphraser, FSP / AB student pre-training), in the order the methods are listed."""
        stages = [m.training_stage(teacher, student) for m in self.methods.values()]
        return [s for s in stages if s is not None]

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        terms: dict[str, Tensor] = {}
        if self.ce_weight > 0 and not any(m.replaces_ce for m in self.methods.values()):
            if isinstance(batch.y, Tensor) and batch.y.is_floating_point():  # real-valued targets (STS-B)
                terms["l2"] = self.ce_weight * squared_error(student.logits, batch.y)
            else:
                terms["ce"] = self.ce_weight * F.cross_entropy(upcast(student.logits), batch.y)
        for name, method in self.methods.items():
            weight = self.weights[name]
            if weight == 0:
                continue
            weight = weight * method.ramp(progress)
            out = method(student, teacher, batch, progress)
            for term, value in out.items():
                coef = weight * method.term_weights.get(term, 1.0)
                terms[name if len(out) == 1 else f"{name}.{term}"] = coef * value
        return terms


def needs_of_modules(methods: Any, attr: str) -> set[str]:
    taps = {"logits"}
    for m in methods:
        taps.update(getattr(m, attr))
    return taps


def build_objective(method: str | Sequence[str] | KDConfig, student: Taps, teacher: Taps, *, num_classes: int,
                    num_samples: int, teacher_model: nn.Module | None = None, **kd: Any) -> DistillObjective:
    """The :class:`DistillObjective` for ``method`` from probed student/teacher taps.

    ``method`` is a validated :class:`KDConfig`, or method name(s) with the other ``kd`` fields as keywords
    (``alpha``, ``temperature``, ``gamma``, ``options``, ``ce_weight``), validated here. ``teacher_model``
    (the tapped frozen teacher) goes to the methods that read the teacher's parameters
    (``reads_teacher_model``); they refuse to build without it.
    """
    cfg = method if isinstance(method, KDConfig) else from_mapping(KDConfig, {"method": method, **kd}, "kd")
    weights, ce = cfg.weights()
    modules = {}
    for name in cfg.methods:
        cls = LOSSES.get(name)
        options = cfg.options.get(name)
        if name == "kd" and options is not None and getattr(options, "temperature", 0) is None:
            options = dataclasses.replace(options, temperature=cfg.temperature)  # kd.temperature is KD's T
        args = () if LOSSES.options_of(name) is None else (options,)
        extra = {"teacher_model": teacher_model} if cls.reads_teacher_model else {}
        modules[name] = cls(student, teacher, *args, num_classes=num_classes, num_samples=num_samples, **extra)
    return DistillObjective(modules, weights, ce)
