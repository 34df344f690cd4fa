"""DOT, the Distillation-Oriented Trainer (Zhao et al., ICCV 2023): momentum SGD that keeps apart the gradient
of the task loss and that of the distillation loss, with a smaller momentum for the first and a larger one for
the second, so that the distillation loss, whose optimum the task loss disturbs, is optimised more fully.

With ``momentum`` mu and ``delta`` d (Sec. 4.2 of the paper; defaults mu = 0.9, d = 0.075 as mdistiller's
``CFG.SOLVER.DOT.DELTA``), per step and parameter p with task gradient g_t and distillation gradient g_kd:

- p has both gradients: ``b_t <- (mu - d) b_t + (g_t + wd p)``, ``b_kd <- (mu + d) b_kd + g_kd``;
- p has only a task gradient: ``b_t <- mu b_t + (g_t + wd p)``;
- p has only a distillation gradient (a FitNet regressor): ``b_kd <- mu b_kd + (g_kd + wd p)``;
- then ``p <- p - lr b_t - lr b_kd`` (each for the buffers p has this step).

A buffer starts as its first gradient (no momentum term). As the reference (mdistiller's
``DistillationOrientedTrainer``) weight decay goes into the task buffer, and into the distillation buffer
only for parameters without a task gradient, from their second step on; no dampening, no Nesterov. A step with
no distillation term (a label-only stage) is momentum SGD with mu, which this module computes bit for bit as
``torch.optim.SGD`` does. Deviation: the reference takes no momentum at all for task-only parameters when
mu - d = 0; here they keep mu.

:class:`SplitBackward`, the engine's hook for an optimiser that needs the loss terms apart, is defined here too
(``teachkit.engine.optim`` re-exports it), so that the optimiser module can build DOT without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

#: the loss terms that take the task momentum by default: the KD objective's label terms (cross-entropy, and the
#: squared error of real-valued targets), as ``teachkit.recipes.kd.LABEL_TERMS`` names them
TASK_TERMS = ("ce", "l2")
#: the optimiser state keys of the two momentum buffers
TASK_BUFFER, KD_BUFFER = "momentum_buffer", "momentum_kd_buffer"


def scaler_conflict(key: str) -> str:
    """The one-line refusal of an optimiser named at ``key`` (``optim.name``) that keeps the loss terms' gradients
    apart, under fp16 (its gradient scaler scales one summed loss)."""
    return (f"{key}=dot keeps the task and distillation gradients apart, which fp16's gradient scaler does not "
            "support; use train.precision=fp32, bf16 or auto")


class SplitBackward:
    """Mixin for an optimiser that needs the loss terms' gradients apart (DOT keeps one momentum for the task
    loss and another for the distillation loss): the engine calls :meth:`backward` with the step's named terms
    instead of backpropagating their sum, then ``step()`` as usual. Not combined with fp16's gradient scaler or
    several processes (the engine refuses those in one line; ``OptimConfig`` refuses clipping)."""

    def backward(self, terms: Mapping[str, Tensor], factor: float | None) -> None:
        """Backpropagate ``terms`` (each times ``factor``, the chunk's share of the batch; None = 1), keeping
        what :meth:`step` needs to tell them apart; called once per micro-batch chunk, before ``step()``."""
        raise NotImplementedError


class DistillationOrientedTrainer(torch.optim.Optimizer, SplitBackward):
    """DOT over ``params``: :meth:`backward` splits a step's named loss terms into task terms (``task_terms``)
    and distillation terms (every other), keeps the distillation gradient apart and backpropagates the task
    terms into ``.grad``; :meth:`step` applies the two momenta (see the module docstring)."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.9, delta: float = 0.075,
                 weight_decay: float = 0.0, task_terms: Sequence[str] = TASK_TERMS) -> None:
        if lr < 0.0 or weight_decay < 0.0:
            raise ValueError(f"DOT needs lr >= 0 and weight_decay >= 0, got {lr} and {weight_decay}")
        if not (0.0 <= momentum - delta and momentum + delta < 1.0 and delta >= 0.0):
            raise ValueError(f"DOT's momenta momentum -+ delta must lie in [0, 1), got momentum={momentum}, "
                             f"delta={delta}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "delta": delta, "weight_decay": weight_decay})
        self.task_terms = frozenset(task_terms)
        #: the distillation gradient of this step so far, by ``id`` of the parameter (summed over chunks)
        self._kd_grads: dict[int, Tensor] = {}

    def backward(self, terms: Mapping[str, Tensor], factor: float | None) -> None:
        """Keep the distillation terms' gradient (x ``factor``) apart, then backpropagate the task terms
        (x ``factor``) into ``.grad``; terms that need no gradient are skipped."""
        task = [v for k, v in terms.items() if k in self.task_terms and v.requires_grad]
        kd = [v for k, v in terms.items() if k not in self.task_terms and v.requires_grad]
        if kd:
            self._add_kd_grads(weighted_sum(kd, factor), retain_graph=bool(task))
        if task:
            weighted_sum(task, factor).backward()

    def _add_kd_grads(self, loss: Tensor, retain_graph: bool) -> None:
        """Add d ``loss`` / d p to the step's distillation gradients (parameters the loss does not reach get none)."""
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True)
        stash = self._kd_grads
        pairs = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
        seen = [(id(p), g) for p, g in pairs if id(p) in stash]
        if seen:  # out of place: a gradient autograd hands back may be an expanded view
            sums = torch._foreach_add([stash[i] for i, _ in seen], [g for _, g in seen])
            stash.update(zip((i for i, _ in seen), sums, strict=True))
        stash.update((id(p), g) for p, g in pairs if id(p) not in stash)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``.grad`` and the distillation gradients kept for the next step."""
        super().zero_grad(set_to_none)
        self._kd_grads = {}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One DOT update of every parameter with a task or a distillation gradient; no host sync."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        self._kd_grads = {}
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        """The task update, then the distillation update, of one parameter group (each one foreach call)."""
        lr, decay, mu, delta = group["lr"], group["weight_decay"], group["momentum"], group["delta"]
        kd = self._kd_grads
        task_params = [p for p in group["params"] if p.grad is not None]
        both = [p for p in task_params if id(p) in kd]
        task_only = [p for p in task_params if id(p) not in kd]
        buffers = [*self._advance(both, [p.grad for p in both], TASK_BUFFER, mu - delta, decay, decay),
                   *self._advance(task_only, [p.grad for p in task_only], TASK_BUFFER, mu, decay, decay)]
        if buffers:
            torch._foreach_add_([*both, *task_only], buffers, alpha=-lr)
        kd_params = [p for p in group["params"] if id(p) in kd]
        with_task = [p for p in kd_params if p.grad is not None]
        kd_only = [p for p in kd_params if p.grad is None]
        buffers = [*self._advance(with_task, [kd[id(p)] for p in with_task], KD_BUFFER, mu + delta, 0.0, 0.0),
                   *self._advance(kd_only, [kd[id(p)] for p in kd_only], KD_BUFFER, mu, decay, 0.0)]
        if buffers:
            torch._foreach_add_([*with_task, *kd_only], buffers, alpha=-lr)

    def _advance(self, params: list[Tensor], grads: list[Tensor], key: str, momentum: float, decay: float,
                 first_decay: float) -> list[Tensor]:
        """The momentum buffers ``key`` of ``params`` after this step: ``momentum * b + (g + decay * p)``, or
        ``g + first_decay * p`` for a buffer's first step."""
        states = [self.state[p] for p in params]
        old = [i for i, s in enumerate(states) if key in s]
        if old:
            buffers = [states[i][key] for i in old]
            steps = [grads[i] for i in old]
            if decay:
                steps = torch._foreach_add(steps, [params[i] for i in old], alpha=decay)
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_add_(buffers, steps)
        for s, g, p in zip(states, grads, params, strict=True):
            if key not in s:
                s[key] = g.add(p, alpha=first_decay) if first_decay else torch.clone(g).detach()
        return [s[key] for s in states]


def weighted_sum(values: list[Tensor], factor: float | None) -> Tensor:
    """``sum(values)``, times ``factor`` unless it is None."""
    total = sum(values[1:], values[0])
    return total if factor is None else total * factor
