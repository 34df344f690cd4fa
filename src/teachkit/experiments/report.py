"""``teachkit report RUNS_DIR``: run folders aggregated into one table (Markdown + CSV), with published numbers.

A row-level run is a folder under RUNS_DIR holding ``config.yaml`` none of whose ancestors (below RUNS_DIR)
holds one: the sub-runs a recipe nests inside its run folder (an in-command ``teacher/``, TAKD's ``student/``,
ESKD's ``from-epoch-*``, BAN's ``gen-*``) are not rows; folders named ``_*`` (caches) are skipped. A run is
finished when it also holds ``summary.json``; an unfinished one is listed, not reported.

Rows are the distinct values of the report keys (``by``), each resolved by :func:`value_of`: a sweep label
(``sweep.json``), a pseudo-key (``recipe``, ``teacher.loss``, ``teacher.model``, ``pair``) or a dotted config
key. Each row shows the test metric at the last epoch and at the best-validation epoch as mean +- sample std
over its runs, and, against a baseline row, the paired difference with its 95% t interval: a run is paired
with the baseline run that has the same value on every varying key that is not a report key (the seed among
them; a key a run does not have, None, matches anything). Teacher runs (``role: teacher`` in ``sweep.json``,
or a folder another run's ``teacher.checkpoint`` names) go to a small teachers table unless ``teachers=True``.

The Markdown table stays readable for a folder of mixed runs (:meth:`Report.markdown_table`): a ``run`` column
names each row's folders when the keys were not chosen, keys equal on every row move to an ``all runs:`` line,
and more than :data:`MAX_KEY_COLUMNS` varying keys share one ``settings`` column; the CSV keeps every key.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teachkit.config import read_yaml
from teachkit.engine.checkpoint import atomic_write
from teachkit.errors import ConfigError
from teachkit.experiments.published import Published, find_published
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, mean_std, paired_interval
from teachkit.registry import closest

#: pseudo-keys :func:`value_of` resolves from more than one file
PSEUDO_KEYS = ("recipe", "teacher.loss", "teacher.model", "pair")
#: config keys never used to group runs (they differ per run without being a setting)
NOT_GROUPING = frozenset({"name", "out_dir", "plugins", "teacher.checkpoint", "train.progress", "train.device"})
#: last parts of the keys that are seeds: never default report keys, always pairing keys
SEED_NAMES = ("seed", "subset_seed", "split_seed")
#: recipes whose summary records their name as the checkpoint ``loss`` (``recipes/prokd.py``)
FOLLOW_RECIPES = ("prokd", "annealing", "rco")
SELECTS = ("last", "best")
SELECT_TEXT = {"last": "test at the last epoch", "best": "test at the best-validation epoch"}
#: varying report keys shown one column each in the Markdown table; beyond, one ``settings`` column
MAX_KEY_COLUMNS = 6
#: run folder names listed in a row's ``run`` cell; beyond, ``+N more``
MAX_RUN_NAMES = 3


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


def _dotted(tree: Any, key: str) -> Any:
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
    if teacher is not None and _dotted(teacher.config, "model.name") is not None:
        return _dotted(teacher.config, "model.name")
    return _dotted(record.config, "teacher.model.name")


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
        return _dotted(record.config, "teacher.loss")
    if key == "teacher.model":
        return _teacher_model(record)
    if key == "pair":
        return f"{value_of(record, 'teacher.model')}-{value_of(record, 'model.name')}"
    return _dotted(record.config, key)


def method_of(record: RunRecord) -> str:
    """The method a published table would name: ``kd.method`` for recipe kd, else the recipe."""
    recipe = str(value_of(record, "recipe"))
    if recipe != "kd":
        return recipe
    method = value_of(record, "kd.method")
    return "+".join(map(str, method)) if isinstance(method, list) else str(method)


def _flat_keys(tree: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a config mapping, inner nodes included (``model``, ``model.name``, ...)."""
    keys = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        keys.append(key)
        if isinstance(value, dict) and value:
            keys += _flat_keys(value, key + ".")
    return keys


def _leaf_keys(tree: dict, prefix: str = "") -> list[str]:
    return [k for k in _flat_keys(tree, prefix) if not (isinstance(_dotted(tree, k), dict) and _dotted(tree, k))]


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


def _order(values: tuple) -> tuple:
    return tuple((0, "", 0.0) if v is None else (1, "", float(v)) if isinstance(v, (int, float)) and
                 not isinstance(v, bool) else (2, cell(v), 0.0) for v in values)


def _is_seed(key: str) -> bool:
    return key.split(".")[-1] in SEED_NAMES


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _mean(values: Iterable[float]) -> float:
    finite = _finite(values)
    return sum(finite) / len(finite) if finite else float("nan")


def _at_epoch(history: list[dict], epoch: Any, split: str, metric: str) -> float:
    for line in history:
        if line.get("epoch") == epoch:
            return _number((line.get(split) or {}).get(metric))
    return float("nan")


def _number(value: Any) -> float:
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
    last = _number(s.get(f"test_{metric}"))
    if not math.isfinite(last) and record.history:
        last = _number((record.history[-1].get("test") or {}).get(metric))
    best = _number(s.get(f"test_{metric}_at_best"))
    if not math.isfinite(best) and best_epoch is not None and s.get("select_metric") != metric:
        best = _at_epoch(record.history, best_epoch, "test", metric)
    best_val = _number(s.get(f"best_val_{metric}"))
    if not math.isfinite(best_val) and best_epoch is not None:
        best_val = _at_epoch(record.history, best_epoch, "val", metric)
    cost = s.get("cost") if isinstance(s.get("cost"), dict) else {}
    seen = [_number(h.get("images_per_s")) * _number(h.get("epoch_time_s")) for h in record.history]
    images = float(round(sum(seen))) if seen and all(map(math.isfinite, seen)) else float("nan")
    subset = _dotted(record.config, "data.train_subset")
    if not math.isfinite(images) and isinstance(subset, int):
        images = float(_number(cost.get("student_epochs")) * subset)
    images += _number(cost.get("teacher_forward_images") or 0)
    wall = _number(s.get("wall_time_s"))
    teacher = record.teacher
    if teacher is not None and record.teacher_dir is not None and record.folder not in record.teacher_dir.parents:
        wall += _number(teacher.summary.get("wall_time_s") or 0)
    return RunNumbers(last, best, best_val, _number(best_epoch), wall, images)


def pair_runs(runs: Sequence[RunRecord], others: Sequence[RunRecord], keys: Sequence[str],
              value: Callable[[RunRecord], float]) -> tuple[list[float], list[float]]:
    """Paired samples: each run of ``runs`` with the run(s) of ``others`` equal on every key of ``keys`` (None
    matches anything; several partners are averaged); runs without a partner, or with NaN, are dropped."""
    a, b = [], []
    for run in runs:
        mine = {k: hashable(value_of(run, k)) for k in keys}
        partners = [o for o in others if all(mine[k] is None or hashable(value_of(o, k)) in (None, mine[k])
                                             for k in keys)]
        x, y = value(run), _mean(value(o) for o in partners)
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
        return _finite(getattr(n, name) for n in self.numbers)

    def selected(self, select: str) -> list[float]:
        return self.column(select)

    def gap(self, select: str) -> float:
        """Ours minus published, on the ``select`` column (NaN without a published figure)."""
        if self.published is None or not self.selected(select):
            return float("nan")
        return mean_std(self.selected(select))[0] - self.published.value

    def label(self) -> str:
        return ", ".join(f"{k}={cell(v)}" for k, v in self.values.items()) or "all runs"


@dataclass
class Report:
    """The aggregated table and what it is about; :meth:`to_markdown` and :meth:`to_csv` render it."""

    root: Path
    by: list[str]
    select: str
    metric: str
    rows: list[ReportRow]
    pairing_keys: list[str]
    baseline: str | None = None
    baseline_row: ReportRow | None = None
    unfinished: list[RunRecord] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    teachers: list[RunRecord] = field(default_factory=list)
    teacher_forwards_saved: int = 0
    wall_time_s: float = 0.0
    percent: bool = True
    #: a ``run`` column first (the rows' run folders, relative to ``root``): the keys were not chosen (``--by``)
    named: bool = False

    @property
    def runs(self) -> list[RunRecord]:
        return [run for row in self.rows for run in row.runs]

    def _has_published(self) -> bool:
        return any(row.published is not None for row in self.rows)

    def figure_columns(self) -> list[str]:
        """The table's columns after the run and key columns: counts, figures, diff, published."""
        m = self.metric
        columns = ["n", f"test {m} (last)", f"test {m} (best val)", f"best val {m}", "best epoch"]
        if self.baseline_row is not None:
            columns += [f"diff vs baseline ({self.select}) [95% CI]", "pairs"]
        if self._has_published():
            columns += ["published", "gap"]
        return columns

    def figure_cells(self) -> list[list[str]]:
        """The cells of :meth:`figure_columns`, row by row."""
        out = []
        for row in self.rows:
            cells = [str(len(row.runs)), _fmt(row.column("last")), _fmt(row.column("best")),
                      _num(_mean(row.column("best_val"))), _num(_mean(row.column("best_epoch")), 1)]
            if self.baseline_row is not None:
                cells += (["baseline", ""] if row is self.baseline_row else
                          [fmt_interval(row.diff) if row.diff else "-", str(row.pairs)])
            if self._has_published():
                cells += [_num(row.published.value) if row.published else "",
                          f"{row.gap(self.select):+.2f}" if row.published else ""]
            out.append(cells)
        return out

    def key_layout(self) -> tuple[list[str], list[str], dict[str, str]]:
        """The report keys split for the Markdown table: those equal on every row (an ``all runs:`` line), those
        shown as columns, and, beyond :data:`MAX_KEY_COLUMNS`, the usual (most common) value of each key, the
        ``settings`` column listing a row's other values instead of one column per key."""
        values = {k: [hashable(row.values[k]) for row in self.rows] for k in self.by}
        constant = [k for k in self.by if len(set(values[k])) == 1]
        varying = [k for k in self.by if k not in constant]
        if len(varying) <= MAX_KEY_COLUMNS:
            return constant, varying, {}
        usual = {}
        for k in varying:
            common = Counter(values[k]).most_common(1)[0][0]
            usual[k] = next(cell(row.values[k]) for row in self.rows if hashable(row.values[k]) == common)
        return constant, [], usual

    def _settings(self, row: ReportRow, usual: dict[str, str]) -> str:
        return ", ".join(f"{k}={cell(row.values[k])}" for k in usual if cell(row.values[k]) != usual[k]) or "usual"

    def markdown_table(self) -> str:
        """The table, after an ``all runs:`` line naming the keys equal on every row (and, with many varying keys,
        a ``usual values:`` line the ``settings`` column departs from); the CSV keeps one column per key."""
        constant, columns, usual = self.key_layout()
        first = self.rows[0].values if self.rows else {}
        lines = [f"all runs: {', '.join(f'{k}={cell(first[k])}' for k in constant)}", ""] if constant else []
        if usual:
            lines += ["usual values (the settings column lists a row's others): "
                      + ", ".join(f"{k}={v}" for k, v in usual.items()), ""]
        header = (["run"] if self.named else []) + columns + (["settings"] if usual else [])
        header = (header or ["rows"]) + self.figure_columns()
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row, figures in zip(self.rows, self.figure_cells(), strict=True):
            cells = ([_run_names(row, self.root)] if self.named else []) + [cell(row.values[k]) for k in columns]
            cells += [self._settings(row, usual)] if usual else []
            lines.append("| " + " | ".join((cells or ["all runs"]) + figures) + " |")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """Title, what the figures cover, the table, unfinished/failed runs, teachers, published footnote."""
        unit = " (%)" if self.percent else ""
        by = ", ".join(self.by) if self.by else "nothing (one row)"
        pairing = ", ".join(self.pairing_keys) if self.pairing_keys else "nothing (every baseline run)"
        text = [f"# teachkit report: {self.root}", "",
                f"{len(self.runs)} finished runs in {len(self.rows)} rows, grouped by {by}; metric: test "
                f"{self.metric}{unit}.", "",
                f"mean ± sample std over the runs of a row (seeds); paired 95% t intervals over runs paired by "
                f"{pairing}."]
        if self.baseline_row is not None:
            text += ["", f"The difference is to the baseline row ({self.baseline}) on the `{self.select}` column "
                         f"({SELECT_TEXT[self.select]}); runs without a partner are left out (pairs column)."]
        text += ["", self.markdown_table(), "",
                 f"Teacher forwards saved by cached teacher outputs: {self.teacher_forwards_saved}. "
                 f"Total wall time: {self.wall_time_s:.1f} s (runs, plus their teachers' own folders)."]
        if self.unfinished:
            text += ["", "## Unfinished runs", ""]
            text += [f"- {_where(r, self.root)}: {_epochs_done(r)}" for r in self.unfinished]
        if self.failed:
            text += ["", "## Failed runs", ""]
            text += [f"- {j.get('name')} ({j.get('state')}): {j.get('error') or 'no reason recorded'}"
                     for j in self.failed]
        if self.teachers:
            text += ["", "## Teachers", "", "| teacher | model | loss | seed | test " + f"{self.metric} (last) |",
                     "|---|---|---|---|---|"]
            for t in self.teachers:
                text.append(f"| {_where(t, self.root)} | {cell(_dotted(t.config, 'model.name'))} | "
                            f"{cell(t.summary.get('loss') or _dotted(t.config, 'train.loss'))} | "
                            f"{cell(_dotted(t.config, 'train.seed'))} | "
                            f"{_num(_number(t.summary.get(f'test_{self.metric}')))} |")
        if self._has_published():
            text += ["", "## Published numbers", "",
                     "Protocols differ: teachkit selects on a validation split carved from the training data and "
                     "reports the last epoch and the test figure at the best-validation epoch; papers often report "
                     "the maximum test accuracy over epochs (optimistic by construction), on the full training "
                     f"set. The gap is ours minus published on the `{self.select}` column.", ""]
            seen = []
            for row in self.rows:
                if row.published is not None and row.published not in seen:
                    seen.append(row.published)
                    p = row.published
                    text.append(f"- {row.label()}: {p.value:g} from {p.source}; protocol: {p.protocol}.")
        return "\n".join(text) + "\n"

    def to_csv(self) -> str:
        """One line per row, plain numbers (empty where there is none), with a header: every report key a column
        (``run``, the row's folders joined by ``;``, first when the keys were not chosen)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*(["run"] if self.named else []), *self.by, "n", "test_last_mean", "test_last_std",
                         "test_best_mean", "test_best_std", "best_val_mean", "best_epoch_mean", "diff", "diff_low",
                         "diff_high", "pairs", "published", "gap", "wall_time_s_mean"])
        for row in self.rows:
            last, best = mean_std(row.column("last")), mean_std(row.column("best"))
            diff = row.diff or (float("nan"),) * 3
            names = [";".join(_where(r, self.root) for r in row.runs)] if self.named else []
            writer.writerow([*names, *(cell(row.values[k]) if row.values[k] is not None else "" for k in self.by),
                             len(row.runs), *map(_plain, (*last, *best, _mean(row.column("best_val")),
                                                          _mean(row.column("best_epoch")), *diff)),
                             row.pairs if row.diff else "",
                             _plain(row.published.value if row.published else float("nan")),
                             _plain(row.gap(self.select)), _plain(_mean(row.column("wall_time_s")))])
        return buffer.getvalue()


def _fmt(values: list[float]) -> str:
    return fmt_mean_std(values) if values else "-"


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _plain(value: float) -> str:
    return "" if not math.isfinite(value) else repr(round(value, 6))


def _where(record: RunRecord, root: Path) -> str:
    try:
        return str(record.folder.relative_to(root)) or "."
    except ValueError:
        return str(record.folder)


def _run_names(row: ReportRow, root: Path) -> str:
    """The row's run folders relative to ``root``: the first :data:`MAX_RUN_NAMES`, then ``+N more``."""
    names = [_where(r, root) for r in row.runs]
    extra = len(names) - MAX_RUN_NAMES
    return ", ".join(names[:MAX_RUN_NAMES]) + (f" +{extra} more" if extra > 0 else "")


def _epochs_done(record: RunRecord) -> str:
    try:
        done = sum(1 for line in (record.folder / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        done = 0
    return f"unfinished (no summary.json), {done}/{cell(_dotted(record.config, 'train.epochs'))} epochs logged"


def _failed_jobs(root: Path) -> list[dict]:
    """Failed or blocked jobs of the sweeps whose ``sweep_status.json`` lies under ``root`` (unreadable: none)."""
    jobs = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("_"))
        if "config.yaml" in files:
            dirs[:] = []
        elif "sweep_status.json" in files:
            try:
                status = json.loads((Path(here) / "sweep_status.json").read_text())
            except (OSError, ValueError):
                continue
            jobs += [j for j in status.get("jobs") or [] if isinstance(j, dict)
                     and j.get("state") in ("failed", "blocked")]
    return jobs


def _check_root(root: Path) -> None:
    if not root.exists():
        raise ConfigError(f"runs folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise ConfigError(f"runs folder {str(root)!r} is not a folder")


def _pick_metric(runs: list[RunRecord], metric: str | None) -> str:
    if metric is None:
        chosen = sorted({str(r.summary.get("select_metric") or "acc") for r in runs})
        if len(chosen) > 1:
            raise ConfigError(f"the runs select on different metrics ({', '.join(chosen)}): pass --metric to "
                              "report one of them")
        return chosen[0]
    available = sorted({k[len("test_"):] for r in runs for k in r.summary if k.startswith("test_")
                        and not k.endswith("_at_best")})
    if metric not in available and not any(metric in (h.get("test") or {}) for r in runs for h in r.history[-1:]):
        raise ConfigError(f"no run records the test metric {metric!r}{closest(metric, available)}; the runs record: "
                          f"{', '.join(available) or 'none'}")
    return metric


def _candidate_keys(runs: list[RunRecord]) -> list[str]:
    """Keys that may distinguish runs: sweep labels when there are sweep runs, else recipe, teacher.model and
    every leaf config key (less :data:`NOT_GROUPING`)."""
    if any(r.sweep for r in runs):
        return list(dict.fromkeys(k for r in runs if r.sweep for k in (r.sweep.get("labels") or {})))
    keys = ["recipe", "teacher.model"] + [k for r in runs for k in _leaf_keys(r.config)]
    return [k for k in dict.fromkeys(keys) if k not in NOT_GROUPING and k != "teacher.model.name"]


def _known_keys(runs: list[RunRecord]) -> list[str]:
    keys = [*PSEUDO_KEYS] + [k for r in runs for k in (r.sweep or {}).get("labels") or {}]
    keys += [k for r in runs for k in _flat_keys(r.config)]
    return list(dict.fromkeys(keys))


def _baseline_row(text: str, by: list[str], rows: list[ReportRow]) -> ReportRow:
    """The one row ``key=value[,key=value]`` selects; a ConfigError naming the allowed keys and values."""
    wanted: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--baseline {text!r}: expected key=value[,key=value] over the report keys "
                              f"({', '.join(by) or 'none'})")
        if key not in by:
            raise ConfigError(f"--baseline key {key!r} is not a report key{closest(key, by)}; the rows are keyed by: "
                              f"{', '.join(by) or 'nothing (one row)'}")
        wanted[key] = value.strip()
    if not wanted:
        raise ConfigError(f"--baseline {text!r}: expected key=value[,key=value]")

    def matches(value: Any, given: str) -> bool:
        return cell(value) == given or str(value) == given or (value is None and given.lower() in ("none", "null"))

    chosen = [row for row in rows if all(matches(row.values[k], v) for k, v in wanted.items())]
    if not chosen:
        allowed = "; ".join(f"{k} takes {', '.join(dict.fromkeys(cell(r.values[k]) for r in rows))}" for k in wanted)
        raise ConfigError(f"--baseline {text!r} matches no row: {allowed}")
    if len(chosen) > 1:
        rest = [k for k in by if k not in wanted]
        raise ConfigError(f"--baseline {text!r} matches {len(chosen)} rows: add key=value for "
                          f"{', '.join(rest)} to pick one")
    return chosen[0]


def _published_for(row: ReportRow, metric: str) -> Published | None:
    found = {find_published(value_of(r, "data.name"), value_of(r, "teacher.model"), value_of(r, "model.name"),
                            method_of(r), value_of(r, "teacher.loss"), metric) for r in row.runs}
    return found.pop() if len(found) == 1 else None


def _teachers(runs: list[RunRecord], listed: list[RunRecord]) -> list[RunRecord]:
    """Teacher runs under the folder plus the teacher folders the runs read (deduplicated by folder)."""
    out: dict[Path, RunRecord] = {r.folder.resolve(): r for r in listed}
    for run in runs:
        teacher = run.teacher
        if teacher is not None and teacher.finished:
            out.setdefault(teacher.folder.resolve(), teacher)
    return list(out.values())


def build_report(root: Path, by: list[str] | None = None, baseline: str | None = None, select: str = "last",
                 metric: str | None = None, teachers: bool = False) -> Report:
    """Group the finished runs under ``root`` into rows by ``by`` (default: the varying sweep labels or config
    keys, less seeds) and aggregate them; see the module docstring. ``teachers``: teacher runs are rows too."""
    root = Path(root)
    _check_root(root)
    if select not in SELECTS:
        raise ConfigError(f"--select {select!r} is not allowed: use last or best")
    records = collect_runs(root)
    finished = [r for r in records if r.finished]
    if not finished:
        raise ConfigError(f"no run folders (config.yaml + summary.json) under {root}")
    read_by = {r.teacher_dir.resolve() for r in finished if r.teacher_dir is not None}
    is_teacher = [r.role == "teacher" or r.folder.resolve() in read_by for r in finished]
    runs = [r for r, t in zip(finished, is_teacher, strict=True) if teachers or not t]
    if not runs:
        raise ConfigError(f"only teacher runs under {root}: pass --teachers to report them")
    metric = _pick_metric(runs, metric)
    candidates = _candidate_keys(runs)
    varying = [k for k in candidates if len({hashable(value_of(r, k)) for r in runs}) > 1]
    named = by is None
    if by is None:
        by = [k for k in varying if not _is_seed(k)]
    else:
        known = _known_keys(runs)
        for key in by:
            if key not in known:
                raise ConfigError(f"unknown report key {key!r}{closest(key, known)}: use a sweep label, one of "
                                  f"{', '.join(PSEUDO_KEYS)}, or a dotted config key")
        by = list(dict.fromkeys(by))
    pairing = [k for k in varying if k not in by]
    groups: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(tuple(hashable(value_of(run, k)) for k in by), []).append(run)
    rows = []
    for key in sorted(groups, key=_order):
        members = groups[key]
        rows.append(ReportRow({k: value_of(members[0], k) for k in by}, members,
                              [run_numbers(r, metric) for r in members]))
    base = _baseline_row(baseline, by, rows) if baseline else None
    if base is not None:
        rows = [base] + [r for r in rows if r is not base]
        for row in rows[1:]:
            a, b = pair_runs(row.runs, base.runs, pairing, lambda r: run_numbers(r, metric).selected(select))
            row.pairs = len(a)
            row.diff = paired_interval(a, b) if a else None
    for row in rows:
        row.published = _published_for(row, metric)
    listed_teachers = [r for r, t in zip(finished, is_teacher, strict=True) if t and not teachers]
    teacher_runs = _teachers(runs, listed_teachers)
    saved = sum(int(_number((r.summary.get("cost") or {}).get("teacher_forwards_saved") or 0)) for r in runs)
    wall = sum(_finite(_number(r.summary.get("wall_time_s")) for r in runs))
    wall += sum(_finite(_number(t.summary.get("wall_time_s")) for t in teacher_runs
                        if not any(t.folder.resolve() == r.folder.resolve() for r in runs)
                        and not any(r.folder in t.folder.parents for r in runs)))
    selecting = [r for r in runs if r.summary.get("select_metric") == metric]  # they say whether it is in %
    percent = all(r.summary.get("select_metric_percent") for r in selecting) if selecting else metric == "acc"
    return Report(root, by, select, metric, rows, pairing, baseline, base,
                  unfinished=[r for r in records if not r.finished], failed=_failed_jobs(root),
                  teachers=teacher_runs, teacher_forwards_saved=saved, wall_time_s=wall, percent=percent,
                  named=named)


def write_report(report: Report, out: Path | None = None, plots: bool = True) -> list[Path]:
    """Write ``report.md``, ``report.csv`` and the plots (PNG + SVG) into ``out`` (default RUNS_DIR/report)."""
    out = Path(out) if out is not None else report.root / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"report folder {str(out)!r} cannot be made: {e.strerror or type(e).__name__}") from None
    markdown, table = report.to_markdown(), report.to_csv()
    paths = [out / "report.md", out / "report.csv"]
    atomic_write(paths[0], lambda tmp: Path(tmp).write_text(markdown, encoding="utf-8"))
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text(table, encoding="utf-8"))
    if plots:
        from teachkit.experiments.report_plots import write_plots

        paths += write_plots(report, out)
    return paths


def run_report(root: Path, by: list[str] | None = None, baseline: str | None = None, select: str = "last",
               metric: str | None = None, out: Path | None = None, plots: bool = True,
               teachers: bool = False) -> Report:
    """``teachkit report``: build, write, print the table and a ``report: PATH ...`` line; returns the report."""
    report = build_report(Path(root), by, baseline, select, metric, teachers)
    paths = write_report(report, out, plots)
    print(report.markdown_table())
    print("report: " + ", ".join([str(paths[0]), *(p.name for p in paths[1:])]))
    return report


__all__ = ["RunRecord", "RunNumbers", "ReportRow", "Report", "collect_runs", "load_run", "value_of", "method_of",
           "run_numbers", "pair_runs", "build_report", "write_report", "run_report", "read_history"]
