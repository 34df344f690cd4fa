"""lm_generate: cached greedy / sampling / beam search from hf_causal_lm models, against uncached references."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from teachkit.errors import ConfigError  # noqa: E402
from teachkit.models import FrozenTeacher, build_model  # noqa: E402
from teachkit.models.causal_lm import HFCausalLM, cache_names  # noqa: E402
from teachkit.models.lm_generate import (  # noqa: E402
    GenerateOptions,
    _filter,
    generate,
    generate_rows,
    left_pad,
    select_cache,
    sequence_logprob,
)

PAD, EOS = 0, 2
TINY = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 48}


def lively(family: str = "llama", vocab: int = 20, seed: int = 0, length: int = 6, **options) -> HFCausalLM:
    """A tiny random model with large weights, so that its greedy choices vary from step to step."""
    torch.manual_seed(seed)
    model = build_model("hf_causal_lm", (length,), vocab, family=family, **{**TINY, **options})
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.4)
    return model.eval()


def prompts(vocab: int = 20, lengths=(5, 2, 4), seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths) + 1), PAD, dtype=torch.int64)  # one extra pad column
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=g)
    return ids, torch.tensor(lengths)


@torch.no_grad()
def greedy_without_cache(model: HFCausalLM, prompt: list[int], steps: int, eos: int | None) -> list[int]:
    """Each step runs the whole prefix through the Hugging Face model (no cache, no padding) and takes the argmax."""
    seq, out = list(prompt), []
    for _ in range(steps):
        token = int(model.hf(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token == eos:
            break
    return out


def rows(out: torch.Tensor, eos: int) -> list[list[int]]:
    """Responses as lists, each through its first EOS."""
    result = []
    for row in out.tolist():
        result.append(row[:row.index(eos) + 1] if eos in row else row)
    return result


# --- greedy -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_equals_an_uncached_loop_on_prompts_of_different_lengths(family: str) -> None:
    model = lively(family)
    ids, lengths = prompts()
    free = generate(model, ids, lengths, GenerateOptions(max_new_tokens=7), eos_id=99, pad_id=PAD)  # no EOS
    expect = [greedy_without_cache(model, ids[i, :n].tolist(), 7, None) for i, n in enumerate(lengths.tolist())]
    assert free.shape == (3, 7) and free.dtype == torch.int64
    assert free.tolist() == expect
    assert len({tuple(r) for r in expect}) == 3 and sum(len(set(r)) > 1 for r in expect) >= 2  # not degenerate
    # EOS: a token row 0 makes at step 3 stops it there (and any other row at its first one); the rest is PAD
    eos = expect[0][3]
    out = generate(model, ids, lengths, GenerateOptions(max_new_tokens=7), eos_id=eos, pad_id=PAD)
    expect_eos = [greedy_without_cache(model, ids[i, :n].tolist(), 7, eos) for i, n in enumerate(lengths.tolist())]
    assert rows(out, eos) == [r[:r.index(eos) + 1] if eos in r else r for r in expect]
    assert rows(out, eos) == expect_eos
    assert out.shape[1] == max(len(r) for r in expect_eos)
    for i, r in enumerate(expect_eos):
        assert out[i, len(r):].eq(PAD).all()
        assert out[i, :len(r)].tolist() == r


def test_max_new_tokens_and_the_models_positions_limit_the_responses() -> None:
    model = lively()
    ids, lengths = prompts()
    for n in (1, 3):
        assert generate(model, ids, lengths, GenerateOptions(max_new_tokens=n), eos_id=99, pad_id=PAD).shape == (3, n)
    short = lively(max_positions=6)  # prompts of 5, 2, 4 tokens: room for 1, 4, 2 more
    short.hf.load_state_dict(lively().hf.state_dict())
    responses, total = generate_rows(short, ids, lengths, GenerateOptions(max_new_tokens=10), EOS, PAD, 3)
    assert [len(r) for r in responses] == [1, 4, 2] and total == 7
    full = generate(model, ids, lengths, GenerateOptions(max_new_tokens=4), eos_id=99, pad_id=PAD).tolist()
    assert responses == [full[0][:1], full[1], full[2][:2]]
    filled = torch.tensor([[5, 6, 7, 8, 9, 10]])
    assert generate(short, filled, torch.tensor([6]), GenerateOptions(), eos_id=EOS, pad_id=PAD).shape == (1, 0)
    with pytest.raises(ConfigError, match="set data.options.max_length to at most 6"):
        generate(short, torch.ones(1, 7, dtype=torch.long), torch.tensor([7]), GenerateOptions(), eos_id=EOS,
                 pad_id=PAD)


def test_generate_rows_keeps_the_row_order_and_counts_tokens() -> None:
    model = lively()
    ids, lengths = prompts(lengths=(5, 2, 4, 1, 3))
    opts = GenerateOptions(max_new_tokens=6)
    free = generate(model, ids, lengths, opts, eos_id=99, pad_id=PAD)[0].tolist()
    eos = free[2]
    one = generate(model, ids, lengths, opts, eos_id=eos, pad_id=PAD)
    for batch_size in (1, 2, 5):
        responses, total = generate_rows(model, ids, lengths, opts, eos, PAD, batch_size)
        assert responses == rows(one, eos)
        assert total == sum(len(r) for r in responses)
    assert responses[0][-1] == eos and len(responses[0]) == free.index(eos) + 1
    assert generate_rows(model, ids[:0], lengths[:0], opts, eos, PAD, 4) == ([], 0)
    with pytest.raises(ConfigError, match="batch_size 0 is not allowed"):
        generate_rows(model, ids, lengths, opts, eos, PAD, 0)


def test_wrappers_frozen_teacher_bf16_and_the_train_flag() -> None:
    model = lively()
    ids, lengths = prompts()
    opts = GenerateOptions(max_new_tokens=5)
    expect = generate(model, ids, lengths, opts, eos_id=99, pad_id=PAD)
    assert torch.equal(generate(FrozenTeacher(model), ids, lengths, opts, eos_id=99, pad_id=PAD), expect)
    assert torch.equal(generate(torch.compile(model), ids, lengths, opts, eos_id=99, pad_id=PAD), expect)
    model.train()
    generate(model, ids, lengths, opts, eos_id=99, pad_id=PAD)
    assert model.training and all(m.training for m in model.modules())
    low = lively(dtype="bfloat16")
    out = generate(FrozenTeacher(low), ids, lengths, GenerateOptions(strategy="beam", beam=2, max_new_tokens=4),
                   eos_id=99, pad_id=PAD)
    assert out.shape == (3, 4) and out.dtype == torch.int64
    assert next(low.parameters()).dtype == torch.bfloat16


# --- beam search --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_beam_width_one_is_greedy(family: str) -> None:
    model = lively(family)
    ids, lengths = prompts()
    greedy = generate(model, ids, lengths, GenerateOptions(max_new_tokens=6), eos_id=99, pad_id=PAD)
    eos = int(greedy[1, 2])
    for e in (99, eos):
        g = generate(model, ids, lengths, GenerateOptions(max_new_tokens=6), eos_id=e, pad_id=PAD)
        b = generate(model, ids, lengths, GenerateOptions(strategy="beam", beam=1, max_new_tokens=6), eos_id=e,
                     pad_id=PAD)
        assert torch.equal(b, g)


def score(model: HFCausalLM, prompt: list[int], response: list[int], penalty: float) -> float:
    return sequence_logprob(model, prompt, response) / len(response) ** penalty


def responses(model: HFCausalLM, ids: torch.Tensor, lengths: torch.Tensor, opts: GenerateOptions,
              eos: int) -> list[list[int]]:
    """Each row's response (PAD may be a generated token here: generate_rows knows where each ends)."""
    return generate_rows(model, ids, lengths, opts, eos, PAD, len(lengths))[0]


@pytest.mark.parametrize("penalty", [1.0, 0.0])
def test_wide_beam_search_finds_the_brute_force_best(penalty: float) -> None:
    # vocabulary of 4 (EOS = 2), at most 3 new tokens: every response is one of 4 + 12 + 36 ... enumerate them all
    model = lively(vocab=4, seed=1)
    ids, lengths = prompts(vocab=4, lengths=(3, 1, 2), seed=4)
    out = responses(model, ids, lengths, GenerateOptions(strategy="beam", beam=64, max_new_tokens=3,
                                                         length_penalty=penalty), EOS)
    for i, n in enumerate(lengths.tolist()):
        prompt = ids[i, :n].tolist()
        candidates = [list(c) + [EOS] for k in range(3) for c in itertools.product([0, 1, 3], repeat=k)]
        candidates += [list(c) for c in itertools.product([0, 1, 3], repeat=3)]  # cut at the limit
        scores = {tuple(c): score(model, prompt, c, penalty) for c in candidates}
        best = max(scores, key=scores.get)
        assert scores[tuple(out[i])] == pytest.approx(scores[best], abs=1e-9)


def test_beam_search_scores_at_least_greedy() -> None:
    model = lively(seed=2)
    ids, lengths = prompts(seed=5)
    opts = GenerateOptions(max_new_tokens=6)
    eos = int(generate(model, ids, lengths, opts, eos_id=99, pad_id=PAD)[0, 3])
    greedy = responses(model, ids, lengths, opts, eos)
    beam = responses(model, ids, lengths, GenerateOptions(strategy="beam", beam=4, max_new_tokens=6), eos)
    differ = 0
    for i, n in enumerate(lengths.tolist()):
        prompt = ids[i, :n].tolist()
        assert score(model, prompt, beam[i], 1.0) >= score(model, prompt, greedy[i], 1.0) - 1e-6
        differ += beam[i] != greedy[i]
    assert differ  # a case where the searches disagree


# --- sampling -------------------------------------------------------------------------------------------------

def test_sampling_is_reproducible_from_the_generator() -> None:
    model = lively()
    ids, lengths = prompts()
    opts = GenerateOptions(strategy="sample", max_new_tokens=8, temperature=1.5)

    def draw(seed: int) -> torch.Tensor:
        return generate(model, ids, lengths, opts, eos_id=99, pad_id=PAD,
                        generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    responses = generate_rows(model, ids, lengths, opts, 99, PAD, 2, torch.Generator().manual_seed(7))
    assert responses == generate_rows(model, ids, lengths, opts, 99, PAD, 2, torch.Generator().manual_seed(7))


@pytest.mark.parametrize("opts", [{"top_k": 1}, {"temperature": 1e-4}, {"top_p": 1e-6},
                                  {"top_k": 1, "temperature": 3.0, "top_p": 0.9}])
def test_degenerate_sampling_is_greedy(opts: dict) -> None:
    model = lively()
    ids, lengths = prompts()
    greedy = generate(model, ids, lengths, GenerateOptions(max_new_tokens=6), eos_id=99, pad_id=PAD)
    sampled = generate(model, ids, lengths, GenerateOptions(strategy="sample", max_new_tokens=6, **opts), eos_id=99,
                       pad_id=PAD, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, greedy)


def test_filters_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    inf = float("-inf")
    top_p = _filter(logits, GenerateOptions(strategy="sample", top_p=0.6))  # 0.5 < 0.6: the second token stays
    assert torch.isfinite(top_p).tolist() == [[True, True, False, False]]
    assert _filter(logits, GenerateOptions(strategy="sample", top_p=0.5))[0, 1] == inf  # 0.5 reaches 0.5
    top_k = _filter(logits, GenerateOptions(strategy="sample", top_k=3, temperature=2.0))
    torch.testing.assert_close(top_k[0, :3], logits[0, :3] / 2)
    assert top_k[0, 3] == inf
    probs = torch.softmax(_filter(logits, GenerateOptions(strategy="sample", top_k=2)), -1)
    torch.testing.assert_close(probs, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]]))


# --- pieces ---------------------------------------------------------------------------------------------------

def test_left_pad_by_hand() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]])
    left, mask = left_pad(ids, torch.tensor([3, 1, 4]), pad_id=9)
    assert left.tolist() == [[9, 5, 6, 7], [9, 9, 9, 8], [1, 2, 3, 4]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]]


def test_cache_keyword_compat() -> None:
    model = lively()
    keyword, field = cache_names(model.hf.base_model)
    import inspect

    params = inspect.signature(type(model.hf.base_model).forward).parameters
    assert keyword == field == ("cache" if "cache" in params else "past_key_values")
    out = model.hf.base_model(input_ids=torch.tensor([[3, 4]]), use_cache=True)
    assert getattr(out, field) is not None

    class Old(nn.Module):  # transformers 4.4x
        def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
            return input_ids

    class New(nn.Module):  # transformers 5.x
        def forward(self, input_ids, cache=None, attention_mask=None):
            return input_ids

    assert cache_names(Old()) == ("past_key_values", "past_key_values")
    assert cache_names(New()) == ("cache", "cache")


def test_select_cache_rows() -> None:
    legacy = tuple((torch.arange(6.0).view(3, 1, 2), -torch.arange(6.0).view(3, 1, 2)) for _ in range(2))
    picked = select_cache(legacy, torch.tensor([2, 0, 0]))
    assert picked[1][0][:, 0, 0].tolist() == [4.0, 0.0, 0.0] and picked[0][1][:, 0, 1].tolist() == [-5.0, -1.0, -1.0]
    model = lively()
    _, cache = model.decode_step(torch.tensor([[3, 4], [5, 6]]), torch.ones(2, 2, dtype=torch.long),
                                 torch.tensor([[0, 1], [0, 1]]))
    assert select_cache(cache, torch.tensor([1, 1, 0])) is cache and cache.get_seq_length() == 2
    with pytest.raises(TypeError, match="cannot select rows"):
        select_cache(object(), torch.tensor([0]))


@pytest.mark.parametrize(("options", "match"), [
    ({"strategy": "top"}, "strategy 'top' is not allowed; allowed: greedy, sample, beam"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 is not allowed: it must be an integer >= 1"),
    ({"max_new_tokens": 2.0}, "max_new_tokens=2.0"),
    ({"temperature": 0}, "temperature=0 is not allowed: it must be a number > 0"),
    ({"temperature": math.inf}, "temperature=inf"),
    ({"top_k": -1}, "top_k=-1 is not allowed"),
    ({"top_p": 0.0}, r"top_p=0.0 is not allowed: it must be a number in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"beam": 0}, "beam=0 is not allowed"),
    ({"beam": True}, "beam=True"),
    ({"length_penalty": "long"}, "length_penalty='long'"),
])
def test_bad_generate_options_are_one_line(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        GenerateOptions(**options)
    assert "\n" not in str(err.value)


def test_bad_calls() -> None:
    model = lively()
    with pytest.raises(ValueError, match="prompt lengths must be in"):
        generate(model, torch.ones(2, 3, dtype=torch.long), torch.tensor([0, 3]), GenerateOptions(), eos_id=EOS,
                 pad_id=PAD)
    with pytest.raises(TypeError, match="GenerateOptions"):
        generate(model, torch.ones(1, 3, dtype=torch.long), torch.tensor([3]), {"strategy": "greedy"}, eos_id=EOS,
                 pad_id=PAD)
    with pytest.raises(ConfigError, match="not a causal language model"):
        generate(nn.Linear(2, 2), torch.ones(1, 3, dtype=torch.long), torch.tensor([3]), GenerateOptions(),
                 eos_id=EOS, pad_id=PAD)
