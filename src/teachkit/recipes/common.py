"""Pieces every recipe composes: run results, seeding, data, model checkpoints, compatibility checks."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from teachkit.config import RunConfig, from_dict, to_dict, with_changes
from teachkit.data import DataConfig, Splits, splits_for
from teachkit.data.raw import is_tokens
from teachkit.data.text import check_tokenizer, tokenizer_of
from teachkit.engine import load_checkpoint, resolve_device
from teachkit.engine.checkpoint import describe_mismatch, strip
from teachkit.engine.runlog import RunLog
from teachkit.errors import CheckpointError, ConfigError
from teachkit.models import FrozenTeacher, ModelConfig, make_model
from teachkit.models.text import check_recorded_fits
from teachkit.options import short_repr
from teachkit.trust import TrustError, reading_from

__all__ = ["FrozenTeacher", "RunResult", "check_compatible", "checkpoint_file", "composed_cost", "device_of",
           "finished_run", "load_data", "load_model", "model_meta", "seed_everything", "student_of", "with_changes"]


@dataclass
class RunResult:
    """A finished run: its folder, summary.json contents, per-epoch history and trained model."""

    run_dir: Path
    summary: dict[str, Any]
    model: nn.Module | None
    history: list[dict[str, Any]] = field(default_factory=list)


def finished_run(folder: Path, device: torch.device | str = "cpu") -> RunResult | None:
    """The run in ``folder`` when it finished (its ``summary.json`` exists): summary, per-epoch history and its
    final model; None otherwise. Composed recipes (TAKD's assistant, BAN's generations) reuse finished parts."""
    folder = Path(folder)
    if not (folder / "summary.json").is_file():
        return None
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"run summary {str(folder / 'summary.json')!r} is unreadable") from None
    model = load_model(folder, "last", device)[0] if (folder / "checkpoints" / "last.safetensors").is_file() else None
    return RunResult(folder, summary, model, RunLog(folder).records())


def run_wall_time(summary: dict[str, Any]) -> float:
    """The total wall time of a finished run from its summary: its ``cost.wall_time_s`` (everything the run is
    made of) when it has one, else its own ``wall_time_s``; 0 when neither is a number."""
    cost = summary.get("cost")
    for value in ((cost or {}).get("wall_time_s") if isinstance(cost, dict) else None, summary.get("wall_time_s")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return float(value)
    return 0.0


def folder_wall_time(folder: Path) -> float:
    """The total wall time of the finished run in ``folder`` (:func:`run_wall_time`); 0 when it has none."""
    summary_file = Path(folder) / "summary.json"
    if not summary_file.is_file():
        return 0.0
    try:
        return run_wall_time(json.loads(summary_file.read_text()))
    except (OSError, json.JSONDecodeError, AttributeError):
        raise CheckpointError(f"run summary {str(summary_file)!r} is unreadable") from None


def composed_cost(results: list[RunResult], teacher_epochs: int, t0: float,
                  teacher_dir: Path | None = None) -> dict[str, Any]:
    """The ``cost`` block of a recipe made of several runs: teacher epochs it trains, student epochs and
    teacher forward images summed over the runs, and ``wall_time_s``, the TOTAL: the wall time of every run the
    result is made of (each counted over all its sessions, so a resumed or reused run still counts) plus the
    teacher trained in the recipe's folder (``teacher_dir``, default ``<folder>/teacher`` beside the runs,
    counted when ``teacher_epochs`` > 0). The composed summary's own ``wall_time_s`` is its final student's
    (copied from that run's summary), so ``cost.wall_time_s`` >= ``wall_time_s`` always; ``t0`` (when this
    command started) only bounds it from below when this command took longer than its parts."""
    wall = sum(run_wall_time(r.summary) for r in results)
    if teacher_epochs > 0 and results:
        folder = teacher_dir if teacher_dir is not None else Path(results[0].run_dir).parent / "teacher"
        summary_file = folder / "summary.json"
        if summary_file.is_file():
            try:
                wall += run_wall_time(json.loads(summary_file.read_text()))
            except (OSError, json.JSONDecodeError, AttributeError):
                raise CheckpointError(f"run summary {str(summary_file)!r} is unreadable") from None
    return {"teacher_epochs_trained": teacher_epochs,
            "student_epochs": sum(r.summary.get("epochs", 0) for r in results),
            "teacher_forward_images": sum(r.summary.get("cost", {}).get("teacher_forward_images", 0) for r in results),
            "wall_time_s": max(wall, time.perf_counter() - t0)}


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def load_data(data: DataConfig, device: torch.device | str, subset: bool = True) -> Splits:
    """The dataset's splits on ``device``. ``subset=False`` (teachers) ignores the student's transfer-set
    options ``data.train_subset``, ``omit_classes`` and ``few_shot``."""
    return splits_for(data if subset else data.full()).to(device)


def device_of(cfg: RunConfig) -> torch.device:
    return resolve_device(cfg.train.device)


def model_meta(cfg: RunConfig, splits: Splits, loss: str) -> dict[str, Any]:
    """What a checkpoint records to be loadable on its own: model, shapes, data, objective, and the training
    split's per-channel statistics its inputs were normalised with (``normalisation``: a teacher used on data
    normalised otherwise gets its inputs re-normalised to them)."""
    meta = {"model": to_dict(cfg.model), "input_shape": list(splits.input_shape), "data": to_dict(cfg.data),
            "num_classes": splits.num_classes, "dataset": splits.name, "loss": loss, "task": splits.task}
    if splits.class_names is not None:  # the run's own label names (a predictor's labels)
        meta["class_names"] = list(splits.class_names)
    if splits.feature_names is not None:  # a table's feature columns, in the model's input order
        meta["feature_names"] = list(splits.feature_names)
    if splits.mean is not None and splits.std is not None:
        meta["normalisation"] = {"mean": splits.mean.flatten().tolist(), "std": splits.std.flatten().tolist()}
    vocabulary = getattr(splits.train.x, "vocabulary_digest", None)  # token-level outputs over a vocabulary
    if vocabulary is not None:
        meta["vocabulary"] = vocabulary
    tokenizer = tokenizer_of(splits.train.x, str(cfg.model.options.get("inputs", "student")))  # the ids it reads
    if tokenizer is not None:
        meta["tokenizer"] = tokenizer
    notes = dict(getattr(splits.train.x, "data_notes", None) or {})  # what reading the files did (lines skipped)
    if splits.warnings:  # the data's one-line warnings (pairs skipped, one class)
        notes["warnings"] = list(splits.warnings)
    if notes:
        meta["data_notes"] = notes
    return meta


def checkpoint_file(path: str | Path, select: str = "last") -> Path:
    """A checkpoint file from a file path or a run folder (``checkpoints/{select}.safetensors``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / f"{select}.safetensors"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return path


def _positive_int(value: Any) -> bool:
    return type(value) is int and value >= 1


def shape_and_classes(state: dict[str, Any], file: str | Path | None) -> tuple[tuple[int, ...], int]:
    """(input shape, class count) a checkpoint's state records; a one-line CheckpointError naming ``file`` and
    the field when one is missing or of the wrong type."""
    name = f"checkpoint {str(file)!r}" if file is not None else "the teacher checkpoint"
    for key, ok, expected in (
            ("input_shape", lambda v: isinstance(v, list) and bool(v) and all(_positive_int(d) for d in v),
             "a list of positive integers"),
            ("num_classes", _positive_int, "a positive integer")):
        if key not in state:
            raise CheckpointError(f"{name} has no {key!r} field (expected {expected})")
        if not ok(state[key]):
            raise CheckpointError(f"{name} has {key}={short_repr(state[key])}, not {expected}")
    return tuple(state["input_shape"]), state["num_classes"]


def model_fields(state: dict[str, Any], file: str | Path) -> tuple[ModelConfig, tuple[int, ...], int]:
    """(model config, input shape, class count) a checkpoint's state records; a one-line CheckpointError naming
    ``file`` and the field when one is missing or of the wrong type."""
    if not isinstance(state.get("model"), dict):
        missing = "model" not in state
        raise CheckpointError(f"checkpoint {str(file)!r} does not describe its model (no 'model' field: not a "
                              f"teachkit model checkpoint)" if missing else
                              f"checkpoint {str(file)!r} has model={short_repr(state['model'])}, not a model config")
    shape, classes = shape_and_classes(state, file)
    try:
        model_cfg = from_dict(state["model"], ModelConfig)
    except TrustError:
        raise
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {str(file)!r} records a model this version cannot build ({e})") from None
    return model_cfg, shape, classes


def load_model(path: str | Path, select: str = "last", device: torch.device | str = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a model from a teachkit checkpoint (file or run folder); returns (model, state). The state also
    gives the file under ``source_file`` (for messages such as :func:`check_compatible`'s). A model factory the
    checkpoint names is imported only when the user named it in this command or trusts code read from disk
    (:mod:`teachkit.trust`)."""
    file = checkpoint_file(path, select)
    tensors, state = load_checkpoint(file)
    with reading_from(f"checkpoint {str(file)!r}"):
        model_cfg, shape, classes = model_fields(state, file)
        try:
            model = make_model(model_cfg, shape, classes)
        except TrustError:
            raise
        except ConfigError as e:
            raise CheckpointError(f"checkpoint {str(file)!r} records a model that cannot be built ({e})") from None
    try:
        model.load_state_dict(strip("model/", tensors))
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {str(file)!r} does not fit model {model_cfg.name!r}: "
                              f"{describe_mismatch(e)}") from None
    return model.to(device), {**state, "source_file": str(file)}


def check_compatible(teacher_state: dict, splits: Splits, source: str | Path | None = None,
                     who: str = "teacher") -> None:
    """The checkpoint's model (``who``: the teacher, or ``the model in FILE`` for eval) and the dataset must
    agree on class count and input shape; on text also on the tokenizer (the ``tokenizer`` digest it records,
    when it does), and the data's ``max_length`` and token ids must fit its position embeddings and vocabulary.
    The one-line ConfigError names the checkpoint (``source``, default the ``source_file`` that
    :func:`load_model` records)."""
    source = source if source is not None else teacher_state.get("source_file")
    shape, classes = shape_and_classes(teacher_state, source)
    where = f" (checkpoint {str(source)!r})" if source is not None and who == "teacher" else ""
    student = " (and so the student)" if who == "teacher" else ""
    ours, theirs = getattr(splits.train.x, "vocabulary_digest", None), teacher_state.get("vocabulary")
    size = splits.num_classes
    own = own_vocabulary(splits, who)
    if own is not None:  # a causal LM teacher reading its own tokenisation (Universal Logit Distillation)
        ours, size = own
    if ours is not None and (classes != size or (isinstance(theirs, str) and theirs != ours)):
        differ = (f"{classes} tokens vs {size}" if classes != size else
                  f"same size {classes}, other tokens: sha256 {str(theirs)[:12]} vs {ours[:12]}")
        fix = ("set data.options.tokenizer (or teacher_tokenizer) to the teacher's tokenizer: its run folder or its "
               "name" if hasattr(splits.train.x, "prompts") else
               "set data.options.vocab_file to the teacher's run folder (its vocab.json)")
        raise ConfigError(f"{who} was trained with another vocabulary than dataset {splits.name!r}{where} ({differ}); "
                          f"per-token outputs are compared over one vocabulary: {fix}")
    if classes != size:
        raise ConfigError(f"{who} has {classes} classes but dataset {splits.name!r}{student} has "
                          f"{splits.num_classes}{where}")
    if shape != tuple(splits.input_shape) and not is_tokens(splits.train.x):  # text models take any length
        raise ConfigError(f"{who} takes inputs of shape {shape} but dataset {splits.name!r} has "
                          f"{tuple(splits.input_shape)}{where}")
    if is_tokens(splits.train.x):  # text: the tokenizer it was trained on, then its positions and vocabulary
        options = (teacher_state.get("model") or {}).get("options") if isinstance(teacher_state.get("model"), dict) \
            else None
        side = "teacher" if who == "teacher" or (isinstance(options, dict) and options.get("inputs") == "teacher") \
            else "student"
        check_tokenizer(teacher_state.get("tokenizer"), splits.train.x, side, f"{who}{where}", splits.name)
        check_recorded_fits(teacher_state, [s.x for s in (splits.train, *splits.eval_splits().values())],
                            f"{who}{where}", splits.name, side)


def own_vocabulary(splits: Splits, who: str) -> tuple[str, int] | None:
    """(vocabulary sha256, size) of the teacher's own tokenisation when a causal LM's data carries one (a teacher
    with another tokenizer than the student's); None otherwise."""
    x = splits.train.x
    if who != "teacher" or not getattr(x, "has_teacher", False):
        return None
    entry = tokenizer_of(x, "teacher")
    tok = getattr(x.info, "teacher_tokenizer", None)
    if entry is None or tok is None:
        return None
    return str(entry["sha256"]), len(tok)


def student_of(path: Path) -> tuple[Path, str]:
    """The run folder holding the model a run folder stands for, and how to call it: a plain run folder is
    itself; TAKD's student is in ``student/``; ESKD's in the ``from-epoch-NNNN/`` its summary names (the
    best of a search); BAN's final student in the last ``gen-G/``."""
    if not path.is_dir() or (path / "checkpoints").is_dir():
        return path, "the model"
    if (path / "student" / "checkpoints").is_dir():
        return path / "student", "the student (TAKD run)"
    summary: dict[str, Any] = {}
    try:
        loaded = json.loads((path / "summary.json").read_text())
        summary = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    students = sorted(p for p in path.glob("from-epoch-*") if (p / "checkpoints").is_dir())
    if students:
        epoch = summary.get("teacher_epoch")
        named = path / f"from-epoch-{epoch:04d}" if isinstance(epoch, int) else None
        if named is not None and named in students:
            what = "the best student of the search" if len(students) > 1 else "the student"
            return named, f"{what} (ESKD run, teacher epoch {epoch})"
        if len(students) == 1:
            return students[0], "the student (ESKD run)"
        names = ", ".join(p.name for p in students[:4]) + (", ..." if len(students) > 4 else "")
        raise CheckpointError(f"run folder {str(path)!r} holds {len(students)} students ({names}) and no finished "
                              f"summary.json naming the best; evaluate one of them, e.g. {str(students[0])!r}")
    generations = [p for p in path.glob("gen-*") if p.name[4:].isdigit() and (p / "checkpoints").is_dir()]
    if generations:
        last = max(generations, key=lambda p: int(p.name[4:]))
        return last, f"the last generation's student ({last.name}, BAN run)"
    return path, "the model"
