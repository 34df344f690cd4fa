"""Parallel text files as translation data: sources ``parallel_text`` (any corpus) and ``iwslt14`` (IWSLT14
German-English as fairseq prepares it).

A corpus is a folder of files ``{prefix}.{lang}``, one sentence per line, line ``k`` of the source file the
translation of line ``k`` of the target file: ``train``, ``valid`` and ``test`` prefixes, the language suffixes
given by ``src_lang`` / ``tgt_lang``. fairseq's ``examples/translation/prepare-iwslt14.sh`` writes IWSLT14
De-En this way (``train.de``, ``train.en``, ``valid.*``, ``test.*``): Moses-tokenised, lowercased, split into
joint BPE units (``@@`` markers); its ``tmp/`` folder holds the same files before BPE. The script holds out
every 23rd line of the training data as the valid split; without valid files this source does the same.

Reading, in order (each step per split, messages name the file and line):

1. the files are read as UTF-8 (a byte sequence that is not is a DataError naming file and line), a source
   and a target file with different line counts are a DataError saying which lines have no counterpart;
   every line is whitespace-normalised (runs of spaces collapsed, ends stripped) and lowercased with
   ``lowercase=True``;
2. no valid files (``valid=None``, or no ``valid.*`` files with the default prefix): every 23rd training
   line (lines 23, 46, ... of the files, as the preparation script does) becomes the valid split;
3. a pair with an empty side is dropped and counted (``empty_lines="skip"``, one warning for all splits: a run
   prints it on one line, not under ``--quiet``, and keeps it in its summary) or a DataError (``"reject"``);
4. ``limit``: the training split keeps its first ``limit`` pairs;
5. units: BPE learned on the training split (``bpe="learn"``, or ``"auto"`` when the files carry no ``@@``
   markers and ``bpe_size > 0``; joint over both languages, :mod:`teachkit.data.bpe`), the files' own BPE units
   (``"given"``, or ``"auto"`` when they carry markers), or whitespace tokens (``"none"``, or ``"auto"`` with
   ``bpe_size=0``); with ``vocab_file`` the merges of that run (its ``bpe.json``) instead of learning;
6. the vocabulary: the units of both languages of the training split seen at least ``min_freq`` times
   (never valid or test), or the ``vocab_file`` of an earlier run (how a student shares its teacher's ids);
7. ids with EOS appended; a sequence longer than ``max_length`` (with EOS) keeps its first ``max_length - 1``
   units and EOS, counted and warned once (``too_long="truncate"``), or is a DataError (``"reject"``).

The result (vocabulary, merges, id arrays, reference lines, notes) is cached under
``cache_root(cache_dir)/translation/<key>`` (see :mod:`teachkit.data.text`), keyed by the sha256 of the files
read and of every option that changes it: ``meta.json`` (the key, the vocabulary, merges, notes, and the
sha256 of the two other files), ``arrays.safetensors`` (int32 ids without padding, and each sequence's length)
and ``targets.txt`` (the reference lines). An entry is used only when its key and both digests match and its
ids are consistent (lengths, ids within the vocabulary, EOS last), else rebuilt; it is written to a temporary
folder and renamed into place. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.bpe import JointBPE, is_bpe_marked, learn_bpe
from teachkit.data.parallel import (
    EOS,
    PAD,
    TRANSLATION,
    UNK,
    DecodeOptions,
    ParallelText,
    TranslationInfo,
    Vocab,
    merge_units,
)
from teachkit.data.raw import DATASETS, RawDataset, int_option, new_temp_folder
from teachkit.data.text import cache_root, file_sha256
from teachkit.errors import ConfigError, DataError, WriteError

#: bump when reading, segmenting or encoding changes: older cache entries are then never used
READER_VERSION = 1
#: without valid files, every CARVE_EVERY-th training line is the valid split (prepare-iwslt14.sh)
CARVE_EVERY = 23
#: where the prepared IWSLT14 files come from (named by the missing-file error)
IWSLT14_HINT = "IWSLT14 De-En files are made by fairseq's examples/translation/prepare-iwslt14.sh"
BPE_MODES = ("auto", "learn", "none", "given")
SPLITS = ("train", "val", "test")


# -- options ----------------------------------------------------------------------------------------------------
def _choice(dataset: str, key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"dataset {dataset!r} option {key!r} is {value!r}; choose one of: {', '.join(allowed)}")
    return value


def _text(dataset: str, key: str, value: Any, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be {what}, got {value!r}")
    return value


def _number(dataset: str, key: str, value: Any, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            minimum is not None and value < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be a finite number{bound}, got {value!r}")
    return float(value)


def batching_options(dataset: str, max_tokens: Any, decode: Any, beam: Any, length_penalty: Any, max_len_a: Any,
                     max_len_b: Any) -> tuple[int | None, DecodeOptions]:
    """The checked batching and decoding options of a translation source (one-line ConfigErrors)."""
    if max_tokens is not None:
        max_tokens = int_option(dataset, "max_tokens", max_tokens, 8)
    options = DecodeOptions(strategy=_choice(dataset, "decode", decode, ("greedy", "beam")),  # type: ignore[arg-type]
                            beam=int_option(dataset, "beam", beam, 1),
                            length_penalty=_number(dataset, "length_penalty", length_penalty),
                            max_len_a=_number(dataset, "max_len_a", max_len_a, 0),
                            max_len_b=int_option(dataset, "max_len_b", max_len_b, 1))
    return max_tokens, options


# -- reading files ----------------------------------------------------------------------------------------------
def read_lines(path: Path, dataset: str) -> list[str]:
    """The lines of a UTF-8 text file (a leading BOM and ``\\r`` line ends removed; lines are split at ``\\n`` only,
    as ``wc -l`` counts them). A DataError naming the file and line when a byte sequence is not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"dataset {dataset!r}: {str(path)!r} line {line:,} is not UTF-8 text (byte "
                        f"0x{data[e.start]:02x} at byte {column:,} of the line)") from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _line_range(first: int, last: int) -> str:
    return f"line {first:,}" if first == last else f"lines {first:,}-{last:,}"


def check_counts(dataset: str, src_path: Path, src: Sequence[str], tgt_path: Path, tgt: Sequence[str]) -> None:
    """A DataError unless both files hold the same number of lines, saying which lines have no counterpart."""
    if len(src) == len(tgt):
        return
    (long_path, n), (short_path, m) = sorted(((src_path, len(src)), (tgt_path, len(tgt))), key=lambda t: -t[1])
    verb = "has" if n == m + 1 else "have"
    raise DataError(f"dataset {dataset!r}: {src_path.name} has {len(src):,} lines but {tgt_path.name} has "
                    f"{len(tgt):,} (in {str(src_path.parent)!r}): {_line_range(m + 1, n)} of {long_path.name} "
                    f"{verb} no counterpart in {short_path.name}")


@dataclass
class SplitLines:
    """The sentence pairs of one split: normalised source and target lines, each pair's line number in its
    files (1-based; for messages), and the files' names."""

    src: list[str]
    tgt: list[str]
    lines: list[int]
    src_file: str
    tgt_file: str

    def take(self, keep: Sequence[int]) -> SplitLines:
        return SplitLines([self.src[i] for i in keep], [self.tgt[i] for i in keep], [self.lines[i] for i in keep],
                          self.src_file, self.tgt_file)

    def __len__(self) -> int:
        return len(self.src)


def normalise(line: str, lowercase: bool) -> str:
    """Whitespace-normalised (and lowercased) text."""
    line = " ".join(line.split())
    return line.lower() if lowercase else line


# -- encoding -----------------------------------------------------------------------------------------------------
@dataclass
class Encoded:
    """A corpus as ids: per split ``src`` / ``tgt`` int32 (N, L) arrays and int64 ``row_ids`` into
    ``target_texts``; the vocabulary, the merges applied (None without learned BPE), whether units carry BPE
    markers, and the notes."""

    src: dict[str, np.ndarray]
    tgt: dict[str, np.ndarray]
    row_ids: dict[str, np.ndarray]
    target_texts: list[str]
    vocab: Vocab
    bpe: JointBPE | None
    marked: bool
    notes: dict[str, Any] = field(default_factory=dict)


def id_array(rows: Sequence[Sequence[str]], vocab: Vocab, max_length: int) -> tuple[np.ndarray, int]:
    """Ids of each row of units followed by EOS, right-padded with PAD to the longest row (int32); rows longer
    than ``max_length`` with EOS keep their first ``max_length - 1`` units. Returns the array and the number of
    rows cut."""
    lengths = np.array([min(len(r) + 1, max_length) for r in rows], dtype=np.int64)
    out = np.zeros((len(rows), int(lengths.max(initial=1))), dtype=np.int32)
    cut = 0
    for i, units in enumerate(rows):
        if len(units) >= max_length:
            cut += 1
            units = units[:max_length - 1]
        ids = vocab.encode(units)
        ids.append(EOS)
        out[i, :len(ids)] = ids
    # a unit spelled like a special token (a literal "</s>" in the text) is unknown, never PAD, BOS or EOS
    inside = np.arange(out.shape[1])[None, :] < (lengths[:, None] - 1)
    out[inside & (out <= EOS)] = UNK
    return out, cut


def encode_corpus(dataset: str, splits: dict[str, SplitLines], *, units: str, bpe: JointBPE | None = None,
                  bpe_size: int = 0, vocab: Vocab | None = None, min_freq: int = 1, max_length: int = 1024,
                  too_long: str = "truncate", sources: dict[str, str] | None = None) -> Encoded:
    """Ids of the ``train`` / ``val`` / ``test`` pairs of ``splits``. ``units``: ``learn`` (apply ``bpe``, or
    learn ``bpe_size`` merges on the training pairs when None), ``given`` (the lines' own BPE units) or ``none``
    (whitespace tokens). ``vocab``: a shared vocabulary, else built from the training units. ``sources``: notes
    on where the vocabulary / merges came from."""
    sources = dict(sources or {})
    notes: dict[str, Any] = {}
    train = splits["train"]
    if units == "learn":
        if bpe is None:
            bpe = learn_bpe([*train.src, *train.tgt], bpe_size)
            notes["bpe"] = f"learned on the training split: {len(bpe):,} merges (asked {bpe_size:,})"
        else:
            notes["bpe"] = f"{len(bpe):,} merges from {sources.get('bpe', 'the caller')}"
        notes["bpe_merges"] = len(bpe)
        segment: Callable[[str], list[str]] = bpe.apply
    else:
        bpe = None
        segment = str.split
        notes["bpe"] = "given in the files (@@ markers)" if units == "given" else "none (word units)"
    split_units = {name: ([segment(s) for s in part.src], [segment(t) for t in part.tgt])
                   for name, part in splits.items()}
    if vocab is None:
        counts: Counter[str] = Counter()
        for side in split_units["train"]:
            for row in side:
                counts.update(row)
        vocab = Vocab.build(counts, min_freq=min_freq)
        notes["vocab"] = (f"built from the training split: {len(vocab):,} tokens (both languages, units seen >= "
                          f"{min_freq} times)")
    else:
        notes["vocab"] = f"{len(vocab):,} tokens from {sources.get('vocab', 'the caller')}"
    notes["vocab_size"] = len(vocab)
    src: dict[str, np.ndarray] = {}
    tgt: dict[str, np.ndarray] = {}
    row_ids: dict[str, np.ndarray] = {}
    texts: list[str] = []
    truncated: dict[str, int] = {}
    for name in SPLITS:
        part = splits[name]
        s_units, t_units = split_units[name]
        if too_long == "reject":
            for rows, file in ((s_units, part.src_file), (t_units, part.tgt_file)):
                for i, row in enumerate(rows):
                    if len(row) + 1 > max_length:
                        after = " after BPE" if units == "learn" else ""
                        raise DataError(f"dataset {dataset!r}: {file} line {part.lines[i]:,} is {len(row) + 1:,} "
                                        f"tokens long with EOS{after}, more than max_length={max_length} (option "
                                        f"too_long='reject'; 'truncate' keeps the first {max_length - 1} tokens "
                                        "and EOS)")
        src[name], cut_s = id_array(s_units, vocab, max_length)
        tgt[name], cut_t = id_array(t_units, vocab, max_length)
        truncated[name] = cut_s + cut_t
        row_ids[name] = np.arange(len(texts), len(texts) + len(part), dtype=np.int64)
        texts.extend([merge_units(t.split()) for t in part.tgt] if units == "given" else part.tgt)
    notes["pairs"] = {name: len(splits[name]) for name in SPLITS}
    notes["max_length"] = max_length
    notes["truncated"] = truncated
    return Encoded(src, tgt, row_ids, texts, vocab, bpe, units != "none", notes)


def make_dataset(dataset: str, enc: Encoded, src_lang: str, tgt_lang: str, decode: DecodeOptions,
                 max_tokens: int | None) -> RawDataset:
    """The RawDataset of an encoded corpus: every split a :class:`ParallelText` sharing one TranslationInfo."""
    artifacts = {"vocab.json": enc.vocab.to_json()}
    if enc.bpe is not None:
        artifacts["bpe.json"] = enc.bpe.to_json()
    info = TranslationInfo(vocab=enc.vocab, target_texts=tuple(enc.target_texts), src_lang=src_lang,
                           tgt_lang=tgt_lang, bpe=enc.marked, decode=decode, max_tokens=max_tokens,
                           notes=dict(enc.notes), artifacts=artifacts)
    parts = {}
    for name in SPLITS:
        tgt = torch.from_numpy(np.ascontiguousarray(enc.tgt[name]))
        x = ParallelText(torch.from_numpy(np.ascontiguousarray(enc.src[name])), tgt,
                         torch.from_numpy(np.ascontiguousarray(enc.row_ids[name])), info)
        parts[name] = (x, tgt)
    return RawDataset(parts["train"][0], parts["train"][1], parts["test"][0], parts["test"][1],
                      num_classes=len(enc.vocab), default_augment="none", task=TRANSLATION, name=dataset,
                      val_x=parts["val"][0], val_y=parts["val"][1])


def note_warnings(dataset: str, notes: dict[str, Any]) -> list[str]:
    """One warning each for the pairs skipped and the sequences truncated, with their counts per split: the
    dataset's :attr:`~teachkit.data.raw.RawDataset.warnings` (a run prints each on one line, not under
    ``--quiet``, and keeps it in its summary's ``warnings`` and ``data_notes``)."""
    out = []
    for key, what in (("skipped_empty", "pairs with an empty side skipped (option empty_lines='skip')"),
                      ("truncated", f"sequences longer than max_length={notes.get('max_length')} tokens truncated "
                                    "(option too_long='truncate')")):
        counts = notes.get(key) or {}
        total = sum(counts.values())
        if total:
            per = ", ".join(f"{k} {v:,}" for k, v in counts.items())
            out.append(f"dataset {dataset!r}: {total:,} {what}: {per}")
    return out


# -- the cache ----------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Padded ids (N, L) as (the non-PAD ids row after row, each row's length): how the cache stores them."""
    return ids[ids != PAD].astype(np.int32), (ids != PAD).sum(axis=1).astype(np.int32)


def unpack(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The padded (N, longest) int32 array of :func:`pack`'s output."""
    width = int(lengths.max()) if lengths.size else 1
    out = np.zeros((lengths.shape[0], width), dtype=np.int32)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat
    return out


def _read_cache(folder: Path, key: str) -> Encoded | None:
    """The entry in ``folder`` when it is complete, recorded under ``key`` and consistent; None otherwise."""
    from safetensors.numpy import load_file

    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("key") != key or meta.get("reader") != READER_VERSION:
            return None
        if _sha256(folder / "arrays.safetensors") != meta["arrays_sha256"] or \
                _sha256(folder / "targets.txt") != meta["targets_sha256"]:
            return None
        arrays = load_file(str(folder / "arrays.safetensors"))
        texts = (folder / "targets.txt").read_text(encoding="utf-8").split("\n")
        if texts == [""]:
            texts = []
        vocab = Vocab(tuple(meta["vocab"]))
        bpe = None if meta["bpe"] is None else JointBPE.from_json(meta["bpe"])
        src, tgt, rows = {}, {}, {}
        for name in SPLITS:
            rows[name] = arrays[f"{name}.row_ids"]
            n = rows[name].shape[0]
            if rows[name].dtype != np.int64 or rows[name].ndim != 1 or \
                    (n and (int(rows[name].min()) < 0 or int(rows[name].max()) >= len(texts))):
                return None
            for side, out in (("src", src), ("tgt", tgt)):
                flat, lengths = arrays[f"{name}.{side}.ids"], arrays[f"{name}.{side}.lengths"]
                if flat.dtype != np.int32 or lengths.dtype != np.int32 or flat.ndim != 1 or lengths.shape != (n,) \
                        or (n and int(lengths.min()) < 1) or int(lengths.sum(dtype=np.int64)) != flat.shape[0]:
                    return None
                if flat.size and (int(flat.min()) <= PAD or int(flat.max()) >= len(vocab) or
                                  not (flat[np.cumsum(lengths, dtype=np.int64) - 1] == EOS).all()):
                    return None
                out[name] = unpack(flat, lengths)
        return Encoded(src, tgt, rows, texts, vocab, bpe, bool(meta["marked"]), dict(meta["notes"]))
    except Exception:  # noqa: BLE001 - an entry that cannot be read in full is rebuilt
        return None


def _write_cache(root: Path, folder: Path, key: str, enc: Encoded) -> None:
    """Write ``enc`` to ``folder`` atomically (a temporary folder renamed into place)."""
    from safetensors.numpy import save_file

    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = new_temp_folder(root, f".{key[:12]}-")
        try:
            arrays = {f"{name}.row_ids": np.ascontiguousarray(enc.row_ids[name], dtype=np.int64) for name in SPLITS}
            for name in SPLITS:
                for side, ids in (("src", enc.src[name]), ("tgt", enc.tgt[name])):
                    arrays[f"{name}.{side}.ids"], arrays[f"{name}.{side}.lengths"] = pack(ids)
            save_file(arrays, str(tmp / "arrays.safetensors"))
            (tmp / "targets.txt").write_text("\n".join(enc.target_texts), encoding="utf-8")
            meta = {"key": key, "reader": READER_VERSION, "vocab": list(enc.vocab.tokens),
                    "bpe": None if enc.bpe is None else enc.bpe.to_json(), "marked": enc.marked, "notes": enc.notes,
                    "arrays_sha256": _sha256(tmp / "arrays.safetensors"),
                    "targets_sha256": _sha256(tmp / "targets.txt")}
            (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            try:
                os.replace(tmp, folder)
            except OSError:  # another process wrote it first
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise WriteError(f"cannot write the translation cache in {str(root)!r}: {e.strerror or e}; set "
                         "data.options.cache_dir or TEACHKIT_CACHE to a writable folder") from None


def cached_corpus(key: str, cache_dir: str | None, build: Callable[[], Encoded]) -> Encoded:
    """The corpus stored under ``key`` in the translation cache, or ``build()`` written there."""
    root = cache_root(cache_dir) / "translation"
    folder = root / key
    if folder.is_dir():
        enc = _read_cache(folder, key)
        if enc is not None:
            return enc
    enc = build()
    _write_cache(root, folder, key, enc)
    return enc


# -- the sources ----------------------------------------------------------------------------------------------------
def shared_vocabulary(dataset: str, value: str) -> tuple[Vocab, JointBPE | None, str]:
    """The vocabulary of an earlier run (``vocab.json`` or its folder) and its merges (``bpe.json`` beside it)."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        path = path / "vocab.json"
    if not path.is_file():
        raise DataError(f"dataset {dataset!r} option 'vocab_file': {str(path)!r} not found; give the vocab.json an "
                        "earlier run wrote (or that run's folder) to share its vocabulary")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"dataset {dataset!r} option 'vocab_file': cannot read {str(path)!r} ({e})") from None
    vocab = Vocab.from_json(text, where=f"dataset {dataset!r} vocab_file {str(path)!r}")
    bpe_path = path.with_name("bpe.json")
    bpe = None
    if bpe_path.is_file():
        bpe = JointBPE.from_json(bpe_path.read_text(encoding="utf-8"),
                                 where=f"dataset {dataset!r} BPE file {str(bpe_path)!r}")
    return vocab, bpe, str(path)


def _resolve_units(dataset: str, mode: str, marked: bool, bpe_size: int, shared: bool,
                   shared_bpe: JointBPE | None) -> str:
    """``learn``, ``given`` or ``none``: how the lines become units (module docstring, step 5)."""
    if mode == "auto":
        if marked:
            mode = "given"
        elif shared:
            mode = "learn" if shared_bpe is not None else "none"
        else:
            mode = "learn" if bpe_size > 0 else "none"
    elif mode == "learn":
        if marked:
            raise DataError(f"dataset {dataset!r}: the training files already carry BPE markers ('@@ '), so BPE "
                            "cannot be learned on them; set option bpe to 'given' (or 'auto')")
        if shared and shared_bpe is None:
            raise ConfigError(f"dataset {dataset!r} option bpe='learn' with vocab_file: that run learned no BPE (no "
                              "bpe.json beside its vocab.json); use bpe='auto'")
    if shared and shared_bpe is not None and mode != "learn":
        raise ConfigError(f"dataset {dataset!r}: the vocab_file's run learned BPE (bpe.json beside it) but option "
                          f"bpe={mode!r} would not apply it; use bpe='auto' or 'learn'")
    return mode


@dataclass(frozen=True)
class _ParallelOptions:
    """The checked options of :func:`load_parallel` (``valid`` None: carve the validation split from train)."""

    src_lang: str
    tgt_lang: str
    train: str
    valid: str | None
    test: str
    bpe_size: int
    mode: str
    vocab_file: str | None
    min_freq: int
    lowercase: bool
    max_length: int
    too_long: str
    empty_lines: str
    max_tokens: int | None
    decode_options: DecodeOptions
    limit: int | None
    cache_dir: str | None


def _check_languages(dataset: str, src_lang: Any, tgt_lang: Any) -> None:
    """Both language suffixes given, file-name safe and different."""
    lang = "a language suffix of the files (a non-empty string without spaces or '/', e.g. 'de')"
    for key, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if value is None:
            raise ConfigError(f"dataset {dataset!r} option {key!r} is required: {lang}")
        if not isinstance(value, str) or not value or any(c.isspace() or c in "/\\" for c in value):
            raise ConfigError(f"dataset {dataset!r} option {key!r} must be {lang}, got {value!r}")
    if src_lang == tgt_lang:
        raise ConfigError(f"dataset {dataset!r} options 'src_lang' and 'tgt_lang' are both {src_lang!r}; they must "
                          "differ")


def _parallel_options(dataset: str, *, src_lang: Any, tgt_lang: Any, train: Any, valid: Any, test: Any,
                      bpe_size: Any, bpe: Any, vocab_file: Any, min_freq: Any, lowercase: Any, max_length: Any,
                      too_long: Any, empty_lines: Any, max_tokens: Any, decode: Any, beam: Any, length_penalty: Any,
                      max_len_a: Any, max_len_b: Any, limit: Any, cache_dir: Any) -> _ParallelOptions:
    """Every option checked, in the order a user reads them; the first bad one is a one-line error."""
    _check_languages(dataset, src_lang, tgt_lang)
    prefix = "a file name prefix (a non-empty string, e.g. 'train')"
    train = _text(dataset, "train", train, prefix)
    valid = _text(dataset, "valid", valid, f"{prefix[:-1]}, or null to carve it from train)", optional=True)
    test = _text(dataset, "test", test, prefix)
    bpe_size = int_option(dataset, "bpe_size", bpe_size, 0)
    mode = _choice(dataset, "bpe", bpe, BPE_MODES)
    vocab_file = _text(dataset, "vocab_file", vocab_file, "a path to a vocab.json or the folder of the run that "
                       "wrote it", optional=True)
    min_freq = int_option(dataset, "min_freq", min_freq, 1)
    if not isinstance(lowercase, bool):
        raise ConfigError(f"dataset {dataset!r} option 'lowercase' must be true or false, got {lowercase!r}")
    max_length = int_option(dataset, "max_length", max_length, 2)
    too_long = _choice(dataset, "too_long", too_long, ("truncate", "reject"))
    empty_lines = _choice(dataset, "empty_lines", empty_lines, ("skip", "reject"))
    max_tokens, decode_options = batching_options(dataset, max_tokens, decode, beam, length_penalty, max_len_a,
                                                  max_len_b)
    if limit is not None:
        limit = int_option(dataset, "limit", limit, 1)
    if mode == "learn" and bpe_size == 0 and vocab_file is None:
        raise ConfigError(f"dataset {dataset!r} option bpe='learn' needs bpe_size >= 1, got 0")
    cache_dir = _text(dataset, "cache_dir", cache_dir, "a folder path", optional=True)
    return _ParallelOptions(src_lang, tgt_lang, train, valid, test, bpe_size, mode, vocab_file, min_freq, lowercase,
                            max_length, too_long, empty_lines, max_tokens, decode_options, limit, cache_dir)


def _corpus_files(dataset: str, root: str | None, opts: _ParallelOptions) -> tuple[dict[str, list[Path]], str | None]:
    """The (source, target) files of each split under ``root``, and the validation prefix: None when the default
    ``valid`` has no files (the split is then carved from train)."""
    src_lang, tgt_lang, train, valid, test = opts.src_lang, opts.tgt_lang, opts.train, opts.valid, opts.test
    if root is None:
        raise ConfigError(f"dataset {dataset!r} needs its files: set data.root to the folder holding "
                          f"{train}.{src_lang}, {train}.{tgt_lang}, {test}.{src_lang}, ... ({IWSLT14_HINT})")
    folder = Path(root)
    if not folder.is_dir():
        raise DataError(f"dataset {dataset!r}: data.root {str(folder)!r} is not a folder ({IWSLT14_HINT})")

    def paths(stem: str) -> tuple[Path, Path]:
        return folder / f"{stem}.{src_lang}", folder / f"{stem}.{tgt_lang}"

    def require_file(path: Path) -> Path:
        if not path.is_file():
            stems = ", ".join(f"{stem}.{src_lang}/.{tgt_lang}" for stem in (train, valid, test) if stem)
            raise DataError(f"dataset {dataset!r}: file {str(path)!r} not found; expected {stems} in "
                            f"{str(folder)!r} ({IWSLT14_HINT})")
        return path

    files = {"train": [require_file(p) for p in paths(train)]}
    if valid is not None:
        vpaths = paths(valid)
        if valid == "valid" and not any(p.exists() for p in vpaths):
            valid = None  # the default prefix without files: carve
        else:
            files["val"] = [require_file(p) for p in vpaths]
    files["test"] = [require_file(p) for p in paths(test)]
    return files, valid


def _cache_key(dataset: str, opts: _ParallelOptions, valid: str | None, files: dict[str, list[Path]],
               shared: tuple[Vocab, JointBPE | None, str] | None) -> str:
    """The translation cache key: reader version, options, the files' contents and the shared vocabulary."""
    options = {"src_lang": opts.src_lang, "tgt_lang": opts.tgt_lang, "bpe_size": opts.bpe_size, "bpe": opts.mode,
               "min_freq": opts.min_freq, "lowercase": opts.lowercase, "max_length": opts.max_length,
               "too_long": opts.too_long, "empty_lines": opts.empty_lines, "limit": opts.limit,
               "carve": CARVE_EVERY if valid is None else None}
    key_parts = {"reader": READER_VERSION, "dataset": dataset, "options": options,
                 "files": {part: [[p.name, file_sha256(p)] for p in ps] for part, ps in files.items()},
                 "vocab": None if shared is None else shared[0].digest,
                 "shared_bpe": None if shared is None or shared[1] is None else shared[1].digest}
    return hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()


def _read_splits(dataset: str, files: dict[str, list[Path]], lowercase: bool) -> dict[str, SplitLines]:
    """Each split's normalised lines, the two sides checked to have as many lines."""
    read: dict[str, SplitLines] = {}
    for part, (sp, tp) in files.items():
        s_lines, t_lines = read_lines(sp, dataset), read_lines(tp, dataset)
        check_counts(dataset, sp, s_lines, tp, t_lines)
        read[part] = SplitLines([normalise(s, lowercase) for s in s_lines],
                                [normalise(t, lowercase) for t in t_lines],
                                list(range(1, len(s_lines) + 1)), sp.name, tp.name)
    return read


def _carve_validation(read: dict[str, SplitLines]) -> str:
    """Without validation files, every :data:`CARVE_EVERY`-th training line held out as ``val``; the note saying
    where the validation split comes from."""
    if "val" in read:
        return f"{read['val'].src_file}/{read['val'].tgt_file}"
    whole = read["train"]
    held = [i for i, n in enumerate(whole.lines) if n % CARVE_EVERY == 0]
    held_set = set(held)
    read["val"] = whole.take(held)
    read["train"] = whole.take([i for i in range(len(whole)) if i not in held_set])
    return f"carved from {whole.src_file}/{whole.tgt_file}: every {CARVE_EVERY}rd line (prepare-iwslt14.sh)"


def _drop_empty_pairs(dataset: str, read: dict[str, SplitLines], empty_lines: str) -> dict[str, int]:
    """Pairs with an empty side dropped (``skip``) or refused (``reject``); the number dropped per split."""
    skipped: dict[str, int] = {}
    for part in SPLITS:
        lines = read[part]
        keep = []
        for i, (s, t) in enumerate(zip(lines.src, lines.tgt, strict=True)):
            if s and t:
                keep.append(i)
            elif empty_lines == "reject":
                file = lines.src_file if not s else lines.tgt_file
                raise DataError(f"dataset {dataset!r}: {file} line {lines.lines[i]:,} is empty (option "
                                "empty_lines='reject'; 'skip' drops such pairs)")
        skipped[part] = len(lines) - len(keep)
        read[part] = lines.take(keep) if skipped[part] else lines
    return skipped


def _build_corpus(dataset: str, opts: _ParallelOptions, files: dict[str, list[Path]],
                  shared: tuple[Vocab, JointBPE | None, str] | None) -> Encoded:
    """Read, carve, clean and limit the splits, then encode them (module docstring, steps 1-6)."""
    read = _read_splits(dataset, files, opts.lowercase)
    notes: dict[str, Any] = {"files": {part: [str(p) for p in ps] for part, ps in files.items()}}
    notes["val"] = _carve_validation(read)
    notes["skipped_empty"] = _drop_empty_pairs(dataset, read, opts.empty_lines)
    if opts.limit is not None and len(read["train"]) > opts.limit:
        read["train"] = read["train"].take(range(opts.limit))
        notes["limit"] = f"the first {opts.limit:,} training pairs"
    for part in SPLITS:
        if not len(read[part]):
            raise DataError(f"dataset {dataset!r}: the {part} split holds no sentence pairs "
                            f"({read[part].src_file}, {read[part].tgt_file})")
    marked = is_bpe_marked(read["train"].src) or is_bpe_marked(read["train"].tgt)
    units = _resolve_units(dataset, opts.mode, marked, opts.bpe_size, shared is not None,
                           None if shared is None else shared[1])
    sources = {} if shared is None else {"vocab": shared[2], "bpe": str(Path(shared[2]).with_name("bpe.json"))}
    enc = encode_corpus(dataset, read, units=units, bpe=None if shared is None else shared[1],
                        bpe_size=opts.bpe_size, vocab=None if shared is None else shared[0], min_freq=opts.min_freq,
                        max_length=opts.max_length, too_long=opts.too_long, sources=sources)
    enc.notes.update(notes)
    return enc


def load_parallel(dataset: str, root: str | None, *, src_lang: Any, tgt_lang: Any, train: Any, valid: Any, test: Any,
                  bpe_size: Any, bpe: Any, vocab_file: Any, min_freq: Any, lowercase: Any, max_length: Any,
                  too_long: Any, empty_lines: Any, max_tokens: Any, decode: Any, beam: Any, length_penalty: Any,
                  max_len_a: Any, max_len_b: Any, limit: Any, cache_dir: Any) -> RawDataset:
    """The translation corpus of the files under ``root`` (module docstring)."""
    opts = _parallel_options(dataset, src_lang=src_lang, tgt_lang=tgt_lang, train=train, valid=valid, test=test,
                             bpe_size=bpe_size, bpe=bpe, vocab_file=vocab_file, min_freq=min_freq,
                             lowercase=lowercase, max_length=max_length, too_long=too_long, empty_lines=empty_lines,
                             max_tokens=max_tokens, decode=decode, beam=beam, length_penalty=length_penalty,
                             max_len_a=max_len_a, max_len_b=max_len_b, limit=limit, cache_dir=cache_dir)
    files, valid = _corpus_files(dataset, root, opts)
    shared = shared_vocabulary(dataset, opts.vocab_file) if opts.vocab_file is not None else None
    key = _cache_key(dataset, opts, valid, files, shared)
    enc = cached_corpus(key, opts.cache_dir, lambda: _build_corpus(dataset, opts, files, shared))
    raw = make_dataset(dataset, enc, opts.src_lang, opts.tgt_lang, opts.decode_options, opts.max_tokens)
    raw.warnings.extend(note_warnings(dataset, enc.notes))
    return raw


@DATASETS.register("parallel_text", "a parallel corpus from {prefix}.{lang} files under data.root (options src_lang, "
                                    "tgt_lang required); joint BPE learned on train, cached")
def parallel_text(root: str | None = None, src_lang: str | None = None, tgt_lang: str | None = None,
                  train: str = "train", valid: str | None = "valid", test: str = "test", bpe_size: int = 10000,
                  bpe: str = "auto", vocab_file: str | None = None, min_freq: int = 1, lowercase: bool = False,
                  max_length: int = 175, too_long: str = "truncate", empty_lines: str = "skip",
                  max_tokens: int | None = None, decode: str = "greedy", beam: int = 5, length_penalty: float = 1.0,
                  max_len_a: float = 1.2, max_len_b: int = 10, limit: int | None = None,
                  cache_dir: str | None = None) -> RawDataset:
    """Any parallel corpus of ``{train,valid,test}.{src_lang,tgt_lang}`` files (module docstring)."""
    return load_parallel("parallel_text", root, src_lang=src_lang, tgt_lang=tgt_lang, train=train, valid=valid,
                         test=test, bpe_size=bpe_size, bpe=bpe, vocab_file=vocab_file, min_freq=min_freq,
                         lowercase=lowercase, max_length=max_length, too_long=too_long, empty_lines=empty_lines,
                         max_tokens=max_tokens, decode=decode, beam=beam, length_penalty=length_penalty,
                         max_len_a=max_len_a, max_len_b=max_len_b, limit=limit, cache_dir=cache_dir)


@DATASETS.register("iwslt14", "IWSLT14 German-English (160k pairs) as fairseq's prepare-iwslt14.sh writes it under "
                              "data.root; BPE given or learned (bpe_size 10000)")
def iwslt14(root: str | None = None, src_lang: str = "de", tgt_lang: str = "en", train: str = "train",
            valid: str | None = "valid", test: str = "test", bpe_size: int = 10000, bpe: str = "auto",
            vocab_file: str | None = None, min_freq: int = 1, lowercase: bool = False, max_length: int = 175,
            too_long: str = "truncate", empty_lines: str = "skip", max_tokens: int | None = None,
            decode: str = "greedy", beam: int = 5, length_penalty: float = 1.0, max_len_a: float = 1.2,
            max_len_b: int = 10, limit: int | None = None, cache_dir: str | None = None) -> RawDataset:
    """IWSLT14 De-En (TED talks; Cettolo et al. 2014) in the layout of fairseq's
    ``examples/translation/prepare-iwslt14.sh``: ``train``, ``valid``, ``test`` ``.de`` / ``.en``, Moses-tokenised
    and lowercased by the script. Its BPE'd files are used as they are (``@@`` markers detected); on the files
    before BPE (the script's ``tmp/`` folder) a joint BPE of ``bpe_size`` merges is learned (10,000 as in the
    script; the L2T-DLF setting is 25,000). Swap ``src_lang`` / ``tgt_lang`` for En-De."""
    return load_parallel("iwslt14", root, src_lang=src_lang, tgt_lang=tgt_lang, train=train, valid=valid,
                         test=test, bpe_size=bpe_size, bpe=bpe, vocab_file=vocab_file, min_freq=min_freq,
                         lowercase=lowercase, max_length=max_length, too_long=too_long, empty_lines=empty_lines,
                         max_tokens=max_tokens, decode=decode, beam=beam, length_penalty=length_penalty,
                         max_len_a=max_len_a, max_len_b=max_len_b, limit=limit, cache_dir=cache_dir)
