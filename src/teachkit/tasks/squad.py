"""Extractive question answering on SQuAD v1.1 / v2.0: the ``squad`` source and the ``squad`` evaluator.

Source (``data.name: squad``): the official JSON files (``train-v1.1.json`` / ``dev-v1.1.json``, or
``train-v2.0.json`` / ``dev-v2.0.json`` with ``version: "2.0"``) in ``data.root``, as published at
https://rajpurkar.github.io/SQuAD-explorer/. Each question is tokenised with its context as the Hugging Face
``run_qa.py`` example does: question (left-stripped, cut to ``max_query_length`` tokens) first, context second,
truncated ``only_second`` into windows of ``max_length`` tokens overlapping by ``doc_stride`` tokens. A
window's target is the (start, end) token of the first gold answer when that answer lies entirely inside the
window's context, else (0, 0), the CLS token (also for every window of an unanswerable v2.0 question). An
answer whose text is not the context's at its ``answer_start``, or that no window holds whole, still trains
that way (another span, or CLS everywhere), as ``run_qa.py`` does, but is counted per file (the run's
``data_notes``) and named in one warning line that the run prints and keeps in its summary.

Options: ``version`` ("1.1" or "2.0"), ``tokenizer`` (a bundled name such as ``minilm-l6``, a folder, or a
Hub name already cached), ``max_length`` (384), ``doc_stride`` (128), ``max_query_length`` (64), ``cache_dir``
(the tokenisation cache, see :mod:`teachkit.data.text`) and ``limit`` (the first N questions of each file).

The features (:class:`~teachkit.data.text.TokenFeatures`) carry two side columns: ``example_id`` (int64, the
question's index in the split's ``examples``) and ``offset_mapping`` (int32 (N, L, 2), character offsets of
context tokens in the context, (-1, -1) for every other token). The dev file is the ``test`` split; ``val`` is
carved from the training windows.

Evaluator: the model's (B, L, 2) logits (start, end over token positions) on every window of a question are
post-processed as ``run_qa.py``'s ``postprocess_qa_predictions`` does: best span of start + end logits over
the ``n_best`` start and end candidates, start <= end, at most ``max_answer_length`` tokens, both in the
context; for v2.0 the answer is "" when the null score (start + end logit of CLS, the minimum over the
question's windows) beats the best span's score by more than ``null_threshold``. One deliberate difference:
the ``n_best`` candidates are taken among context tokens only (``run_qa.py`` takes them among all tokens and
then drops those outside the context), so a question always has a candidate span when its context allows one.
Metrics are those of the official evaluation scripts (v1.1 and v2.0), in %: ``exact`` and ``f1`` (primary),
for v2.0 also ``has_ans_*`` / ``no_ans_*``, plus ``loss``, the mean over windows of the mean start / end CE.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Splits, TensorSplit
from teachkit.data.raw import DATASETS, RawDataset
from teachkit.data.text import (
    TextInfo,
    TokenFeatures,
    cache_key,
    cached_table,
    column,
    file_sha256,
    load_tokenizer,
    text_option,
    tokenizer_digest,
    tokenizer_entry,
)
from teachkit.engine.evaluate import EVALUATORS
from teachkit.errors import ConfigError, DataError
from teachkit.models.text import check_fits_splits
from teachkit.types import Batch, Evaluator

URL = "https://rajpurkar.github.io/SQuAD-explorer/"
#: version -> (train file, dev file)
FILES = {"1.1": ("train-v1.1.json", "dev-v1.1.json"), "2.0": ("train-v2.0.json", "dev-v2.0.json")}
METRICS_V1 = ("exact", "f1", "loss")
METRICS_V2 = ("exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1", "loss")
#: the token every "no answer in this window" target points at
CLS_INDEX = 0


# -- examples -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SquadExample:
    """One question: ``answers`` are the gold texts (empty for an unanswerable v2.0 question) and
    ``answer_starts`` their character offsets in ``context``."""

    id: str
    context: str
    question: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]
    is_impossible: bool = False


@dataclass(frozen=True)
class SquadExamples(Sequence[SquadExample]):
    """The questions of one file (the ``examples`` of its features), with the SQuAD ``version`` they follow."""

    version: str
    items: tuple[SquadExample, ...]
    #: the evaluator's post-processing options (``n_best``, ``max_answer_length``, ``null_threshold``)
    postprocess: dict[str, Any] = field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]

    def __iter__(self) -> Iterator[SquadExample]:
        return iter(self.items)

    def __repr__(self) -> str:
        return f"SquadExamples(version={self.version!r}, {len(self.items)} questions)"


def check_version(version: Any) -> str:
    """``version`` as "1.1" or "2.0" (numbers accepted); else a one-line ConfigError listing both."""
    v = str(version).strip() if isinstance(version, (str, int, float)) and not isinstance(version, bool) else None
    v = {"1.1": "1.1", "2": "2.0", "2.0": "2.0"}.get(v or "")
    if v is None:
        raise ConfigError(f"dataset 'squad' option 'version' must be one of 1.1, 2.0, got {version!r}")
    return v


def load_examples(path: str | Path, version: str = "1.1", limit: int | None = None) -> SquadExamples:
    """The questions of an official SQuAD JSON file, flattened in file order (first ``limit`` only when given).

    Malformed JSON or a missing field is a one-line DataError naming the file (and the entry)."""
    version = check_version(version)
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"dataset 'squad': {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno} "
                        f"column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"dataset 'squad': {str(path)!r} is not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise DataError(f"dataset 'squad': cannot read {str(path)!r}: {e.strerror or e}") from None

    def bad(where: str, what: str) -> DataError:
        return DataError(f"dataset 'squad': {str(path)!r} is not in the SQuAD format: {where} {what}")

    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise bad("the top level", "has no 'data' list")
    out: list[SquadExample] = []
    for a, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise bad(f"data[{a}]", "has no 'paragraphs' list")
        for p, para in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) \
                    or not isinstance(para.get("qas"), list):
                raise bad(where, "needs a 'context' string and a 'qas' list")
            context = para["context"]
            for q, qa in enumerate(para["qas"]):
                if limit is not None and len(out) >= limit:
                    return SquadExamples(version, tuple(out))
                out.append(_example(qa, context, version, f"{where}.qas[{q}]", bad))
    return SquadExamples(version, tuple(out))


def _example(qa: Any, context: str, version: str, where: str, bad: Any) -> SquadExample:
    if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or "id" not in qa:
        raise bad(where, "needs an 'id' and a 'question' string")
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        raise bad(where, "has an 'answers' entry that is not a list")
    texts, starts = [], []
    for i, ans in enumerate(answers):
        if not isinstance(ans, dict) or not isinstance(ans.get("text"), str) \
                or isinstance(ans.get("answer_start"), bool) or not isinstance(ans.get("answer_start"), int):
            raise bad(f"{where}.answers[{i}]", "needs a 'text' string and an integer 'answer_start'")
        texts.append(ans["text"])
        starts.append(ans["answer_start"])
    impossible = version == "2.0" and (bool(qa.get("is_impossible", False)) or not texts)
    if impossible:
        texts, starts = [], []
    elif not texts:
        raise bad(where, f"(question id {qa['id']!r}) has no answers (unanswerable questions need version 2.0)")
    return SquadExample(str(qa["id"]), context, qa["question"], tuple(texts), tuple(starts), impossible)


# -- tokenisation -------------------------------------------------------------------------------------------
def _cut_questions(tokenizer: Any, questions: list[str], max_query_length: int) -> tuple[list[str], int]:
    """Questions left-stripped and cut after their ``max_query_length``-th token; the longest one's tokens."""
    questions = [q.lstrip() for q in questions]
    longest = 0
    for start in range(0, len(questions), 1000):
        part = questions[start:start + 1000]
        enc = tokenizer(part, add_special_tokens=False, return_offsets_mapping=True)
        for i, (ids, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], strict=True)):
            if len(ids) > max_query_length:
                questions[start + i] = part[i][:offsets[max_query_length - 1][1]]
    # token counts of the questions as they are used (a cut one may retokenise differently at its end)
    for start in range(0, len(questions), 1000):
        enc = tokenizer(questions[start:start + 1000], add_special_tokens=False)
        longest = max([longest, *(len(ids) for ids in enc["input_ids"])])
    return questions, longest


def tokenize_squad(tokenizer: Any, examples: Sequence[SquadExample], max_length: int = 384, doc_stride: int = 128,
                   max_query_length: int = 64, batch: int = 1000) -> dict[str, np.ndarray]:
    """Windows of every question (see the module docstring) as arrays: ``input_ids``, ``attention_mask``
    (``token_type_ids`` when the tokenizer makes them) int32 (N, max_length); ``offset_start`` /
    ``offset_end`` int32 (N, max_length), -1 outside the context; ``example_id``, ``start_position``,
    ``end_position`` int64 (N,). A ``max_length`` or ``doc_stride`` the longest question leaves no room for
    is a one-line ConfigError."""
    questions, longest = _cut_questions(tokenizer, [e.question for e in examples], max_query_length)
    special = int(tokenizer.num_special_tokens_to_add(pair=True))
    room = max_length - longest - special
    if room <= 0:
        raise ConfigError(f"dataset 'squad' option max_length={max_length} is too short: the longest question has "
                          f"{longest} tokens (after max_query_length={max_query_length}), plus {special} special "
                          f"tokens, leaving no room for the context")
    if doc_stride >= room:
        raise ConfigError(f"dataset 'squad' option doc_stride={doc_stride} must be less than the context tokens per "
                          f"window, {room} (max_length={max_length} minus the longest question's {longest} tokens "
                          f"minus {special} special tokens)")
    cols: dict[str, list[np.ndarray]] = collections.defaultdict(list)
    for start in range(0, len(examples), batch):
        part = examples[start:start + batch]
        enc = tokenizer(questions[start:start + batch], [e.context for e in part], truncation="only_second",
                        max_length=max_length, stride=doc_stride, return_overflowing_tokens=True,
                        return_offsets_mapping=True, padding="max_length")
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            if k in enc:
                cols[k].append(np.asarray(enc[k], dtype=np.int32))
        sample = np.asarray(enc["overflow_to_sample_mapping"], dtype=np.int64)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int32).reshape(len(sample), max_length, 2)
        in_context = np.array([[s == 1 for s in enc.sequence_ids(i)] for i in range(len(sample))], dtype=bool)
        offsets = np.where(in_context[..., None], offsets, -1).astype(np.int32)
        positions = np.full((len(sample), 2), CLS_INDEX, dtype=np.int64)
        for i, j in enumerate(sample):
            positions[i] = answer_positions(offsets[i], part[int(j)])
        cols["example_id"].append(sample + start)
        cols["offset_start"].append(offsets[..., 0])
        cols["offset_end"].append(offsets[..., 1])
        cols["start_position"].append(positions[:, 0])
        cols["end_position"].append(positions[:, 1])
    if not cols:
        raise DataError("dataset 'squad': no questions to tokenise")
    return {k: np.concatenate(v) for k, v in cols.items()}


def answer_positions(offsets: np.ndarray, example: SquadExample) -> tuple[int, int]:
    """(start, end) token of ``example``'s first answer in one window (``offsets`` (L, 2), -1 outside the
    context), or (CLS, CLS) when the answer is not entirely inside the window's context (or there is none)."""
    if not example.answers:
        return CLS_INDEX, CLS_INDEX
    start_char = example.answer_starts[0]
    end_char = start_char + len(example.answers[0])
    ctx = np.flatnonzero(offsets[:, 0] >= 0)
    if len(ctx) == 0 or not (offsets[ctx[0], 0] <= start_char and offsets[ctx[-1], 1] >= end_char):
        return CLS_INDEX, CLS_INDEX
    start = ctx[offsets[ctx, 0] <= start_char][-1]
    end = ctx[offsets[ctx, 1] >= end_char][0]
    return int(start), int(end)


def _column(ds: Any, name: str, dtype: Any = np.int32) -> Tensor:
    """A fixed-width column of a cached table as a CPU tensor (:func:`teachkit.data.text.column`)."""
    return column(ds, name, dtype)


def _features(ds: Any, examples: SquadExamples, where: str, info: TextInfo) -> tuple[TokenFeatures, Tensor]:
    names = ds.column_names
    inputs = {k: _column(ds, k) for k in ("input_ids", "attention_mask", "token_type_ids") if k in names}
    example_id = _column(ds, "example_id", np.int64)
    if len(example_id) == 0 or int(example_id.max()) + 1 != len(examples) \
            or int(torch.unique(example_id).numel()) != len(examples):
        raise DataError(f"dataset 'squad': the tokenisation cache of {where} does not match its {len(examples)} "
                        f"questions; delete the cache folder and run again")
    offsets = torch.stack([_column(ds, "offset_start"), _column(ds, "offset_end")], dim=-1)
    y = torch.stack([_column(ds, "start_position", np.int64), _column(ds, "end_position", np.int64)], dim=1)
    return TokenFeatures(inputs, {"example_id": example_id, "offset_mapping": offsets}, examples, info), y


def answer_problems(examples: Sequence[SquadExample], example_id: Tensor, start: Tensor) -> dict[str, int]:
    """How many answerable questions do not train on their (first) answer: ``not_at_answer_start``, whose text
    is not the context's at ``answer_start`` (a wrong span or, beyond the context, "no answer" is trained), and
    ``in_no_window``, whose answer no window holds whole (every window trains "no answer", CLS)."""
    found = torch.zeros(len(examples), dtype=torch.bool)
    found[example_id[start != CLS_INDEX]] = True
    counts = {"answers": 0, "not_at_answer_start": 0, "in_no_window": 0}
    for i, ex in enumerate(examples):
        if not ex.answers:
            continue
        counts["answers"] += 1
        first, text = ex.answer_starts[0], ex.answers[0]
        if first < 0 or ex.context[first:first + len(text)] != text:
            counts["not_at_answer_start"] += 1
        elif not found[i]:
            counts["in_no_window"] += 1
    return counts


def note_answers(info: TextInfo, problems: Mapping[str, Mapping[str, int]], max_length: int) -> list[str]:
    """Record per file the answers counted by :func:`answer_problems` (when there are any) in ``info``'s notes;
    returns one warning line for all files (none when every answer trains as given)."""
    bad = {f: dict(c) for f, c in problems.items() if c["not_at_answer_start"] or c["in_no_window"]}
    if not bad:
        return []
    info.notes["squad_answers_not_trained"] = bad
    parts = []
    for name, c in bad.items():
        why = [f"{c['not_at_answer_start']:,} not the context's text at their answer_start (trained as another span "
               "or \"no answer\")"] if c["not_at_answer_start"] else []
        if c["in_no_window"]:
            why.append(f"{c['in_no_window']:,} in no window of max_length={max_length} tokens (trained as \"no "
                       "answer\")")
        parts.append(f"{name} {c['not_at_answer_start'] + c['in_no_window']:,} of {c['answers']:,}: {', '.join(why)}")
    return [f"dataset 'squad': answers not trained as given: {'; '.join(parts)}; check the files' answer_start "
            "or raise max_length"]


@DATASETS.register("squad", "SQuAD v1.1 / v2.0 extractive question answering (official JSON files in data.root), "
                            "tokenised into overlapping windows")
def squad(root: str | None, version: str = "1.1", tokenizer: str = "minilm-l6", max_length: int = 384,
          doc_stride: int = 128, max_query_length: int = 64, cache_dir: str | None = None,
          limit: int | None = None, n_best: int = 20, max_answer_length: int = 30,
          null_threshold: float = 0.0) -> RawDataset:
    """SQuAD's training file as ``train`` and its dev file as ``test`` (``val`` is carved from ``train``).
    ``n_best``, ``max_answer_length`` and ``null_threshold`` (v2.0) are the evaluator's post-processing options:
    they travel with the questions and change no feature."""
    version = check_version(version)
    n_best = text_option("squad", "n_best", n_best, 1)
    max_answer_length = text_option("squad", "max_answer_length", max_answer_length, 1)
    if isinstance(null_threshold, bool) or not isinstance(null_threshold, int | float) or \
            not math.isfinite(null_threshold):
        raise ConfigError(f"dataset 'squad' option 'null_threshold' must be a finite number, got {null_threshold!r}")
    post = {"n_best": n_best, "max_answer_length": max_answer_length, "null_threshold": float(null_threshold)}
    max_length = text_option("squad", "max_length", max_length, 8)
    doc_stride = text_option("squad", "doc_stride", doc_stride, 0)
    max_query_length = text_option("squad", "max_query_length", max_query_length, 1)
    if limit is not None:
        limit = text_option("squad", "limit", limit, 1)
    folder = Path(root if root is not None else ".")
    paths = [folder / name for name in FILES[version]]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"dataset 'squad' (version {version}) needs {' and '.join(missing)} in {str(folder)!r}; "
                        f"download them from {URL} (data.root is that folder)")
    digest = tokenizer_digest(tokenizer)
    info = TextInfo(max_length=max_length, tokenizers={"": tokenizer_entry(tokenizer)})
    parts, problems = [], {}
    for path in paths:
        examples = dataclasses.replace(load_examples(path, version, limit), postprocess=post)
        if not examples:
            raise DataError(f"dataset 'squad': {str(path)!r} holds no questions")
        key = cache_key(kind="squad", file=file_sha256(path), tokenizer=digest, max_length=max_length,
                        doc_stride=doc_stride, max_query_length=max_query_length, version=version, limit=limit)

        def build(examples: SquadExamples = examples) -> dict[str, Any]:
            cols = tokenize_squad(load_tokenizer(tokenizer), examples, max_length, doc_stride, max_query_length)
            return {k: list(v) if v.ndim > 1 else v for k, v in cols.items()}

        x, y = _features(cached_table(key, cache_dir, build), examples, path.name, info)
        problems[path.name] = answer_problems(examples, x.side["example_id"], y[:, 0])
        parts.append((x, y))
    (train_x, train_y), (test_x, test_y) = parts
    return RawDataset(train_x, train_y, test_x, test_y, num_classes=2, task="squad", name="squad",
                      warnings=note_answers(info, problems, max_length))


# -- scoring (the official evaluation scripts) --------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, punctuation removed, articles (a, an, the) removed, whitespace collapsed (official)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 when both normalise to the same text, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    """Token-overlap F1 of the normalised texts (official v2.0 script: 1.0 when both are empty, 0.0 when
    only one is; the v1.1 script differs only in scoring two empty texts 0)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[int, str], examples: Sequence[SquadExample],
                 version_2: bool = False) -> dict[str, float]:
    """``exact`` and ``f1`` in % (max over gold answers, mean over the questions in ``predictions``, keyed by
    their index in ``examples``), as the official scripts compute them; with ``version_2`` also
    ``has_ans_*`` / ``no_ans_*`` (an unanswerable question scores 1 only for an answer normalising to "";
    NaN for a group with no question). A question missing from ``predictions`` is not scored."""
    em: dict[bool, list[float]] = {True: [], False: []}
    f1: dict[bool, list[float]] = {True: [], False: []}
    for i, pred in predictions.items():
        ex = examples[i]
        golds = list(ex.answers)
        if version_2:  # the v2.0 script: golds normalising to "" are dropped; none left = unanswerable
            golds = [g for g in golds if normalize_answer(g)] or [""]
        has_ans = not ex.is_impossible
        em[has_ans].append(max(exact_match(pred, g) for g in golds))
        if version_2:
            f1[has_ans].append(max(f1_score(pred, g) for g in golds))
        else:  # the v1.1 script: two empty texts have F1 0
            f1[has_ans].append(max(f1_score(pred, g) if normalize_answer(g) else 0.0 for g in golds))

    def pct(values: list[float]) -> float:
        return 100.0 * sum(values) / len(values) if values else float("nan")

    out = {"exact": pct(em[True] + em[False]), "f1": pct(f1[True] + f1[False])}
    if version_2:
        out.update(has_ans_exact=pct(em[True]), has_ans_f1=pct(f1[True]),
                   no_ans_exact=pct(em[False]), no_ans_f1=pct(f1[False]))
    return out


# -- post-processing ----------------------------------------------------------------------------------------
def postprocess(start_logits: Tensor | np.ndarray, end_logits: Tensor | np.ndarray, offsets: Tensor | np.ndarray,
                example_ids: Tensor | np.ndarray, examples: Sequence[SquadExample], *, version_2: bool = False,
                n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0) -> dict[int, str]:
    """The predicted answer text of every question with windows in ``example_ids`` (N,), keyed by its index in
    ``examples``, from per-window ``start_logits`` / ``end_logits`` (N, L) and ``offsets`` (N, L, 2) (-1 outside
    the context). Spans: start among the ``n_best`` best context starts, end among the ``n_best`` best context
    ends, start <= end, at most ``max_answer_length`` tokens, score start + end logit, best over the question's
    windows; non-finite logits are never candidates. v2.0: "" when the null score (CLS start + end, minimum over
    windows) exceeds the best span's score by more than ``null_threshold``. No candidate span at all: ""."""
    starts = np.asarray(torch.as_tensor(start_logits).float().cpu())
    ends = np.asarray(torch.as_tensor(end_logits).float().cpu())
    offs = np.asarray(torch.as_tensor(offsets).cpu())
    ids = np.asarray(torch.as_tensor(example_ids).cpu())
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for w in range(len(ids)):
        ex_id = int(ids[w])
        s_log, e_log, off = starts[w], ends[w], offs[w]
        null[ex_id] = min(null.get(ex_id, math.inf), float(s_log[CLS_INDEX] + e_log[CLS_INDEX]))
        ok = (off[:, 0] >= 0) & np.isfinite(s_log) & np.isfinite(e_log)
        ctx = np.flatnonzero(ok)
        if len(ctx) == 0:
            continue
        s_idx = ctx[np.argsort(-s_log[ctx], kind="stable")[:n_best]]
        e_idx = ctx[np.argsort(-e_log[ctx], kind="stable")[:n_best]]
        scores = s_log[s_idx][:, None] + e_log[e_idx][None, :]
        length = e_idx[None, :] - s_idx[:, None] + 1
        scores = np.where((length >= 1) & (length <= max_answer_length), scores, -np.inf)
        k = int(np.argmax(scores))
        score = float(scores.flat[k])
        if score == -np.inf:
            continue
        if ex_id not in best or score > best[ex_id][0]:
            s, e = int(s_idx[k // len(e_idx)]), int(e_idx[k % len(e_idx)])
            best[ex_id] = (score, examples[ex_id].context[int(off[s, 0]):int(off[e, 1])])
    out: dict[int, str] = {}
    for ex_id in null:
        score, text = best.get(ex_id, (-math.inf, ""))
        if version_2 and null[ex_id] - score > null_threshold:
            text = ""
        out[ex_id] = text
    return out


# -- the evaluator ------------------------------------------------------------------------------------------
@torch.no_grad()
def span_logits(model: nn.Module, split: TensorSplit, batch_size: int = 1000) -> tuple[Tensor, float]:
    """((N, L, 2) float32 CPU logits of every window of ``split``, padded to the split's full length with
    -inf, and the mean over windows of the mean start / end cross-entropy), ``model`` in eval mode."""
    x = split.x
    full = int(x.side["offset_mapping"].shape[1]) if "offset_mapping" in x.side else int(x.shape[1])
    was_training = model.training
    model.eval()
    outs, loss_sum = [], 0.0
    try:
        for i in range(0, len(split), batch_size):
            logits = model(x[i:i + batch_size])
            if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[-1] != 2:
                shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
                raise ValueError(f"a question-answering model must return logits (B, L, 2), got {shape}")
            logits = logits.float()
            loss_sum += float(F.cross_entropy(logits, split.y[i:i + batch_size].to(logits.device), reduction="sum"))
            pad = full - int(logits.shape[1])
            outs.append(F.pad(logits.cpu(), (0, 0, 0, pad), value=-math.inf) if pad > 0 else logits.cpu())
    finally:
        model.train(was_training)
    n = len(split)
    logits = torch.cat(outs) if outs else torch.empty(0, full, 2)
    return logits, loss_sum / (2 * n) if n else float("nan")


class SquadEvaluator(Evaluator):
    """SQuAD ``exact`` / ``f1`` (primary) in %, ``has_ans_*`` / ``no_ans_*`` for v2.0, and the window ``loss``,
    on each named split (see the module docstring)."""

    primary = "f1"
    sample_unit = "seq"  # a question-context window

    def __init__(self, splits: Mapping[str, TensorSplit], version_2: bool = False, batch_size: int = 1000,
                 n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0,
                 dataset: str = "squad", train_x: Any = None) -> None:
        self.splits = dict(splits)
        self.version_2 = version_2
        self.batch_size = batch_size
        self.n_best = n_best
        self.max_answer_length = max_answer_length
        self.null_threshold = null_threshold
        self.dataset = dataset
        #: the training inputs, checked with the evaluated ones by :meth:`check_model`
        self.train_x = train_x

    def check_model(self, model: nn.Module) -> None:
        """A text model must take the data's ``max_length`` and have an embedding row for each of its token ids
        (:func:`teachkit.models.text.check_fits`): a one-line ConfigError before the run, not an IndexError."""
        check_fits_splits(model, self.splits.values(), self.train_x, self.dataset)

    def metric_names(self) -> tuple[str, ...]:
        return METRICS_V2 if self.version_2 else METRICS_V1

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "min" if metric == "loss" else "max"

    def is_percent(self, metric: str) -> bool:
        return metric != "loss"

    def score_split(self, model: nn.Module, split: TensorSplit) -> dict[str, float]:
        """The metrics of ``model`` on one split of SQuAD windows."""
        logits, loss = span_logits(model, split, self.batch_size)
        x = split.x
        preds = postprocess(logits[..., 0], logits[..., 1], x.side["offset_mapping"], x.side["example_id"],
                            x.examples, version_2=self.version_2, n_best=self.n_best,
                            max_answer_length=self.max_answer_length, null_threshold=self.null_threshold)
        return {**squad_scores(preds, x.examples, self.version_2), "loss": loss}

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {name: self.score_split(model, split) for name, split in self.splits.items()}

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: 100 x the number of windows whose start and end are both predicted exactly (argmax)."""
        return {"train_acc": (outputs.detach().argmax(1) == batch.y).all(1).sum() * 100.0}


@EVALUATORS.register("squad", "extractive QA: SQuAD exact match and F1 (primary), v2.0 has/no-answer splits, "
                              "window CE, on val and test")
def squad_evaluator(splits: Splits, batch_size: int) -> Evaluator:
    examples = getattr(splits.test.x, "examples", None)
    if not isinstance(examples, SquadExamples):
        raise ConfigError(f"dataset {splits.name!r} has task 'squad' but its inputs carry no SQuAD questions; "
                          "use the 'squad' dataset")
    return SquadEvaluator(splits.eval_splits(), examples.version == "2.0", batch_size,
                          **getattr(examples, "postprocess", {}), dataset=splits.name, train_x=splits.train.x)
