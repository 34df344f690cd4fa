"""Translation: BLEU conventions, word-level KD on packed token logits, the evaluator, and end-to-end runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teachkit.data.parallel import merge_units
from teachkit.losses import build_objective
from teachkit.losses.kd import HintonKD
from teachkit.tasks.translation import Detokenizer, corpus_bleu
from teachkit.types import Batch, Progress, Taps

REFS = ["the cat sat on the mat .", "a dog , however , didn 't .", "we 're going to the zoo tomorrow !"]


def test_bleu_of_references_against_themselves_is_100_both_ways():
    detok = Detokenizer("en")
    assert corpus_bleu(REFS, REFS, tokenised=True) == pytest.approx(100.0)
    assert corpus_bleu([detok(r) for r in REFS], [detok(r) for r in REFS], tokenised=False) == pytest.approx(100.0)


def test_tokenised_bleu_is_case_insensitive_and_detokenised_bleu_sees_moses_detokenisation():
    detok = Detokenizer("en")
    assert detok("a dog , however , didn 't .") == "a dog, however, didn't."
    assert corpus_bleu([r.upper() for r in REFS], REFS, tokenised=True) == pytest.approx(100.0)
    worse = corpus_bleu(["the cat sat on a hat .", *REFS[1:]], REFS, tokenised=True)
    assert 0 < worse < 100


def test_bpe_units_merge_back_to_tokenised_text():
    assert merge_units(["the", "c@@", "at", "s@@", "a@@", "t", "."]) == "the cat sat ."
    assert merge_units(["tail@@"]) == "tail"


def test_word_level_kd_equals_ce_when_the_teacher_is_one_hot():
    """Kim & Rush's word-level KD with a one-hot teacher is the NLL of the gold token: the ``kd`` loss on packed
    per-token logits (T = 1) and the mixed objective (1 - alpha) CE + alpha KD both equal CE exactly."""
    g = torch.Generator().manual_seed(0)
    tokens, vocab = 37, 50
    student = torch.randn(tokens, vocab, generator=g, dtype=torch.float64)
    gold = torch.randint(0, vocab, (tokens,), generator=g)
    teacher = F.one_hot(gold, vocab).double() * 1e4  # softmax is exactly one-hot in float64
    ce = F.cross_entropy(student, gold)
    batch = Batch({"src_ids": torch.zeros(4, 3)}, gold, torch.arange(4))
    progress = Progress(0, 0, 1, 1)
    kd = HintonKD(options=None)
    kd.temperature = 1.0
    torch.testing.assert_close(kd(Taps(student), Taps(teacher), batch, progress)["kl"], ce, rtol=1e-12, atol=1e-12)
    objective = build_objective("kd", Taps(student), Taps(teacher), num_classes=vocab, num_samples=4, alpha=0.5,
                                temperature=1.0)
    terms = objective(Taps(student), Taps(teacher), batch, progress)
    torch.testing.assert_close(sum(terms.values()), ce, rtol=1e-12, atol=1e-12)
    # a softer teacher is not CE: the test above can fail
    soft = kd(Taps(student), Taps(torch.randn(tokens, vocab, generator=g, dtype=torch.float64)), batch, progress)
    assert not torch.allclose(soft["kl"], ce)
