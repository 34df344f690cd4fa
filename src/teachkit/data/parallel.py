"""Parallel text for translation: one joint vocabulary, padded token-id tensors, token-level targets, and
batches by token count with length bucketing.

Every translation split holds a :class:`ParallelText` as its ``x`` and the padded target ids as its ``y``:

- ``src`` (N, S) and ``tgt`` (N, T) int32 token ids, padded with :data:`PAD` on the right, each sequence ending
  with :data:`EOS` (fairseq's convention for both sides); one vocabulary (:class:`Vocab`) for both languages;
- as a mapping it is the model's input, ``model(**x)``: ``src_ids`` and ``tgt_in`` (the target shifted right
  behind :data:`BOS`, teacher forcing on the gold prefix; PAD where the target is PAD, so ``tgt_in != PAD``
  marks exactly the target positions);
- indexed by rows like a tensor (``x[idx]``, ``x[a:b]``): the rows, trimmed to their longest source and target;
- :meth:`ParallelText.token_targets`: the targets of its rows *packed*, one entry per target token in row-major
  order (N_tokens,) int64. A translation model returns its logits in the same packed layout (one row per target
  position), so every per-sample loss of teachkit (CE, the MSE teacher, Hinton KD, DKD, Pro-KD's logit MSE, ...)
  is a per-token loss on translation without a special case: a batch's ``y`` is these packed targets.

:class:`TokenBatchLoader` is the translation training :class:`~teachkit.types.BatchSource`: rows sorted by
length (ties broken by a seeded draw), cut into batches of at most ``max_tokens`` padded tokens (the larger of
source and target) and at most ``batch_size`` sentences, and the batches visited in a seeded random order each
epoch (fairseq's scheme): the batches are fixed, their order is a function of (seed, epoch), so resuming needs
no loader state.

What every split of one corpus shares lives in :class:`TranslationInfo` (vocabulary, the target text lines the
references are read from, decoding settings of the evaluator, counts of lines skipped or truncated, files to
keep in the run folder).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from teachkit.data.loader import epoch_generator
from teachkit.errors import ConfigError, DataError
from teachkit.types import Batch

#: special token ids, the same in every vocabulary
PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
#: the task of parallel text (its evaluator: BLEU, token accuracy, perplexity)
TRANSLATION = "translation"
#: the BPE continuation marker of prepared corpora (subword-nmt / fairseq): ``lo@@ w@@ er`` is ``lower``
BPE_MARK = "@@"


@dataclass(frozen=True, eq=False)
class Vocab:
    """Token strings by id; ids 0-3 are :data:`SPECIALS`. Units are words or BPE pieces (``piece@@``)."""

    tokens: tuple[str, ...]

    def __post_init__(self) -> None:
        if tuple(self.tokens[:len(SPECIALS)]) != SPECIALS:
            raise DataError(f"a vocabulary must start with the special tokens {list(SPECIALS)}")
        index = {t: i for i, t in enumerate(self.tokens)}
        if len(index) != len(self.tokens):
            raise DataError("a vocabulary lists a token twice")
        object.__setattr__(self, "_index", index)

    @classmethod
    def build(cls, counts: Mapping[str, int], min_freq: int = 1, max_size: int | None = None) -> Vocab:
        """Specials, then units by decreasing count (ties in alphabetical order: deterministic), those seen at
        least ``min_freq`` times, at most ``max_size`` tokens in all."""
        ranked = sorted((u for u, c in counts.items() if c >= min_freq and u not in SPECIALS),
                        key=lambda u: (-counts[u], u))
        if max_size is not None:
            ranked = ranked[:max(0, max_size - len(SPECIALS))]
        return cls((*SPECIALS, *ranked))

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, unit: str) -> int:
        return self._index.get(unit, UNK)  # type: ignore[attr-defined]

    def encode(self, units: Sequence[str]) -> list[int]:
        """Ids of ``units`` (unknown units are :data:`UNK`), without EOS."""
        index = self._index  # type: ignore[attr-defined]
        return [index.get(u, UNK) for u in units]

    def decode(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Units of ``ids`` up to the first EOS; PAD and BOS are dropped."""
        out = []
        for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
            if i == EOS:
                break
            if i in (PAD, BOS):
                continue
            out.append(self.tokens[i] if 0 <= i < len(self.tokens) else SPECIALS[UNK])
        return out

    @property
    def digest(self) -> str:
        """sha256 of the token list: two runs share a vocabulary exactly when their digests agree."""
        return hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps({"format": "teachkit-vocab", "version": 1, "tokens": list(self.tokens)}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, where: str = "vocabulary") -> Vocab:
        try:
            data = json.loads(text)
            tokens = data["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise TypeError("tokens must be a list of strings")
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{where} is not a teachkit vocabulary file ({str(e).splitlines()[0][:120]})") from None
        return cls(tuple(tokens))


def merge_units(units: Sequence[str]) -> str:
    """Units joined as tokenised text: BPE pieces ``piece@@`` glued to the next one (``lo@@ w@@ er`` -> ``lower``)."""
    text = " ".join(units)
    text = text.replace(f"{BPE_MARK} ", "")
    return text[:-len(BPE_MARK)] if text.endswith(BPE_MARK) else text


@dataclass(frozen=True)
class DecodeOptions:
    """How the evaluator decodes: ``greedy`` or ``beam`` (``beam`` width, ``length_penalty``: scores are divided
    by length ** length_penalty, fairseq's convention); at most ``max_len_a * source length + max_len_b``
    target tokens."""

    strategy: Literal["greedy", "beam"] = "greedy"
    beam: int = 5
    length_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10

    def __post_init__(self) -> None:
        if self.strategy not in ("greedy", "beam"):
            raise ConfigError(f"decoding strategy {self.strategy!r} is not allowed; choose greedy or beam")
        if isinstance(self.beam, bool) or not isinstance(self.beam, int) or self.beam < 1:
            raise ConfigError(f"beam width {self.beam!r} is not allowed: it must be an integer >= 1")
        if isinstance(self.max_len_b, bool) or not isinstance(self.max_len_b, int) or self.max_len_b < 1 or \
                isinstance(self.max_len_a, bool) or not isinstance(self.max_len_a, (int, float)) or self.max_len_a < 0:
            raise ConfigError(f"decoding length limit max_len_a={self.max_len_a!r}, max_len_b={self.max_len_b!r} is "
                              "not allowed: max_len_a must be a number >= 0 and max_len_b an integer >= 1")

    def describe(self) -> str:
        return "greedy" if self.strategy == "greedy" else f"beam {self.beam}, length penalty {self.length_penalty:g}"


@dataclass(eq=False)
class TranslationInfo:
    """What every split of one parallel corpus shares (the ``info`` of its :class:`ParallelText` s)."""

    vocab: Vocab
    #: the target side as read (tokenised, lowercased when asked), one line per corpus row: BLEU's references
    target_texts: Sequence[str] = ()
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    #: units carry BPE ``@@`` markers (merged back with :func:`merge_units` before BLEU)
    bpe: bool = False
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    #: training batches: at most this many padded tokens (None: ``data.batch_size`` sentences per batch)
    max_tokens: int | None = None
    #: counts and facts for the run summary (lines skipped, truncated, BPE size, vocabulary source...)
    notes: dict[str, Any] = field(default_factory=dict)
    #: files a run keeps in its folder (name -> text): the vocabulary and BPE merges it was trained with
    artifacts: dict[str, str] = field(default_factory=dict)

    def text(self, ids: Sequence[int] | Tensor) -> str:
        """Tokenised text of target ids (BPE merged), as the references are."""
        return merge_units(self.vocab.decode(ids))


def _longest(ids: Tensor) -> int:
    """The longest non-PAD prefix length over rows (>= 1)."""
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        return 1
    used = (ids != PAD).any(dim=0).nonzero()
    return int(used.max()) + 1 if used.numel() else 1


def shift_right(tgt: Tensor) -> Tensor:
    """Teacher-forcing input: ``[BOS, y_1 .. y_{n-1}]`` for a target ``[y_1 .. y_n]`` (y_n = EOS), PAD where the
    target is PAD (so the input and the target mark the same positions)."""
    out = torch.empty_like(tgt)
    out[:, 0] = BOS
    out[:, 1:] = tgt[:, :-1]
    return out.masked_fill_(tgt == PAD, PAD)


class ParallelText(Mapping[str, Tensor]):
    """Source/target token ids of N sentence pairs (see the module docstring). ``row_ids`` (N,) int64: each
    row's line in ``info.target_texts`` (its reference)."""

    def __init__(self, src: Tensor, tgt: Tensor, row_ids: Tensor, info: TranslationInfo) -> None:
        if src.dim() != 2 or tgt.dim() != 2 or row_ids.dim() != 1 or not (
                src.shape[0] == tgt.shape[0] == row_ids.shape[0]):
            raise ValueError(f"ParallelText needs src (N, S), tgt (N, T) and row_ids (N,); got {tuple(src.shape)}, "
                             f"{tuple(tgt.shape)}, {tuple(row_ids.shape)}")
        self.src, self.tgt, self.row_ids, self.info = src, tgt, row_ids, info
        self.num_rows = int(src.shape[0])

    # -- the mapping of model inputs -------------------------------------------------------------------------
    KEYS = ("src_ids", "tgt_in")

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key == "src_ids":
                return self.src
            if key == "tgt_in":
                return shift_right(self.tgt)
            raise KeyError(key)
        return self.rows(key)

    @property
    def inputs(self) -> dict[str, Tensor]:
        """The model inputs as a dict (``src_ids``, ``tgt_in``)."""
        return {k: self[k] for k in self.KEYS}

    @property
    def vocabulary_digest(self) -> str:
        """sha256 of the vocabulary (recorded in checkpoints: a teacher and a student must share it)."""
        return self.info.vocab.digest

    @property
    def data_notes(self) -> dict[str, Any]:
        """What reading the corpus did (pairs per split, lines skipped, sequences truncated, BPE, vocabulary): kept
        in every checkpoint and run summary of this data (``data_notes``)."""
        return dict(self.info.notes)

    @property
    def artifacts(self) -> dict[str, str]:
        """Files a run on this data keeps in its folder (``vocab.json``, and ``bpe.json`` when BPE was learned)."""
        return dict(self.info.artifacts)

    @property
    def side(self) -> dict[str, Tensor]:
        return {"row_ids": self.row_ids}

    # -- tensor-like -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """(rows, padded source length)."""
        return self.num_rows, int(self.src.shape[1])

    @property
    def device(self) -> torch.device:
        return self.src.device

    @property
    def dtype(self) -> torch.dtype:
        return self.src.dtype

    def is_floating_point(self) -> bool:
        return False

    def dim(self) -> int:
        return 2

    def to(self, device: torch.device | str) -> ParallelText:
        return ParallelText(self.src.to(device), self.tgt.to(device), self.row_ids.to(device), self.info)

    def rows(self, index: Any) -> ParallelText:
        """The selected rows, source and target each trimmed to the longest selected sequence."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        if isinstance(index, list):
            index = torch.as_tensor(index, dtype=torch.long)
        if isinstance(index, Tensor):
            index = index.to(self.src.device)
        src, tgt = self.src[index], self.tgt[index]
        return ParallelText(src[:, :_longest(src)], tgt[:, :_longest(tgt)], self.row_ids[index], self.info)

    def with_targets(self, tgt: Tensor) -> ParallelText:
        """The same sources with other targets (N, T') (sequence-level KD: the teacher's translations)."""
        if tgt.shape[0] != self.num_rows:
            raise ValueError(f"{tgt.shape[0]} targets for {self.num_rows} rows")
        return ParallelText(self.src, tgt.to(self.src.device, self.src.dtype), self.row_ids, self.info)

    # -- targets ---------------------------------------------------------------------------------------------
    def token_targets(self) -> Tensor:
        """The targets packed: (N_tokens,) int64, the non-PAD target ids in row-major order."""
        tgt = self.tgt
        return tgt[tgt != PAD].long()

    def src_lengths(self) -> Tensor:
        return (self.src != PAD).sum(dim=1)

    def bucket_lengths(self) -> tuple[Tensor, Tensor]:
        """(source, target) lengths: what :class:`TokenBatchLoader` sorts rows by and pads to."""
        return self.src_lengths(), self.tgt_lengths()

    def tgt_lengths(self) -> Tensor:
        return (self.tgt != PAD).sum(dim=1)

    def batch_source(self, batch_size: int, shuffle: bool, seed: int) -> TokenBatchLoader:
        """The batches of a split holding these rows: :class:`TokenBatchLoader` with ``info.max_tokens``."""
        return TokenBatchLoader(self, batch_size, shuffle, seed, self.info.max_tokens)

    def __repr__(self) -> str:
        return (f"ParallelText({self.num_rows} pairs, src {tuple(self.src.shape)}, tgt {tuple(self.tgt.shape)}, "
                f"vocab {len(self.info.vocab)})")


def length_buckets(src_len: Tensor, tgt_len: Tensor, batch_size: int, max_tokens: int | None,
                   generator: torch.Generator | None) -> list[Tensor]:
    """Row positions grouped into batches: rows sorted by (target length, source length) -- ties in a random
    order from ``generator``, or by position when None -- then cut greedily so that a batch holds at most
    ``batch_size`` rows and, with ``max_tokens``, at most that many padded tokens (rows x the longest source or
    target in it)."""
    n = int(src_len.shape[0])
    tie = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    # lexicographic sort by (tgt, src, tie) with stable sorts from the last key to the first
    order = tie
    order = order[torch.sort(src_len[order], stable=True).indices]
    order = order[torch.sort(tgt_len[order], stable=True).indices]
    longest = torch.maximum(src_len, tgt_len)[order].tolist()
    batches: list[Tensor] = []
    start, top = 0, 0
    for i, length in enumerate(longest):
        rows = i - start  # rows already in the current batch
        grown = max(top, length)
        if rows and (rows >= batch_size or (max_tokens is not None and grown * (rows + 1) > max_tokens)):
            batches.append(order[start:i])
            start, grown = i, length
        top = grown
    if start < n:
        batches.append(order[start:])
    return batches


class TokenBatchLoader:
    """Training batches of a split of token rows (see the module docstring): ``Batch(x, y, index)`` with ``x`` the
    rows (trimmed), ``y`` their packed token targets, ``index`` the rows' positions in the split. ``x`` is a
    :class:`ParallelText` or any rows giving ``bucket_lengths()`` (the two lengths a row's padding grows with:
    source and target; a causal LM's two tokenisations), ``rows``, ``token_targets`` and ``tgt_lengths``."""

    def __init__(self, x: Any, batch_size: int, shuffle: bool = True, seed: int = 0,
                 max_tokens: int | None = None) -> None:
        self.x, self.batch_size, self.shuffle, self.seed, self.max_tokens = x, batch_size, shuffle, seed, max_tokens
        src_len, tgt_len = (lengths.cpu() for lengths in x.bucket_lengths())
        if max_tokens is not None and x.num_rows:
            longest = int(torch.maximum(src_len, tgt_len).max())
            if longest > max_tokens:
                raise ConfigError(f"data.options.max_tokens={max_tokens} is smaller than the longest sequence of the "
                                  f"split ({longest} tokens); raise max_tokens or lower data.options.max_length")
        gen = epoch_generator(seed, 0, "length-buckets") if shuffle else None
        self.buckets = length_buckets(src_len, tgt_len, batch_size, max_tokens, gen)

    def __len__(self) -> int:
        return len(self.buckets)

    def order(self, epoch: int) -> list[int]:
        """The batch numbers of ``epoch`` in visiting order."""
        if not self.shuffle:
            return list(range(len(self.buckets)))
        return torch.randperm(len(self.buckets), generator=epoch_generator(self.seed, epoch, "order")).tolist()

    def batches(self, epoch: int) -> Iterator[Batch]:
        device = self.x.device
        for b in self.order(epoch):
            index = self.buckets[b].to(device)
            rows = self.x.rows(index)
            yield Batch(rows, rows.token_targets(), index)

    def tokens(self) -> int:
        """Target tokens per epoch (all rows)."""
        return int(self.x.tgt_lengths().sum())
