"""GLUE (Wang et al. 2019): the nine sentence and sentence-pair tasks as a data source, their metrics as
evaluators, and the GLUE average.

Source ``glue`` (options ``task``, ``tokenizer``, ``max_length``, ``teacher_tokenizer``, ``cache_dir``)
reads the files under ``data.root`` in either layout, nothing is downloaded:

- the official TSV files (https://gluebenchmark.com/tasks): ``<root>/<Dir>/train.tsv`` and ``dev.tsv``
  (MNLI: ``dev_matched.tsv``, ``dev_mismatched.tsv``), Dir one of CoLA, SST-2, MRPC, STS-B, QQP, MNLI,
  QNLI, RTE, WNLI. They are read as UTF-8 with quoting disabled (sentences hold stray ``"`` characters); a
  byte that is not UTF-8, or a field over the csv module's field size limit, is a DataError naming the file
  and line. QQP's train file has a few malformed rows (too few fields): they are skipped, counted, and a
  warning (one line, kept in the run summary) says how many; a short row in any other task's file is a
  DataError;
- the Parquet files of the Hugging Face Hub dataset ``nyu-mll/glue``: ``<root>/<config>/train-*.parquet``,
  ``validation-*.parquet`` (MNLI: ``validation_matched-*``, ``validation_mismatched-*``), config one of
  cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli.

``data.root`` may also be the task's folder itself. The TSV layout is looked for first.

Labels follow the Hub's ids: MNLI 0 entailment, 1 neutral, 2 contradiction; QNLI and RTE 0 entailment,
1 not_entailment; CoLA, SST-2, MRPC, QQP and WNLI 0 / 1 as in the files; STS-B's similarity score (0..5)
is a real-valued target (float32, one output; task ``glue-stsb`` counts as regression, train it with
``train.loss=l2``). GLUE's test labels are hidden, so the dev set is the test split (MNLI: dev matched;
dev mismatched is the extra evaluation split ``test_mm``) and val is carved from train (seeded, stratified
for the classification tasks). The task of GLUE task ``t`` is ``glue-t``.

Evaluators ``glue-<task>`` report on every evaluation split (val, test, and MNLI's test_mm), as GLUE
reports them, scaled x100:

- CoLA: ``mcc`` (Matthews correlation, primary), ``acc``;
- MRPC, QQP: ``acc``, ``f1`` (F1 of class 1), ``score`` = their mean (primary; GLUE's task score);
- STS-B: ``pearson``, ``spearman``, ``score`` = their mean (primary); a constant prediction or target
  vector has no defined correlation and scores 0;
- SST-2, MNLI, QNLI, RTE, WNLI: ``acc`` (primary);
- every task: ``loss``, the mean cross-entropy (STS-B: mean squared error), minimised; all else maximised.

:func:`glue_average` combines task scores into the GLUE score as the GLUE leaderboard does.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Splits, TensorSplit
from teachkit.data.raw import DATASETS, REGRESSION_TASKS, RawDataset, require
from teachkit.data.text import file_sha256, label_ids, text_option, tokenize_texts
from teachkit.engine.evaluate import EVALUATORS, SplitScoreEvaluator
from teachkit.errors import ConfigError, DataError
from teachkit.models.text import check_fits_splits
from teachkit.registry import closest
from teachkit.tasks.binary import binary_metrics
from teachkit.types import Batch, Evaluator

#: where GLUE is published (named by the missing-files error)
PUBLISHED = "https://gluebenchmark.com/tasks or the Hugging Face Hub dataset nyu-mll/glue"
#: a carriage return not followed by a line feed: where a text file opened with ``newline=""`` ends a line
_LONE_CR = re.compile(r"(?<=\r)(?!\n)")
#: bump when the reading of the files changes, so that older tokenisation cache entries are not reused
READER_VERSION = 1


@dataclass(frozen=True)
class GlueTask:
    """How one GLUE task is stored and measured."""

    name: str
    #: the official TSV folder (``SST-2``)
    folder: str
    #: label names in id order (the Hub's); empty for STS-B's real-valued score
    labels: tuple[str, ...]
    #: TSV (first text, second text or None, label): header names, or positions for header-less CoLA
    tsv: tuple[Any, Any, Any]
    #: Parquet (first text, second text or None) columns; the label is ``label``
    parquet: tuple[str, str | None]
    metrics: tuple[str, ...]
    primary: str

    @property
    def regression(self) -> bool:
        return not self.labels

    @property
    def header(self) -> bool:
        return isinstance(self.tsv[0], str)

    @property
    def tsv_dev(self) -> tuple[str, ...]:
        return ("dev_matched.tsv", "dev_mismatched.tsv") if self.name == "mnli" else ("dev.tsv",)

    @property
    def parquet_dev(self) -> tuple[str, ...]:
        return ("validation_matched", "validation_mismatched") if self.name == "mnli" else ("validation",)


_BINARY_PAIR = ("score", "acc", "f1", "loss")
_ACC = ("acc", "loss")
_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "CoLA", ("unacceptable", "acceptable"), (3, None, 1), ("sentence", None),
             ("mcc", "acc", "loss"), "mcc"),
    GlueTask("sst2", "SST-2", ("negative", "positive"), ("sentence", None, "label"), ("sentence", None), _ACC, "acc"),
    GlueTask("mrpc", "MRPC", ("not_equivalent", "equivalent"), ("#1 String", "#2 String", "Quality"),
             ("sentence1", "sentence2"), _BINARY_PAIR, "score"),
    GlueTask("stsb", "STS-B", (), ("sentence1", "sentence2", "score"), ("sentence1", "sentence2"),
             ("score", "pearson", "spearman", "loss"), "score"),
    GlueTask("qqp", "QQP", ("not_duplicate", "duplicate"), ("question1", "question2", "is_duplicate"),
             ("question1", "question2"), _BINARY_PAIR, "score"),
    GlueTask("mnli", "MNLI", ("entailment", "neutral", "contradiction"), ("sentence1", "sentence2", "gold_label"),
             ("premise", "hypothesis"), _ACC, "acc"),
    GlueTask("qnli", "QNLI", _NLI2, ("question", "sentence", "label"), ("question", "sentence"), _ACC, "acc"),
    GlueTask("rte", "RTE", _NLI2, ("sentence1", "sentence2", "label"), ("sentence1", "sentence2"), _ACC, "acc"),
    GlueTask("wnli", "WNLI", ("not_entailment", "entailment"), ("sentence1", "sentence2", "label"),
             ("sentence1", "sentence2"), _ACC, "acc"),
)}

REGRESSION_TASKS.add("glue-stsb")


def glue_task(task: Any) -> GlueTask:
    """The task named ``task``; a one-line ConfigError listing the tasks otherwise."""
    if not isinstance(task, str) or task not in TASKS:
        names = list(TASKS)
        raise ConfigError(f"dataset 'glue' option 'task' is {task!r}{closest(str(task), names)}; "
                          f"choose one of: {', '.join(names)}")
    return TASKS[task]


# -- files ----------------------------------------------------------------------------------------------------
@dataclass
class GlueFiles:
    """The files of one task: ``layout`` ``tsv`` or ``parquet``; ``train`` and each dev split's files."""

    layout: Literal["tsv", "parquet"]
    folder: Path
    train: list[Path]
    dev: list[list[Path]]


def _shards(folder: Path, stem: str) -> list[Path]:
    """``<stem>.parquet`` or the shards ``<stem>-*.parquet`` in ``folder``, in name order."""
    single = folder / f"{stem}.parquet"
    return [single] if single.is_file() else sorted(p for p in folder.glob(f"{stem}-*.parquet") if p.is_file())


def find_files(root: str, spec: GlueTask) -> GlueFiles:
    """The task's files under ``root`` (module docstring); a one-line DataError naming what was looked for."""
    base = Path(root)
    wanted = (f"{spec.folder}/train.tsv and {' and '.join(f'{spec.folder}/{d}' for d in spec.tsv_dev)} (official "
              f"TSV) or {spec.name}/train-*.parquet and "
              f"{' and '.join(f'{spec.name}/{d}-*.parquet' for d in spec.parquet_dev)} (Hub Parquet)")
    if base.is_dir():
        for folder in (base / spec.folder, base):
            if (folder / "train.tsv").is_file():
                missing = [d for d in spec.tsv_dev if not (folder / d).is_file()]
                if missing:
                    raise DataError(f"dataset 'glue' task {spec.name!r}: {str(folder)!r} has train.tsv but not "
                                    f"{', '.join(missing)}; get the task's files from {PUBLISHED}")
                return GlueFiles("tsv", folder, [folder / "train.tsv"], [[folder / d] for d in spec.tsv_dev])
        for folder in (base / spec.name, base):
            train = _shards(folder, "train")
            if train:
                dev = [_shards(folder, d) for d in spec.parquet_dev]
                missing = [f"{d}-*.parquet" for d, files in zip(spec.parquet_dev, dev, strict=True) if not files]
                if missing:
                    raise DataError(f"dataset 'glue' task {spec.name!r}: {str(folder)!r} has train Parquet files but "
                                    f"not {', '.join(missing)}; get the task's files from {PUBLISHED}")
                return GlueFiles("parquet", folder, train, dev)
        where = f"in {str(base)!r}"
    else:
        where = f"because data.root {str(base)!r} is not a folder"
    raise DataError(f"dataset 'glue' task {spec.name!r}: no files found {where}; looked for {wanted}, also directly "
                    f"in the folder; get them from {PUBLISHED}")


@dataclass
class GlueRows:
    """The examples of one split as read: texts, raw label values, and the malformed rows skipped."""

    first: list[str]
    second: list[str] | None
    labels: list[Any]
    skipped: int = 0


def utf8_lines(f: Iterable[bytes], path: Path, task: str) -> Iterator[str]:
    """The lines of a binary file as text, ended by ``\n``, ``\r\n`` or a lone ``\r`` as in a text file opened
    with ``newline=""`` (a leading UTF-8 byte-order mark dropped); a line that is not UTF-8 is a one-line
    DataError naming the file, the line (counted in ``\n``) and the byte."""
    for number, raw in enumerate(f, 1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"dataset 'glue' task {task!r}: {str(path)!r} line {number} is not UTF-8 text: byte "
                            f"0x{raw[e.start]:02x} (byte {e.start + 1} of the line: {e.reason}); GLUE files are "
                            "UTF-8: save it as UTF-8") from None
        if "\r" in text.rstrip("\r\n"):  # lone carriage returns end lines too (old Mac files)
            yield from (part for part in _LONE_CR.split(text) if part)
        else:
            yield text


def read_tsv(path: Path, spec: GlueTask) -> GlueRows:
    """One official TSV file, read as UTF-8 with quoting disabled (``csv.QUOTE_NONE``): a ``"`` is text, so a
    row is one line. A byte that is not UTF-8, or a field longer than the csv module's field size limit
    (``csv.field_size_limit()``, 131,072 characters; not raised: no GLUE sentence comes near it, so such a
    field means the file is not a GLUE TSV), is a one-line DataError naming the file and the line."""
    with open(path, "rb") as f:
        reader = csv.reader(utf8_lines(f, path, spec.name), delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            return _read_rows(reader, path, spec)
        except csv.Error as e:
            reason = str(e)
            if "field larger than field limit" in reason:
                reason = (f"a field is longer than {csv.field_size_limit():,} characters (the csv field size "
                          "limit); GLUE sentences are short: is it a GLUE TSV file?")
            raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} line {reader.line_num} cannot be "
                            f"read as tab-separated text: {reason}") from None


def _positions(reader: Any, path: Path, spec: GlueTask) -> list[int | None]:
    """The (first text, second text, label) column positions: from the header (read here) or CoLA's fixed ones."""
    if not spec.header:
        return list(spec.tsv)
    head = next(reader, None)
    if head is None:
        raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} is empty")
    positions: list[int | None] = []
    for name in spec.tsv:
        if name is None:
            positions.append(None)
        elif name in head:
            positions.append(head.index(name))
        else:
            raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} has no column {name!r} "
                            f"(header: {', '.join(head)}); is it the {spec.folder} file?")
    return positions


def _read_rows(reader: Any, path: Path, spec: GlueTask) -> GlueRows:
    """The rows of an open TSV ``reader`` (header, column positions, short rows: see :func:`read_tsv`)."""
    rows = GlueRows([], None if spec.tsv[1] is None else [], [])
    positions = _positions(reader, path, spec)
    need = max(p for p in positions if p is not None) + 1
    for row in reader:
        if not row:
            continue
        if len(row) < need:
            if spec.name == "qqp":  # the real QQP train file has a few broken rows
                rows.skipped += 1
                continue
            raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} line {reader.line_num} has "
                            f"{len(row)} tab-separated fields, expected at least {need}")
        a, b, y = (None if p is None else row[p] for p in positions)
        rows.first.append(a)
        if rows.second is not None:
            rows.second.append(b)
        rows.labels.append(y)
    return rows


def read_parquet(paths: list[Path], spec: GlueTask) -> GlueRows:
    """The Hub's Parquet shards of one split, concatenated in name order."""
    pq = require("pyarrow.parquet", "glue", "pyarrow")
    first_col, second_col = spec.parquet
    rows = GlueRows([], None if second_col is None else [], [])
    for path in paths:
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - a damaged file is one line
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            raise DataError(f"dataset 'glue' task {spec.name!r}: cannot read {str(path)!r} ({reason})") from None
        for name in (first_col, second_col, "label"):
            if name is not None and name not in table.column_names:
                raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} has no column {name!r} "
                                f"(columns: {', '.join(table.column_names)}); is it the {spec.name} file?")
        for name, out in ((first_col, rows.first), (second_col, rows.second)):
            if name is None or out is None:
                continue
            values = table.column(name).to_pylist()
            if None in values:
                raise DataError(f"dataset 'glue' task {spec.name!r}: {str(path)!r} column {name!r} has no text in "
                                f"row {values.index(None) + 1}")
            out.extend(str(v) for v in values)
        rows.labels.extend(table.column("label").to_pylist())
    return rows


def targets(spec: GlueTask, values: list[Any], where: str) -> Tensor:
    """Class ids (int64) or, for STS-B, float32 scores of the raw label values of one file."""
    if not spec.regression:
        return label_ids("glue", values, spec.labels, where)
    out = np.empty(len(values), dtype=np.float32)
    for i, v in enumerate(values):
        try:
            out[i] = float(str(v).strip())
        except ValueError:
            out[i] = np.nan
        if not math.isfinite(float(out[i])):
            raise DataError(f"dataset 'glue': label {v!r} in {where} (row {i + 1}) is not a similarity score "
                            "(a finite number, 0..5)")
    return torch.from_numpy(out)


def read_split(files: GlueFiles, paths: list[Path], spec: GlueTask, said: list[str] | None = None) -> GlueRows:
    """The rows of one split's files; when malformed rows were skipped, one warning line is added to ``said``
    (the dataset's warnings: a run prints it once and keeps it in its summary)."""
    rows = read_tsv(paths[0], spec) if files.layout == "tsv" else read_parquet(paths, spec)
    where = ", ".join(repr(str(p)) for p in paths)
    if not rows.first:
        raise DataError(f"dataset 'glue' task {spec.name!r}: {where} holds no examples")
    if rows.skipped and said is not None:
        said.append(f"dataset 'glue' task {spec.name!r}: skipped {rows.skipped} malformed rows (too few fields) "
                    f"of {where}")
    return rows


@DATASETS.register("glue", "GLUE tasks (option task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) from the "
                           "official TSV or Hub Parquet files under data.root; tokenised offline, cached")
def glue(root: str | None = None, task: str = "sst2", tokenizer: str = "minilm-l6", max_length: int = 128,
         teacher_tokenizer: str | None = None, cache_dir: str | None = None) -> RawDataset:
    """GLUE task ``task`` from the files under ``root`` (module docstring), tokenised with ``tokenizer``
    (and ``teacher_tokenizer`` under the prefix ``teacher.`` when given) to at most ``max_length`` tokens;
    the tokenisation is cached under ``cache_dir`` (see :mod:`teachkit.data.text`)."""
    spec = glue_task(task)
    max_length = text_option("glue", "max_length", max_length, 8)
    for key, value in (("tokenizer", tokenizer), ("teacher_tokenizer", teacher_tokenizer), ("cache_dir", cache_dir)):
        if (value is not None or key == "tokenizer") and not (isinstance(value, str) and value):
            raise ConfigError(f"dataset 'glue' option {key!r} must be a non-empty string, got {value!r}")
    if root is None:
        raise ConfigError(f"dataset 'glue' needs its files: set data.root to the folder holding the GLUE task "
                          f"folders ({spec.folder}/ with train.tsv, or the Hub's {spec.name}/ Parquet files)")
    files = find_files(root, spec)
    said: list[str] = []

    def load(paths: list[Path], split: str) -> tuple[Any, Tensor]:
        rows = read_split(files, paths, spec, said)
        y = targets(spec, rows.labels, f"task {spec.name!r} file {', '.join(repr(str(p)) for p in paths)}")
        x = tokenize_texts(rows.first, rows.second, tokenizer=tokenizer, max_length=max_length,
                           key_parts={"source": "glue", "task": spec.name, "split": split, "layout": files.layout,
                                      "reader": READER_VERSION, "files": {p.name: file_sha256(p) for p in paths}},
                           cache_dir=cache_dir, teacher_tokenizer=teacher_tokenizer)
        return x, y

    train_x, train_y = load(files.train, "train")
    test_x, test_y = load(files.dev[0], "test")
    extra = {"test_mm": load(files.dev[1], "test_mm")} if spec.name == "mnli" else {}
    return RawDataset(train_x, train_y, test_x, test_y, num_classes=len(spec.labels) or 1, default_augment="none",
                      task=f"glue-{spec.name}", name="glue", extra_test=extra, warnings=said)


# -- metrics --------------------------------------------------------------------------------------------------
def average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``a``, ties sharing the mean of their ranks (``scipy.stats.rankdata(method="average")``)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    n = len(a)
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    new = np.r_[True, s[1:] != s[:-1]] if n else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], n]
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(new) - 1]
    return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two vectors in [-1, 1]; 0 when either is constant (undefined)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if len(a) == 0:
        return float("nan")
    da, db = a - a.mean(), b - b.mean()
    den = math.sqrt(float(da @ da)) * math.sqrt(float(db @ db))
    return float(np.clip(float(da @ db) / den, -1.0, 1.0)) if den > 0 else 0.0


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks); 0 when either vector is constant."""
    return pearson(average_ranks(a), average_ranks(b))


def glue_metrics(task: str, outputs: Tensor, y: Tensor) -> dict[str, float]:
    """The metrics of GLUE task ``task`` (module docstring) from the model's ``outputs`` (logits (N, C); STS-B:
    (N, 1) or (N,) scores) against targets ``y``."""
    spec = glue_task(task)
    if spec.regression:
        if outputs.dim() == 2 and outputs.shape[1] == 1:
            outputs = outputs[:, 0]
        if outputs.dim() != 1 or outputs.shape[0] != y.shape[0]:
            raise ValueError(f"STS-B outputs must be (N, 1) or (N,) scores, got {tuple(outputs.shape)} for "
                             f"{y.shape[0]} targets")
        pred = outputs.detach().double().cpu().numpy()
        gold = y.detach().double().cpu().numpy()
        p, s = pearson(pred, gold) * 100, spearman(pred, gold) * 100
        loss = float(np.mean((pred - gold) ** 2)) if len(gold) else float("nan")
        return {"score": (p + s) / 2, "pearson": p, "spearman": s, "loss": loss}
    if outputs.dim() != 2 or outputs.shape[1] != len(spec.labels):
        raise ValueError(f"GLUE {task} outputs must be (N, {len(spec.labels)}) logits, got {tuple(outputs.shape)}")
    if task in ("cola", "mrpc", "qqp"):
        m = binary_metrics(outputs, y)
        if task == "cola":
            return {"mcc": m["mcc"] * 100, "acc": m["acc"], "loss": m["loss"]}
        return {"score": (m["acc"] + m["f1"]) / 2, "acc": m["acc"], "f1": m["f1"], "loss": m["loss"]}
    acc = (outputs.argmax(1) == y).double().mean()
    loss = F.cross_entropy(outputs.float(), y).double()
    acc_v, loss_v = torch.stack([acc, loss]).tolist()
    return {"acc": acc_v * 100, "loss": loss_v}


class GlueEvaluator(SplitScoreEvaluator):
    """GLUE's metrics of one task (module docstring) on each named split."""

    sample_unit = "seq"

    def __init__(self, task: str, splits: Mapping[str, TensorSplit], batch_size: int = 1000, dataset: str = "glue",
                 train_x: Any = None) -> None:
        super().__init__(dict(splits), batch_size)
        self.task = glue_task(task).name
        self.metrics = TASKS[self.task].metrics
        self.primary = TASKS[self.task].primary
        self.dataset = dataset
        #: the training inputs, checked with the evaluated ones by :meth:`check_model`
        self.train_x = train_x

    def check_model(self, model: nn.Module) -> None:
        """A text model must take the data's ``max_length`` and have an embedding row for each of its token ids
        (:func:`teachkit.models.text.check_fits`): a one-line ConfigError before the run, not an IndexError."""
        check_fits_splits(model, self.splits.values(), self.train_x, self.dataset)

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "min" if metric == "loss" or metric.endswith("_loss") else "max"

    def is_percent(self, metric: str) -> bool:
        """Accuracy, F1 and MRPC's / QQP's score (their mean) are percentages; the correlations (MCC, Pearson,
        Spearman, STS-B's score) are x100 too but are no percentages, so they print as plain numbers."""
        if metric == "score":
            return not TASKS[self.task].regression
        return metric in ("acc", "f1") or metric.endswith("_acc")

    def score(self, outputs: Tensor, y: Tensor) -> dict[str, float]:
        return glue_metrics(self.task, outputs, y)

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: 100 x the number of correct predictions (the engine divides by the samples); none
        for STS-B."""
        if TASKS[self.task].regression:
            return {}
        return {"train_acc": (outputs.detach().argmax(1) == batch.y).sum() * 100.0}


def _evaluator_factory(task: str) -> Any:
    spec = TASKS[task]

    def make(splits: Splits, batch_size: int) -> Evaluator:
        width = len(spec.labels) or 1
        if splits.num_classes != width:
            raise ConfigError(f"dataset {splits.name!r} has task 'glue-{task}' but {splits.num_classes} outputs; "
                              f"GLUE {task} has {width}")
        return GlueEvaluator(task, splits.eval_splits(), batch_size, splits.name, splits.train.x)

    return make


for _name, _spec in TASKS.items():
    EVALUATORS.register(f"glue-{_name}", f"GLUE {_spec.folder}: {', '.join(_spec.metrics)} (primary {_spec.primary}) "
                                         "on val, test and extra test splits")(_evaluator_factory(_name))


# -- the GLUE score -------------------------------------------------------------------------------------------
def task_score(task: str, metrics: Mapping[str, float]) -> float:
    """The headline number of one task from its metrics (x100): CoLA ``mcc``; MRPC and QQP the mean of ``acc``
    and ``f1``; STS-B the mean of ``pearson`` and ``spearman`` (each pair's ``score`` when a component is
    missing); the others ``acc``."""
    spec = glue_task(task)
    pair = {"mrpc": ("acc", "f1"), "qqp": ("acc", "f1"), "stsb": ("pearson", "spearman")}.get(spec.name)
    if pair and all(k in metrics for k in pair):
        return (float(metrics[pair[0]]) + float(metrics[pair[1]])) / 2
    key = "score" if pair else ("mcc" if spec.name == "cola" else "acc")
    if key not in metrics:
        need = f"{pair[0]} and {pair[1]}, or score" if pair else key
        raise ValueError(f"GLUE {spec.name} scores need {need}; got {', '.join(metrics) or 'nothing'}")
    return float(metrics[key])


def glue_average(scores: Mapping[str, Mapping[str, float]]) -> float:
    """The GLUE score: the unweighted mean over the tasks given of each task's headline number (x100).

    ``scores`` maps a task (``cola``, ..., or ``glue-cola``) to its metrics on one split, as the task's
    evaluator reports them (``{"acc": 84.1, "f1": 88.0, ...}``). As on the GLUE leaderboard (whose scores it
    reproduces, e.g. BERT-large's 80.5):

    - a task with two metrics counts their mean (MRPC, QQP: accuracy and F1; STS-B: Pearson and Spearman);
    - MNLI is one task whose number is the mean of the matched and mismatched accuracies: give the matched
      metrics as ``mnli`` (or ``mnli-m``) and the mismatched ones as ``mnli-mm`` (the ``test_mm`` split);
      both are required;
    - WNLI counts like every other task when given; the diagnostic set AX is not part of the score.

    The official score averages all nine tasks; with fewer (say without WNLI, as BERT's paper does) this is the
    mean over those given. ValueError for an empty mapping, an unknown task, or MNLI without both halves.
    """
    per_task: dict[str, float] = {}
    mnli: dict[str, float] = {}
    for name, metrics in scores.items():
        key = str(name).lower().removeprefix("glue-")
        if key in ("mnli", "mnli-m", "mnli_m", "mnli-mm", "mnli_mm"):
            half = "mm" if key.endswith("mm") else "m"
            if half in mnli:
                raise ValueError(f"GLUE scores give MNLI-{half} twice ({name!r})")
            mnli[half] = task_score("mnli", metrics)
            continue
        if key not in TASKS:
            raise ValueError(f"GLUE scores name an unknown task {name!r}{closest(key, list(TASKS))}; tasks: "
                             f"{', '.join(TASKS)} (MNLI as mnli and mnli-mm)")
        if key in per_task:
            raise ValueError(f"GLUE scores give task {key!r} twice")
        per_task[key] = task_score(key, metrics)
    if mnli:
        if len(mnli) != 2:
            raise ValueError("GLUE's MNLI score is the mean of matched and mismatched accuracy: give both 'mnli' "
                             "and 'mnli-mm'")
        per_task["mnli"] = (mnli["m"] + mnli["mm"]) / 2
    if not per_task:
        raise ValueError("glue_average needs the scores of at least one task")
    return sum(per_task.values()) / len(per_task)
