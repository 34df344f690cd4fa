"""The addition task (teachkit.data.addition): deterministic with global RNGs untouched, disjoint splits with a test
split independent of the train size, correct (and reversed) answers as response-only targets, a fixed
vocabulary, an optional teacher tokenisation, and load_splits."""

from __future__ import annotations

import random

import pytest
import torch

from teachkit.data import addition as add
from teachkit.data import lm_tokenizers as lmt
from teachkit.data import load_raw, load_splits
from teachkit.errors import ConfigError

SMALL = {"train": 300, "valid": 50, "test": 80}


def problems(x):
    """(prompt text, response text) of every row."""
    tok = x.info.tokenizer
    return [(tok.decode(x.ids[i, :x.starts[i]], skip_special_tokens=True),
             tok.decode(x.ids[i, x.starts[i]:x.lengths[i]], skip_special_tokens=True)) for i in range(x.num_rows)]


def test_deterministic_and_global_rngs_left_alone():
    state, torch_state = random.getstate(), torch.get_rng_state()
    a = load_raw("addition", None, SMALL)
    b = load_raw("addition", None, SMALL)
    assert random.getstate() == state and torch.equal(torch.get_rng_state(), torch_state)
    for (_, xa, ya), (_, xb, yb) in zip(a.parts(), b.parts(), strict=True):
        assert torch.equal(xa.ids, xb.ids) and torch.equal(ya, yb)
    assert a.train_x.info.references == b.train_x.info.references
    assert not torch.equal(load_raw("addition", None, {**SMALL, "seed": 1}).test_x.ids, a.test_x.ids)


def test_splits_share_no_prompt_and_test_does_not_depend_on_train_size():
    raw = load_raw("addition", None, SMALL)
    prompts = [[p for p, _ in problems(x)] for x in (raw.train_x, raw.val_x, raw.test_x)]
    assert [len(set(p)) for p in prompts] == [300, 50, 80]  # no repeat within a split either
    assert not (set(prompts[0]) & set(prompts[1])) and not (set(prompts[0]) & set(prompts[2]))
    assert not (set(prompts[1]) & set(prompts[2]))
    bigger = load_raw("addition", None, {**SMALL, "train": 900})
    assert torch.equal(bigger.test_x.ids, raw.test_x.ids) and torch.equal(bigger.val_x.ids, raw.val_x.ids)
    pairs = add.draw_pairs({"test": 5, "val": 5, "train": 5}, 3, 0)
    assert all(0 <= a < 1000 and 0 <= b < 1000 for part in pairs.values() for a, b in part)


@pytest.mark.parametrize("reverse", [False, True])
def test_answers_are_correct_and_the_only_targets(reverse):
    raw = load_raw("addition", None, {**SMALL, "digits": 4, "reverse": reverse})
    x = raw.train_x
    for i, (prompt, response) in enumerate(problems(x)):
        a, b = (int(v) for v in prompt.rstrip("=").split("+"))
        want = str(a + b)[::-1] if reverse else str(a + b)
        assert response == want == x.info.references[x.row_ids[i]] == add.answer(a, b, reverse)
        assert int(x.ids[i, 0]) == 1 and int(x.ids[i, x.lengths[i] - 1]) == 2  # BOS ... EOS
    assert add.answer(123, 459, reverse=True) == "285"
    targets = x.token_targets()
    assert targets.numel() == int(x.tgt_lengths().sum()) and x.info.text(targets[:x.tgt_lengths()[0]]) == \
        problems(x)[0][1]
    assert x.info.max_length == 4 * 3 + 5 >= int(x.lengths.max()) and x.info.max_new_tokens == 6
    assert x.info.kind == "prompt_response" and raw.task == "causal_lm"


def test_the_vocabulary_is_fixed():
    a = load_raw("addition", None, SMALL).train_x
    b = load_raw("addition", None, {**SMALL, "seed": 5, "digits": 1, "train": 20, "valid": 5, "test": 5}).train_x
    assert a.vocabulary_digest == b.vocabulary_digest == lmt.vocab_digest(lmt.char_tokenizer([add.ALPHABET]))
    vocab = a.info.tokenizer.get_vocab()
    assert [vocab[c] for c in "+0123456789="] == list(range(4, 16)) and len(a.info.tokenizer) == 16
    assert "tokenizer.json" in a.artifacts and a.info.tokenizers[""]["name"] == "char"


def test_a_teacher_tokenisation_of_the_same_rows():
    x = load_raw("addition", None, {**SMALL, "teacher_tokenizer": "byte"}).train_x
    teacher = x.info.teacher_tokenizer
    for i in range(5):
        student_text = x.info.tokenizer.decode(x.ids[i, :x.lengths[i]], skip_special_tokens=True)
        assert teacher.decode(x.t_ids[i, :x.t_lengths[i]], skip_special_tokens=True) == student_text
    assert torch.equal(x.t_starts, x.starts) and x.info.tokenizers["teacher."]["name"] == "byte"
    assert x.teacher_tgt_lengths().tolist() == x.tgt_lengths().tolist()


def test_options_are_checked():
    with pytest.raises(ConfigError, match="only 100"):
        load_raw("addition", None, {"digits": 1, "train": 90, "valid": 10, "test": 10})
    with pytest.raises(ConfigError, match="option 'reverse' must be true or false"):
        load_raw("addition", None, {**SMALL, "reverse": "yes"})
    with pytest.raises(ConfigError, match="option 'digits' must be an integer >= 1"):
        load_raw("addition", None, {"digits": 0})
    with pytest.raises(ConfigError, match="option 'max_tokens' must be an integer >= 14"):
        load_raw("addition", None, {**SMALL, "max_tokens": 4})


def test_load_splits():
    s = load_splits("addition", options=SMALL, train_subset=100)
    assert s.task == "causal_lm" and len(s.train) == 100 and len(s.val) == 50 and len(s.test) == 80
    loader = s.train.x.batch_source(32, True, 0)
    batch = next(iter(loader.batches(0)))
    assert torch.equal(batch.y, batch.x.token_targets()) and len(loader) == 4


def test_padded_rows_put_every_digit_at_a_fixed_position():
    raw = load_raw("addition", None, {**SMALL, "pad": True, "reverse": True})
    x = raw.train_x
    for prompt, response in problems(x)[:50]:
        a, b = (int(v) for v in prompt.rstrip("=").split("+"))
        assert len(prompt) == 8 and len(response) == 4 and response == str(a + b).zfill(4)[::-1]
    assert set(x.lengths.tolist()) == {14} and set(x.starts.tolist()) == {9}  # BOS + 8 + 4 digits + EOS
    assert add.prompt(7, 45, 3) == "007+045=" and add.answer(7, 45, False, 4) == "0052"


def test_label_noise_changes_one_training_digit_and_leaves_val_and_test_clean():
    clean = load_raw("addition", None, {**SMALL, "pad": True})
    noisy = load_raw("addition", None, {**SMALL, "pad": True, "noise": 0.3})
    before, after = problems(clean.train_x), problems(noisy.train_x)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert len(changed) == round(0.3 * 300) and noisy.train_x.info.notes["noise"].startswith("90 training answers")
    for (p1, r1), (p2, r2) in changed:
        assert p1 == p2 and len(r1) == len(r2) and sum(c != d for c, d in zip(r1, r2, strict=True)) == 1
    for part in ("val_x", "test_x"):
        assert torch.equal(getattr(clean, part).ids, getattr(noisy, part).ids)
    again = load_raw("addition", None, {**SMALL, "pad": True, "noise": 0.3})
    assert torch.equal(again.train_x.ids, noisy.train_x.ids)
    with pytest.raises(ConfigError, match="option 'noise' must be a fraction in \\[0, 1\\)"):
        load_raw("addition", None, {**SMALL, "noise": 1.0})


def test_another_tokenizer_for_the_student():
    x = load_raw("addition", None, {**SMALL, "tokenizer": "byte"}).train_x
    assert x.info.tokenizers[""]["name"] == "byte" and len(x.info.tokenizer) == 260
    assert problems(x)[:3] == problems(load_raw("addition", None, SMALL).train_x)[:3]
