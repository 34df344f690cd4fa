"""``addition``: multi-digit addition as prompt / response rows for causal LMs, generated offline.

A row is ``BOS a+b=`` (the prompt) followed by the answer ``c`` and EOS (the targets), with ``a`` and ``b``
drawn uniformly from ``[0, 10^digits)``, written without leading zeros. With ``reverse=True`` the answer is
written least-significant digit first (``123+459=`` -> ``285``), the order in which the carries are computed,
which small transformers learn much faster (Lee et al. 2024, "Teaching arithmetic to small transformers"); with
``pad=True`` the operands are zero-padded to ``digits`` digits and the answer to ``digits + 1`` (``012+459=`` ->
``0471``), so every digit sits at a fixed position (a fixed format, also from Lee et al.). ``noise``: the share
of *training* answers in which one digit is replaced by a wrong one (seeded; validation and test stay clean), so
the references are an imperfect sample of the true answer: the regime in which a teacher's estimate of the answer
distribution is worth more to a student than the references themselves.

The splits are drawn with a local ``random.Random(seed)`` (global RNGs untouched), test first, then valid, then
train, none repeating a pair (so no prompt is shared across or within splits) and the test split independent of
the train size. The tokenizer (``tokenizer``) is by default ``char`` over the fixed alphabet ``0123456789+=`` (ids 4-15
after the specials ``<pad> <s> </s> <unk>``), so it never depends on the data; ``byte``, ``bpe`` (learned on the
training rows) or a pretrained tokenizer may replace it, and a teacher's own tokenisation (``teacher_tokenizer``,
the same choices) is optional. ``references`` are the answer strings as a
model should write them (reversed with ``reverse``); a model generates at most ``digits + 2`` tokens.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from teachkit.data import lm_tokenizers as lmt
from teachkit.data.lm import LMInfo, lm_dataset, lm_splits, ragged
from teachkit.data.lm_sources import Item, Side, encode_records
from teachkit.data.raw import DATASETS, RawDataset, int_option
from teachkit.data.text import TEACHER_PREFIX
from teachkit.errors import ConfigError

NAME = "addition"
#: every character a row can hold
ALPHABET = "0123456789+="
#: the order the splits are drawn in (so the test split never depends on the train size)
DRAW_ORDER = ("test", "val", "train")
#: BPE size of a teacher tokenizer learned on the rows (``teacher_tokenizer='bpe'``)
TEACHER_BPE_SIZE = lmt.MIN_BPE_VOCAB + 64


def draw_pairs(counts: dict[str, int], digits: int, seed: int) -> dict[str, list[tuple[int, int]]]:
    """Operand pairs per split, drawn in the order of ``counts`` with ``random.Random(seed)``, none repeated."""
    top = 10 ** digits
    total = sum(counts.values())
    if total > top * top:
        raise ConfigError(f"dataset {NAME!r} asks for {total:,} distinct problems but {digits}-digit operands give "
                          f"only {top * top:,}; raise digits or lower train/valid/test")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out: dict[str, list[tuple[int, int]]] = {}
    for part, n in counts.items():
        pairs: list[tuple[int, int]] = []
        while len(pairs) < n:
            pair = (rng.randrange(top), rng.randrange(top))
            if pair not in seen:
                seen.add(pair)
                pairs.append(pair)
        out[part] = pairs
    return out


def answer(a: int, b: int, reverse: bool = False, width: int = 0) -> str:
    """The answer to ``a+b=`` as written in the rows: at least ``width`` digits (leading zeros), least-significant
    digit first with ``reverse``."""
    c = str(a + b).zfill(width)
    return c[::-1] if reverse else c


def prompt(a: int, b: int, width: int = 0) -> str:
    """The prompt ``a+b=``, each operand written with at least ``width`` digits (leading zeros)."""
    return f"{str(a).zfill(width)}+{str(b).zfill(width)}="


def corrupt(items: list[Item], fraction: float, seed: int) -> int:
    """Label noise: in a seeded ``fraction`` of ``items`` one digit of the answer, chosen at random, is replaced by
    another digit drawn at random (the prompt is unchanged); returns how many answers were changed."""
    if fraction <= 0:
        return 0
    rng = random.Random(f"{NAME}-noise-{seed}")
    chosen = rng.sample(range(len(items)), round(fraction * len(items)))
    for i in chosen:
        text = items[i].text
        k = rng.randrange(len(text))
        digit = rng.choice([d for d in "0123456789" if d != text[k]])
        items[i].text = text[:k] + digit + text[k + 1:]
    return len(chosen)


def _items(pairs: dict[str, list[tuple[int, int]]], reverse: bool, digits: int, pad: bool) -> dict[str, list[Item]]:
    width = digits if pad else 0
    return {part: [Item(answer(a, b, reverse, width + 1 if pad else 0), f"{NAME} {part}", i + 1,
                        prompt=prompt(a, b, width))
                   for i, (a, b) in enumerate(pairs[part])] for part in ("train", "val", "test")}


def _side(key: str, value: Any, texts: list[str]) -> Side | None:
    """The tokenisation option ``key`` (``tokenizer`` or ``teacher_tokenizer``), checked and built (None without
    one): ``char`` over :data:`ALPHABET`, ``byte``, ``bpe`` learned on the rows, or a pretrained tokenizer."""
    name = lmt.check_name(NAME, key, value, optional=key == "teacher_tokenizer")
    if name is None:
        return None
    tok = lmt.char_tokenizer([ALPHABET]) if name == "char" else \
        lmt.build_tokenizer(NAME, key, name, texts, TEACHER_BPE_SIZE)
    return Side.of(key, name, tok)


@DATASETS.register(NAME, "multi-digit addition a+b= -> c as prompt/response rows for causal LMs (options digits, "
                         "reverse, pad, noise, train, valid, test, seed); generated offline, char tokenizer by default")
def addition(root: str | None = None, digits: int = 3, train: int = 20000, valid: int = 500, test: int = 1000,
             seed: int = 0, reverse: bool = False, pad: bool = False, noise: float = 0.0,
             max_tokens: int | None = None, tokenizer: str = "char",
             teacher_tokenizer: str | None = None) -> RawDataset:
    """The addition task of the module docstring."""
    digits = int_option(NAME, "digits", digits, 1)
    counts = {"test": int_option(NAME, "test", test, 1), "val": int_option(NAME, "valid", valid, 1),
              "train": int_option(NAME, "train", train, 1)}
    seed = int_option(NAME, "seed", seed, 0)
    for key, value in (("reverse", reverse), ("pad", pad)):
        if not isinstance(value, bool):
            raise ConfigError(f"dataset {NAME!r} option {key!r} must be true or false, got {value!r}")
    if max_tokens is not None:
        max_tokens = int_option(NAME, "max_tokens", max_tokens, 3 * digits + 5)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise ConfigError(f"dataset {NAME!r} option 'noise' must be a fraction in [0, 1) (the share of training "
                          f"answers with a wrong digit), got {noise!r}")
    parts = _items(draw_pairs(counts, digits, seed), reverse, digits, pad)
    noisy = corrupt(parts["train"], float(noise), seed)
    texts = [text for d in parts["train"] for text in (d.prompt or "", d.text)]
    student = _side("tokenizer", tokenizer, texts)
    assert student is not None
    teacher = _side("teacher_tokenizer", teacher_tokenizer, texts)
    sides = [student] if teacher is None else [student, teacher]
    items = [item for part in ("train", "val", "test") for item in parts[part]]
    rows, _, _ = encode_records(NAME, items, sides, 10 ** 6, "reject")
    sizes = [len(parts[part]) for part in ("train", "val", "test")]
    columns: dict[str, Any] = {"split": np.repeat(np.arange(3, dtype=np.int8), sizes), "ids": ragged(rows["ids"]),
                               "starts": rows["starts"], "row_id": rows["row_id"]}
    tokenizers = {"": lmt.tokenizer_entry(student.name, student.tok)}
    if teacher is not None:
        columns.update(t_ids=ragged(rows["t_ids"]), t_starts=rows["t_starts"])
        tokenizers[TEACHER_PREFIX] = lmt.tokenizer_entry(teacher.name, teacher.tok)
    notes = {"generator": f"a+b= with {digits}-digit operands, seed {seed}" + (", answers reversed" if reverse else "")
             + (", zero-padded" if pad else ""), **({"noise": f"{noisy:,} training answers with one wrong digit "
                                                                  f"({noise:.0%}); val and test clean"}
                                                        if noisy else {}),
             "records": {part: len(parts[part]) for part in ("train", "val", "test")}, "tokenizer": student.name,
             "vocab_size": len(student.tok), "val": "generated (test drawn first, then valid, then train; no "
             "problem shared)", **({"teacher_tokenizer": teacher.name} if teacher is not None else {})}
    info = LMInfo(student.tok, tokenizers, student.pad, student.eos, student.bos, "prompt_response",
                  max_length=3 * digits + 5, max_tokens=max_tokens, max_new_tokens=digits + 2,
                  references=tuple(item.text for item in items), notes=notes,
                  artifacts=lmt.tokenizer_artifacts(student.tok),
                  teacher_tokenizer=None if teacher is None else teacher.tok,
                  teacher_pad_id=None if teacher is None else teacher.pad)
    return lm_dataset(NAME, lm_splits(columns, info))
