"""Shared loss types: training progress and the distillation-loss interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from teachkit.data.base import Batch
from teachkit.models.taps import Taps


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


class DistillLoss(nn.Module):
    """A distillation objective comparing student and teacher taps.

    Subclasses set ``needs`` (the taps they read) and implement
    ``forward(student, teacher, batch, progress) -> dict[str, Tensor]`` of *weighted* named terms
    that the engine sums. Trainable auxiliary modules (regressors, embeddings) are submodules built
    in ``__init__`` from probed taps of one dummy batch, and train and checkpoint with the student.
    """

    needs: ClassVar[tuple[str, ...]] = ("logits",)

    def __init__(self, student_probe: Taps | None = None, teacher_probe: Taps | None = None) -> None:
        super().__init__()

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        raise NotImplementedError
