"""The text predictor: sentences (or sentence pairs) -> the run's tokenisation -> labels, probabilities, scores.

It fits every checkpoint that records a ``tokenizer`` (``text_table``, ``tweets``, ``glue``; not SQuAD's answer
spans). Sentences are tokenised exactly as in training: the recorded tokenizer (its name resolved offline, its
vocabulary digest checked against the recorded one), the run's ``max_length`` with the same truncation, and the
tokenizer's own normalisation (lower-casing). A student that reads its teacher's tokenisation records that
tokenizer, so the pairing needs nothing more. Inputs: a string, a list of strings, a list of ``(text, pair)``
tuples for pair models, or a file given as a ``Path`` (``.txt``: one input per line, a tab between the two texts
of a pair; ``.csv`` / ``.tsv`` / ``.parquet`` / ``.jsonl``: the run's text column(s)).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from teachkit.data.raw import DATASETS, SEQUENCE_TASKS, SPAN_TASKS, is_regression
from teachkit.data.text import (
    BUNDLED_MODELS,
    TextInfo,
    TokenFeatures,
    encode_pairs,
    load_tokenizer,
    resolve_pretrained,
    tokenizer_vocab_digest,
)
from teachkit.data.text_table import file_format, read_rows, texts_of
from teachkit.data.translation_files import read_lines
from teachkit.errors import CheckpointError, ConfigError, DataError
from teachkit.predict.base import Predictor, recorded_task, register_predictor

#: the folder of an export that holds a copied tokenizer
TOKENIZER_FOLDER = "tokenizer"


def data_options(state: dict[str, Any]) -> dict[str, Any]:
    """The options the run's data source ran with: its defaults, updated with those the checkpoint records."""
    data = state.get("data") if isinstance(state.get("data"), dict) else {}
    recorded = data.get("options") if isinstance(data.get("options"), dict) else {}
    try:
        source = DATASETS.get(str(data.get("name")))
        params = inspect.signature(source).parameters.values()
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    except (ConfigError, TypeError, ValueError):
        defaults = {}
    return {**defaults, **recorded}


def text_columns(state: dict[str, Any], options: dict[str, Any]) -> tuple[str, str | None]:
    """(text column, pair column or None) of the run's files: ``text_table``'s options, a GLUE task's columns."""
    if state.get("dataset") == "glue":
        from teachkit.tasks.glue import TASKS

        spec = TASKS.get(str(options.get("task")))
        if spec is not None:
            return spec.parquet[0], spec.parquet[1]
    pair = options.get("text_pair_column")
    return str(options.get("text_column") or "text"), str(pair) if pair else None


def known_labels(state: dict[str, Any], options: dict[str, Any]) -> list[str] | None:
    """Label names of sources that know them but whose checkpoints may not record them (GLUE, tweets)."""
    if state.get("dataset") == "glue":
        from teachkit.tasks.glue import TASKS

        spec = TASKS.get(str(options.get("task")))
        return list(spec.labels) if spec is not None and spec.labels else None
    if state.get("dataset") == "tweets":
        from teachkit.data.tweets import LABELS

        return list(LABELS)
    return None


@register_predictor
class TextPredictor(Predictor):
    """Sentences -> token ids as the run made them -> the model's logits (module docstring)."""

    row_label = "line"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        return isinstance(state.get("tokenizer"), dict) and recorded_task(state) not in (*SPAN_TASKS, *SEQUENCE_TASKS)

    def __init__(self, model: torch.nn.Module, state: dict[str, Any], source: Path,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(model, state, source, device)
        self.options = data_options(state)
        self.max_length = int(self.options.get("max_length") or 128)
        self.text_column, self.pair_column = text_columns(state, self.options)
        self.pairs = self.pair_column is not None
        if self.class_names is None and not is_regression(self.task):
            self.class_names = known_labels(state, self.options)
        self.tokenizer_entry = dict(state["tokenizer"])
        self.tokenizer_name = self._resolve_tokenizer(self.tokenizer_entry)
        self.tokenizer = load_tokenizer(self.tokenizer_name)

    def _resolve_tokenizer(self, entry: dict[str, Any]) -> str:
        """The recorded tokenizer's name (a copy inside an export folder first), its vocabulary checked."""
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"checkpoint of {str(self.source)!r} records a tokenizer without a name")
        base = self.source if self.source.is_dir() else self.source.parent
        if name not in BUNDLED_MODELS and not Path(name).expanduser().is_absolute() and (base / name).is_dir():
            name = str(base / name)
        try:
            resolve_pretrained(name, "tokenizer")
        except ConfigError as e:
            raise CheckpointError(f"the model of {str(self.source)!r} reads the ids of tokenizer "
                                  f"{entry.get('name')!r}, which is not available here ({e})") from None
        digest = entry.get("sha256")
        if isinstance(digest, str) and tokenizer_vocab_digest(name) != digest:
            raise CheckpointError(f"tokenizer {name!r} here has another vocabulary (sha256 "
                                  f"{tokenizer_vocab_digest(name)[:12]}) than the one the model of "
                                  f"{str(self.source)!r} was trained on ({digest[:12]})")
        return name

    # -- inputs ------------------------------------------------------------------------------------------------
    def texts(self, inputs: Any) -> tuple[list[str], list[str] | None]:
        """(first texts, second texts or None) of ``inputs`` (module docstring); DataError when they do not fit."""
        if isinstance(inputs, Path):  # a file of inputs (a str is a sentence)
            inputs = self.read_inputs(inputs)[0]
        if isinstance(inputs, str):
            inputs = [inputs]
        items = list(inputs)
        first: list[str] = []
        second: list[str] = []
        for i, item in enumerate(items):
            pair = isinstance(item, tuple | list)
            if pair != self.pairs or (pair and len(item) != 2):
                want = "a (text, pair) tuple" if self.pairs else "a string"
                raise DataError(f"input {i + 1} is {type(item).__name__} {str(item)[:60]!r}; this model reads "
                                f"{'sentence pairs' if self.pairs else 'single sentences'}: give {want} per input")
            a, b = (item if pair else (item, None))
            for text in (a, b) if pair else (a,):
                if not isinstance(text, str) or not text.strip():
                    raise DataError(f"input {i + 1} holds an empty or non-text value {text!r}")
            first.append(a)
            if pair:
                second.append(b)
        return first, second if self.pairs else None

    def preprocess(self, inputs: Any) -> TokenFeatures:
        first, second = self.texts(inputs)
        columns = encode_pairs(self.tokenizer, first, second, self.max_length)
        info = TextInfo(max_length=self.max_length, tokenizers={"": self.tokenizer_entry})
        return TokenFeatures({k: torch.from_numpy(v) for k, v in columns.items()}, info=info).to(self.device)

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """A ``.txt`` file (one input per line; blank lines skipped; a tab separates a pair) or a table with the
        run's text column(s); the inputs and their line (row) numbers."""
        if not path.is_file():
            raise DataError(f"input {str(path)!r} is not a file")
        if file_format(path) is not None:
            wanted = [self.text_column] + ([self.pair_column] if self.pair_column else [])
            rows = read_rows(path, wanted)
            first = texts_of(rows, self.text_column)
            items: list[Any] = first if not self.pair_column else \
                list(zip(first, texts_of(rows, self.pair_column), strict=True))
            return items, [str(n) for _, n in rows.origin]
        items, names = [], []
        for number, line in enumerate(read_lines(path, "text input"), 1):
            if not line.strip():
                continue
            if self.pairs:
                parts = line.split("\t")
                if len(parts) != 2:
                    raise DataError(f"input {str(path)!r} line {number}: a sentence-pair model needs two texts "
                                    f"separated by one tab, found {len(parts)} field(s)")
                items.append((parts[0], parts[1]))
            else:
                items.append(line)
            names.append(str(number))
        return items, names

    def export_files(self, folder: Path) -> dict[str, Any] | None:
        """A tokenizer given as a folder is saved into the export (``tokenizer/``); bundled names need nothing."""
        if self.tokenizer_name in BUNDLED_MODELS:
            return None
        self.tokenizer.save_pretrained(str(Path(folder) / TOKENIZER_FOLDER))
        return {"tokenizer": {**self.tokenizer_entry, "name": TOKENIZER_FOLDER}}
