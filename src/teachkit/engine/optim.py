"""The optimiser and learning-rate schedule options, and the optimiser they build."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.options import Options, option, short_repr


@dataclass
class OptimConfig(Options):
    """Optimiser and learning-rate schedule (per-step warm-up, then step/multistep/cosine/constant, or
    ``linear``: per-step decay to 0 at the end, Hugging Face's default for fine-tuning, or ``inverse_sqrt``:
    lr x sqrt(warm-up / t) after the warm-up, fairseq's Transformer schedule, with t in epochs)."""

    name: Literal["sgd", "adamw"] = "sgd"
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

    def validate(self) -> None:
        """AdamW's ``betas`` are two numbers in [0, 1) (torch would fail at the first step otherwise);
        ``inverse_sqrt`` needs a warm-up."""
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"{self.key('betas')}={short_repr(self.betas)} is not allowed: expected two numbers "
                              f"in [0, 1), e.g. [0.9, 0.999]")
        if self.schedule == "inverse_sqrt" and self.warmup_epochs <= 0:
            raise ConfigError(f"{self.key('schedule')}=inverse_sqrt decays as sqrt(warm-up / t): it needs "
                              f"{self.key('warmup_epochs')} > 0 (fairseq's 4,000 updates are ~3.6 IWSLT14 epochs "
                              "at 4,096 tokens per batch)")


def build_optimizer(params: list[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov) or AdamW over ``params`` with ``cfg``'s base learning rate."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
                               weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


class SplitBackward:
    """Mixin for an optimiser that needs the loss terms' gradients apart (DOT keeps one momentum for the task
    loss and another for the distillation loss): the engine calls :meth:`backward` with the step's named terms
    instead of backpropagating their sum, then ``step()`` as usual. Not combined with fp16's gradient scaler,
    gradient clipping or several processes (the engine refuses those in one line)."""

    def backward(self, terms: Mapping[str, Tensor], factor: float | None) -> None:
        """Backpropagate ``terms`` (each times ``factor``, the chunk's share of the batch; None = 1), keeping
        what :meth:`step` needs to tell them apart; called once per micro-batch chunk, before ``step()``."""
        raise NotImplementedError
