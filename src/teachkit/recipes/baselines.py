"""Pro-KD's other baselines: TAKD, early-stopped teacher (ESKD) and teacher-checkpoint search.

- TAKD (Mirzadeh et al. 2020): teacher -> teacher assistant (Hinton KD) -> student (Hinton KD). The
  public code's bugs are avoided by construction: KL is 'batchmean', the lr schedule is the engine's,
  augmentation follows ``data.augment`` and selection reads val, never test.
- ESKD (Cho & Hariharan 2019): distil from the teacher checkpoint after epoch ``eskd.epoch``.
- Checkpoint search (``eskd.search=true``): one student per saved teacher checkpoint; the best student
  on validation names the checkpoint; the total cost of the search is reported.

ESKD reads the teacher's checkpoints through its validated trajectory manifest (``Trajectory.epochs`` /
``.path``; sha256 from the manifest), never by file name; each student run is named after the teacher
epoch it follows (``<name>/from-epoch-0003``), and a line before it says which checkpoint that is.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from teachkit.config import RunConfig, with_changes
from teachkit.data import Splits
from teachkit.engine.checkpoint import write_json
from teachkit.errors import ConfigError
from teachkit.models import ModelConfig, count_parameters
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult, composed_cost, finished_run
from teachkit.recipes.context import RunContext
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TeacherSource, declare_shared_run, declare_teacher_use


@dataclass
class TAKDOptions(Options):
    """Teacher-assistant KD (Mirzadeh et al. 2020): teacher -> assistant (KD) -> student (KD)."""

    assistant: ModelConfig = option(factory=lambda: ModelConfig(name="resnet20"))
    assistant_epochs: int | None = option(None, ge=1)
    #: a finished assistant run folder to distil the student from (a sweep shares one assistant this way);
    #: None: the assistant is trained in ``run_dir/assistant``
    assistant_checkpoint: str | None = option(None, path=True)


def assistant_config(cfg: RunConfig) -> RunConfig:
    """The TAKD assistant's run: Hinton KD of ``takd.assistant`` from the teacher on the full training split, for
    ``takd.assistant_epochs`` (default ``train.epochs``)."""
    return with_changes(cfg, name=f"{cfg.name}/assistant", model=cfg.takd.assistant,
                        train={"epochs": cfg.takd.assistant_epochs or cfg.train.epochs},
                        data={"train_subset": None, "omit_classes": [], "few_shot": 0}, kd={"method": "kd"},
                        takd={"assistant_checkpoint": None})


@dataclass
class ESKDOptions(Options):
    """Early-stopped teacher (Cho & Hariharan 2019) and checkpoint search over a teacher trajectory."""

    epoch: int | None = option(None, ge=1)
    search: bool = False


@RECIPES.register("takd", "TAKD: teacher -> teacher assistant (KD) -> student (KD)", options=TAKDOptions)
def takd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Distil the assistant ``takd.assistant`` from the teacher, then the student from the assistant."""
    t0 = time.perf_counter()
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    assistant_cfg = assistant_config(cfg)
    teacher_model = cfg.teacher.model
    ta_size = count_parameters(ctx.model(cfg.takd.assistant))
    if not cfg.teacher.checkpoint:
        t_size = count_parameters(ctx.model(teacher_model))
        if ta_size > t_size:
            print(f"teachkit: warning: the assistant {cfg.takd.assistant.name} ({ta_size:,} parameters) is larger "
                  f"than the teacher {teacher_model.name} ({t_size:,})", file=sys.stderr)
    if cfg.takd.assistant_checkpoint:
        assistant_dir = Path(cfg.takd.assistant_checkpoint)
        given = finished_run(assistant_dir, ctx.device)
        if given is None:
            raise ConfigError(f"takd.assistant_checkpoint={str(assistant_dir)!r} is not a finished run folder (no "
                              "summary.json and last checkpoint); train it first or leave the option out")
        assistant = given
    else:
        assistant_dir = ctx.run_dir / "assistant"
        assistant = finished_run(assistant_dir, ctx.device) or distill(assistant_cfg, resume=resume,
                                                                       splits=ctx.full_splits(), run_dir=assistant_dir)
    student_cfg = with_changes(cfg, teacher={"checkpoint": str(assistant_dir)}, kd={"method": "kd"})
    student = distill(student_cfg, resume=resume, splits=ctx.splits, run_dir=ctx.run_dir / "student")
    summary = {**student.summary, "assistant": {k: assistant.summary.get(k) for k in
                                                ("val_acc", "test_acc", "best_val_acc", "test_acc_at_best")},
               "cost": composed_cost([assistant, student], TeacherSource(ctx).epochs_trained, t0)}
    write_json(ctx.run_dir / "summary.json", summary)
    return RunResult(ctx.run_dir, summary, student.model, student.history)


@RECIPES.register("eskd", "early-stopped teacher (eskd.epoch) or search over every teacher checkpoint (eskd.search)",
                  options=ESKDOptions)
def eskd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Hinton KD from a teacher trajectory checkpoint; with ``eskd.search`` from each, keeping the best on val."""
    t0 = time.perf_counter()
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    source = TeacherSource(ctx)
    trajectory = source.recorded()
    available = [e for e in trajectory.epochs if e > 0]
    if cfg.eskd.search:
        epochs = available
    else:
        if cfg.eskd.epoch is None:
            raise ConfigError("eskd needs eskd.epoch (the teacher checkpoint to distil from) or eskd.search=true")
        if cfg.eskd.epoch not in available:
            raise ConfigError(f"eskd.epoch={cfg.eskd.epoch} has no teacher checkpoint; saved epochs: {available}")
        epochs = [cfg.eskd.epoch]
    runs = {}
    for i, epoch in enumerate(epochs, start=1):
        folder = f"from-epoch-{epoch:04d}"
        student_cfg = with_changes(cfg, name=f"{cfg.name}/{folder}", kd={"method": "kd"},
                                   teacher={"checkpoint": str(trajectory.path(epoch))})
        if cfg.train.progress:
            tqdm.write(f"{cfg.name}: student {i}/{len(epochs)} follows the teacher checkpoint after epoch {epoch} "
                       f"({trajectory.path(epoch)})")
        runs[epoch] = distill(student_cfg, resume=resume, splits=ctx.splits, run_dir=ctx.run_dir / folder)
    metric = next(iter(runs.values())).summary["select_metric"]
    sign = 1.0 if ctx.evaluator().direction(metric) == "max" else -1.0
    if cfg.train.select_mode != "auto":
        sign = 1.0 if cfg.train.select_mode == "max" else -1.0
    best_epoch = max(runs, key=lambda e: (sign * runs[e].summary[f"best_val_{metric}"], -e))
    best = runs[best_epoch]
    keys = (f"best_val_{metric}", f"val_{metric}", f"test_{metric}", f"test_{metric}_at_best")
    table = [{"teacher_epoch": e, **{k: r.summary[k] for k in keys}} for e, r in runs.items()]
    summary = {**best.summary, "teacher_epoch": best_epoch, "search": table,
               "cost": composed_cost(list(runs.values()), source.epochs_trained, t0)}
    write_json(ctx.run_dir / "summary.json", summary)
    return RunResult(ctx.run_dir, summary, best.model, best.history)


declare_teacher_use("takd", "frozen")
declare_shared_run("takd", "assistant", lambda cfg: ("kd", assistant_config(cfg)), "takd.assistant_checkpoint",
                   when=lambda cfg: not cfg.takd.assistant_checkpoint)
declare_teacher_use("eskd", "recorded")
