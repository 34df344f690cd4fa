"""A resumed run's ``cost`` counts every epoch the run trained, not only those of the last session."""

from __future__ import annotations

import pytest
import torch

from teachkit.engine import Trainer
from teachkit.recipes import RECIPES


class Interrupt(BaseException):
    """A kill, as the engine sees one (not an Exception: nothing may swallow it)."""


def interrupt_teacher_at(monkeypatch: pytest.MonkeyPatch, done: int) -> None:
    """Make the in-command teacher's trainer stop once it has finished ``done`` epochs."""
    real = Trainer.run_epoch

    def run_epoch(self: Trainer):
        if self.run_dir.name == "teacher" and self.epoch == done:
            raise Interrupt
        return real(self)

    monkeypatch.setattr(Trainer, "run_epoch", run_epoch)


def follow_cfg(tiny, name: str):
    teacher = {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 4}
    return tiny(name=name, train={"epochs": 5, "progress": False}, teacher=teacher,
                prokd={"mode": "online", "tau_max": 3}, rco={"anchors": 2})


@pytest.mark.parametrize("recipe", ["prokd", "annealing", "rco"])
def test_online_teacher_epochs_are_counted_over_a_resume(tiny, monkeypatch, recipe):
    """Interrupted after 2 of the teacher's 4 epochs, then resumed: the summary counts all 4."""
    with monkeypatch.context() as m:
        interrupt_teacher_at(m, 2)
        with pytest.raises(Interrupt):
            RECIPES.get(recipe)(follow_cfg(tiny, recipe))
    resumed = RECIPES.get(recipe)(follow_cfg(tiny, recipe), resume=True)
    assert resumed.summary["cost"]["teacher_epochs_trained"] == 4
    assert resumed.summary["cost"]["teacher_epochs"] == 4
    if recipe == "prokd":  # the resumed student is the one an uninterrupted run makes
        straight = RECIPES.get(recipe)(follow_cfg(tiny, "straight"))
        assert straight.summary["cost"]["teacher_epochs_trained"] == 4
        for (k, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(),
                                  strict=True):
            assert torch.equal(a, b), k


def test_kd_teacher_epochs_are_counted_over_a_resume(tiny, monkeypatch):
    """kd with a teacher trained in the command, interrupted inside the teacher's run: all its epochs count."""
    cfg = tiny(name="kd", teacher={"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 3})
    with monkeypatch.context() as m:
        interrupt_teacher_at(m, 1)
        with pytest.raises(Interrupt):
            RECIPES.get("kd")(cfg)
    resumed = RECIPES.get("kd")(cfg, resume=True)
    assert resumed.summary["cost"]["teacher_epochs_trained"] == 3
