"""Causal-LM data from files: ``lm_text`` (plain text, cut into blocks) and ``prompt_response`` (a prompt and the
response a model should give, the loss on the response only). Both give :class:`~teachkit.data.lm.LMText` splits.

``lm_text`` reads ``train`` (default: ``data.root`` when it is a file), ``valid`` and ``test`` files: ``.txt``
(one document per non-empty line) or ``.jsonl`` / ``.ndjson`` (one document per record, its ``text_field``).
Each document is tokenised with BOS first (when the tokenizer has one) and EOS last, then cut into blocks of
at most ``max_length`` tokens, one block a row: a block never holds two documents. A continuation block starts
with the last token of the block before it, so every token after a document's first is a target exactly once
(``starts`` = 1 on every row). With ``teacher_tokenizer`` both tokenisations must see the same text per row, so
every document must then fit in one block under both tokenizers (a longer one is a one-line DataError naming
its file and line: split long documents into shorter lines, or raise ``max_length``). Empty (or blank) lines of
a text file and empty texts of a record are skipped, counted and warned (``empty='skip'``) or refused
(``'reject'``); blank lines of a JSON Lines file are no records and are passed over.

``prompt_response`` reads JSON Lines files of records ``{"prompt": str, "response": str}`` or ``{"messages":
[{"role", "content"}, ...]}`` whose last message is the assistant's (the response); the earlier messages are the
prompt (a record with a ``prompt`` key is read as a prompt / response record), rendered with the tokenizer's chat
template when it has one (``add_generation_prompt=True``), else as ``"<role>: <content>\\n"`` per message followed
by ``"assistant: "``. A row is BOS (when the tokenizer has one and the rendered prompt does not already start with
it), the prompt, then the TARGETS: the response and EOS. ``references`` are the responses as written.
A row longer than ``max_length`` is cut in its response (``too_long='truncate'``: counted and warned; the cut
response keeps at least one token and loses its EOS, so the model is never taught to stop there; with a
teacher tokenisation the response TEXT is cut where both tokenisations fit) or refused (``'reject'``); a prompt
that alone reaches ``max_length`` is always refused. ``max_new_tokens`` (the generation limit when evaluating)
defaults to the longest response in tokens + 8.

Both: missing ``valid`` / ``test`` files are carved from train (test first, then valid; 10% each of the
documents or records, seeded by ``split_seed``), whole documents, so no document's blocks straddle two splits;
``limit`` keeps the first training documents / records after carving. ``tokenizer``: ``char``, ``byte``, ``bpe``
(``vocab_size`` tokens, learned on the training split) or a pretrained one (:mod:`teachkit.data.lm_tokenizers`);
``teacher_tokenizer`` likewise, a teacher's own tokenisation of the same rows (``teacher.`` keys). Every problem
with the input is one line naming the file and line. The result (tokenizers built here included) is cached
with the tokenisation cache (:func:`teachkit.data.text.cached_table`), keyed by the sha256 of the files, the
tokenizers and every option: a second load reads the Arrow files instead of tokenising again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data import lm_tokenizers as lmt
from teachkit.data.lm import LMInfo, lm_dataset, lm_splits, ragged
from teachkit.data.raw import DATASETS, RawDataset, int_option
from teachkit.data.splits import random_fraction
from teachkit.data.text import TEACHER_PREFIX, cache_key, cached_table, file_sha256, tokenizer_digest
from teachkit.data.translation_files import read_lines
from teachkit.data.userdata import default_file, resolve
from teachkit.errors import ConfigError, DataError

#: bump when reading or encoding changes: older cache entries are then never used
READER_VERSION = 1
SPLITS = ("train", "val", "test")
#: the option naming each split's file
FILE_OPTION = {"train": "train", "val": "valid", "test": "test"}
#: without a valid / test file, this share of the training documents (records) is carved for each
CARVE = Fraction(1, 10)
TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
#: the generation limit's margin over the longest response
NEW_TOKENS_MARGIN = 8


@dataclass
class Item:
    """One document (``text``) or one record (``text`` = the response; ``prompt`` or ``messages``), and where
    it was read."""

    text: str
    file: str
    line: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None

    def where(self) -> str:
        return f"{self.file!r} line {self.line:,}"


@dataclass
class Side:
    """One tokenisation: the option naming it, its value, the tokenizer and its special ids."""

    key: str
    name: str
    tok: Any
    pad: int
    eos: int
    bos: int | None

    @classmethod
    def of(cls, key: str, name: str, tok: Any) -> Side:
        pad, eos, bos = lmt.special_ids(tok)
        return cls(key, name, tok, pad, eos, bos)

    @property
    def who(self) -> str:
        return "" if self.key == "tokenizer" else " with the teacher's tokenizer"


# -- options -----------------------------------------------------------------------------------------------------
def _choice(dataset: str, key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"dataset {dataset!r} option {key!r} is {value!r}; choose one of: {', '.join(allowed)}")
    return value


def _string(dataset: str, key: str, value: Any, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be {what}{' or null' if optional else ''}, got "
                          f"{value!r}")
    return value


def _optional_int(dataset: str, key: str, value: Any, minimum: int) -> int | None:
    return None if value is None else int_option(dataset, key, value, minimum)


@dataclass
class Common:
    """The options both sources share, checked."""

    tokenizer: str
    vocab_size: int
    max_length: int
    max_tokens: int | None
    limit: int | None
    split_seed: int
    cache_dir: str | None
    teacher_tokenizer: str | None

    def key_parts(self) -> dict[str, Any]:
        """What the cached rows depend on besides the files (the tokenizers by identity, see :func:`_identity`)."""
        return {"tokenizer": _identity(self.tokenizer, self.vocab_size), "max_length": self.max_length,
                "limit": self.limit, "split_seed": self.split_seed,
                "teacher": None if self.teacher_tokenizer is None else _identity(self.teacher_tokenizer,
                                                                                 self.vocab_size)}


def common_options(dataset: str, *, tokenizer: Any, vocab_size: Any, max_length: Any, max_tokens: Any, limit: Any,
                   split_seed: Any, cache_dir: Any, teacher_tokenizer: Any) -> Common:
    """The shared options checked in the order a user reads them (one-line ConfigErrors)."""
    tokenizer = lmt.check_name(dataset, "tokenizer", tokenizer)
    vocab_size = int_option(dataset, "vocab_size", vocab_size, len(lmt.SPECIALS) + 1)
    max_length = int_option(dataset, "max_length", max_length, 2)
    max_tokens = _optional_int(dataset, "max_tokens", max_tokens, 2)
    limit = _optional_int(dataset, "limit", limit, 1)
    split_seed = int_option(dataset, "split_seed", split_seed, 0)
    cache_dir = _string(dataset, "cache_dir", cache_dir, "a folder path", optional=True)
    teacher = lmt.check_name(dataset, "teacher_tokenizer", teacher_tokenizer, optional=True)
    for key, value in (("tokenizer", tokenizer), ("teacher_tokenizer", teacher)):
        if value == "bpe" and vocab_size < lmt.MIN_BPE_VOCAB:
            raise ConfigError(f"dataset {dataset!r} option 'vocab_size' must be >= {lmt.MIN_BPE_VOCAB} for "
                              f"{key}='bpe' (4 specials and 256 bytes), got {vocab_size}; use {key}='char' for a "
                              "smaller vocabulary")
    return Common(tokenizer, vocab_size, max_length, max_tokens, limit, split_seed, cache_dir,  # type: ignore
                  teacher)


def _identity(name: str, vocab_size: int) -> Any:
    """What a tokenizer option's encoding depends on: a built kind (and its size), or the pretrained files'
    sha256 with the chat template (``chat_template.jinja``, kept beside tokenizer_config.json by transformers 5)."""
    if name in lmt.BUILT:
        return [name, vocab_size if name == "bpe" else None]
    from teachkit.data.text import resolve_pretrained

    template = Path(resolve_pretrained(name, "tokenizer")) / "chat_template.jinja"
    return [tokenizer_digest(name), file_sha256(template) if template.is_file() else None]


# -- files -------------------------------------------------------------------------------------------------------
def split_files(dataset: str, root: str | None, train: Any, valid: Any, test: Any, what: str,
                suffixes: Sequence[str]) -> dict[str, Path | None]:
    """The file of each split (None: carve it from train); ``train`` defaults to ``data.root`` itself."""
    files: dict[str, Path | None] = {}
    for part, value in (("train", train), ("val", valid), ("test", test)):
        key = FILE_OPTION[part]
        if value is None:
            files[part] = default_file(root, dataset, what) if part == "train" else None
            continue
        files[part] = resolve(root, value, dataset, key, kind="file")
    for part, path in files.items():
        if path is not None and path.suffix.lower() not in suffixes:
            raise DataError(f"dataset {dataset!r}: file {str(path)!r} of option {FILE_OPTION[part]!r} is not a "
                            f"file this source reads; name it with one of the suffixes {', '.join(suffixes)}")
    return files


def _json_record(dataset: str, path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"dataset {dataset!r}: {str(path)!r} line {number:,} is not JSON ({e.msg}, character "
                        f"{e.colno})") from None
    if not isinstance(record, dict):
        raise DataError(f"dataset {dataset!r}: {str(path)!r} line {number:,} is a JSON {type(record).__name__}, not "
                        "an object with named fields")
    return record


def _field(dataset: str, path: Path, number: int, record: dict[str, Any], key: str, needed: str) -> str:
    if key not in record:
        keys = ", ".join(map(str, record)) or "none"
        raise DataError(f"dataset {dataset!r}: {str(path)!r} line {number:,} has no key {key!r} (keys: {keys}); "
                        f"{needed}")
    value = record[key]
    if not isinstance(value, str):
        raise DataError(f"dataset {dataset!r}: {str(path)!r} line {number:,} field {key!r} is a JSON "
                        f"{type(value).__name__}, not a string")
    return value


def read_documents(dataset: str, path: Path, text_field: str, empty: str) -> tuple[list[Item], int]:
    """The documents of a ``.txt`` (a line each) or JSON Lines file (a record each), and how many empty ones
    were skipped (``empty='reject'``: a DataError naming the first)."""
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    docs: list[Item] = []
    skipped = 0
    for number, line in enumerate(read_lines(path, dataset), 1):
        if jsonl:
            if not line.strip():
                continue
            record = _json_record(dataset, path, number, line)
            text = _field(dataset, path, number, record, text_field, "set option text_field to the key holding "
                          "the text")
        else:
            text = line
        if not text.strip():
            if empty == "reject":
                what = f"field {text_field!r} is empty" if jsonl else "is empty"
                raise DataError(f"dataset {dataset!r}: {str(path)!r} line {number:,} {what} (option empty='reject'; "
                                "'skip' drops empty documents)")
            skipped += 1
            continue
        docs.append(Item(text, str(path), number))
    if not docs:
        raise DataError(f"dataset {dataset!r}: {str(path)!r} holds no documents (no non-empty line or text)")
    return docs, skipped


def _messages(dataset: str, path: Path, number: int, value: Any) -> list[dict[str, str]]:
    """A record's ``messages``: at least two {"role", "content"} strings, the last the assistant's."""
    where = f"dataset {dataset!r}: {str(path)!r} line {number:,}"
    if not isinstance(value, list) or len(value) < 2:
        raise DataError(f"{where} field 'messages' must be a list of at least two messages (the prompt's, then the "
                        f"assistant's response), got {str(value)[:60]!r}")
    out = []
    for i, m in enumerate(value, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where} message {i} must be an object with string fields 'role' and 'content', got "
                            f"{str(m)[:60]!r}")
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "assistant":
        raise DataError(f"{where}: the last message must be the assistant's (the response), got role "
                        f"{out[-1]['role']!r}")
    return out


def read_records(dataset: str, path: Path) -> list[Item]:
    """The prompt / response records of a JSON Lines file (blank lines skipped)."""
    items = []
    needed = "a record needs 'prompt' and 'response' strings, or 'messages'"
    for number, line in enumerate(read_lines(path, dataset), 1):
        if not line.strip():
            continue
        record = _json_record(dataset, path, number, line)
        if "messages" in record and "prompt" not in record:
            messages = _messages(dataset, path, number, record["messages"])
            items.append(Item(messages[-1]["content"], str(path), number, messages=messages[:-1]))
            continue
        prompt = _field(dataset, path, number, record, "prompt", needed)
        response = _field(dataset, path, number, record, "response", needed)
        items.append(Item(response, str(path), number, prompt=prompt))
    if not items:
        raise DataError(f"dataset {dataset!r}: {str(path)!r} holds no records (every line is blank)")
    return items


def carve(dataset: str, parts: dict[str, list[Item] | None], seed: int, what: str) -> dict[str, str]:
    """Missing splits carved from train, whole items at random (test first, then val; :data:`CARVE` each,
    seeded); where each split comes from."""
    g = torch.Generator().manual_seed(seed)
    origin = {part: "file" for part, items in parts.items() if items is not None}
    missing = [part for part in ("test", "val") if parts[part] is None]
    n = len(parts["train"] or [])
    if missing and n <= len(missing):
        names = " and ".join(f"{part} split" for part in missing)
        files = " and ".join(repr(FILE_OPTION[part]) for part in missing)
        raise DataError(f"dataset {dataset!r}: {n} training {what} are too few to carve a {names} (at least "
                        f"{len(missing) + 1} needed); give option {files} a file")
    for part in missing:
        train = parts["train"] or []
        rest, held = random_fraction(len(train), CARVE, g)
        parts[part] = [train[i] for i in held.tolist()]
        parts["train"] = [train[i] for i in rest.tolist()]
        origin[part] = f"carved from train: {float(CARVE):.0%} of the {what} at random (split_seed {seed})"
    return origin


# -- encoding ----------------------------------------------------------------------------------------------------
def encode_text(tok: Any, texts: Sequence[str], batch: int = 8192) -> list[list[int]]:
    """Token ids of each text, without special tokens added (the one place texts are tokenised): the Rust
    tokenizer of a fast tokenizer called directly, as ``tok(texts)`` does (special tokens written in the text
    are matched unless the tokenizer splits them), without building Python encodings per text."""
    backend = tok.backend_tokenizer
    backend.encode_special_tokens = bool(getattr(tok, "split_special_tokens", False))
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    out: list[list[int]] = []
    for start in range(0, len(texts), batch):
        out.extend(e.ids for e in encode(list(texts[start:start + batch]), add_special_tokens=False))
    return out


def fallback_prompt(messages: Sequence[dict[str, str]]) -> str:
    """The prompt of ``messages`` for a tokenizer without a chat template: ``role: content`` lines, then
    ``assistant: ``."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def render_prompt(dataset: str, item: Item, side: Side | None) -> str:
    """The prompt text of a record as ``side``'s tokenizer sees it (its chat template, else the fallback)."""
    if item.messages is None:
        return item.prompt or ""
    template = None if side is None else lmt.chat_template(side.tok)
    if template is None:
        return fallback_prompt(item.messages)
    try:
        return side.tok.apply_chat_template(item.messages, tokenize=False,  # type: ignore[union-attr]
                                            add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a template that refuses the messages is one line
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise DataError(f"dataset {dataset!r}: {item.where()}: the chat template of {side.key} "  # type: ignore
                        f"{side.name!r} refuses these messages ({reason})") from None


def with_bos(ids: list[int], bos: int | None) -> list[int]:
    """BOS first when the tokenizer has one (not twice when a chat template wrote it)."""
    return ids if bos is None or (ids and ids[0] == bos) else [bos, *ids]


def training_texts(kind: str, train: Sequence[Item]) -> list[str]:
    """The texts a tokenizer is built on: the documents, or the prompts (fallback rendering) and responses."""
    if kind == "text":
        return [d.text for d in train]
    return [*(render_prompt("", d, None) for d in train), *(d.text for d in train)]


@dataclass
class Built:
    """What a source's cache entry holds: the tokenizers built here (``tokenizer.json`` text, None for a
    pretrained one), the rows of every split, their references, notes and the longest response."""

    tokenizer_json: str | None
    teacher_json: str | None
    references: list[str]
    notes: dict[str, Any]
    longest_response: int
    rows: dict[str, list[Any]] = field(default_factory=dict)


def document_blocks(tokens: list[int], max_length: int) -> list[list[int]]:
    """A document's tokens cut into blocks of at most ``max_length``, each continuation block starting with the
    last token of the one before (so every token but the first is a target exactly once)."""
    if len(tokens) <= max_length:
        return [tokens]
    out, start = [], 0
    while True:
        out.append(tokens[start:start + max_length])
        if start + max_length >= len(tokens):
            return out
        start += max_length - 1


def encode_documents(dataset: str, docs: Sequence[Item], sides: Sequence[Side], max_length: int) -> dict[str, list]:
    """Rows of documents: ``ids`` and ``starts`` per row, the document index ``row_id``; with a teacher side
    ``t_ids`` / ``t_starts`` (each document one block, module docstring)."""
    texts = [d.text for d in docs]
    encoded = [[[*with_bos(ids, s.bos), s.eos] for ids in encode_text(s.tok, texts)] for s in sides]
    rows: dict[str, list] = {"ids": [], "starts": [], "row_id": []}
    if len(sides) > 1:
        rows.update(t_ids=[], t_starts=[])
        for side, seqs in zip(sides, encoded, strict=True):
            for i, seq in enumerate(seqs):
                if len(seq) > max_length:
                    raise DataError(f"dataset {dataset!r}: {docs[i].where()} is {len(seq):,} tokens long{side.who} "
                                    f"(BOS and EOS included), more than max_length={max_length}; with "
                                    "teacher_tokenizer every document must fit in one block: split long documents "
                                    "into shorter lines or raise max_length")
    for i, seq in enumerate(encoded[0]):
        for block in document_blocks(seq, max_length):
            rows["ids"].append(block)
            rows["starts"].append(1)
            rows["row_id"].append(i)
            if len(sides) > 1:
                rows["t_ids"].append(encoded[1][i])
                rows["t_starts"].append(1)
    return rows


def _cut_text(text: str, prompts: Sequence[list[int]], sides: Sequence[Side], max_length: int) -> int:
    """The most characters of a response whose tokens fit after each side's prompt (binary search)."""
    def fits(c: int) -> bool:
        return all(len(p) + len(ids) <= max_length for p, ids in
                   zip(prompts, (encode_text(s.tok, [text[:c]])[0] for s in sides), strict=True))

    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_record(dataset: str, item: Item, prompts: list[list[int]], responses: list[list[int]],
               sides: Sequence[Side], max_length: int, too_long: str) -> tuple[list[list[int]], bool]:
    """Each side's row (prompt + response + EOS) within ``max_length``: as it is, or cut in the response
    (``truncate``; returns True), or a one-line DataError (``reject``, or a prompt that leaves no room)."""
    for side, p in zip(sides, prompts, strict=True):
        if len(p) >= max_length:
            raise DataError(f"dataset {dataset!r}: {item.where()}: the prompt alone is {len(p):,} tokens{side.who}, "
                            f"max_length={max_length} leaves no room for a response; shorten it or raise max_length")
    sizes = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    if all(n <= max_length for n in sizes):
        return [p + r for p, r in zip(prompts, responses, strict=True)], False
    if too_long == "reject":
        side, n = next((s, n) for s, n in zip(sides, sizes, strict=True) if n > max_length)
        raise DataError(f"dataset {dataset!r}: {item.where()} is {n:,} tokens long{side.who} (prompt, response and "
                        f"EOS), more than max_length={max_length} (option too_long='reject'; 'truncate' cuts the "
                        "response)")
    if len(sides) == 1:
        return [prompts[0] + responses[0][:max_length - len(prompts[0])]], True
    cut = item.text[:_cut_text(item.text, prompts, sides, max_length)]
    rows = [p + encode_text(s.tok, [cut])[0] for p, s in zip(prompts, sides, strict=True)]
    if any(len(r) == len(p) for r, p in zip(rows, prompts, strict=True)):
        raise DataError(f"dataset {dataset!r}: {item.where()}: no part of the response fits after the prompt in "
                        f"max_length={max_length} tokens under both tokenizers; shorten the prompt or raise max_length")
    return rows, True


def encode_records(dataset: str, items: Sequence[Item], sides: Sequence[Side], max_length: int,
                   too_long: str) -> tuple[dict[str, list], list[bool], int]:
    """Rows of records (``ids``, ``starts`` = prompt length, ``row_id``; ``t_*`` for a teacher side), which were
    cut, and the longest response in the student's tokens."""
    prompts, responses = [], []
    for s in sides:
        rendered = [render_prompt(dataset, item, s) for item in items]
        prompts.append([with_bos(ids, s.bos) for ids in encode_text(s.tok, rendered)])
        responses.append([[*ids, s.eos] for ids in encode_text(s.tok, [item.text for item in items])])
    for s, ps in zip(sides, prompts, strict=True):
        for i, p in enumerate(ps):
            if not p:
                raise DataError(f"dataset {dataset!r}: {items[i].where()}: the prompt is empty and {s.key} "
                                f"{s.name!r} has no BOS token, so there is nothing to condition the response on")
    keys = [("ids", "starts"), ("t_ids", "t_starts")][:len(sides)]
    rows: dict[str, list] = {k: [] for pair in keys for k in pair} | {"row_id": []}
    cut = []
    for i, item in enumerate(items):
        seqs, was_cut = fit_record(dataset, item, [p[i] for p in prompts], [r[i] for r in responses], sides,
                                   max_length, too_long)
        for (ids_key, starts_key), seq, p in zip(keys, seqs, prompts, strict=True):
            rows[ids_key].append(seq)
            rows[starts_key].append(len(p[i]))
        rows["row_id"].append(i)
        cut.append(was_cut)
    longest = max((len(r) - 1 for r in responses[0]), default=0)
    return rows, cut, longest


# -- building, caching, loading ------------------------------------------------------------------------------------
Encoder = Callable[[Sequence[Item], Sequence[Side]], tuple[dict[str, list], list[bool], int]]


def make_sides(dataset: str, kind: str, train: Sequence[Item], opts: Common) -> list[Side]:
    """The student's tokenisation and, with ``teacher_tokenizer``, the teacher's, built on the training split."""
    texts = training_texts(kind, train)
    sides = [Side.of("tokenizer", opts.tokenizer,
                     lmt.build_tokenizer(dataset, "tokenizer", opts.tokenizer, texts, opts.vocab_size))]
    if opts.teacher_tokenizer is not None:
        sides.append(Side.of("teacher_tokenizer", opts.teacher_tokenizer,
                             lmt.build_tokenizer(dataset, "teacher_tokenizer", opts.teacher_tokenizer, texts,
                                                 opts.vocab_size)))
    return sides


def encode_splits(dataset: str, kind: str, parts: dict[str, list[Item]], opts: Common, encode: Encoder,
                  notes: dict[str, Any]) -> Built:
    """Tokenizers built on train, then the rows of every split (stored split after split), counted in notes."""
    sides = make_sides(dataset, kind, parts["train"], opts)
    items = [item for part in SPLITS for item in parts[part]]
    split_of = np.repeat(np.arange(3, dtype=np.int8), [len(parts[part]) for part in SPLITS])
    rows, cut, longest = encode(items, sides)
    rows["split"] = split_of[np.asarray(rows["row_id"], dtype=np.int64)].tolist()
    what = "documents" if kind == "text" else "records"
    notes.update({what: {part: len(parts[part]) for part in SPLITS},
                  "rows": {part: int((np.asarray(rows["split"]) == c).sum()) for c, part in enumerate(SPLITS)},
                  "tokenizer": opts.tokenizer, "vocab_size": len(sides[0].tok), "max_length": opts.max_length})
    if kind != "text":
        notes["truncated"] = {part: int(np.logical_and(split_of == c, cut).sum()) for c, part in enumerate(SPLITS)}
    if opts.teacher_tokenizer is not None:
        notes["teacher_tokenizer"] = opts.teacher_tokenizer
        notes["teacher_vocab_size"] = len(sides[1].tok)
    built_json = [lmt.backend_json(s.tok) if s.name in lmt.BUILT else None for s in sides]
    return Built(built_json[0], built_json[1] if len(sides) > 1 else None, [item.text for item in items], notes,
                 longest, rows)


def _list_column(rows: Sequence[Sequence[int]]) -> Any:
    import pyarrow as pa

    flat, lengths = ragged(rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int32()))


def _row_columns(built: Built) -> dict[str, Any]:
    import pyarrow as pa

    out = {"split": pa.array(built.rows["split"], pa.int8()), "ids": _list_column(built.rows["ids"]),
           "starts": pa.array(built.rows["starts"], pa.int32()), "row_id": pa.array(built.rows["row_id"], pa.int64())}
    if "t_ids" in built.rows:
        out.update(t_ids=_list_column(built.rows["t_ids"]), t_starts=pa.array(built.rows["t_starts"], pa.int32()))
    return out


def _meta_columns(built: Built) -> dict[str, Any]:
    return {"tokenizer_json": [built.tokenizer_json or ""], "teacher_json": [built.teacher_json or ""],
            "references": [built.references], "notes": [json.dumps(built.notes, ensure_ascii=False)],
            "longest_response": [built.longest_response]}


def _read_ragged(ds: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    arr = ds.data.column(name).combine_chunks()
    return (arr.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
            arr.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64))


def cached_rows(key: str, cache_dir: str | None, build: Callable[[], Built]) -> tuple[Built, dict[str, Any]]:
    """The entry stored under ``key`` in the tokenisation cache (two Arrow tables: the rows, and one row of
    tokenizers, references and notes), built with ``build()`` when absent; (the entry without its rows, the
    row columns as :func:`teachkit.data.lm.lm_splits` takes them)."""
    made: list[Built] = []

    def get() -> Built:
        if not made:
            made.append(build())
        return made[0]

    meta = cached_table(cache_key(kind="lm-meta", key=key), cache_dir, lambda: _meta_columns(get()))[0]
    ds = cached_table(cache_key(kind="lm-rows", key=key), cache_dir, lambda: _row_columns(get()))
    columns: dict[str, Any] = {"ids": _read_ragged(ds, "ids")}
    for name in ("split", "starts", "row_id", "t_starts"):
        if name in ds.column_names:
            columns[name] = ds.data.column(name).to_numpy()
    if "t_ids" in ds.column_names:
        columns["t_ids"] = _read_ragged(ds, "t_ids")
    built = Built(meta["tokenizer_json"] or None, meta["teacher_json"] or None, list(meta["references"]),
                  json.loads(meta["notes"]), int(meta["longest_response"]))
    return built, columns


def source_key(dataset: str, files: dict[str, Path | None], opts: Common, extra: dict[str, Any]) -> str:
    """The cache key: reader version, the files' names and sha256, and every option the rows depend on."""
    return cache_key(kind="lm", reader=READER_VERSION, dataset=dataset,
                     files={part: None if p is None else [p.name, file_sha256(p)] for part, p in files.items()},
                     options={**opts.key_parts(), **extra})


def lm_warnings(dataset: str, notes: dict[str, Any]) -> list[str]:
    """One warning each for the empty lines skipped and the responses cut, with their counts per split."""
    out = []
    for key, what in (("skipped_empty", "empty documents skipped (option empty='skip')"),
                      ("truncated", f"rows longer than max_length={notes.get('max_length')} tokens cut in their "
                                    "response (option too_long='truncate')")):
        counts = notes.get(key) or {}
        total = sum(counts.values())
        if total:
            per = ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)
            out.append(f"dataset {dataset!r}: {total:,} {what}: {per}")
    return out


def side_tokenizer(dataset: str, key: str, name: str, built_json: str | None, vocab_size: int) -> Any:
    """A tokenizer again: from the cached ``tokenizer.json`` when built here, else loaded offline."""
    return lmt.from_json(built_json) if built_json is not None else \
        lmt.build_tokenizer(dataset, key, name, [], vocab_size)


def load_lm(dataset: str, kind: str, key: str, opts: Common, build: Callable[[], Built],
            files: dict[str, Path | None], max_new_tokens: int | None) -> RawDataset:
    """The RawDataset of a source: the cached entry (built when absent) as :class:`LMText` splits."""
    built, columns = cached_rows(key, opts.cache_dir, build)
    student = side_tokenizer(dataset, "tokenizer", opts.tokenizer, built.tokenizer_json, opts.vocab_size)
    pad, eos, bos = lmt.special_ids(student)
    tokenizers = {"": lmt.tokenizer_entry(opts.tokenizer, student)}
    teacher, t_pad = None, None
    if opts.teacher_tokenizer is not None:
        teacher = side_tokenizer(dataset, "teacher_tokenizer", opts.teacher_tokenizer, built.teacher_json,
                                 opts.vocab_size)
        t_pad = lmt.special_ids(teacher)[0]
        tokenizers[TEACHER_PREFIX] = lmt.tokenizer_entry(opts.teacher_tokenizer, teacher)
    notes = {**built.notes, "files": {part: None if p is None else str(p) for part, p in files.items()}}
    limit = max_new_tokens if max_new_tokens is not None else built.longest_response + NEW_TOKENS_MARGIN
    info = LMInfo(student, tokenizers, pad, eos, bos, kind, opts.max_length, max_tokens=opts.max_tokens,
                  max_new_tokens=limit, references=tuple(built.references), notes=notes,
                  artifacts=lmt.tokenizer_artifacts(student) if opts.tokenizer in lmt.BUILT else {},
                  teacher_tokenizer=teacher, teacher_pad_id=t_pad)
    return lm_dataset(dataset, lm_splits(columns, info), lm_warnings(dataset, notes))


# -- the sources ---------------------------------------------------------------------------------------------------
def read_parts(dataset: str, files: dict[str, Path | None], read: Callable[[str, Path], list[Item]], opts: Common,
               what: str, notes: dict[str, Any]) -> dict[str, list[Item]]:
    """Every split's items: read, missing splits carved, train limited (notes say where each came from)."""
    parts: dict[str, list[Item] | None] = {part: None if p is None else read(part, p) for part, p in files.items()}
    origin = carve(dataset, parts, opts.split_seed, what)
    notes.update(val=origin["val"], test=origin["test"])
    train = parts["train"] or []
    if opts.limit is not None and len(train) > opts.limit:
        parts["train"] = train[:opts.limit]
        notes["limit"] = f"the first {opts.limit:,} training {what}"
    return {part: items or [] for part, items in parts.items()}


@DATASETS.register("lm_text", "plain text for language modelling: .txt (a document per line) or .jsonl files "
                              "(options train, valid, test; tokenizer char/byte/bpe or pretrained); blocks of "
                              "max_length tokens, cached", paths=("train", "valid", "test"))
def lm_text(root: str | None = None, train: str | None = None, valid: str | None = None, test: str | None = None,
            text_field: str = "text", tokenizer: str = "bpe", vocab_size: int = 4000, max_length: int = 256,
            max_tokens: int | None = None, limit: int | None = None, empty: str = "skip", split_seed: int = 0,
            cache_dir: str | None = None, teacher_tokenizer: str | None = None) -> RawDataset:
    """Plain text cut into blocks of documents (module docstring)."""
    name = "lm_text"
    opts = common_options(name, tokenizer=tokenizer, vocab_size=vocab_size, max_length=max_length,
                          max_tokens=max_tokens, limit=limit, split_seed=split_seed, cache_dir=cache_dir,
                          teacher_tokenizer=teacher_tokenizer)
    text_field = _string(name, "text_field", text_field, "the JSON key of a record's text")  # type: ignore
    empty = _choice(name, "empty", empty, ("skip", "reject"))
    files = split_files(name, root, train, valid, test, "a .txt or .jsonl file of documents",
                        TEXT_SUFFIXES + JSONL_SUFFIXES)

    def build() -> Built:
        skipped: dict[str, int] = {}

        def read(part: str, path: Path) -> list[Item]:
            docs, skipped[part] = read_documents(name, path, text_field, empty)
            return docs

        notes: dict[str, Any] = {}
        parts = read_parts(name, files, read, opts, "documents", notes)
        notes["skipped_empty"] = skipped
        return encode_splits(name, "text", parts, opts, lambda items, sides: (
            encode_documents(name, items, sides, opts.max_length), [], 0), notes)

    key = source_key(name, files, opts, {"text_field": text_field, "empty": empty})
    return load_lm(name, "text", key, opts, build, files, max_new_tokens=opts.max_length)


@DATASETS.register("prompt_response", "prompts and responses (JSON Lines: prompt/response or chat messages) for "
                                      "causal LMs, the loss on the response; tokenizer char/byte/bpe or pretrained, "
                                      "cached", paths=("train", "valid", "test"))
def prompt_response(root: str | None = None, train: str | None = None, valid: str | None = None,
                    test: str | None = None, tokenizer: str = "bpe", vocab_size: int = 4000, max_length: int = 512,
                    too_long: str = "truncate", max_tokens: int | None = None, max_new_tokens: int | None = None,
                    limit: int | None = None, split_seed: int = 0, cache_dir: str | None = None,
                    teacher_tokenizer: str | None = None) -> RawDataset:
    """Prompt / response records (module docstring)."""
    name = "prompt_response"
    opts = common_options(name, tokenizer=tokenizer, vocab_size=vocab_size, max_length=max_length,
                          max_tokens=max_tokens, limit=limit, split_seed=split_seed, cache_dir=cache_dir,
                          teacher_tokenizer=teacher_tokenizer)
    too_long = _choice(name, "too_long", too_long, ("truncate", "reject"))
    max_new_tokens = _optional_int(name, "max_new_tokens", max_new_tokens, 1)
    files = split_files(name, root, train, valid, test, "a .jsonl file of prompt/response records", JSONL_SUFFIXES)

    def build() -> Built:
        notes: dict[str, Any] = {}
        parts = read_parts(name, files, lambda part, path: read_records(name, path), opts, "records", notes)
        return encode_splits(name, "prompt_response", parts, opts, lambda items, sides: encode_records(
            name, items, sides, opts.max_length, too_long), notes)

    key = source_key(name, files, opts, {"too_long": too_long})
    return load_lm(name, "prompt_response", key, opts, build, files, max_new_tokens=max_new_tokens)
