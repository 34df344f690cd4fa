"""Shared loss types: training progress and the distillation-loss interface."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from teachkit.data.base import Batch
from teachkit.errors import ConfigError
from teachkit.models.taps import Taps
from teachkit.registry import closest


@dataclass(frozen=True)
class Progress:
    """Where training is: ``epoch`` counts from 0; ``fraction`` of all steps done, in [0, 1)."""

    epoch: int
    step: int
    epochs: int
    steps_per_epoch: int

    @property
    def fraction(self) -> float:
        return (self.epoch * self.steps_per_epoch + self.step) / max(1, self.epochs * self.steps_per_epoch)

    @property
    def epoch_float(self) -> float:
        """Epochs done, fractional (epoch 2, half way -> 2.5): for per-step warm-ups."""
        return self.epoch + self.step / max(1, self.steps_per_epoch)


class DistillLoss(nn.Module):
    """One distillation objective comparing student and teacher taps (uniform interface).

    Subclasses set ``needs`` (the taps they read: "logits", "embedding", "stages", "stages_pre"),
    ``default_weight`` (the paper's gamma in  L = CE + gamma * L_distill) and implement
    ``forward(student, teacher, batch, progress) -> dict[str, Tensor]`` of *unweighted* named terms
    (the :class:`~teachkit.losses.distiller.Distiller` multiplies them by gamma). Trainable auxiliary
    modules (regressors, embeddings, memory banks) are built in ``__init__`` from the probed taps of a
    dummy batch -- never from hand-written shapes -- and train, save and resume with the student.

    ``__init__(student, teacher, *, num_classes, num_samples, **options)``: ``student``/``teacher``
    are probed :class:`Taps` (batch of 2, eval mode, no grad), ``num_samples`` the size of the
    student's training split (memory banks indexed by ``batch.index``).
    """

    needs: ClassVar[tuple[str, ...]] = ("logits",)
    default_weight: ClassVar[float] = 1.0
    #: True when the method computes its own label loss (the Distiller then adds no CE term).
    replaces_ce: ClassVar[bool] = False

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int, num_samples: int) -> None:
        super().__init__()

    def transform_batch(self, batch: Batch) -> Batch:
        """The batch both models see (HSAKD: each image with its 4 rotations). Default: unchanged.

        The original samples must stay first (rows 0..B-1): the engine's train accuracy reads them."""
        return batch

    def prepare_teacher(self, teacher: nn.Module, splits: Any, cfg: Any, run_dir: Any) -> None:
        """A recipe step run once before the student trains (HSAKD: fit the teacher's auxiliary heads
        with its backbone frozen). ``teacher`` is the frozen, tapped teacher. Default: nothing."""

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        raise NotImplementedError


def option_names(cls: type) -> list[str]:
    """The keyword options a DistillLoss accepts beyond the probes, num_classes and num_samples."""
    fixed = {"self", "student", "teacher", "num_classes", "num_samples"}
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name not in fixed and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_options(method: str, cls: type, options: dict[str, Any]) -> None:
    """Unknown option names for ``method`` as a one-line ConfigError naming the allowed ones."""
    allowed = option_names(cls)
    for key in options:
        if key not in allowed:
            raise ConfigError(f"kd.options.{method}.{key} is not an option of {method!r}{closest(key, allowed)}; "
                              f"allowed: {', '.join(allowed) or 'none'}")
