"""The report's rows: run folders read as records, a run's figures on the report metric, runs paired across rows.

:mod:`teachkit.experiments.report` groups these records into a :class:`~teachkit.experiments.report_table.Report`;
:mod:`teachkit.experiments.report_plots` draws from them. Reading a run never imports code from it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teachkit.config import read_yaml
from teachkit.errors import ConfigError
from teachkit.experiments.published import Published
from teachkit.experiments.stats import mean_std

#: pseudo-keys :func:`value_of` resolves from more than one file
PSEUDO_KEYS = ("recipe", "teacher.loss", "teacher.model", "pair")
#: config keys never used to group runs (they differ per run without being a setting)
NOT_GROUPING = frozenset({"name", "out_dir", "plugins", "teacher.checkpoint", "train.progress", "train.device"})
#: last parts of the keys that are seeds: never default report keys, always pairing keys
SEED_NAMES = ("seed", "subset_seed", "split_seed")
#: recipes whose summary records their name as the checkpoint ``loss`` (``recipes/prokd.py``)
FOLLOW_RECIPES = ("prokd", "annealing", "rco")


def _read_json(path: Path) -> Any:
    """The JSON document in ``path``, or a one-line ConfigError naming the file and why not."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (a JSON file is expected)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None


def _read_object(path: Path) -> dict:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def read_history(path: Path) -> list[dict]:
    """The per-epoch lines of a ``metrics.jsonl`` (none when the file is absent); a bad line is a ConfigError."""
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})") from None
    history = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: line {number} is not valid JSON ({e.msg})") from None
        if isinstance(record, dict):
            history.append(record)
    return history


@dataclass
class RunRecord:
    """One run folder: its resolved config, summary (empty while unfinished), sweep marker, epoch history."""

    folder: Path
    config: dict
    summary: dict
    sweep: dict | None = None
    finished: bool = True
    #: the folder of its teacher run (in-command ``teacher/`` or ``teacher.checkpoint``), when there is one
    teacher_dir: Path | None = None
    _history: list[dict] | None = field(default=None, repr=False)
    _teacher: RunRecord | None = field(default=None, repr=False)

    @property
    def history(self) -> list[dict]:
        """``metrics.jsonl``, one dict per epoch, read on first use."""
        if self._history is None:
            self._history = read_history(self.folder / "metrics.jsonl")
        return self._history

    @property
    def role(self) -> str:
        """``teacher`` or ``student`` as the sweep marked it (``student`` without a marker)."""
        return str((self.sweep or {}).get("role") or "student")

    @property
    def teacher(self) -> RunRecord | None:
        """The teacher's run folder read as a record (config + summary), or None."""
        if self._teacher is None and self.teacher_dir is not None:
            self._teacher = load_run(self.teacher_dir)
        return self._teacher


def load_run(folder: Path) -> RunRecord:
    """The run in ``folder`` (``config.yaml`` required; ``summary.json`` and ``sweep.json`` when present). An
    empty ``config.yaml`` is refused: read as the defaults, it would put the run in the wrong row."""
    config = read_yaml(folder / "config.yaml")
    if not config:
        raise ConfigError(f"run folder {str(folder)!r} has an empty config.yaml, so its settings are unknown; "
                          "restore it (the config the run was made with) or move the folder out of the report")
    summary_file = folder / "summary.json"
    summary = _read_object(summary_file) if summary_file.exists() else {}
    sweep_file = folder / "sweep.json"
    sweep = _read_object(sweep_file) if sweep_file.exists() else None
    return RunRecord(folder, config, summary, sweep, finished=summary_file.exists())


def _run_folders(root: Path) -> Iterable[Path]:
    """Folders holding config.yaml with no such ancestor below ``root`` (and ``root`` itself if it is one)."""
    for here, dirs, files in os.walk(root):
        if "config.yaml" in files:
            dirs[:] = []
            yield Path(here)
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("_"))


def _find_teacher_dir(record: RunRecord, root: Path) -> Path | None:
    """The teacher's run folder: in-command ``RUN/teacher/``, else ``teacher.checkpoint`` as given (absolute or
    relative to the working folder or to RUNS_DIR or one of its ancestors; a checkpoint file's run folder)."""
    inside = record.folder / "teacher"
    if (inside / "config.yaml").is_file():
        return inside
    checkpoint = (record.config.get("teacher") or {}).get("checkpoint")
    if not isinstance(checkpoint, str) or not checkpoint:
        return None
    given = Path(checkpoint)
    bases = [Path()] if given.is_absolute() else [Path.cwd(), root, *root.resolve().parents]
    for base in bases:
        candidate = base / given
        for folder in (candidate, *list(candidate.parents)[:2]):
            if (folder / "config.yaml").is_file():
                return folder
    return None


def collect_runs(root: Path) -> list[RunRecord]:
    """Every row-level run folder under ``root`` (finished or not), in path order."""
    root = Path(root)
    records = []
    for folder in _run_folders(root):
        record = load_run(folder)
        record.teacher_dir = _find_teacher_dir(record, root)
        records.append(record)
    return sorted(records, key=lambda r: str(r.folder))


def dotted_value(tree: Any, key: str) -> Any:
    """``tree[a][b]`` for the key ``a.b``; None where a part is missing."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _recipe(record: RunRecord) -> str:
    recipe = (record.sweep or {}).get("recipe")
    if recipe:
        return "kd" if recipe == "distill" else str(recipe)
    if record.summary.get("loss") in FOLLOW_RECIPES:
        return str(record.summary["loss"])
    if isinstance(record.summary.get("seqkd"), dict):  # recipes/seqkd.py reports its decoding there
        return "seqkd"
    return "kd" if isinstance(record.summary.get("teacher"), dict) else "train"


def _teacher_model(record: RunRecord) -> Any:
    teacher = record.teacher
    if teacher is not None and dotted_value(teacher.config, "model.name") is not None:
        return dotted_value(teacher.config, "model.name")
    return dotted_value(record.config, "teacher.model.name")


def value_of(record: RunRecord, key: str) -> Any:
    """The run's value of a report key: its sweep label, else a pseudo-key, else the dotted config key.

    Pseudo-keys: ``recipe`` (the sweep's recipe; else ``prokd``/``annealing``/``rco`` as its summary records,
    ``seqkd`` when the summary has a ``seqkd`` section, ``kd`` when it holds a teacher, else ``train``);
    ``teacher.loss`` (the loss the teacher really had: summary ``teacher.loss``, else the config's);
    ``teacher.model`` (the model of the teacher's own run folder, else the config's ``teacher.model.name``);
    ``pair`` (``<teacher model>-<student model>``). The teacher keys are None for a ``train`` run (no teacher)."""
    labels = (record.sweep or {}).get("labels") or {}
    if key in labels:
        return labels[key]
    if key == "recipe":
        return _recipe(record)
    if key in ("teacher.loss", "teacher.model", "pair") and _recipe(record) == "train":
        return None
    if key == "teacher.loss":
        teacher = record.summary.get("teacher")
        if isinstance(teacher, dict) and teacher.get("loss") is not None:
            return teacher["loss"]
        return dotted_value(record.config, "teacher.loss")
    if key == "teacher.model":
        return _teacher_model(record)
    if key == "pair":
        return f"{value_of(record, 'teacher.model')}-{value_of(record, 'model.name')}"
    return dotted_value(record.config, key)


def method_of(record: RunRecord) -> str:
    """The method a published table would name: ``kd.method`` for recipe kd, else the recipe."""
    recipe = str(value_of(record, "recipe"))
    if recipe != "kd":
        return recipe
    method = value_of(record, "kd.method")
    return "+".join(map(str, method)) if isinstance(method, list) else str(method)


def flat_keys(tree: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a config mapping, inner nodes included (``model``, ``model.name``, ...)."""
    keys = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        keys.append(key)
        if isinstance(value, dict) and value:
            keys += flat_keys(value, key + ".")
    return keys


def leaf_keys(tree: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a config mapping's leaves (values that are not a non-empty mapping)."""
    return [k for k in flat_keys(tree, prefix)
            if not (isinstance(dotted_value(tree, k), dict) and dotted_value(tree, k))]


def hashable(value: Any) -> Any:
    """A value usable as a dict key and comparable across runs (lists and mappings as sorted JSON)."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def cell(value: Any) -> str:
    """A table cell for a key's value (``-`` for None)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def finite_values(values: Iterable[float]) -> list[float]:
    """The values that are finite numbers."""
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def finite_mean(values: Iterable[float]) -> float:
    """The mean of the finite values; NaN when there is none."""
    finite = finite_values(values)
    return sum(finite) / len(finite) if finite else float("nan")


def _at_epoch(history: list[dict], epoch: Any, split: str, metric: str) -> float:
    for line in history:
        if line.get("epoch") == epoch:
            return as_number((line.get(split) or {}).get(metric))
    return float("nan")


def as_number(value: Any) -> float:
    """``value`` as a float when it is a number (not a bool), else NaN."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


@dataclass(frozen=True)
class RunNumbers:
    """One run's figures on the report metric: test at the last epoch and at the best-validation epoch."""

    last: float
    best: float
    best_val: float
    best_epoch: float
    wall_time_s: float
    images: float  #: student images seen in training + teacher forward images (see :func:`run_numbers`)

    def selected(self, select: str) -> float:
        return self.last if select == "last" else self.best


def run_numbers(record: RunRecord, metric: str) -> RunNumbers:
    """The summary's ``test_{m}``, ``test_{m}_at_best``, ``best_val_{m}``, ``best_epoch`` (from metrics.jsonl
    at the best epoch when the summary lacks them, e.g. for a metric the run did not select on). ``images``:
    the student's images, the sum over epochs of ``images_per_s * epoch_time_s`` (else ``cost.student_epochs *
    data.train_subset``), plus ``cost.teacher_forward_images``; wall time: ``wall_time_s`` plus that of a
    teacher trained in a folder of its own."""
    s = record.summary
    best_epoch = s.get("best_epoch")
    last = as_number(s.get(f"test_{metric}"))
    if not math.isfinite(last) and record.history:
        last = as_number((record.history[-1].get("test") or {}).get(metric))
    best = as_number(s.get(f"test_{metric}_at_best"))
    if not math.isfinite(best) and best_epoch is not None and s.get("select_metric") != metric:
        best = _at_epoch(record.history, best_epoch, "test", metric)
    best_val = as_number(s.get(f"best_val_{metric}"))
    if not math.isfinite(best_val) and best_epoch is not None:
        best_val = _at_epoch(record.history, best_epoch, "val", metric)
    cost = s.get("cost") if isinstance(s.get("cost"), dict) else {}
    seen = [as_number(h.get("images_per_s")) * as_number(h.get("epoch_time_s")) for h in record.history]
    images = float(round(sum(seen))) if seen and all(map(math.isfinite, seen)) else float("nan")
    subset = dotted_value(record.config, "data.train_subset")
    if not math.isfinite(images) and isinstance(subset, int):
        images = float(as_number(cost.get("student_epochs")) * subset)
    images += as_number(cost.get("teacher_forward_images") or 0)
    wall = as_number(s.get("wall_time_s"))
    teacher = record.teacher
    if teacher is not None and record.teacher_dir is not None and record.folder not in record.teacher_dir.parents:
        wall += as_number(teacher.summary.get("wall_time_s") or 0)
    return RunNumbers(last, best, best_val, as_number(best_epoch), wall, images)


def pair_runs(runs: Sequence[RunRecord], others: Sequence[RunRecord], keys: Sequence[str],
              value: Callable[[RunRecord], float]) -> tuple[list[float], list[float]]:
    """Paired samples: each run of ``runs`` with the run(s) of ``others`` equal on every key of ``keys`` (None
    matches anything; several partners are averaged); runs without a partner, or with NaN, are dropped."""
    a, b = [], []
    for run in runs:
        mine = {k: hashable(value_of(run, k)) for k in keys}
        partners = [o for o in others if all(mine[k] is None or hashable(value_of(o, k)) in (None, mine[k])
                                             for k in keys)]
        x, y = value(run), finite_mean(value(o) for o in partners)
        if partners and math.isfinite(x) and math.isfinite(y):
            a.append(x)
            b.append(y)
    return a, b


@dataclass
class ReportRow:
    """One group of runs with equal report-key values, and its aggregated figures."""

    values: dict[str, Any]
    runs: list[RunRecord]
    numbers: list[RunNumbers]
    diff: tuple[float, float, float] | None = None  #: paired difference to the baseline (mean, low, high)
    pairs: int = 0
    published: Published | None = None

    def column(self, name: str) -> list[float]:
        """The finite values of one :class:`RunNumbers` field over the runs."""
        return finite_values(getattr(n, name) for n in self.numbers)

    def selected(self, select: str) -> list[float]:
        return self.column(select)

    def gap(self, select: str) -> float:
        """Ours minus published, on the ``select`` column (NaN without a published figure)."""
        if self.published is None or not self.selected(select):
            return float("nan")
        return mean_std(self.selected(select))[0] - self.published.value

    def label(self) -> str:
        return ", ".join(f"{k}={cell(v)}" for k, v in self.values.items()) or "all runs"


__all__ = ["RunRecord", "RunNumbers", "ReportRow", "load_run", "collect_runs", "read_history", "value_of", "method_of",
           "run_numbers", "pair_runs", "hashable", "cell", "dotted_value", "as_number", "finite_values", "finite_mean",
           "flat_keys", "leaf_keys", "PSEUDO_KEYS", "NOT_GROUPING", "SEED_NAMES", "FOLLOW_RECIPES"]
