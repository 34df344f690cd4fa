"""The tokenizer of causal-LM data (option ``tokenizer``): built here from the training texts, or pretrained.

- ``char``: every character seen in the training texts, sorted (deterministic), after the specials;
- ``byte``: the 256 byte values (byte-level, lossless: any text round-trips), token id = byte value + 4;
- ``bpe``: a byte-level BPE of ``vocab_size`` tokens learned on the training texts with Hugging Face
  ``tokenizers`` (``BpeTrainer``, GPT-2's byte alphabet, Sennrich et al. 2016; Radford et al. 2019);
- anything else: a pretrained tokenizer folder, bundled or cached Hub name, loaded offline
  (:func:`teachkit.data.text.load_tokenizer`), with its own special ids (pad = its pad token, else EOS).

The three built ones have ``<pad>`` = 0, ``<s>`` = 1 (BOS), ``</s>`` = 2 (EOS), ``<unk>`` = 3 and are
``transformers.PreTrainedTokenizerFast`` objects like a pretrained one, so the data code uses one API (encode
without specials, decode with ``skip_special_tokens``); the text ``<s>`` in a document is three characters,
never BOS (``split_special_tokens``). :func:`tokenizer_artifacts` gives the files that make a run folder
loadable with ``AutoTokenizer.from_pretrained``; :func:`vocab_digest` what a checkpoint records (the same
value as :func:`teachkit.data.text.tokenizer_vocab_digest` for a pretrained tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from teachkit.data.text import load_tokenizer
from teachkit.errors import ConfigError

#: the special tokens of the tokenizers built here, ids 0-3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
#: the tokenizers built from the data (every other value names a pretrained one)
BUILT = ("char", "byte", "bpe")
#: the smallest byte-level BPE: the specials and the 256 bytes
MIN_BPE_VOCAB = len(SPECIALS) + 256


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character of each byte (the alphabet of byte-level tokenizers)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def wrap(backend: Any) -> Any:
    """A ``tokenizers.Tokenizer`` whose first ids are :data:`SPECIALS` as a fast Hugging Face tokenizer."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=SPECIALS[1], eos_token=SPECIALS[2],
                                   pad_token=SPECIALS[0], unk_token=SPECIALS[3], split_special_tokens=True)


def char_tokenizer(texts: Iterable[str]) -> Any:
    """Specials, then every character of ``texts`` in code-point order; other characters are ``<unk>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    seen: set[str] = set()
    for text in texts:
        seen.update(text)
    vocab = {t: i for i, t in enumerate([*SPECIALS, *sorted(seen)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS[3]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIALS))
    return wrap(backend)


def byte_tokenizer() -> Any:
    """Specials, then the 256 bytes in byte order (id = byte + 4): every text is encoded losslessly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate([*SPECIALS, *(alphabet[b] for b in range(256))])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIALS[3]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    return wrap(backend)


def bpe_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE of at most ``vocab_size`` tokens learned on ``texts`` (fewer when the texts run out of
    pairs to merge): specials first, the 256 bytes, then the merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token=SPECIALS[3]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return wrap(backend)


def from_json(text: str) -> Any:
    """A built tokenizer again from its ``tokenizer.json`` text (:func:`backend_json`; the cache keeps it)."""
    from tokenizers import Tokenizer

    return wrap(Tokenizer.from_str(text))


def backend_json(tok: Any) -> str:
    """The ``tokenizer.json`` text of a fast tokenizer."""
    return tok.backend_tokenizer.to_str()


def check_name(dataset: str, key: str, value: Any, optional: bool = False) -> str | None:
    """A ``tokenizer`` option: ``char``, ``byte``, ``bpe`` or a pretrained name/folder; ConfigError otherwise."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        none = " or null" if optional else ""
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be one of {', '.join(BUILT)} or a pretrained "
                          f"tokenizer folder / cached name{none}, got {value!r}")
    return value


def build_tokenizer(dataset: str, key: str, name: str, texts: Sequence[str], vocab_size: int) -> Any:
    """The tokenizer option ``key`` names: built on ``texts`` (``vocab_size`` for ``bpe``) or loaded offline. A
    pretrained one must have an end-of-sequence token (one-line ConfigError otherwise)."""
    if name == "char":
        return char_tokenizer(texts)
    if name == "byte":
        return byte_tokenizer()
    if name == "bpe":
        if vocab_size < MIN_BPE_VOCAB:
            raise ConfigError(f"dataset {dataset!r} option 'vocab_size' must be >= {MIN_BPE_VOCAB} for {key}='bpe' "
                              f"(4 specials and 256 bytes), got {vocab_size}; use {key}='char' for a smaller one")
        return bpe_tokenizer(texts, vocab_size)
    tok = load_tokenizer(name)
    if tok.eos_token_id is None:
        raise ConfigError(f"dataset {dataset!r} option {key!r}: tokenizer {name!r} has no end-of-sequence token "
                          "(eos_token), which a causal language model needs to end its responses")
    return tok


def special_ids(tok: Any) -> tuple[int, int, int | None]:
    """(pad, eos, bos) ids: the tokenizer's own; pad is EOS when it has no pad token; bos may be None."""
    eos = int(tok.eos_token_id)
    pad = tok.pad_token_id
    bos = tok.bos_token_id
    return (eos if pad is None else int(pad)), eos, (None if bos is None else int(bos))


def vocab_digest(tok: Any) -> str:
    """sha256 of the vocabulary (every token, added ones included, in id order) and the model type (BPE,
    WordLevel, ...): :func:`teachkit.data.text.tokenizer_vocab_digest` for a tokenizer held in memory."""
    vocab = [token for token, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    model = type(tok.backend_tokenizer.model).__name__
    blob = json.dumps({"model": model, "vocab": vocab}, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def tokenizer_entry(name: str, tok: Any) -> dict[str, str]:
    """``{"name", "sha256"}``: how ``LMInfo.tokenizers`` and checkpoints name a tokenizer."""
    return {"name": name, "sha256": vocab_digest(tok)}


def tokenizer_artifacts(tok: Any) -> dict[str, str]:
    """The files ``save_pretrained`` writes (``tokenizer.json``, ``tokenizer_config.json``, a chat template),
    as text: kept in a run folder, ``AutoTokenizer.from_pretrained(run_folder)`` loads the tokenizer again."""
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def chat_template(tok: Any) -> str | None:
    """The tokenizer's chat template (None without one)."""
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template else None
