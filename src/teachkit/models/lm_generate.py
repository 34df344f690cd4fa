"""Batched generation from a causal LM (:class:`~teachkit.models.causal_lm.HFCausalLM`) with the key/value cache:
greedy search, sampling (temperature, top-k, top-p: Holtzman et al. 2020) and beam search.

Prompts come right-padded (how :meth:`teachkit.data.lm.LMText.prompts` gives them) and are left-padded
internally, so every row's last prompt token is the last column; position ids count each row's real tokens
(the attention mask's running sum), so a row's positions do not depend on its padding, and the whole batch
advances one token per step through the cache (the prefix is never recomputed).

Conventions:

- a response holds the generated tokens, no prompt; it ends with EOS when the model produced one within the
  limit, then pad_id; no token is banned and EOS is never forced (a row cut at its limit has no EOS);
- a row generates at most ``max_new_tokens`` tokens, and at most ``max_positions - prompt length`` (so prompt and
  response fit the model's positions; a prompt filling them gets an empty response);
- beam search follows :mod:`teachkit.models.decoding` (fairseq's conventions, Ott et al. 2019): the best 2K
  candidates of a prompt's K beams each step; EOS candidates among the first K become finished hypotheses while
  the prompt needs them, the best K others continue; a finished hypothesis scores ``logprob / len **
  length_penalty`` with ``len`` counting its EOS; at a row's length limit its best continuing beams finish
  without EOS (len = the limit); the best score wins. Beam width 1 is greedy search;
- sampling draws with ``torch.multinomial`` from the given ``torch.Generator``: the same generator state and
  the same batch give the same samples.

Everything runs in eval mode under ``torch.no_grad`` (the model's train/eval flag restored) on an
:class:`HFCausalLM`, a FrozenTeacher holding one (bf16 weights: logits taken in float32), or a DDP /
torch.compile wrapper of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.models.causal_lm import HFCausalLM, causal_lm_of, positions_from_mask
from teachkit.models.decoding import inference, model_device
from teachkit.options import short_repr

__all__ = ["STRATEGIES", "GenerateOptions", "generate", "generate_rows", "left_pad", "select_cache", "sequence_logprob"]

STRATEGIES = ("greedy", "sample", "beam")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GenerateOptions:
    """How to generate: ``strategy`` (greedy, sample, beam), at most ``max_new_tokens`` tokens per response;
    sampling's ``temperature`` (> 0), ``top_k`` (0: no cut) and ``top_p`` (1: no cut); beam search's ``beam``
    width and ``length_penalty`` (the exponent of the length normaliser)."""

    strategy: str = "greedy"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    beam: int = 4
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"generation strategy {short_repr(self.strategy)} is not allowed; allowed: "
                              f"{', '.join(STRATEGIES)}")
        checks = (("max_new_tokens", _integer(self.max_new_tokens) and self.max_new_tokens >= 1, "an integer >= 1"),
                  ("temperature", _number(self.temperature) and self.temperature > 0, "a number > 0"),
                  ("top_k", _integer(self.top_k) and self.top_k >= 0, "an integer >= 0 (0: no cut)"),
                  ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1] (1: no cut)"),
                  ("beam", _integer(self.beam) and self.beam >= 1, "an integer >= 1"),
                  ("length_penalty", _number(self.length_penalty), "a finite number"))
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"generation option {name}={short_repr(getattr(self, name))} is not allowed: it "
                                  f"must be {allowed}")


# -- helpers ------------------------------------------------------------------------------------------------
def left_pad(ids: Tensor, lengths: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded ``ids`` (B, P) with ``lengths`` (B,) real tokens as left-padded (B, W) ids (W the longest
    length) and their attention mask (B, W) int64."""
    width = int(lengths.max()) if lengths.numel() else 0
    col = torch.arange(width, device=ids.device)[None, :] - (width - lengths)[:, None]
    real = col >= 0
    gathered = ids[:, :width].gather(1, col.clamp(min=0)) if width else ids[:, :0]
    return gathered.masked_fill(~real, pad_id), real.long()


def select_cache(cache: Any, index: Tensor) -> Any:
    """The key/value cache of the rows ``index`` (any order, repeats allowed): a ``transformers`` Cache
    (``reorder_cache``, in place) or the legacy tuple of (key, value) per layer."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    if isinstance(cache, (tuple, list)):
        return tuple(tuple(t.index_select(0, index.to(t.device)) for t in layer) for layer in cache)
    raise TypeError(f"cannot select rows of a {type(cache).__name__} key/value cache")


def _filter(logits: Tensor, options: GenerateOptions) -> Tensor:
    """Sampling logits (R, V) float32: divided by the temperature, then top-k and top-p (nucleus: the smallest
    set of most likely tokens whose probability reaches ``top_p``; the most likely token always stays) cuts."""
    logits = logits / options.temperature
    if 0 < options.top_k < logits.shape[-1]:
        kth = logits.topk(options.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if options.top_p < 1.0:
        ordered, index = logits.sort(dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= options.top_p
        logits = logits.masked_fill(drop.scatter(1, index, drop), float("-inf"))
    return logits


def _choose(logits: Tensor, options: GenerateOptions, generator: torch.Generator | None) -> Tensor:
    """The next token of each row (R,): the argmax (greedy) or a draw from the filtered distribution."""
    if options.strategy == "greedy":
        return logits.argmax(dim=-1)
    probs = torch.softmax(_filter(logits, options), dim=-1)
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).view(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).view(-1)


class _Decoder:
    """The rows being decoded: their attention mask, last position and cache; ``step`` feeds one token each."""

    def __init__(self, lm: HFCausalLM, ids: Tensor, mask: Tensor) -> None:
        self.lm, self.mask = lm, mask
        positions = positions_from_mask(mask)
        self.logits, self.cache = lm.decode_step(ids, mask, positions, None)
        self.last = positions[:, -1]

    def select(self, index: Tensor) -> None:
        self.cache = select_cache(self.cache, index)
        self.mask, self.last, self.logits = self.mask[index], self.last[index], self.logits[index]

    def step(self, tokens: Tensor) -> None:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        self.last = self.last + 1
        self.logits, self.cache = self.lm.decode_step(tokens[:, None], self.mask, self.last[:, None], self.cache)


def _sample(lm: HFCausalLM, ids: Tensor, mask: Tensor, limits: Tensor, options: GenerateOptions, eos_id: int,
            pad_id: int, generator: torch.Generator | None) -> Tensor:
    """Greedy or sampled responses (B, T) of left-padded prompts; finished rows leave the batch (their cache
    rows dropped) once a quarter of the rows in it are done."""
    b, device = ids.shape[0], ids.device
    out = torch.full((b, int(limits.max())), pad_id, dtype=torch.long, device=device)
    dec = _Decoder(lm, ids, mask)
    rows = torch.arange(b, device=device)  # the original row of each row in the batch
    done = torch.zeros(b, dtype=torch.bool, device=device)
    for t in range(out.shape[1]):
        tokens = _choose(dec.logits, options, generator).masked_fill(done, pad_id)
        out[rows, t] = tokens
        done = done | (tokens == eos_id) | (limits[rows] <= t + 1)
        if bool(done.all()):
            break
        if int(done.sum()) * 4 >= done.numel():
            keep = (~done).nonzero().view(-1)
            dec.select(keep)
            rows, tokens, done = rows[keep], tokens[keep], done[keep]
        dec.step(tokens)
    return out


def _beam(lm: HFCausalLM, ids: Tensor, mask: Tensor, limits: Tensor, options: GenerateOptions, eos_id: int,
          pad_id: int) -> Tensor:
    """Beam search (module docstring) over left-padded prompts: (B, T) best responses."""
    b, k, device = ids.shape[0], options.beam, ids.device
    dec = _Decoder(lm, ids, mask)
    dec.select(torch.arange(b, device=device).repeat_interleave(k))  # the prompt is encoded once
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    alive = torch.arange(b, device=device)
    count = torch.zeros(b, dtype=torch.long, device=device)
    cum = torch.full((b, k), float("-inf"), dtype=torch.float64, device=device)
    cum[:, 0] = 0.0  # one live beam per prompt at the start
    history = torch.empty(b * k, 0, dtype=torch.long, device=device)
    step = 0
    while True:
        n = alive.shape[0]
        logp = torch.log_softmax(dec.logits, dim=-1).to(torch.float64)
        v = logp.shape[-1]
        top, index = (cum[:, :, None] + logp.view(n, k, v)).view(n, k * v).topk(min(2 * k, k * v), dim=1)
        parent, token = index // v, index % v
        is_eos = token == eos_id
        norm = float(step + 1) ** options.length_penalty
        ended = is_eos[:, :k] & torch.isfinite(top[:, :k])
        ended &= ended.cumsum(dim=1) <= (k - count[alive])[:, None]
        _record(finished, alive, ended, history, parent[:, :k], token[:, :k], top[:, :k], k, norm)
        count[alive] += ended.sum(dim=1)
        keep_order = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :k]
        next_score, next_parent, next_token = (t.gather(1, keep_order) for t in (top, parent, token))
        at_limit = limits[alive] <= step + 1
        if bool(at_limit.any()):  # the best continuing beams finish without EOS
            cut = at_limit[:, None] & torch.isfinite(next_score)
            cut &= cut.cumsum(dim=1) <= (k - count[alive])[:, None]
            _record(finished, alive, cut, history, next_parent, next_token, next_score, k, norm)
            count[alive] += cut.sum(dim=1)
        done = (count[alive] >= k) | at_limit | ~torch.isfinite(next_score[:, 0])
        if bool(done.all()):
            break
        live = ~done
        rows = (torch.arange(n, device=device)[:, None] * k + next_parent)[live].view(-1)
        history = torch.cat([history[rows], next_token[live].view(-1, 1)], dim=1)
        cum, alive = next_score[live], alive[live]
        dec.select(rows)
        dec.step(next_token[live].view(-1))
        step += 1
    best = [max(hyps, key=lambda h: h[0])[1] if hyps else [] for hyps in finished]
    out = torch.full((b, max(len(r) for r in best)), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(best):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long, device=device)
    return out


def _record(finished: list[list[tuple[float, list[int]]]], alive: Tensor, chosen: Tensor, history: Tensor,
            parent: Tensor, token: Tensor, score: Tensor, k: int, norm: float) -> None:
    """Add the ``chosen`` candidates (n, C) as finished hypotheses: their beam's history plus their token,
    scored ``logprob / norm``."""
    if not bool(chosen.any()):
        return
    i, j = chosen.nonzero(as_tuple=True)
    sequences = torch.cat([history[i * k + parent[i, j]], token[i, j][:, None]], dim=1).tolist()
    for s, seq, logprob in zip(alive[i].tolist(), sequences, score[i, j].tolist(), strict=True):
        finished[s].append((logprob / norm, seq))


# -- the entry points ---------------------------------------------------------------------------------------
def _check_prompts(prompt_ids: Tensor, prompt_lengths: Tensor) -> None:
    if prompt_ids.dim() != 2 or prompt_lengths.dim() != 1 or prompt_lengths.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"generate needs prompt_ids (B, P) and prompt_lengths (B,); got "
                         f"{tuple(prompt_ids.shape)} and {tuple(prompt_lengths.shape)}")
    if prompt_lengths.numel() and (int(prompt_lengths.min()) < 1 or int(prompt_lengths.max()) > prompt_ids.shape[1]):
        raise ValueError(f"prompt lengths must be in [1, {prompt_ids.shape[1]}] (every prompt has a token); got "
                         f"{int(prompt_lengths.min())}..{int(prompt_lengths.max())}")


def _generate(model: torch.nn.Module, prompt_ids: Tensor, prompt_lengths: Tensor, options: GenerateOptions,
              eos_id: int, pad_id: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """(responses (B, T) int64 padded with pad_id, tokens generated per row (B,))."""
    if not isinstance(options, GenerateOptions):
        raise TypeError(f"generate takes GenerateOptions; got {type(options).__name__}")
    _check_prompts(prompt_ids, prompt_lengths)
    lm = causal_lm_of(model)
    device = model_device(lm, prompt_ids.device)
    ids, lengths = prompt_ids.to(device).long(), prompt_lengths.to(device).long()
    b = ids.shape[0]
    limits = torch.full_like(lengths, options.max_new_tokens)
    if lm.max_tokens is not None:
        if b and int(lengths.max()) > lm.max_tokens:
            lm.check_length(int(lengths.max()))
        limits = torch.minimum(limits, lm.max_tokens - lengths)
    out = torch.full((b, 0), pad_id, dtype=torch.long, device=device)
    todo = (limits > 0).nonzero().view(-1)
    if todo.numel():
        left, mask = left_pad(ids[todo], lengths[todo], pad_id)
        with inference(lm):
            if options.strategy == "beam":
                part = _beam(lm, left, mask, limits[todo], options, eos_id, pad_id)
            else:
                part = _sample(lm, left, mask, limits[todo], options, eos_id, pad_id, generator)
        out = torch.full((b, part.shape[1]), pad_id, dtype=torch.long, device=device)
        out[todo] = part
    counts = _counts(out, eos_id, limits)
    return out[:, :int(counts.max()) if b else 0], counts


def _counts(out: Tensor, eos_id: int, limits: Tensor) -> Tensor:
    """Tokens per response: through the first EOS, else the row's limit (within the width of ``out``)."""
    width = out.shape[1]
    if not width:
        return torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
    is_eos = out == eos_id
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, torch.full_like(limits, width))
    return torch.minimum(first, limits.clamp(min=0))


def generate(model: torch.nn.Module, prompt_ids: Tensor, prompt_lengths: Tensor, options: GenerateOptions, *,
             eos_id: int, pad_id: int, generator: torch.Generator | None = None) -> Tensor:
    """Responses (B, T) int64 on the model's device to right-padded ``prompt_ids`` (B, P) with ``prompt_lengths``
    (B,) real tokens: each its tokens (EOS last when produced), then ``pad_id`` (module docstring)."""
    return _generate(model, prompt_ids, prompt_lengths, options, eos_id, pad_id, generator)[0]


def generate_rows(model: torch.nn.Module, prompts: Tensor, prompt_lengths: Tensor, options: GenerateOptions,
                  eos_id: int, pad_id: int, batch_size: int,
                  generator: torch.Generator | None = None) -> tuple[list[list[int]], int]:
    """Responses to many prompts, ``batch_size`` rows at a time (rows sorted by prompt length so a batch holds
    similar lengths): per row, in the original order, its tokens (ending with EOS when one was generated), and the
    number of tokens generated in all (for tokens/s)."""
    if not _integer(batch_size) or batch_size < 1:
        raise ConfigError(f"generation batch_size {short_repr(batch_size)} is not allowed: it must be an integer >= 1")
    _check_prompts(prompts, prompt_lengths)
    lengths = prompt_lengths.long().cpu()
    order = torch.sort(lengths, stable=True).indices
    results: list[list[int]] = [[] for _ in range(prompts.shape[0])]
    total = 0
    for first in range(0, len(results), batch_size):
        index = order[first:first + batch_size]
        width = int(lengths[index].max())
        rows = prompts[index.to(prompts.device), :width]
        out, counts = _generate(model, rows, lengths[index], options, eos_id, pad_id, generator)
        for i, row, n in zip(index.tolist(), out.tolist(), counts.tolist(), strict=True):
            results[i] = row[:n]
            total += n
    return results, total


def sequence_logprob(model: torch.nn.Module, prompt: Sequence[int], response: Sequence[int]) -> float:
    """The sum of the model's log-probabilities of ``response`` after ``prompt`` (one row, no cache), in eval mode:
    what beam search maximises (before length normalisation); for tests and debugging."""
    lm = causal_lm_of(model)
    device = model_device(lm, torch.device("cpu"))
    ids = torch.tensor([list(prompt) + list(response)], dtype=torch.long, device=device)
    with inference(lm):
        logits = lm(input_ids=ids).float()[0, len(prompt) - 1:-1]
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp.gather(1, torch.tensor(list(response), device=device)[:, None]).sum())
