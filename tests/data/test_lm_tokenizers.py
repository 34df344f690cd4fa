"""The tokenizers of causal-LM data (teachkit.data.lm_tokenizers): char / byte / bpe built deterministically with
the specials at ids 0-3, lossless byte level, the run-folder files AutoTokenizer reloads, and the vocabulary digest
(the same for a tokenizer in memory and the folder it was saved to)."""

from __future__ import annotations

import pytest

from teachkit.data import lm_tokenizers as lmt
from teachkit.data.text import tokenizer_vocab_digest
from teachkit.errors import ConfigError

TEXTS = ["the cat sat on the mat", "a dog ate the cat's dinner", "héllo wörld, 1 + 2 = 3"] * 20


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_char_vocabulary_is_sorted_after_the_specials():
    tok = lmt.char_tokenizer(["cab", "ba c"])
    vocab = sorted(tok.get_vocab(), key=tok.get_vocab().get)
    assert vocab == ["<pad>", "<s>", "</s>", "<unk>", " ", "a", "b", "c"]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert encode(tok, "cabz") == [7, 5, 6, 3]  # unseen characters are <unk>
    assert encode(tok, "<s>") == [3, 3, 3]  # the text "<s>" is characters, never BOS
    assert tok.decode([1, 7, 5, 4, 6, 2, 0], skip_special_tokens=True) == "ca b"
    assert lmt.vocab_digest(tok) == lmt.vocab_digest(lmt.char_tokenizer(["ba c", "cab"]))


def test_byte_tokenizer_is_lossless_and_ids_are_bytes_plus_four():
    tok = lmt.byte_tokenizer()
    text = "héllo\n\t<s> 😀"
    ids = encode(tok, text)
    assert ids == [b + 4 for b in text.encode("utf-8")] and len(tok) == 260
    assert tok.decode(ids) == text and tok.decode([1, *ids, 2], skip_special_tokens=True) == text


def test_bpe_is_deterministic_byte_level_and_sized():
    a, b = lmt.bpe_tokenizer(TEXTS, 300), lmt.bpe_tokenizer(list(TEXTS), 300)
    assert lmt.vocab_digest(a) == lmt.vocab_digest(b) and lmt.backend_json(a) == lmt.backend_json(b)
    assert 260 < len(a) <= 300 and [a.convert_ids_to_tokens(i) for i in range(4)] == list(lmt.SPECIALS)
    text = "the cat ate 😀 ü"
    assert len(encode(a, "the cat")) < len("the cat") and a.decode(encode(a, text)) == text
    assert lmt.vocab_digest(lmt.bpe_tokenizer(TEXTS, 280)) != lmt.vocab_digest(a)


def test_build_tokenizer_checks_its_options():
    assert len(lmt.build_tokenizer("d", "tokenizer", "char", ["ab"], 0)) == 6
    with pytest.raises(ConfigError, match="'vocab_size' must be >= 260"):
        lmt.build_tokenizer("d", "tokenizer", "bpe", TEXTS, 100)
    with pytest.raises(ConfigError, match="not found offline"):
        lmt.build_tokenizer("d", "tokenizer", "no-such-tokenizer-here", TEXTS, 300)
    with pytest.raises(ConfigError, match="option 'tokenizer' must be one of char, byte, bpe"):
        lmt.check_name("d", "tokenizer", 5)
    assert lmt.check_name("d", "teacher_tokenizer", None, optional=True) is None
    with pytest.raises(ConfigError, match="tokenizer 'minilm-l6' has no end-of-sequence token"):
        lmt.build_tokenizer("d", "tokenizer", "minilm-l6", [], 0)  # BERT's WordPiece: no EOS


def test_artifacts_reload_with_auto_tokenizer_and_digests_agree(tmp_path):
    from transformers import AutoTokenizer

    tok = lmt.bpe_tokenizer(TEXTS, 300)
    files = lmt.tokenizer_artifacts(tok)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert encode(again, "the cat <s>") == encode(tok, "the cat <s>")
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id) == (0, 1, 2)
    assert lmt.vocab_digest(again) == lmt.vocab_digest(tok) == tokenizer_vocab_digest(str(tmp_path))
    assert lmt.vocab_digest(lmt.from_json(lmt.backend_json(tok))) == lmt.vocab_digest(tok)
    loaded = lmt.build_tokenizer("d", "tokenizer", str(tmp_path), [], 0)  # a folder: pretrained, offline
    assert lmt.special_ids(loaded) == (0, 2, 1)
    assert lmt.tokenizer_entry("bpe", tok) == {"name": "bpe", "sha256": lmt.vocab_digest(tok)}


def test_a_pretrained_tokenizer_without_pad_pads_with_eos(tmp_path):
    tok = lmt.char_tokenizer(["ab"])
    tok.save_pretrained(str(tmp_path))
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(str(tmp_path))
    bare.pad_token = None
    assert lmt.special_ids(bare) == (2, 2, 1)
