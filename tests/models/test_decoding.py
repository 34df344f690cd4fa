"""Greedy and beam search through the Seq2Seq interface: valid outputs, beam 1 = greedy, scores, row order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teachkit.data.parallel import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    DecodeOptions,
    ParallelText,
    TranslationInfo,
    Vocab,
    shift_right,
)
from teachkit.errors import ConfigError
from teachkit.models import build_model
from teachkit.models.decoding import beam_search, greedy, length_limits, translate, translate_split
from teachkit.models.seq2seq import Seq2Seq
from tests.models.test_seq2seq_models import reverse_batch

V = 20
CONFIGS = {
    "luong": ("lstm_attn", {"hidden": 16, "embed_dim": 16}),
    "bahdanau": ("lstm_attn", {"hidden": 16, "embed_dim": 16, "attention": "bahdanau", "layers": 2}),
    "transformer": ("transformer_seq2seq", {"d_model": 16, "heads": 2, "ffn": 32, "encoder_layers": 2,
                                            "decoder_layers": 2}),
}


def make(kind: str, trained: bool) -> Seq2Seq:
    """The model of ``kind`` (built once per test session; tests leave it in eval mode)."""
    name, options = CONFIGS[kind]
    torch.manual_seed(0)
    model = build_model(name, (12,), V, **options, dropout=0.0)
    if trained:  # a little: outputs that end before the length limit, with real choices between tokens
        src, tgt = reverse_batch(64, seed=11)
        y = tgt[tgt != PAD].long()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2 if kind == "transformer" else 3e-2)
        for _ in range(60):
            loss = F.cross_entropy(model(src, shift_right(tgt)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="module", params=[(k, t) for k in CONFIGS for t in (False, True)],
                ids=lambda p: f"{p[0]}-{'trained' if p[1] else 'random'}")
def model(request) -> Seq2Seq:
    return make(*request.param)


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    return reverse_batch(7, seed=3)[0]


def check_valid(out: torch.Tensor, src: torch.Tensor, max_len_a: float, max_len_b: int) -> None:
    """Each row: tokens in range, no BOS/PAD before its single EOS, PAD after it, within the length limit."""
    assert out.dtype == torch.int64 and out.shape[0] == src.shape[0]
    limits = length_limits(src, max_len_a, max_len_b)
    for row, limit in zip(out.tolist(), limits.tolist(), strict=True):
        assert row.count(EOS) == 1
        end = row.index(EOS)
        assert all(4 <= t < V or t == 3 for t in row[:end]), row  # no PAD, BOS or EOS inside
        assert all(t == PAD for t in row[end + 1:])
        assert end <= limit
    assert (out[:, -1] != PAD).any()  # no all-PAD column at the end


# --- greedy ---------------------------------------------------------------------------------------------------

def test_greedy_valid(model, src) -> None:
    model.train()
    out = greedy(model, src)
    assert model.training  # the mode is restored
    model.eval()
    check_valid(out, src, 1.2, 10)


def test_greedy_forces_eos_at_the_limit(src) -> None:
    model = make("luong", trained=False)
    out = greedy(model, src, max_len_a=0.0, max_len_b=2)
    check_valid(out, src, 0.0, 2)
    assert out.shape[1] <= 3
    one = greedy(model, src, max_len_a=0.5, max_len_b=1)
    check_valid(one, src, 0.5, 1)


def test_trained_model_learns_to_stop(src) -> None:
    out = greedy(make("transformer", trained=True), src)
    check_valid(out, src, 1.2, 10)
    ends = (out == EOS).nonzero()[:, 1]
    assert (ends < length_limits(src, 1.2, 10)).sum() >= 3  # EOS chosen, not forced


# --- beam search ------------------------------------------------------------------------------------------------

def test_beam_one_is_greedy(model, src) -> None:
    g = greedy(model, src)
    hyps = beam_search(model, src, beam=1)
    assert len(hyps) == src.shape[0]
    for row, h in zip(g, hyps, strict=True):
        assert len(h) == 1
        assert torch.equal(h[0].tokens, row[row != PAD])
    assert torch.equal(translate(model, src, DecodeOptions("beam", beam=1)), g)


def test_beam_hypotheses_sorted_and_rescored(model, src) -> None:
    k, lp = 4, 0.7
    hyps = beam_search(model, src, beam=k, length_penalty=lp, n_best=k)
    limits = length_limits(src, 1.2, 10).tolist()
    for i, sentence in enumerate(hyps):
        assert 1 <= len(sentence) <= k
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        s = int((src[i] != PAD).sum())
        tokens = torch.stack([torch.nn.functional.pad(h.tokens, (0, 30 - len(h.tokens)), value=PAD)
                              for h in sentence])
        tgt_in = shift_right(tokens)
        with torch.no_grad():
            logp = torch.log_softmax(model(src[i:i + 1, :s].expand(len(sentence), s), tgt_in), dim=-1)
        picked = logp.gather(1, tokens[tokens != PAD][:, None]).squeeze(1)
        sums = torch.split(picked, [len(h.tokens) for h in sentence])
        for h, total in zip(sentence, sums, strict=True):
            assert h.tokens[-1] == EOS and (h.tokens[:-1] != EOS).all() and (h.tokens > BOS).all()
            assert len(h.tokens) <= limits[i] + 1
            assert abs(h.logprob - float(total.sum())) < 1e-4
            assert h.score == pytest.approx(h.logprob / len(h.tokens) ** lp)
    best = beam_search(model, src, beam=k, length_penalty=lp)
    assert [len(b) for b in best] == [1] * src.shape[0]
    assert all(torch.equal(b[0].tokens, h[0].tokens) for b, h in zip(best, hyps, strict=True))


def test_beam_search_is_at_least_as_good_as_greedy() -> None:
    model = make("transformer", trained=True)
    src = reverse_batch(7, seed=3)[0]
    g = greedy(model, src)
    hyps = beam_search(model, src, beam=5, length_penalty=0.0)  # score = logprob
    for i, row in enumerate(g):
        tokens = row[row != PAD]
        s = int((src[i] != PAD).sum())
        with torch.no_grad():
            logp = torch.log_softmax(model(src[i:i + 1, :s], shift_right(tokens[None])), dim=-1)
        greedy_logprob = float(logp.gather(1, tokens[:, None]).sum())
        assert hyps[i][0].logprob >= greedy_logprob - 1e-4


# --- translate ----------------------------------------------------------------------------------------------------

def test_translate_beam_pads_the_best(src) -> None:
    model = make("bahdanau", trained=True)
    out = translate(model, src, DecodeOptions("beam", beam=3, length_penalty=1.0))
    check_valid(out, src, 1.2, 10)
    best = beam_search(model, src, beam=3)
    for row, h in zip(out, best, strict=True):
        assert torch.equal(row[row != PAD], h[0].tokens)


@pytest.mark.parametrize("options", [DecodeOptions(), DecodeOptions("beam", beam=3)], ids=["greedy", "beam"])
def test_translate_split_keeps_row_order(options) -> None:
    model = make("luong", trained=True)
    src, tgt = reverse_batch(11, seed=8, min_len=1, max_len=7)
    vocab = Vocab((*SPECIALS, *[f"w{i}" for i in range(V - len(SPECIALS))]))
    x = ParallelText(src, tgt, torch.arange(11), TranslationInfo(vocab))
    model.train()
    got = translate_split(model, x, options, batch_size=4)
    assert model.training
    model.eval()
    assert len(got) == 11
    for i in range(11):
        alone = translate(model, x.rows(i).src, options)[0].tolist()
        assert got[i] == alone[:alone.index(EOS)]
        assert EOS not in got[i] and PAD not in got[i]


# --- bad options ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda m, s: beam_search(m, s, beam=0), "beam width 0"),
    (lambda m, s: beam_search(m, s, beam=2, n_best=3), "n_best=3"),
    (lambda m, s: beam_search(m, s, beam=2.5), "beam width 2.5"),
    (lambda m, s: greedy(m, s, max_len_a=-1.0), "max_len_a=-1.0"),
    (lambda m, s: greedy(m, s, max_len_b=1.5), "max_len_b=1.5"),
])
def test_bad_options_are_one_line(call, words, src) -> None:
    model = make("luong", trained=False)
    with pytest.raises(ConfigError, match=words) as info:
        call(model, src)
    assert "\n" not in str(info.value)


def test_bad_batch_size(src) -> None:
    model = make("luong", trained=False)
    x = ParallelText(src, src, torch.arange(src.shape[0]), TranslationInfo(Vocab(SPECIALS)))
    with pytest.raises(ConfigError, match="batch_size 0"):
        translate_split(model, x, DecodeOptions(), batch_size=0)
