"""The optimiser and learning-rate schedule options, and the optimiser they build (SGD, AdamW, or DOT:
:mod:`teachkit.engine.dot`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from teachkit.engine.dot import DistillationOrientedTrainer, SplitBackward
from teachkit.errors import ConfigError
from teachkit.options import Options, option, short_repr

__all__ = ["OptimConfig", "SplitBackward", "build_optimizer"]  # SplitBackward: the engine's hook, defined with DOT


@dataclass
class OptimConfig(Options):
    """Optimiser and learning-rate schedule (per-step warm-up, then step/multistep/cosine/constant, or
    ``linear``: per-step decay to 0 at the end, Hugging Face's default for fine-tuning, or ``inverse_sqrt``:
    lr x sqrt(warm-up / t) after the warm-up, fairseq's Transformer schedule, with t in epochs).

    ``dot`` is the Distillation-Oriented Trainer (Zhao et al., ICCV 2023): momentum SGD with momentum
    ``momentum - dot_delta`` for the gradient of the task terms (``dot_task_terms``) and ``momentum + dot_delta``
    for the gradient of every other (distillation) term.

    ``implementation`` picks torch's kernel for SGD and AdamW: ``foreach`` (one multi-tensor op per state
    tensor, bit-identical to the per-parameter ``loop``; what ``auto`` runs), ``loop`` or ``fused`` (one kernel
    per parameter group, fastest, but differs from the loop by float rounding, ~1e-7 after a few steps; torch
    versions or devices without it run ``foreach``, with a warning). The optimiser's state is the same in all three."""

    name: Literal["sgd", "adamw", "dot"] = "sgd"
    lr: float = option(0.1, gt=0.0)
    momentum: float = option(0.9, ge=0.0, lt=1.0)
    nesterov: bool = False
    weight_decay: float = option(5e-4, ge=0.0)
    betas: list[float] = option(factory=lambda: [0.9, 0.999])
    schedule: Literal["constant", "step", "multistep", "cosine", "linear", "inverse_sqrt"] = "cosine"
    milestones: list[int] = option(factory=list)
    step_size: int = option(30, ge=1)
    gamma: float = option(0.1, gt=0.0, le=1.0)
    warmup_epochs: float = option(0.0, ge=0.0)
    grad_clip: float | None = option(None, gt=0.0)
    #: DOT: the task momentum is ``momentum - dot_delta``, the distillation momentum ``momentum + dot_delta``
    dot_delta: float = option(0.075, ge=0.0)
    #: DOT: the names of the loss terms that take the task momentum (the label terms); every other is distillation
    dot_task_terms: list[str] = option(factory=lambda: ["ce", "l2"])
    #: SGD/AdamW kernels: auto = foreach (bit-identical to loop; ResNet-20's SGD step 1.5-2.8x faster here); fused:
    #: fastest, not bit-identical (float rounding); DOT has its own step
    implementation: Literal["auto", "loop", "foreach", "fused"] = "auto"

    def validate(self) -> None:
        """AdamW's ``betas`` are two numbers in [0, 1) (torch would fail at the first step otherwise);
        ``inverse_sqrt`` needs a warm-up; DOT's two momenta lie in [0, 1)."""
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"{self.key('betas')}={short_repr(self.betas)} is not allowed: expected two numbers "
                              f"in [0, 1), e.g. [0.9, 0.999]")
        if self.schedule == "inverse_sqrt" and self.warmup_epochs <= 0:
            raise ConfigError(f"{self.key('schedule')}=inverse_sqrt decays as sqrt(warm-up / t): it needs "
                              f"{self.key('warmup_epochs')} > 0 (fairseq's 4,000 updates are ~3.6 IWSLT14 epochs "
                              "at 4,096 tokens per batch)")
        if self.name == "dot":
            self._validate_dot()

    def _validate_dot(self) -> None:
        """DOT's momenta ``momentum -+ dot_delta`` in [0, 1), task terms named, no Nesterov and no clipping
        (the reference has neither; clipping would mix the two gradients DOT keeps apart)."""
        low, high = self.momentum - self.dot_delta, self.momentum + self.dot_delta
        if low < 0.0 or high >= 1.0:
            raise ConfigError(f"{self.key('dot_delta')}={self.dot_delta} is out of range for {self.key('momentum')}="
                              f"{self.momentum}: DOT's momenta momentum - dot_delta = {low:g} and momentum + dot_delta "
                              f"= {high:g} must lie in [0, 1)")
        if not self.dot_task_terms or not all(self.dot_task_terms):
            raise ConfigError(f"{self.key('dot_task_terms')}={short_repr(self.dot_task_terms)} is not allowed: "
                              "expected the names of the task loss terms, e.g. [ce, l2]")
        if self.nesterov:
            raise ConfigError(f"{self.key('nesterov')}=true is not supported by {self.key('name')}=dot "
                              "(heavy-ball momentum, as the reference); unset it")
        if self.grad_clip is not None:
            raise ConfigError(f"{self.key('name')}=dot does not support {self.key('grad_clip')}={self.grad_clip} "
                              "(its two momenta see the gradients apart); unset it")


def build_optimizer(params: list[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov), AdamW or DOT over ``params`` with ``cfg``'s base learning rate, SGD and
    AdamW with the kernels of ``cfg.implementation``."""
    if cfg.name == "dot":
        return DistillationOrientedTrainer(params, lr=cfg.lr, momentum=cfg.momentum, delta=cfg.dot_delta,
                                           weight_decay=cfg.weight_decay, task_terms=cfg.dot_task_terms)
    if cfg.name == "sgd":
        kind, hyper = torch.optim.SGD, {"lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
                                        "nesterov": cfg.nesterov and cfg.momentum > 0}
    else:
        kind, hyper = torch.optim.AdamW, {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}
    if cfg.implementation == "fused":
        try:
            return kind(params, **hyper, fused=True)
        except (TypeError, RuntimeError) as e:  # torch without a fused kernel for this optimiser or device
            reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            warnings.warn(f"{cfg.key('implementation')}=fused is not available here ({reason}); running foreach",
                          stacklevel=2)
    return kind(params, **hyper, foreach=cfg.implementation != "loop")

