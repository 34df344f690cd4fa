"""Born-Again Networks (Furlanello, Lipton, Tschannen, Itti & Anandkumar, "Born-Again Neural Networks",
ICML 2018): a chain of students, each distilled from the previous generation.

- Generation 0 is the teacher of the ``teacher`` section: ``teacher.checkpoint`` (``teacher.select``
  applies), or a teacher trained in this command into ``run_dir/teacher``.
- Generation g >= 1 is a student of architecture ``model`` distilled with the ``kd`` section (default
  Hinton KD) from generation g - 1's final (``last``) checkpoint, in ``run_dir/gen-<g>``. Every generation
  is a ``distill`` run of its own, so each one resumes exactly; a finished generation is reused.
- Generation g is seeded with ``train.seed + g`` (initialisation, batch order and augmentation), so the
  students are independently initialised as in the paper; a teacher trained here is generation 0 and
  uses ``train.seed``.
- In the paper teacher and students share one architecture; a teacher whose model differs from ``model``
  is allowed, with a warning.
- ``ban.ensemble=true`` also reports BANE, the ensemble of the students of generations 1..G (the teacher
  is not a member): for every val and test sample, the mean over the students of softmax(logits) of each
  student's final (``last``) checkpoint in eval mode; ``acc`` is the top-1 accuracy (%) of that mean's
  argmax and ``loss`` its mean negative log-likelihood. It is an evaluation only: training is unchanged.

Nothing is selected on test: each student's best checkpoint is chosen on val by the engine, and the chain
always passes on final checkpoints.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from teachkit.config import RunConfig, with_changes
from teachkit.data import Splits
from teachkit.engine.checkpoint import write_json
from teachkit.engine.evaluate import predict
from teachkit.errors import ConfigError
from teachkit.options import Options, option, to_plain
from teachkit.recipes.common import RunResult, composed_cost, finished_run, load_model
from teachkit.recipes.context import RunContext
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TeacherSource, declare_teacher_use


@dataclass
class BANOptions(Options):
    """Born-Again Networks (Furlanello et al. 2018): ``generations`` students after the teacher, each
    distilled from the one before; ``ensemble`` also reports BANE (the students' mean softmax) on val/test."""

    generations: int = option(3, ge=1)
    ensemble: bool = False

    #: a finished chain may be resumed with more generations (only the new ones train) or the ensemble added
    resumable = frozenset({"generations", "ensemble"})


def generation_dir(run_dir: Path, generation: int) -> Path:
    """The folder of generation ``generation`` >= 1 of a BAN run."""
    return run_dir / f"gen-{generation}"


def _describe(model: dict[str, Any]) -> str:
    options = model.get("options") or {}
    return f"{model.get('name')} {options}" if options else str(model.get("name"))


def _warn_if_other_architecture(teacher_model: dict[str, Any], cfg: RunConfig) -> None:
    student_model = to_plain(cfg.model)
    if teacher_model != student_model:
        print(f"teachkit: warning: the teacher {_describe(teacher_model)} is not the student model "
              f"{_describe(student_model)}; Born-Again Networks distil a model into its own architecture",
              file=sys.stderr)


def _reuse_or_distill(cfg: RunConfig, resume: bool, splits: Splits, folder: Path, device: torch.device) -> RunResult:
    """A finished generation is reused (like TAKD's assistant); otherwise ``distill`` runs (resuming exactly)."""
    return finished_run(folder, device) or distill(cfg, resume=resume, splits=splits, run_dir=folder)


def _teacher_row(source: TeacherSource, state: dict[str, Any], metric: str, seed: int) -> dict[str, Any]:
    """Generation 0: the figures of the checkpoint generation 1 learns from (``state``); best-on-val figures
    from its run's summary.json, else from the checkpoint's record of its best epoch, else None."""
    path = source.checkpoint()
    best_val = best_test = None
    summary_file = path / "summary.json"
    if path.is_dir() and summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        best_val, best_test = summary.get(f"best_val_{metric}"), summary.get(f"test_{metric}_at_best")
    elif isinstance(state.get("best"), dict):
        best = state["best"]
        best_val, best_test = best.get("val", {}).get(metric), best.get("test", {}).get(metric)
    return {"generation": 0, "run_dir": str(path), "seed": None if source.given else seed,
            "epoch": state.get("epoch"), f"val_{metric}": state.get(f"val_{metric}"),
            f"test_{metric}": state.get(f"test_{metric}"), f"best_val_{metric}": best_val,
            f"test_{metric}_at_best": best_test}


def _student_row(generation: int, result: RunResult, metric: str, seed: int) -> dict[str, Any]:
    s = result.summary
    return {"generation": generation, "run_dir": str(result.run_dir), "seed": seed, "epoch": s.get("last_epoch"),
            **{k: s.get(k) for k in (f"val_{metric}", f"test_{metric}", f"best_val_{metric}",
                                     f"test_{metric}_at_best")}}


@torch.no_grad()
def ensemble_figures(folders: list[Path], splits: Splits, batch_size: int,
                     device: torch.device | str = "cpu") -> dict[str, float]:
    """BANE on val and test: the mean over ``folders`` of softmax(logits) of each run's ``last`` checkpoint
    (eval mode); ``{split}_acc`` is the top-1 accuracy (%) of its argmax, ``{split}_loss`` its mean NLL."""
    names = ("val", "test")
    sums: dict[str, torch.Tensor] = {}
    for folder in folders:
        model, _ = load_model(folder, "last", device)
        for name in names:
            probs = predict(model, getattr(splits, name), batch_size).softmax(dim=1)
            sums[name] = probs if name not in sums else sums[name] + probs
    out: dict[str, float] = {}
    for name in names:
        mean, y = sums[name] / len(folders), getattr(splits, name).y
        out[f"{name}_acc"] = float((mean.argmax(dim=1) == y).double().mean()) * 100.0
        out[f"{name}_loss"] = float(F.nll_loss(mean.clamp_min(1e-12).log(), y))
    return out


@RECIPES.register("ban", "Born-Again Networks: teacher -> gen-1 -> ... -> gen-G, each distilled from the one before "
                         "(ban.ensemble: BANE)", options=BANOptions)
def ban(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Distil ``ban.generations`` students of ``model`` in a chain from the teacher (see the module docstring)."""
    t0 = time.perf_counter()
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    options: BANOptions = ctx.section("ban")
    if options.ensemble and ctx.splits.task != "classification":
        raise ConfigError(f"{options.key('ensemble')}=true averages class probabilities; dataset "
                          f"{ctx.splits.name!r} is a {ctx.splits.task!r} task, not classification")
    source = TeacherSource(ctx)
    if not source.given:
        _warn_if_other_architecture(to_plain(cfg.teacher.model), cfg)
    _, teacher_state = source.frozen(inference=False)  # trains it into run_dir/teacher when not given
    if source.given:
        _warn_if_other_architecture(teacher_state.get("model") or {}, cfg)

    previous, select = source.checkpoint(), cfg.teacher.select
    students: list[RunResult] = []
    for g in range(1, options.generations + 1):
        folder = generation_dir(ctx.run_dir, g)
        gen_cfg = with_changes(cfg, name=f"{cfg.name}/gen-{g}", train={"seed": cfg.train.seed + g},
                               teacher={"checkpoint": str(previous), "select": select})
        students.append(_reuse_or_distill(gen_cfg, resume, ctx.splits, folder, ctx.device))
        previous, select = folder, "last"

    last = students[-1]
    metric = last.summary.get("select_metric", "acc")
    table = [_teacher_row(source, teacher_state, metric, cfg.train.seed),
             *(_student_row(g, r, metric, cfg.train.seed + g) for g, r in enumerate(students, start=1))]
    summary: dict[str, Any] = {**last.summary, "generations": table}
    if options.ensemble:
        members = [generation_dir(ctx.run_dir, g) for g in range(1, options.generations + 1)]
        summary["ensemble"] = {"members": list(range(1, options.generations + 1)), "checkpoint": "last",
                               "average": "softmax", **ensemble_figures(members, ctx.splits,
                                                                        cfg.data.eval_batch_size, ctx.device)}
    summary["cost"] = composed_cost(students, source.epochs_trained, t0)
    write_json(ctx.run_dir / "summary.json", summary)
    return RunResult(ctx.run_dir, summary, last.model, last.history)


declare_teacher_use("ban", "frozen")
