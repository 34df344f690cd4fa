"""Feature pre-training stages: what they report (their loss on the validation split) and how FSP / AB build
theirs.

FSP and AB pre-train the student's body on the feature loss alone, and FT trains the teacher's
paraphraser to reconstruct the teacher's last stage (RepDistiller ``helper/pretrain.py``, ``init``),
before the student trains on labels. Those stages run through the engine like any training run; their
evaluator is :class:`StageLossEvaluator`: the stage's loss averaged over the validation split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.types import Batch, Evaluator, Progress, StepOutput, TrainingStage, upcast

#: Validation rows per forward when the run gives none.
EVAL_BATCH = 256


class StageLossEvaluator(Evaluator):
    """``loss`` (primary, minimised): ``loss_fn(x)`` averaged over the validation split's batches, each
    weighted by its rows, under no grad with every module in ``modules`` in eval mode (their train/eval
    flags are restored afterwards). ``evaluate(model)`` ignores ``model``: ``loss_fn`` closes over it."""

    primary = "loss"

    def __init__(self, loss_fn: Callable[[Tensor], Tensor], modules: list[nn.Module], split: Any,
                 batch_size: int = EVAL_BATCH) -> None:
        self.loss_fn = loss_fn
        self.modules = modules
        self.split = split
        self.batch_size = max(1, int(batch_size))

    def metric_names(self) -> tuple[str, ...]:
        return ("loss",)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        modes = [(m, m.training) for module in self.modules for m in module.modules()]
        for module in self.modules:
            module.eval()
        try:
            total, rows = 0.0, 0
            x_all = self.split.x
            device = next((p.device for m in self.modules for p in m.parameters()), torch.device("cpu"))
            for i in range(0, len(x_all), self.batch_size):
                x = x_all[i:i + self.batch_size].to(device)
                n = x.shape[0]
                total += float(upcast(self.loss_fn(x)).item()) * n
                rows += n
        finally:
            for m, mode in modes:
                m.training = mode
        return {"val": {"loss": total / rows if rows else float("nan")}}


def pretrain_optim(lr: float, weight_decay: float = 5e-4, momentum: float = 0.9) -> dict[str, Any]:
    """RepDistiller's ``init`` optimiser: SGD, momentum 0.9, weight decay 5e-4, constant learning rate
    (no schedule, no warm-up) for the stage's epochs."""
    return {"name": "sgd", "lr": lr, "momentum": momentum, "nesterov": False, "weight_decay": weight_decay,
            "schedule": "constant", "warmup_epochs": 0.0}


def student_pretraining_stage(name: str, loss_fn: Callable[[Any, Any], Tensor], teacher: nn.Module,
                              student: nn.Module | None, extra: dict[str, nn.Module], *, epochs: int,
                              lr: float, method: str) -> TrainingStage | None:
    """RepDistiller's ``init`` for FSP and AB: the student's body (and ``extra`` modules such as AB's
    connectors) trained on the feature loss alone for ``epochs`` epochs, SGD at constant ``lr``, on the
    student's transfer set, before the student's main training. ``loss_fn(student_taps, teacher_taps)``
    gives the stage loss; the teacher runs under no grad. None when ``epochs`` is 0. The student's
    classifier gets no gradient (the loss reads only stage maps), so it is left as initialised."""
    if epochs <= 0:
        return None
    if student is None:
        raise ConfigError(f"{method!r}'s pre-training stage needs the student; build it through the kd recipe")
    model = student.model

    def stage_loss(x: Tensor) -> Tensor:
        with torch.no_grad():
            t_taps = teacher(x)
        return loss_fn(student(x), t_taps)

    def step(batch: Batch, progress: Progress) -> StepOutput:
        return StepOutput({method: stage_loss(batch.x)})

    def evaluator(splits: Any, batch_size: int) -> Evaluator:
        return StageLossEvaluator(stage_loss, [model, *extra.values()], splits.val, batch_size)

    return TrainingStage(name=name, modules={"model": model, **extra}, step=step, evaluator=evaluator,
                         optim=pretrain_optim(lr), epochs=epochs, data="student")
