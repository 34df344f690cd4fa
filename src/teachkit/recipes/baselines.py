"""Pro-KD's other baselines: TAKD, early-stopped teacher (ESKD) and teacher-checkpoint search.

- TAKD (Mirzadeh et al. 2020): teacher -> teacher assistant (Hinton KD) -> student (Hinton KD). The
  public code's bugs are avoided by construction: KL is 'batchmean', the lr schedule is the engine's,
  augmentation follows ``data.augment`` and selection reads val, never test.
- ESKD (Cho & Hariharan 2019): distil from the teacher checkpoint after epoch ``eskd.epoch``.
- Checkpoint search (``eskd.search=true``): one student per saved teacher checkpoint; the best student
  on validation names the checkpoint; the total cost of the search is reported.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from teachkit.config import RunConfig
from teachkit.data.base import Splits
from teachkit.engine.checkpoint import Trajectory, write_json
from teachkit.errors import CheckpointError, ConfigError
from teachkit.models import count_parameters
from teachkit.recipes.common import RunResult, device_of, load_data, make_model, prepare_run_dir, with_changes
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model
from teachkit.recipes.trajectory import teacher_run_config


def _cost(results: list[RunResult], teacher_epochs: int, t0: float) -> dict:
    return {"teacher_epochs_trained": teacher_epochs,
            "student_epochs": sum(r.summary.get("epochs", 0) for r in results),
            "teacher_forward_images": sum(r.summary.get("cost", {}).get("teacher_forward_images", 0) for r in results),
            "wall_time_s": time.perf_counter() - t0}


@RECIPES.register("takd", "TAKD: teacher -> teacher assistant (KD) -> student (KD)")
def takd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Distil the assistant ``takd.assistant`` from the teacher, then the student from the assistant."""
    t0 = time.perf_counter()
    device = device_of(cfg)
    run_dir = prepare_run_dir(cfg, resume, run_dir)
    splits = splits if splits is not None else load_data(cfg.data, device)
    assistant_cfg = with_changes(cfg, name=f"{cfg.name}/assistant", model=cfg.takd.assistant,
                                 train={"epochs": cfg.takd.assistant_epochs or cfg.train.epochs},
                                 data={"train_subset": None, "omit_classes": [], "few_shot": 0}, kd={"method": "kd"})
    teacher_model = cfg.teacher.model
    ta_size = count_parameters(make_model(cfg.takd.assistant, splits, device))
    if not cfg.teacher.checkpoint:
        t_size = count_parameters(make_model(teacher_model, splits, device))
        if ta_size > t_size:
            print(f"teachkit: warning: the assistant {cfg.takd.assistant.name} ({ta_size:,} parameters) is larger "
                  f"than the teacher {teacher_model.name} ({t_size:,})", file=sys.stderr)
    assistant_dir = run_dir / "assistant"
    if (assistant_dir / "summary.json").is_file():
        assistant = RunResult(assistant_dir, json.loads((assistant_dir / "summary.json").read_text()), None)
    else:
        full = load_data(cfg.data, device, subset=False)
        assistant = distill(assistant_cfg, resume=resume, splits=full, run_dir=assistant_dir)
    student_cfg = with_changes(cfg, teacher={"checkpoint": str(assistant_dir)}, kd={"method": "kd"})
    student = distill(student_cfg, resume=resume, splits=splits, run_dir=run_dir / "student")
    teacher_epochs = 0 if cfg.teacher.checkpoint else cfg.teacher.epochs
    summary = {**student.summary, "assistant": {k: assistant.summary.get(k) for k in
                                                ("val_acc", "test_acc", "best_val_acc", "test_acc_at_best")},
               "cost": _cost([assistant, student], teacher_epochs, t0)}
    write_json(run_dir / "summary.json", summary)
    return RunResult(run_dir, summary, student.model, student.history)


def trajectory_of(cfg: RunConfig, run_dir: Path, resume: bool, device) -> tuple[Trajectory, Path, int]:
    """The teacher trajectory: recorded in ``teacher.checkpoint``, or trained now into run_dir/teacher."""
    if cfg.teacher.checkpoint:
        folder, trained = Path(cfg.teacher.checkpoint), 0
    else:
        folder = run_dir / "teacher"
        if not (folder / "summary.json").is_file():
            train_model(teacher_run_config(cfg), resume=resume, splits=load_data(cfg.data, device, subset=False),
                        run_dir=folder)
        trained = cfg.teacher.epochs
    manifest = folder / "trajectory" / Trajectory.MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"no trajectory manifest {str(manifest)!r}: train the teacher with train.save_every=k")
    return Trajectory(folder / "trajectory"), folder, trained


@RECIPES.register("eskd", "early-stopped teacher (eskd.epoch) or search over every teacher checkpoint (eskd.search)")
def eskd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Hinton KD from a teacher trajectory checkpoint; with ``eskd.search`` from each, keeping the best on val."""
    t0 = time.perf_counter()
    device = device_of(cfg)
    run_dir = prepare_run_dir(cfg, resume, run_dir)
    splits = splits if splits is not None else load_data(cfg.data, device)
    trajectory, folder, trained = trajectory_of(cfg, run_dir, resume, device)
    available = [e["epoch"] for e in trajectory.entries if e["epoch"] > 0]
    if cfg.eskd.search:
        epochs = available
    else:
        if cfg.eskd.epoch is None:
            raise ConfigError("eskd needs eskd.epoch (the teacher checkpoint to distil from) or eskd.search=true")
        if cfg.eskd.epoch not in available:
            raise ConfigError(f"eskd.epoch={cfg.eskd.epoch} has no teacher checkpoint; saved epochs: {available}")
        epochs = [cfg.eskd.epoch]
    runs = {}
    for epoch in epochs:
        file = folder / "trajectory" / f"epoch_{epoch:04d}.safetensors"
        student_cfg = with_changes(cfg, teacher={"checkpoint": str(file)}, kd={"method": "kd"})
        runs[epoch] = distill(student_cfg, resume=resume, splits=splits, run_dir=run_dir / f"from-epoch-{epoch:04d}")
    best_epoch = max(runs, key=lambda e: (runs[e].summary["best_val_acc"], -e))
    best = runs[best_epoch]
    table = [{"teacher_epoch": e, "best_val_acc": r.summary["best_val_acc"], "val_acc": r.summary["val_acc"],
              "test_acc": r.summary["test_acc"], "test_acc_at_best": r.summary["test_acc_at_best"]}
             for e, r in runs.items()]
    summary = {**best.summary, "teacher_epoch": best_epoch, "search": table,
               "cost": _cost(list(runs.values()), trained, t0)}
    write_json(run_dir / "summary.json", summary)
    return RunResult(run_dir, summary, best.model, best.history)
