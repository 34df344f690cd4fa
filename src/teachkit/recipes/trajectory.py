"""A teacher's training trajectory, trained live (online) or read from a recorded run (replay).

Pro-KD, RCO, early-stopped teachers and checkpoint search all need "the teacher after epoch k".
:class:`TeacherTrajectory` gives it either way: ``online`` advances a teacher :class:`Trainer` epoch
by epoch (recording every epoch, plus the initialisation as epoch 0); ``replay`` loads the
sha256-verified checkpoints listed in ``trajectory/trajectory.json`` of a teacher run folder.
Both hand out the same weights, so students that follow them are identical.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from teachkit.config import RunConfig
from teachkit.data.base import Splits
from teachkit.engine.checkpoint import Trajectory, strip
from teachkit.engine.trainer import Trainer, to_memory_format, weights_state
from teachkit.errors import CheckpointError, ConfigError
from teachkit.recipes.common import (
    FrozenTeacher,
    check_compatible,
    load_model,
    make_model,
    model_meta,
    prepare_run_dir,
    seed_everything,
    with_changes,
)
from teachkit.recipes.standalone import label_step


def teacher_run_config(cfg: RunConfig, save_every: int = 1) -> RunConfig:
    """The config of a teacher trained in-command: full train split, its own model/optim/epochs/loss."""
    t = cfg.teacher
    return with_changes(cfg, name=f"{cfg.name}/teacher", model=t.model, optim=t.optim,
                        train={"epochs": t.epochs, "loss": t.loss, "save_every": save_every},
                        data={"train_subset": None, "omit_classes": [], "few_shot": 0})


class TeacherTrajectory:
    """Teacher weights after any epoch k (0 = initialisation), as a frozen module for distillation."""

    def __init__(self, cfg: RunConfig, mode: str, teacher_splits: Splits, student_splits: Splits,
                 run_dir: Path, resume: bool = False) -> None:
        self.mode = mode
        self.epochs_trained_here = 0
        if mode == "online":
            if cfg.teacher.checkpoint:
                raise ConfigError("online mode trains the teacher itself; to follow a recorded teacher set "
                                  "prokd.mode=replay (teacher.checkpoint names its run folder)")
            tcfg = teacher_run_config(cfg)
            teacher_dir = prepare_run_dir(tcfg, resume, run_dir / "teacher")
            seed_everything(tcfg.train.seed, tcfg.train.deterministic)
            model = make_model(tcfg.model, teacher_splits, teacher_splits.train.x.device)
            meta = model_meta(tcfg, teacher_splits, tcfg.train.loss)
            self.trainer = Trainer(model, label_step(model, tcfg), teacher_splits, tcfg, teacher_dir, meta=meta,
                                   resume=resume, desc=f"{cfg.name} teacher")
            self.trajectory = self.trainer.trajectory
            assert self.trajectory is not None
            if not any(e["epoch"] == 0 for e in self.trajectory.entries):
                self.trajectory.add(0, float("nan"), weights_state(model, None), {**meta, "epoch": 0})
            self.total_epochs = tcfg.train.epochs
            self.frozen = FrozenTeacher(to_memory_format(copy.deepcopy(model), cfg, student_splits))
            self.state = meta
        else:
            if not cfg.teacher.checkpoint:
                raise ConfigError("replay mode needs teacher.checkpoint: the run folder of a teacher trained "
                                  "with train.save_every=1 (its trajectory/trajectory.json)")
            folder = Path(cfg.teacher.checkpoint)
            manifest = folder / "trajectory" / Trajectory.MANIFEST
            if not manifest.is_file():
                raise CheckpointError(f"no trajectory manifest {str(manifest)!r}: train the teacher with "
                                      f"train.save_every=1 to record one")
            self.trajectory = Trajectory(folder / "trajectory")
            if not self.trajectory.entries:
                raise CheckpointError(f"trajectory {str(manifest)!r} lists no checkpoints")
            model, state = load_model(folder / "trajectory" / self.trajectory.entries[-1]["file"])
            check_compatible(state, student_splits)
            self.total_epochs = max(e["epoch"] for e in self.trajectory.entries)
            self.frozen = FrozenTeacher(to_memory_format(model.to(student_splits.train.x.device), cfg, student_splits))
            self.state = state
        self.loaded_epoch: int | None = None

    @property
    def epochs(self) -> list[int]:
        """The teacher epochs with a checkpoint (online: all of 0..E)."""
        if self.mode == "online":
            return list(range(self.total_epochs + 1))
        return [e["epoch"] for e in self.trajectory.entries]

    def advance_to(self, epoch: int) -> None:
        """Online: train the teacher until it has completed ``epoch`` epochs."""
        if self.mode != "online":
            return
        while self.trainer.epoch < epoch:
            self.trainer.run_epoch()
            self.epochs_trained_here += 1

    def at(self, epoch: int) -> nn.Module:
        """The frozen teacher with its weights after ``epoch`` epochs."""
        if epoch == self.loaded_epoch:
            return self.frozen
        if self.mode == "online":
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
        if self.mode == "online":
            self.advance_to(self.total_epochs)
            self.trainer.finish()
