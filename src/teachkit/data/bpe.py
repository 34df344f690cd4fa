"""Joint byte-pair encoding (BPE) of a parallel corpus, learned locally (Sennrich, Haddow & Birch 2016,
"Neural Machine Translation of Rare Words with Subword Units", ACL).

One set of merges is learned on the whitespace-split words of *both* languages of the training split (a joint
BPE, as in fairseq's ``examples/translation/prepare-iwslt14.sh``, which runs subword-nmt's ``learn_bpe.py -s
10000`` on the concatenated training files). The merges are learned with the Hugging Face ``tokenizers``
``BpeTrainer`` on words followed by an end-of-word symbol (so a piece knows whether it ends a word);
applying them needs nothing but this module, so a student applies its teacher's merges (``bpe.json``)
without ``tokenizers``.

Units are written in the subword-nmt / fairseq notation: every piece but the last of a word carries the
continuation marker ``@@`` (``lowest`` -> ``low@@ est``), so :func:`teachkit.data.parallel.merge_units` gives
the words back. Characters never seen in training stay single-character pieces, so segmenting never loses
text: ``merge_units(bpe.apply(line)) == " ".join(line.split())`` for any line whose words do not themselves
end in ``@@``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from teachkit.data.parallel import BPE_MARK
from teachkit.errors import ConfigError, DataError

#: the end-of-word symbol: appended to every word before learning and applying, never part of a unit (a
#: private-use character; another one is picked when the training text holds it)
END = "\ue000"
#: the format name written into ``bpe.json``
FORMAT = "teachkit-bpe"


@dataclass(eq=False)
class JointBPE:
    """Merge operations in the order they were learned (the first applies first): pairs of symbols. A word is
    segmented starting from its characters followed by the end-of-word symbol ``end``, so a piece that ends a
    word is a different symbol from the same letters inside a word."""

    merges: tuple[tuple[str, str], ...]
    end: str = END
    _ranks: dict[tuple[str, str], int] = field(init=False, repr=False)
    _cache: dict[str, tuple[str, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.merges = tuple((str(a), str(b)) for a, b in self.merges)
        self._ranks = {}
        for rank, pair in enumerate(self.merges):
            self._ranks.setdefault(pair, rank)
        self._cache = {}

    def __len__(self) -> int:
        """The number of merge operations."""
        return len(self.merges)

    def segment(self, word: str) -> tuple[str, ...]:
        """The units of one word: ``piece@@`` for every piece but the last (memoised per word)."""
        units = self._cache.get(word)
        if units is not None:
            return units
        if not word:
            return ()
        ranks = self._ranks
        symbols = [*word, self.end]
        while len(symbols) > 1:
            best, best_rank = -1, len(ranks)
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and rank < best_rank:
                    best, best_rank = i, rank
            if best < 0:
                break
            first, second = symbols[best], symbols[best + 1]
            merged: list[str] = []
            i = 0
            while i < len(symbols):  # every occurrence of the pair, left to right
                if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        # the last symbol ends with the end-of-word symbol (alone when no merge took it in): drop it
        last = symbols[-1][:-len(self.end)]
        pieces = [*symbols[:-1], last] if last else symbols[:-1]
        units = (*(p + BPE_MARK for p in pieces[:-1]), pieces[-1])
        self._cache[word] = units
        return units

    def apply(self, line: str) -> list[str]:
        """The units of a whitespace-tokenised line (whitespace runs count as one separator)."""
        cache = self._cache
        out: list[str] = []
        for word in line.split():
            units = cache.get(word)
            out.extend(units if units is not None else self.segment(word))
        return out

    def to_json(self) -> str:
        """The merges as JSON (``bpe.json`` of a run; :meth:`from_json` reads it back)."""
        return json.dumps({"format": FORMAT, "version": 1, "end_of_word": self.end, "marker": BPE_MARK,
                           "merges": [list(p) for p in self.merges]}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, where: str = "BPE merges") -> JointBPE:
        """The merges written by :meth:`to_json`; a one-line DataError naming ``where`` otherwise."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT!r}")
            end = data.get("end_of_word")
            if not isinstance(end, str) or len(end) != 1 or data.get("marker") != BPE_MARK:
                raise ValueError(f"end_of_word must be one character and marker {BPE_MARK!r}")
            merges = data["merges"]
            if not isinstance(merges, list) or not all(
                    isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) and s for s in p) for p in merges):
                raise ValueError("merges must be a list of pairs of non-empty strings")
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{where} is not a teachkit BPE file ({str(e).splitlines()[0][:120]})") from None
        return cls(tuple((a, b) for a, b in merges), end)

    @property
    def digest(self) -> str:
        """sha256 of the merges: two corpora are segmented alike exactly when their digests agree."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def learn_bpe(lines: Iterable[str], size: int, min_frequency: int = 2) -> JointBPE:
    """Learn at most ``size`` merge operations (subword-nmt's ``-s``; fairseq's IWSLT14 recipe uses 10,000) on the
    whitespace-split words of ``lines`` (give the training lines of both languages: a joint BPE). Pairs seen
    fewer than ``min_frequency`` times are never merged (subword-nmt's default 2), so a small corpus may give
    fewer merges.

    Each word is given to the trainer followed by an end-of-word character. (The trainer's own
    ``end_of_word_suffix`` numbers the word-final symbols in hash-map order, so ties between equally frequent
    pairs would be broken differently from run to run; with plain characters, whose ids the trainer sorts, the
    merges are deterministic.) Unlike subword-nmt, joining a final letter with the end of the word is a merge
    of its own (a few dozen of the ``size``)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"BPE size {size!r} is not allowed: it must be an integer >= 1 (merge operations)")
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        raise ConfigError("learning BPE needs the Hugging Face tokenizers package: pip install 'teachkit[text]'") \
            from None
    lines = lines if isinstance(lines, Sequence) else list(lines)
    alphabet: set[str] = set()
    for line in lines:
        alphabet.update(line)
    alphabet.difference_update(" \t\n\r\f\v")
    end = END
    while end in alphabet:  # a character the text never uses
        end = chr(ord(end) + 1)
    words = [" ".join(w + end for w in line.split()) for line in lines]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # the trainer's vocabulary is the alphabet plus one symbol per merge: room for `size` merges, keep `size`
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 1 + size, min_frequency=min_frequency,
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(words, trainer=trainer, length=len(words))
    raw = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in raw]  # older tokenizers: "a b"
    return JointBPE(tuple((a, b) for a, b in merges[:size]), end)


def is_bpe_marked(lines: Iterable[str]) -> bool:
    """True when ``lines`` are already segmented with BPE in the subword-nmt notation: some line holds a unit
    ending in ``@@`` followed by another unit (``low@@ est``), as fairseq's prepared IWSLT14 files do."""
    marker = BPE_MARK + " "
    return any(marker in line for line in lines)
