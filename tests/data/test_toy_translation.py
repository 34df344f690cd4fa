"""The synthetic translation task (teachkit.data.toy_translation): deterministic, disjoint splits, a vocabulary
of a few hundred types from train only, and the grammar's reordering, agreement and context-resolved ambiguity
checked on the generated pairs."""

from __future__ import annotations

import random

import pytest
import torch

from teachkit.data import load_raw, load_splits
from teachkit.data import toy_translation as toy
from teachkit.data.parallel import merge_units
from teachkit.errors import ConfigError

COUNTS = {"test": 300, "val": 300, "train": 3000}


@pytest.fixture(scope="module")
def generated():
    return toy.generate(dict(COUNTS), seed=0)


@pytest.fixture(scope="module")
def pairs(generated):
    return [p for part in generated.values() for p in zip(*part, strict=True)]


@pytest.fixture(scope="module")
def raw():
    return load_raw("toy_translation", None, {"train": 3000, "valid": 300, "test": 300})


# lookup tables of the lexicon: Lingo word form -> (gender, plural)
NOUN_FORMS = {n.src(p): (n.gender, p) for n in toy.NOUNS for p in (False, True)}
ADJ_FORMS = {a.src(g, p): (g, p) for a in toy.ADJECTIVES for g in "mf" for p in (False, True)}
DET_FORMS = {form: ("mf"[slot % 2], slot >= 2) for _, _, forms in toy.DETERMINERS.values()
             for slot, form in enumerate(forms) if form}
NOUNS_BY_FORM = {n.src(p): (n, p) for n in toy.NOUNS if n.verbs is None for p in (False, True)}
ADJS_BY_FORM = {a.src(g, p): a for a in toy.ADJECTIVES for g in "mf" for p in (False, True)}
THIRD = {v.en[1] for v in toy.VERBS} | {v.alt[1] for v in toy.VERBS if v.alt}
BASE = {v.en[0] for v in toy.VERBS} | {v.alt[0] for v in toy.VERBS if v.alt}
PAST = {v.en[2] for v in toy.VERBS} | {v.alt[2] for v in toy.VERBS if v.alt}


def test_generation_is_deterministic_and_leaves_global_rngs_alone(raw):
    state, torch_state = random.getstate(), torch.get_rng_state()
    again = load_raw("toy_translation", None, {"train": 3000, "valid": 300, "test": 300})
    assert random.getstate() == state and torch.equal(torch.get_rng_state(), torch_state)
    for a, b in zip(raw.parts(), again.parts(), strict=True):
        assert torch.equal(a[1].src, b[1].src) and torch.equal(a[2], b[2])
    assert raw.train_x.info.target_texts == again.train_x.info.target_texts
    other = toy.generate({"test": 50}, seed=1)["test"]
    assert other != toy.generate({"test": 50}, seed=0)["test"]


def test_splits_share_no_sentence_and_do_not_depend_on_the_train_size(generated):
    src = [set(generated[p][0]) for p in ("train", "val", "test")]
    tgt = [set(generated[p][1]) for p in ("train", "val", "test")]
    for i, n in enumerate(COUNTS[p] for p in ("train", "val", "test")):
        assert len(src[i]) == len(tgt[i]) == n  # no repeats within a split either
    for sets in (src, tgt):
        assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    smaller = toy.generate({"test": 300, "val": 300, "train": 500}, seed=0)
    assert smaller["test"] == generated["test"] and smaller["val"] == generated["val"]


def test_each_source_has_one_translation_and_lengths_are_4_to_30(pairs):
    g = toy.Generator(random.Random(7))
    seen: dict[str, str] = {}
    for _ in range(20000):
        s, t = g.sentence()
        assert seen.setdefault(s, t) == t  # the target is a function of the source
    for s, t in pairs:
        assert 4 <= len(s.split()) <= 30 and 4 <= len(t.split()) <= 30
        assert s.endswith(" .") and t.endswith(" .")


def test_the_vocabulary_has_a_few_hundred_types_from_train_only(raw, generated):
    info = raw.train_x.info
    train_words = {w for side in generated["train"] for line in side for w in line.split()}
    assert set(info.vocab.tokens[4:]) == train_words
    assert 300 <= len(info.vocab) <= 1000
    src_words, en_words = toy.lexicon_words()
    assert 200 <= len(src_words) <= 600 and 150 <= len(en_words) <= 400
    assert train_words <= src_words | en_words
    assert info.src_lang == "lingo" and info.tgt_lang == "en" and not info.bpe
    assert (raw.train_x.num_rows, raw.val_x.num_rows, raw.test_x.num_rows) == (3000, 300, 300)
    assert list(info.target_texts[:5]) == generated["train"][1][:5]
    assert info.text(raw.test_x.tgt[0]) == generated["test"][1][0]


def test_source_is_verb_final_and_agrees_in_gender_and_number(pairs):
    verb_endings = tuple(toy.VERB_ENDINGS)
    stems = {v.stem for v in toy.VERBS}
    checked_det = checked_adj = 0
    for s, _ in pairs:
        words = s.split()
        last = words[-2]
        assert last.endswith(verb_endings) and any(last.startswith(st) for st in stems), s  # verb-final
        for i, w in enumerate(words[:-1]):
            nxt = words[i + 1]
            if w in DET_FORMS and nxt in NOUN_FORMS:  # determiner + noun: same gender and number
                assert DET_FORMS[w] == NOUN_FORMS[nxt], s
                checked_det += 1
            if w in NOUN_FORMS:  # adjectives follow the noun and agree with it
                j = i + 1
                while j < len(words) and words[j] in ADJ_FORMS:
                    assert ADJ_FORMS[words[j]] == NOUN_FORMS[w], s
                    checked_adj += 1
                    j += 1
    assert checked_det > 1000 and checked_adj > 300


def test_english_is_svo_with_subject_verb_agreement_and_dropped_subjects_come_from_the_verb(pairs):
    first_person = 0
    for s, t in pairs:
        words = t.split()
        if words[0] in ("he", "she"):
            assert words[1] in THIRD | PAST or words[1] in ("does", "did", "will"), t
        elif words[0] in ("i", "we", "they", "you"):
            assert words[1] in BASE | PAST or words[1] in ("do", "did", "will"), t
            assert words[1] not in THIRD - BASE, t
        if words[0] == "i":  # 'i' is not written in Lingo: the main verb's ending says it
            assert s.split()[-2].endswith("em"), (s, t)
            first_person += 1
    assert first_person > 50
    assert not any(" a a" in t or " a e" in t or " a i" in t or " a o" in t or t.startswith(("a a", "a e", "a o"))
                   for _, t in pairs)  # 'an' before a vowel


def test_word_order_is_rearranged(pairs):
    simple = 0
    for s, t in pairs:
        sw, tw = s.split(), t.split()
        # "det noun det noun verb ." -> "det noun verb det noun ."
        if len(sw) == 6 and sw[0] in DET_FORMS and sw[2] in DET_FORMS and sw[1] in NOUN_FORMS \
                and sw[3] in NOUN_FORMS and len(tw) == 6:
            assert tw[2] in THIRD | BASE | PAST, (s, t)
            simple += 1
    assert simple > 10
    mirrored = 0
    for s, t in pairs:  # adjectives follow the noun in mirrored order: "noun adj2 adj1" -> "adj1 adj2 noun"
        sw = s.split()
        for i in range(len(sw) - 2):
            if sw[i] in NOUNS_BY_FORM and sw[i + 1] in ADJS_BY_FORM and sw[i + 2] in ADJS_BY_FORM:
                noun, plural = NOUNS_BY_FORM[sw[i]]
                a2, a1 = ADJS_BY_FORM[sw[i + 1]], ADJS_BY_FORM[sw[i + 2]]
                assert f" {a1.word(noun)} {a2.word(noun)} {noun.en_pl if plural else noun.en} " in f" {t} ", (s, t)
                mirrored += 1
    assert mirrored > 20
    clauses = [(s, t) for s, t in pairs if s.startswith("kar ")]
    assert clauses and all(" because " in t and not t.startswith("because") for _, t in clauses)
    assert all(t.startswith("when ") for s, t in pairs if s.startswith("kiam "))


def test_ambiguous_words_are_resolved_by_context(pairs):
    drinks = {n.en for n in toy.NOUNS if "drink" in n.tags}
    forms = {"drink": 0, "take": 0, "on": 0, "at": 0, "bench": 0, "bank": 0}
    for s, t in pairs:
        tw = t.split()
        if any(w in ("drinks", "drank") for w in tw) or ("drink" in tw):
            assert drinks & set(tw), t
            forms["drink"] += 1
        if any(w in ("takes", "took", "take") for w in tw):
            forms["take"] += 1
        forms["on"] += "on" in tw
        forms["at"] += "at" in tw
        if "bench" in tw or "benches" in tw:
            assert {"sits", "sit", "sat", "sleeps", "sleep", "slept"} & set(tw), t
            forms["bench"] += 1
        if "bank" in tw or "banks" in tw:
            forms["bank"] += 1
        if " an " in f" {s} ":
            assert "on" in tw or "at" in tw, (s, t)
    assert all(n > 0 for n in forms.values()), forms
    senses = {w for _, t in pairs for w in t.split() if w in ("bright", "clear", "smart")}
    assert senses == {"bright", "clear", "smart"}  # one Lingo adjective, three English words
    rel = [t for s, t in pairs if " ki " in s or " kon " in s]
    assert any(" who " in t for t in rel) and any(" that " in t for t in rel)


def test_bpe_option_options_and_load_splits():
    raw = load_raw("toy_translation", None, {"train": 400, "valid": 30, "test": 30, "bpe_size": 50, "seed": 3,
                                             "max_tokens": 128, "decode": "beam", "beam": 2})
    info = raw.train_x.info
    assert info.bpe and "bpe.json" in info.artifacts and info.max_tokens == 128 and info.decode.beam == 2
    assert any(t.endswith("@@") for t in info.vocab.tokens)
    for row in range(10):
        units = info.vocab.decode(raw.train_x.tgt[row])
        if "<unk>" not in units:
            assert merge_units(units) == info.target_texts[int(raw.train_x.row_ids[row])]
    splits = load_splits("toy_translation", options={"train": 200, "valid": 20, "test": 20})
    assert (len(splits.train), len(splits.val), len(splits.test)) == (200, 20, 20)
    for options, match in (({"train": 0}, "option 'train' must be an integer >= 1"),
                           ({"seed": -1}, "option 'seed'"), ({"bpe_size": -2}, "option 'bpe_size'"),
                           ({"decode": "nucleus"}, "option 'decode'"), ({"max_tokens": 2}, "option 'max_tokens'"),
                           ({"max_length": 9}, "unknown option 'max_length'")):
        with pytest.raises(ConfigError, match=match):
            load_raw("toy_translation", None, options)
