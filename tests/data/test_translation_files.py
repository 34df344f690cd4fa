"""Parallel text files (teachkit.data.translation_files): the sources ``iwslt14`` and ``parallel_text`` on tiny
files in the IWSLT layout written to tmp_path: tensors and references, a vocabulary from train only, BPE learned /
given / detected, sharing a run's vocabulary, valid carved from train, the cache, and bad input."""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import pytest
import torch

from teachkit.data import load_raw, load_splits
from teachkit.data import translation_files as tf
from teachkit.data.parallel import EOS, PAD, UNK, ParallelText, merge_units
from teachkit.errors import ConfigError, DataError

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

DE = "der die das hund katze maus haus garten sieht jagt frisst schläft klein groß alt rot über unter größe".split()
EN = "the the the dog cat mouse house garden sees chases eats sleeps small big old red over under size".split()


def pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n German-ish / English-ish sentence pairs over the small word lists (word-by-word, reversed)."""
    r = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        idx = [r.randrange(len(DE)) for _ in range(r.randint(2, 8))]
        de.append(" ".join(DE[i] for i in idx))
        en.append(" ".join(EN[i] for i in reversed(idx)))
    return de, en


def write(folder: Path, stem: str, de: list[str], en: list[str], src: str = "de", tgt: str = "en") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.{src}").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")
    (folder / f"{stem}.{tgt}").write_text("".join(f"{line}\n" for line in en), encoding="utf-8")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path) -> Path:
    """train 120 / valid 15 / test 12 pairs; 'validonly' / 'testonly' appear only in valid / test."""
    root = tmp_path / "iwslt"
    write(root, "train", *pairs(120, 0))
    de, en = pairs(15, 1)
    write(root, "valid", [*de[:-1], de[-1] + " validonly"], [*en[:-1], en[-1] + " validonly"])
    de, en = pairs(12, 2)
    write(root, "test", [de[0] + " testonly", *de[1:]], en)
    return root


def load(root: Path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # these files need no warning
        return load_raw("iwslt14", str(root), options)


def check_tensors(raw) -> None:
    info = raw.train_x.info
    for part, x, y in raw.parts():
        assert isinstance(x, ParallelText) and x.info is info, part
        assert x.src.dtype == x.tgt.dtype == torch.int32 and x.tgt is y
        for ids in (x.src, x.tgt):
            lengths = (ids != PAD).sum(1)
            assert int(lengths.min()) >= 2 and ids.shape[1] == int(lengths.max())  # padded to the split's longest
            assert (ids[torch.arange(len(ids)), lengths - 1] == EOS).all()  # each sequence ends with EOS
            assert ((ids != PAD).cumsum(1) == torch.arange(1, ids.shape[1] + 1).clamp(max=lengths[:, None])).all()
        for row in range(x.num_rows):  # each row's reference is the target as read
            if UNK not in x.tgt[row].tolist():
                assert info.text(x.tgt[row]) == info.target_texts[int(x.row_ids[row])]


def test_iwslt_layout_loads_with_words(corpus):
    raw = load(corpus, bpe_size=0)
    assert raw.task == "translation" and raw.name == "iwslt14" and raw.default_augment == "none"
    assert (raw.train_x.num_rows, raw.val_x.num_rows, raw.test_x.num_rows) == (120, 15, 12)
    info = raw.train_x.info
    assert raw.num_classes == len(info.vocab) and (info.src_lang, info.tgt_lang) == ("de", "en")
    assert not info.bpe and set(info.artifacts) == {"vocab.json"}
    assert info.notes["bpe"].startswith("none") and info.notes["pairs"] == {"train": 120, "val": 15, "test": 12}
    check_tensors(raw)
    de, en = pairs(120, 0)
    assert info.target_texts[:120] == tuple(en) and len(info.target_texts) == 147
    assert info.vocab.decode(raw.train_x.src[0]) == de[0].split()
    assert raw.val_x.row_ids.tolist() == list(range(120, 135)) and raw.test_x.row_ids[0] == 135
    assert info.decode.describe() == "greedy" and info.max_tokens is None


def test_the_vocabulary_holds_no_token_seen_only_in_valid_or_test(corpus):
    raw = load(corpus, bpe_size=0)
    vocab = raw.train_x.info.vocab
    assert "validonly" not in vocab.tokens and "testonly" not in vocab.tokens
    assert raw.val_x.src[-1].tolist().count(UNK) == 1 and raw.test_x.src[0].tolist().count(UNK) == 1
    train_words = {w for line in [*pairs(120, 0)[0], *pairs(120, 0)[1]] for w in line.split()}
    assert set(vocab.tokens[4:]) == train_words


def test_learned_bpe_comes_from_train_only_and_is_saved(corpus):
    raw = load(corpus, bpe_size=30)
    info = raw.train_x.info
    assert info.bpe and info.notes["bpe_merges"] == 30 and set(info.artifacts) == {"vocab.json", "bpe.json"}
    bpe = tf.JointBPE.from_json(info.artifacts["bpe.json"])
    de, en = pairs(120, 0)
    assert tf.learn_bpe([*de, *en], 30).merges == bpe.merges  # learned on the training pairs of both languages
    units = {u for line in [*de, *en] for u in bpe.apply(line)}
    assert set(info.vocab.tokens[4:]) == units
    assert "validonly" not in "".join(info.vocab.tokens)
    check_tensors(raw)
    assert info.text(raw.test_x.tgt[3]) == info.target_texts[int(raw.test_x.row_ids[3])] == pairs(12, 2)[1][3]
    assert any(u.endswith("@@") for u in info.vocab.tokens)


def test_bpe_given_in_the_files_is_detected_and_kept(tmp_path):
    root = tmp_path / "bped"
    de, en = pairs(60, 3)

    def mark(lines):
        return [line.replace("größe", "grö@@ ße").replace("garten", "gar@@ ten") for line in lines]

    write(root, "train", mark(de), en)
    write(root, "valid", mark(de[:5]), en[:5])
    write(root, "test", mark(de[5:10]), en[5:10])
    raw = load(root)  # bpe="auto"
    info = raw.train_x.info
    assert info.bpe and info.notes["bpe"].startswith("given") and "bpe.json" not in info.artifacts
    assert "grö@@" in info.vocab.tokens and "größe" not in info.vocab.tokens
    assert [merge_units(info.vocab.decode(r)) for r in raw.train_x.src[:3]] == de[:3]
    with pytest.raises(DataError, match="already carry BPE markers"):
        load_raw("iwslt14", str(root), {"bpe": "learn"})
    assert not load_raw("iwslt14", str(root), {"bpe": "none"}).train_x.info.bpe


def test_a_shared_vocabulary_gives_the_same_ids(corpus, tmp_path):
    teacher = load(corpus, bpe_size=25)
    run = tmp_path / "teacher_run"
    run.mkdir()
    for name, text in teacher.train_x.info.artifacts.items():
        (run / name).write_text(text, encoding="utf-8")
    for vocab_file in (str(run), str(run / "vocab.json")):
        student = load(corpus, vocab_file=vocab_file, bpe_size=7, min_freq=3)  # bpe_size / min_freq: the run's
        info = student.train_x.info
        assert info.vocab.digest == teacher.train_x.info.vocab.digest and "from" in info.notes["vocab"]
        for a, b in zip(student.parts(), teacher.parts(), strict=True):
            assert torch.equal(a[1].src, b[1].src) and torch.equal(a[2], b[2])
        assert info.artifacts == teacher.train_x.info.artifacts
    # a smaller transfer set still speaks the teacher's ids
    small = load(corpus, vocab_file=str(run), limit=30)
    assert small.train_x.num_rows == 30 and torch.equal(small.test_x.src, teacher.test_x.src)
    with pytest.raises(ConfigError, match="would not apply it"):
        load_raw("iwslt14", str(corpus), {"vocab_file": str(run), "bpe": "none"})
    words = load(corpus, bpe_size=0)
    (run / "bpe.json").unlink()
    (run / "vocab.json").write_text(words.train_x.info.artifacts["vocab.json"], encoding="utf-8")
    shared = load(corpus, vocab_file=str(run))  # no bpe.json beside it: word units, like that run
    assert torch.equal(shared.train_x.src, words.train_x.src) and not shared.train_x.info.bpe


def test_the_cache_returns_identical_tensors_and_is_rebuilt_when_damaged(corpus, tmp_path, monkeypatch):
    cache = tmp_path / "my_cache"
    first = load(corpus, bpe_size=20, cache_dir=str(cache))
    entries = list((cache / "translation").iterdir())
    assert len(entries) == 1 and {p.name for p in entries[0].iterdir()} == {"meta.json", "arrays.safetensors",
                                                                            "targets.txt"}
    calls = []
    real = tf.encode_corpus
    monkeypatch.setattr(tf, "encode_corpus", lambda *a, **k: calls.append(1) or real(*a, **k))

    def same(raw) -> bool:
        return all(torch.equal(a[1].src, b[1].src) and torch.equal(a[2], b[2]) and
                   torch.equal(a[1].row_ids, b[1].row_ids) for a, b in zip(raw.parts(), first.parts(), strict=True)) \
            and raw.train_x.info.target_texts == first.train_x.info.target_texts \
            and raw.train_x.info.vocab.tokens == first.train_x.info.vocab.tokens \
            and raw.train_x.info.artifacts == first.train_x.info.artifacts \
            and raw.train_x.info.notes == first.train_x.info.notes

    assert same(load(corpus, bpe_size=20, cache_dir=str(cache))) and calls == []  # read, not rebuilt
    arrays = entries[0] / "arrays.safetensors"
    data = bytearray(arrays.read_bytes())
    data[-3] ^= 0xFF  # a flipped id: the digest no longer matches
    arrays.write_bytes(bytes(data))
    assert same(load(corpus, bpe_size=20, cache_dir=str(cache))) and calls == [1]
    (entries[0] / "meta.json").write_text("{broken", encoding="utf-8")
    assert same(load(corpus, bpe_size=20, cache_dir=str(cache))) and calls == [1, 1]
    meta = json.loads((entries[0] / "meta.json").read_text(encoding="utf-8"))
    meta["key"] = "0" * 64  # an entry recorded under another key is never trusted
    (entries[0] / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    assert same(load(corpus, bpe_size=20, cache_dir=str(cache))) and calls == [1, 1, 1]
    assert same(load(corpus, bpe_size=20, cache_dir=str(cache))) and calls == [1, 1, 1]
    load(corpus, bpe_size=21, cache_dir=str(cache))  # another option: another entry
    load(corpus, bpe_size=20, cache_dir=str(cache), max_tokens=64, decode="beam")  # batching / decoding: same entry
    assert len(list((cache / "translation").iterdir())) == 2 and calls == [1, 1, 1, 1]
    (corpus / "test.en").write_text((corpus / "test.en").read_text(encoding="utf-8") + "one more\n",
                                    encoding="utf-8")
    (corpus / "test.de").write_text((corpus / "test.de").read_text(encoding="utf-8") + "noch einer\n",
                                    encoding="utf-8")
    assert load(corpus, bpe_size=20, cache_dir=str(cache)).test_x.num_rows == 13  # changed files: rebuilt


def test_without_valid_files_every_23rd_training_line_is_carved(tmp_path):
    root = tmp_path / "novalid"
    de, en = pairs(100, 4)
    de[22], en[22] = "onlyinval " + de[22], "onlyinval " + en[22]  # line 23
    write(root, "train", de, en)
    write(root, "test", *pairs(5, 5))
    raw = load(root, bpe_size=0)
    held = [i for i in range(100) if (i + 1) % 23 == 0]
    assert raw.val_x.num_rows == len(held) == 4 and raw.train_x.num_rows == 96
    info = raw.train_x.info
    assert [info.target_texts[int(r)] for r in raw.val_x.row_ids] == [en[i] for i in held]
    assert "onlyinval" not in info.vocab.tokens and "every 23rd" in info.notes["val"]
    assert load(root, bpe_size=0, valid=None).val_x.num_rows == 4
    with pytest.raises(DataError, match="dev.de"):  # a prefix that is not the default must exist
        load_raw("iwslt14", str(root), {"valid": "dev"})


def test_parallel_text_with_other_languages_prefixes_lowercase_and_limit(tmp_path):
    root = tmp_path / "fr-en"
    de, en = pairs(40, 6)
    write(root, "tr", [d.upper() for d in de], en, "fr", "en")
    write(root, "dv", *pairs(4, 7), "fr", "en")
    write(root, "tst", *pairs(4, 8), "fr", "en")
    raw = load_raw("parallel_text", str(root), {"src_lang": "fr", "tgt_lang": "en", "train": "tr", "valid": "dv",
                                                "test": "tst", "lowercase": True, "limit": 25, "bpe": "none",
                                                "max_tokens": 64, "decode": "beam", "beam": 3})
    info = raw.train_x.info
    assert raw.name == "parallel_text" and raw.train_x.num_rows == 25 and (info.src_lang, info.tgt_lang) == ("fr", "en")
    assert info.vocab.decode(raw.train_x.src[1]) == de[1].split()  # lowercased
    assert info.max_tokens == 64 and info.decode.describe() == "beam 3, length penalty 1"
    assert all(b.x.num_rows * max(b.x.src.shape[1], b.x.tgt.shape[1]) <= 64
               for b in raw.train_x.batch_source(32, True, 0).batches(0))
    splits = load_splits("parallel_text", str(root), options={"src_lang": "fr", "tgt_lang": "en", "train": "tr",
                                                              "valid": "dv", "test": "tst", "bpe_size": 0})
    assert (len(splits.train), len(splits.val), len(splits.test)) == (40, 4, 4) and splits.task == "translation"


def test_empty_lines_are_skipped_and_counted_or_rejected(corpus):
    de = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    en = (corpus / "train.en").read_text(encoding="utf-8").splitlines()
    de[4], en[9] = "   ", ""
    write(corpus, "train", de, en)
    raw = load_raw("iwslt14", str(corpus), {"bpe_size": 0})  # a one-line warning the run prints, not a UserWarning
    assert any(re.search("2 pairs with an empty side skipped .*train 2, val 0, test 0", w) for w in raw.warnings)
    assert raw.train_x.num_rows == 118 and raw.train_x.info.notes["skipped_empty"]["train"] == 2
    assert en[4] not in raw.train_x.info.target_texts[:118] or en.count(en[4]) > 1
    with pytest.raises(DataError, match=r"train.de line 5 is empty \(option empty_lines='reject'"):
        load_raw("iwslt14", str(corpus), {"bpe_size": 0, "empty_lines": "reject"})


def test_too_long_sequences_are_truncated_with_eos_or_rejected(corpus):
    de = (corpus / "test.de").read_text(encoding="utf-8").splitlines()
    de[2] = " ".join(["hund"] * 30)
    (corpus / "test.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    raw = load_raw("iwslt14", str(corpus), {"bpe_size": 0, "max_length": 12})
    assert any("1 sequences longer than max_length=12 tokens truncated" in w for w in raw.warnings)
    row = raw.test_x.src[2]
    assert (row != PAD).sum() == 12 and row[11] == EOS and raw.test_x.src.shape[1] == 12
    assert raw.train_x.info.notes["truncated"]["test"] == 1
    assert raw.train_x.info.target_texts[135 + 2] == pairs(12, 2)[1][2]  # references stay whole
    with pytest.raises(DataError, match="test.de line 3 is 31 tokens long with EOS, more than max_length=12"):
        load_raw("iwslt14", str(corpus), {"bpe_size": 0, "max_length": 12, "too_long": "reject"})


def _unequal(root: Path) -> None:
    (root / "train.en").write_text("".join(f"{line}\n" for line in pairs(118, 0)[1]), encoding="utf-8")


def _non_utf8(root: Path) -> None:
    data = (root / "valid.en").read_bytes().split(b"\n")
    data[6] = b"caf\xe9 " + data[6]
    (root / "valid.en").write_bytes(b"\n".join(data))


BAD = [
    # (what, change the files, source, options, error, message)
    ("line counts differ", _unequal, "iwslt14", {}, DataError,
     r"train.de has 120 lines but train.en has 118 .*: lines 119-120 of train.de have no counterpart in train.en"),
    ("missing file", lambda r: (r / "test.en").unlink(), "iwslt14", {}, DataError,
     r"test.en' not found.*prepare-iwslt14.sh"),
    ("non-UTF-8 line", _non_utf8, "iwslt14", {}, DataError, r"valid.en' line 7 is not UTF-8 text \(byte 0xe9"),
    ("missing src_lang", None, "parallel_text", {"tgt_lang": "en"}, ConfigError,
     r"dataset 'parallel_text' option 'src_lang' is required"),
    ("missing vocab_file", None, "iwslt14", {"vocab_file": "/nonexistent/run"}, DataError,
     r"option 'vocab_file': '/nonexistent/run/vocab.json' not found|option 'vocab_file': '/nonexistent/run' not"),
    ("broken vocab_file", lambda r: (r / "v.json").write_text("{}"), "iwslt14", {"vocab_file": "V"}, DataError,
     r"vocab_file .*v.json' is not a teachkit vocabulary"),
    ("same languages", None, "parallel_text", {"src_lang": "en", "tgt_lang": "en"}, ConfigError, "must differ"),
    ("language with a slash", None, "iwslt14", {"src_lang": "de/x"}, ConfigError, "option 'src_lang' must be"),
    ("bpe_size", None, "iwslt14", {"bpe_size": -1}, ConfigError, r"option 'bpe_size' must be an integer >= 0, got -1"),
    ("bpe mode", None, "iwslt14", {"bpe": "maybe"}, ConfigError,
     r"option 'bpe' is 'maybe'; choose one of: auto, learn, none, given"),
    ("learn without size", None, "iwslt14", {"bpe": "learn", "bpe_size": 0}, ConfigError, "needs bpe_size >= 1"),
    ("too_long", None, "iwslt14", {"too_long": "cut"}, ConfigError, r"option 'too_long' is 'cut'; choose one of"),
    ("empty_lines", None, "iwslt14", {"empty_lines": "drop"}, ConfigError, "option 'empty_lines' is 'drop'"),
    ("max_tokens", None, "iwslt14", {"max_tokens": 4}, ConfigError, r"option 'max_tokens' must be an integer >= 8"),
    ("max_length", None, "iwslt14", {"max_length": 1}, ConfigError, r"option 'max_length' must be an integer >= 2"),
    ("min_freq", None, "iwslt14", {"min_freq": 0}, ConfigError, r"option 'min_freq' must be an integer >= 1"),
    ("limit", None, "iwslt14", {"limit": 0}, ConfigError, r"option 'limit' must be an integer >= 1"),
    ("lowercase", None, "iwslt14", {"lowercase": "yes"}, ConfigError, r"option 'lowercase' must be true or false"),
    ("decode", None, "iwslt14", {"decode": "sample"}, ConfigError, r"option 'decode' is 'sample'; choose one of"),
    ("beam", None, "iwslt14", {"beam": 0}, ConfigError, r"option 'beam' must be an integer >= 1"),
    ("length_penalty", None, "iwslt14", {"length_penalty": "x"}, ConfigError, "option 'length_penalty' must be"),
    ("max_len_a", None, "iwslt14", {"max_len_a": -0.5}, ConfigError, r"'max_len_a' must be a finite number >= 0"),
    ("test prefix", None, "iwslt14", {"test": ""}, ConfigError, "option 'test' must be a file name prefix"),
    ("unknown option", None, "iwslt14", {"bpe_merges": 3}, ConfigError, "unknown option 'bpe_merges'"),
]


@pytest.mark.parametrize("what, change, source, options, error, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(corpus, what, change, source, options, error, message):
    if change is not None:
        change(corpus)
    options = {k: (str(corpus / "v.json") if v == "V" else v) for k, v in options.items()}
    with pytest.raises(error, match=message) as e:
        load_raw(source, str(corpus), options)
    assert "\n" not in str(e.value)
    if source == "iwslt14":
        assert "'iwslt14'" in str(e.value) or "unknown option" in str(e.value)


def test_root_is_required_and_must_be_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="needs its files: set data.root"):
        load_raw("iwslt14", None, {})
    with pytest.raises(DataError, match="is not a folder"):
        load_raw("iwslt14", str(tmp_path / "nothing"), {})


def test_read_lines_counts_lines_like_wc(tmp_path):
    f = tmp_path / "x.txt"
    f.write_bytes("\ufeffa b\r\nc\u2028d\n\nlast".encode())
    assert tf.read_lines(f, "t") == ["a b", "c\u2028d", "", "last"]


def test_text_spelling_a_special_token_is_unknown(corpus):
    de = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    de[0] = "hund </s> <pad> <s> katze"
    write(corpus, "train", de, (corpus / "train.en").read_text(encoding="utf-8").splitlines())
    row = load(corpus, bpe_size=0).train_x.src[0]
    assert row[:6].tolist()[1:4] == [UNK, UNK, UNK] and row[5] == EOS and (row[:5] > EOS).all()
