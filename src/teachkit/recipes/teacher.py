"""Where a run's teacher comes from, one way for every recipe.

:class:`TeacherSource` reads the ``teacher`` section: a checkpoint (``teacher.checkpoint``: a file or a run
folder, ``teacher.select`` last|best) or a teacher trained in this command into ``run_dir/teacher`` on the
full training split (reused when that run finished, resumed exactly when it did not). It hands the
teacher out as

- :meth:`TeacherSource.frozen`: the final teacher, frozen (kd, takd, eskd's students);
- :meth:`TeacherSource.recorded`: its recorded trajectory (every ``save_every`` epochs: eskd, checkpoint
  search, Pro-KD replay);
- :meth:`TeacherSource.trajectory`: a :class:`TeacherTrajectory` giving "the teacher after epoch k", either
  ``online`` (a teacher :class:`~teachkit.engine.Trainer` advanced epoch by epoch alongside the student,
  recording every epoch plus the initialisation as epoch 0) or ``replay`` (the sha256-verified checkpoints
  of a recorded run). Both hand out the same weights, so students that follow them are identical.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from teachkit.config import RunConfig, with_changes
from teachkit.engine import Trainer, Trajectory
from teachkit.engine.checkpoint import strip
from teachkit.engine.trainer import channels_last
from teachkit.errors import CheckpointError, ConfigError
from teachkit.models import FrozenTeacher
from teachkit.recipes.common import check_compatible, load_model
from teachkit.recipes.context import RunContext
from teachkit.recipes.standalone import label_step, train_model

TEACHER_DIR = "teacher"
T = TypeVar("T")


def teacher_run_config(cfg: RunConfig, save_every: int = 1) -> RunConfig:
    """The config of a teacher trained in-command: full train split, its own model/optim/epochs/loss."""
    t = cfg.teacher
    return with_changes(cfg, name=f"{cfg.name}/teacher", model=t.model, optim=t.optim,
                        train={"epochs": t.epochs, "loss": t.loss, "save_every": save_every},
                        data={"train_subset": None, "omit_classes": [], "few_shot": 0})


class TeacherSource:
    """The teacher of the run ``ctx`` (see the module docstring)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg.teacher
        self.folder = ctx.run_dir / TEACHER_DIR

    @property
    def given(self) -> bool:
        """True when ``teacher.checkpoint`` names the teacher; False when this command trains it."""
        return bool(self.cfg.checkpoint)

    @property
    def epochs_trained(self) -> int:
        """Teacher epochs this run trains (0 for a given teacher), for the cost report."""
        return 0 if self.given else self.cfg.epochs

    def _train_here(self, save_every: int) -> Path:
        if not (self.folder / "summary.json").is_file():
            train_model(teacher_run_config(self.ctx.cfg, save_every), resume=self.ctx.resume,
                        splits=self.ctx.full_splits(), run_dir=self.folder)
        return self.folder

    def checkpoint(self) -> Path:
        """Where the final teacher is: ``teacher.checkpoint`` (a file or a run folder), or the run folder of
        the teacher trained in this command (trained now unless it finished before)."""
        return Path(self.cfg.checkpoint) if self.given else self._train_here(save_every=0)

    def frozen(self) -> tuple[FrozenTeacher, dict[str, Any]]:
        """The final teacher (``teacher.select``), frozen, on the run's device; checked against the student's
        data. Returns the module and its checkpoint's state (epoch, val/test metrics, model, ...)."""
        path = self.checkpoint()
        model, state = load_model(path, self.cfg.select, self.ctx.device)
        check_compatible(state, self.ctx.splits)
        return FrozenTeacher(channels_last(model, self.ctx.cfg.train.channels_last)), state

    def recorded(self) -> Trajectory:
        """The teacher's recorded trajectory: from ``teacher.checkpoint``'s run folder, or trained now
        (``train.save_every=1``) into ``run_dir/teacher``."""
        folder = Path(self.cfg.checkpoint) if self.given else self._train_here(save_every=1)
        manifest = folder / "trajectory" / Trajectory.MANIFEST
        if not manifest.is_file():
            raise CheckpointError(f"no trajectory manifest {str(manifest)!r}: train the teacher with "
                                  f"train.save_every=1 to record one")
        trajectory = Trajectory(folder / "trajectory")
        if not trajectory.entries:
            raise CheckpointError(f"trajectory {str(manifest)!r} lists no checkpoints")
        return trajectory

    def learned(self, file: str, load: Callable[[Path], T | None], train: Callable[[], T]) -> T:
        """A teacher that is not a classifier (L2T-DLF's loss teacher), stored as ``file``: loaded from
        ``teacher.checkpoint`` (that file, or a run folder holding it); otherwise, on resume, reused from this
        run's folder when ``load`` accepts it (returns None for an unfinished one); otherwise trained now."""
        if self.given:
            path = Path(self.cfg.checkpoint)
            path = path / file if path.is_dir() else path
            if not path.is_file():
                raise CheckpointError(f"teacher checkpoint {str(path)!r} does not exist")
            teacher = load(path)
            if teacher is None:
                raise CheckpointError(f"teacher checkpoint {str(path)!r} holds an unfinished teacher")
            return teacher
        own = self.ctx.run_dir / file
        if self.ctx.resume and own.is_file():
            teacher = load(own)
            if teacher is not None:
                return teacher
        return train()

    def trajectory(self, mode: str) -> TeacherTrajectory:
        """The teacher after any epoch: ``online`` (trained in this run, interleaved with the student) or
        ``replay`` (the recorded run folder ``teacher.checkpoint``)."""
        ctx = self.ctx
        if mode == "online":
            if self.given:
                raise ConfigError("online mode trains the teacher itself; to follow a recorded teacher set "
                                  "prokd.mode=replay (teacher.checkpoint names its run folder)")
            tcfg = teacher_run_config(ctx.cfg)
            child = ctx.child(TEACHER_DIR, tcfg, ctx.full_splits())
            child.seed()
            model = child.model()
            trainer = child.trainer(model, label_step(model, tcfg.train), meta=child.meta(tcfg.train.loss),
                                    desc=f"{ctx.cfg.name} teacher")
            assert trainer.trajectory is not None
            if 0 not in trainer.trajectory.epochs:
                trainer.trajectory.add(0, {}, trainer.weights(), {**trainer.meta, "epoch": 0})
            frozen = FrozenTeacher(channels_last(copy.deepcopy(model), ctx.cfg.train.channels_last))
            return TeacherTrajectory(frozen, trainer.trajectory, tcfg.train.epochs, trainer)
        if not self.given:
            raise ConfigError("replay mode needs teacher.checkpoint: the run folder of a teacher trained "
                              "with train.save_every=1 (its trajectory/trajectory.json)")
        trajectory = self.recorded()
        model, state = load_model(trajectory.path(trajectory.epochs[-1]), device=ctx.device)
        check_compatible(state, ctx.splits)
        frozen = FrozenTeacher(channels_last(model, ctx.cfg.train.channels_last))
        return TeacherTrajectory(frozen, trajectory, max(trajectory.epochs))


class TeacherTrajectory:
    """Teacher weights after any epoch k (0 = initialisation), as one frozen module whose weights change.

    With a ``trainer`` (online) the teacher is trained on demand up to the epoch asked for; without one
    (replay) the recorded checkpoints are loaded (sha256-verified).
    """

    def __init__(self, frozen: FrozenTeacher, trajectory: Trajectory, total_epochs: int,
                 trainer: Trainer | None = None) -> None:
        self.frozen, self.trajectory, self.total_epochs, self.trainer = frozen, trajectory, total_epochs, trainer
        self.mode = "online" if trainer is not None else "replay"
        self.epochs_trained_here = 0
        self.loaded_epoch: int | None = None

    @property
    def epochs(self) -> list[int]:
        """The teacher epochs with a checkpoint (online: all of 0..E)."""
        if self.trainer is not None:
            return list(range(self.total_epochs + 1))
        return self.trajectory.epochs

    def advance_to(self, epoch: int) -> None:
        """Online: train the teacher until it has completed ``epoch`` epochs."""
        if self.trainer is None:
            return
        while self.trainer.epoch < epoch:
            self.trainer.run_epoch()
            self.epochs_trained_here += 1

    def at(self, epoch: int) -> FrozenTeacher:
        """The frozen teacher with its weights after ``epoch`` epochs."""
        if epoch == self.loaded_epoch:
            return self.frozen
        if self.trainer is not None:
            self.advance_to(epoch)
            if self.trainer.epoch == epoch:
                self.frozen.module.load_state_dict(self.trainer.model.state_dict())
                self.loaded_epoch = epoch
                return self.frozen
        if epoch not in self.epochs:
            raise CheckpointError(f"teacher trajectory has no checkpoint after epoch {epoch} (it has "
                                  f"{self.epochs[:3]}...{self.epochs[-3:]}); record every epoch with "
                                  f"train.save_every=1")
        tensors, _ = self.trajectory.load(epoch)
        self.frozen.module.load_state_dict(strip("model/", tensors))
        self.loaded_epoch = epoch
        return self.frozen

    def finish(self) -> None:
        """Online: train the teacher's remaining epochs (if any) and write its summary."""
        if self.trainer is not None:
            self.advance_to(self.total_epochs)
            self.trainer.finish()
