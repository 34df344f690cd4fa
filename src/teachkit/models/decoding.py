"""Batched incremental decoding of any :class:`~teachkit.models.seq2seq.Seq2Seq` model: greedy search and beam
search, through the model's ``encode`` / ``start`` / ``step`` / ``reorder`` interface only (the prefix is never
recomputed).

Conventions (fairseq's, Ott et al. 2019):

- outputs hold the generated tokens ending with EOS, no BOS; padded outputs have PAD after the EOS;
- a sentence of source length n (its non-PAD tokens, its EOS included) gets at most
  ``floor(max_len_a * n + max_len_b)`` tokens before its EOS: at that step EOS is forced;
- PAD and BOS are never generated; EOS may come first (an empty translation; there is no minimum length);
- beam search scores a finished hypothesis by ``logprob / len ** length_penalty`` with ``len`` counting the EOS;
  each step it takes the best 2K candidates of the K beams of a sentence; EOS candidates among the first K
  become finished hypotheses while the sentence needs them, the best K others continue; a sentence is done with
  K finished hypotheses, or at its length limit. Beam width 1 is greedy search.

Every function runs the model in eval mode under ``torch.no_grad`` and restores its train/eval flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from teachkit.data.parallel import BOS, EOS, PAD, DecodeOptions, ParallelText
from teachkit.errors import ConfigError
from teachkit.options import short_repr

__all__ = ["Hypothesis", "beam_search", "greedy", "inference", "length_limits", "model_device", "translate",
           "translate_split"]


@dataclass
class Hypothesis:
    """A finished beam-search hypothesis: ``tokens`` (L,) ending with EOS, ``logprob`` the sum of its token
    log-probabilities, ``score`` = logprob / L ** length_penalty."""

    tokens: Tensor
    score: float
    logprob: float


@contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """Eval mode and no_grad for the block; the model's train/eval flag restored after."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was)


def model_device(model: nn.Module, default: torch.device) -> torch.device:
    """The device of the model's parameters (``default`` for a model without any)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else default


def _check_lengths(max_len_a: float, max_len_b: int) -> None:
    if isinstance(max_len_a, bool) or not isinstance(max_len_a, (int, float)) or max_len_a < 0 or \
            isinstance(max_len_b, bool) or not isinstance(max_len_b, int) or max_len_b < 0:
        raise ConfigError(f"decoding length limit max_len_a={short_repr(max_len_a)}, max_len_b={short_repr(max_len_b)}"
                          " is not allowed: max_len_a must be a number >= 0 and max_len_b an integer >= 0")


def length_limits(src_ids: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """(B,) int64: the most tokens each sentence may generate before its EOS, floor(a * n + b) with n its
    non-PAD source length."""
    n = (src_ids != PAD).sum(dim=1).to(torch.float64)
    return torch.floor(n * float(max_len_a) + float(max_len_b)).long()


def _constrain(logp: Tensor, step: int, limits: Tensor) -> Tensor:
    """Log-probabilities (R, V) in float32 with PAD and BOS banned and EOS forced on rows whose ``limits``
    (R,) are reached at this ``step``."""
    logp = logp.float()
    vocab = torch.arange(logp.shape[-1], device=logp.device)
    banned = ((vocab == PAD) | (vocab == BOS))[None, :]
    forced = (limits <= step)[:, None] & (vocab != EOS)[None, :]
    return logp.masked_fill(banned | forced, float("-inf"))


def greedy(model: nn.Module, src_ids: Tensor, max_len_a: float = 1.2, max_len_b: int = 10) -> Tensor:
    """Greedy decoding of a source batch (B, S): (B, L) int64 on the model's device, each row its tokens ending
    with EOS, then PAD."""
    _check_lengths(max_len_a, max_len_b)
    src = src_ids.long().to(model_device(model, src_ids.device))
    b = src.shape[0]
    if b == 0:
        return src.new_zeros(0, 0)
    with inference(model):
        limits = length_limits(src, max_len_a, max_len_b).to(src.device)
        enc = model.encode(src)
        state = model.start(enc)
        prev = torch.full((b,), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(b, dtype=torch.bool, device=src.device)
        out = []
        for t in range(int(limits.max()) + 1):
            logp, state = model.step(enc, state, prev)
            tokens = _constrain(logp, t, limits).argmax(dim=-1).masked_fill(done, PAD)
            out.append(tokens)
            done |= tokens == EOS
            if bool(done.all()):
                break
            prev = tokens
        return torch.stack(out, dim=1)


def beam_search(model: nn.Module, src_ids: Tensor, beam: int = 5, length_penalty: float = 1.0,
                max_len_a: float = 1.2, max_len_b: int = 10, n_best: int = 1) -> list[list[Hypothesis]]:
    """Beam search over a source batch (B, S), batched over sentences x beams (see the module docstring):
    per sentence its ``n_best`` best hypotheses by score, best first."""
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ConfigError(f"beam width {short_repr(beam)} is not allowed: it must be an integer >= 1")
    if isinstance(n_best, bool) or not isinstance(n_best, int) or not 1 <= n_best <= beam:
        raise ConfigError(f"n_best={short_repr(n_best)} is not allowed: it must be an integer in [1, beam={beam}]")
    _check_lengths(max_len_a, max_len_b)
    src = src_ids.long().to(model_device(model, src_ids.device))
    b, k, device = src.shape[0], beam, src.device
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    if b == 0:
        return []
    with inference(model):
        limits = length_limits(src, max_len_a, max_len_b).to(device)
        enc = model.encode(src)
        enc, state = model.reorder(enc, model.start(enc), torch.arange(b, device=device).repeat_interleave(k))
        alive = torch.arange(b, device=device)  # the sentences still searched, in row-group order
        count = torch.zeros(b, dtype=torch.long, device=device)  # finished hypotheses per sentence
        cum = torch.full((b, k), float("-inf"), dtype=torch.float64, device=device)
        cum[:, 0] = 0.0  # one live beam per sentence at the start
        history = torch.empty(b * k, 0, dtype=torch.long, device=device)
        prev = torch.full((b * k,), BOS, dtype=torch.long, device=device)
        step = 0
        while True:
            n = alive.shape[0]
            logp, state = model.step(enc, state, prev)
            logp = _constrain(logp, step, limits[alive].repeat_interleave(k))
            v = logp.shape[-1]
            candidates = (cum[:, :, None] + logp.to(torch.float64).view(n, k, v)).view(n, k * v)
            top, index = candidates.topk(min(2 * k, k * v), dim=1)  # best first
            parent, token = index // v, index % v
            is_eos = token == EOS
            # EOS among the first K candidates: finished hypotheses (all of length step + 1), in rank order
            # while the sentence still needs them
            ended = is_eos[:, :k] & torch.isfinite(top[:, :k])
            ended &= ended.cumsum(dim=1) <= (k - count[alive])[:, None]
            if bool(ended.any()):
                count[alive] += ended.sum(dim=1)
                i, j = ended.nonzero(as_tuple=True)
                eos = torch.full((i.shape[0], 1), EOS, dtype=torch.long, device=device)
                sequences = torch.cat([history[i * k + parent[i, j]], eos], dim=1)
                norm = (step + 1) ** length_penalty
                for s, tokens, logprob in zip(alive[i].tolist(), sequences, top[i, j].tolist(), strict=True):
                    finished[s].append(Hypothesis(tokens, logprob / norm, logprob))
            # the best K candidates that do not end in EOS continue (stable sort keeps their rank order)
            keep_order = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :k]
            next_score, next_parent, next_token = (t.gather(1, keep_order) for t in (top, parent, token))
            done = (count[alive] >= k) | (limits[alive] <= step) | ~torch.isfinite(next_score[:, 0])
            if bool(done.all()):
                break
            live = ~done
            rows = (torch.arange(n, device=device)[:, None] * k + next_parent)[live].view(-1)
            history = torch.cat([history[rows], next_token[live].view(-1, 1)], dim=1)
            cum = next_score[live]
            prev = next_token[live].view(-1)
            alive = alive[live]
            enc, state = model.reorder(enc, state, rows)
            step += 1
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]


def _pad_rows(rows: list[Tensor], device: torch.device) -> Tensor:
    width = max((r.numel() for r in rows), default=0)
    out = torch.full((len(rows), width), PAD, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        out[i, :r.numel()] = r
    return out


def translate(model: nn.Module, src_ids: Tensor, options: DecodeOptions) -> Tensor:
    """(B, L) int64 translations padded like :func:`greedy`: greedy search or the best beam hypothesis."""
    if options.strategy == "greedy":
        return greedy(model, src_ids, options.max_len_a, options.max_len_b)
    hyps = beam_search(model, src_ids, options.beam, options.length_penalty, options.max_len_a, options.max_len_b)
    return _pad_rows([h[0].tokens for h in hyps], model_device(model, src_ids.device))


def _strip(row: list[int]) -> list[int]:
    """Token ids up to (without) the first EOS."""
    return row[:row.index(EOS)] if EOS in row else [t for t in row if t != PAD]


def translate_split(model: nn.Module, x: ParallelText, options: DecodeOptions, batch_size: int) -> list[list[int]]:
    """Translate every row of ``x`` in batches of ``batch_size`` sentences (rows sorted by source length, so a
    batch holds similar lengths): per row, in ``x``'s order, the token ids without the final EOS."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"decoding batch_size {short_repr(batch_size)} is not allowed: it must be an integer >= 1")
    device = model_device(model, x.device)
    order = torch.sort(x.src_lengths().cpu(), stable=True).indices
    results: list[list[int]] = [[] for _ in range(x.num_rows)]
    with inference(model):
        for first in range(0, x.num_rows, batch_size):
            index = order[first:first + batch_size]
            src = x.rows(index).src.to(device)
            for i, row in zip(index.tolist(), translate(model, src, options).tolist(), strict=True):
                results[i] = _strip(row)
    return results
