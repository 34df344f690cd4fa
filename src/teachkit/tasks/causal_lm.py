"""Causal language modelling (task ``causal_lm``): perplexity, token accuracy, and for prompt / response data the
exact match and token accuracy of greedy responses, with the generation speed.

The data sources of this task (``lm_text``, ``prompt_response``, ``addition``) live in :mod:`teachkit.data`; a
split's ``x`` is a :class:`~teachkit.data.lm.LMText` whose shared :class:`~teachkit.data.lm.LMInfo` carries the
tokenizer, its special ids, the reference responses and the generation limit (``data.options.max_new_tokens``).

The evaluator ``causal_lm`` reports on every evaluation split:

- ``loss``: the mean cross-entropy of the target tokens (the response tokens of prompt / response data, every
  token after a block's first of plain text) with teacher forcing, in nats, **token-weighted** (the sum over all
  target tokens of the split divided by their number, not a mean of per-row means); ``ppl`` = exp(loss);
  ``acc``: the token accuracy (%) of the argmax prediction under teacher forcing;
- prompt / response data only: ``exact`` (primary, maximised): the percentage of prompts whose greedy response,
  decoded to text, equals the reference response (both stripped of surrounding whitespace); ``gen_acc``: the
  token accuracy (%) of the greedy responses, position by position against the reference tokens (its EOS
  included), over all reference tokens of the split.

Plain-text data has no responses to generate: its primary metric is ``ppl`` (minimised). The greedy responses run
batched with the key/value cache (:func:`teachkit.models.lm_generate.generate_rows`); the generated tokens per
second of the last evaluation are in the run summary (``generation``: tokens, seconds, tokens/s), not among the
per-epoch metrics, so that metrics stay a pure function of the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Splits, TensorSplit
from teachkit.data.lm import CAUSAL_LM, LMBatchLoader, LMInfo, LMText
from teachkit.engine.evaluate import EVALUATORS
from teachkit.errors import ConfigError
from teachkit.models.causal_lm import is_causal_lm
from teachkit.models.lm_generate import GenerateOptions, generate_rows
from teachkit.models.taps import unwrap
from teachkit.types import Batch, Evaluator

TEACHER_FORCED = ("loss", "ppl", "acc")
GENERATED = ("exact", "gen_acc")


@torch.no_grad()
def teacher_forced(model: nn.Module, x: LMText, batch_size: int) -> tuple[float, float, int]:
    """(token-weighted mean CE, token accuracy in [0, 1], target tokens) of ``model`` on ``x``, in eval mode."""
    was = model.training
    model.eval()
    loss, correct, tokens = 0.0, 0, 0
    try:
        loader = LMBatchLoader(x, batch_size, shuffle=False, max_tokens=x.info.max_tokens)
        for batch in loader.batches(0):
            logits = model(batch.x).float()
            loss += float(F.cross_entropy(logits, batch.y, reduction="sum"))
            correct += int((logits.argmax(1) == batch.y).sum())
            tokens += int(batch.y.numel())
    finally:
        model.train(was)
    if not tokens:
        return float("nan"), float("nan"), 0
    return loss / tokens, correct / tokens, tokens


def response_scores(x: LMText, responses: list[list[int]]) -> tuple[float, float]:
    """(exact-match fraction, token accuracy) of generated ``responses`` (one per row of ``x``, in row order)
    against each row's reference: the decoded texts compared stripped; the tokens position by position over the
    reference's tokens (its EOS included)."""
    info = x.info
    refs = x.token_targets().tolist()
    counts = x.tgt_lengths().tolist()
    row_ids = x.row_ids.tolist()
    exact, hits, total, start = 0, 0, 0, 0
    for i, response in enumerate(responses):
        reference = refs[start:start + counts[i]]
        start += counts[i]
        hits += sum(1 for a, b in zip(response, reference, strict=False) if a == b)
        total += len(reference)
        exact += info.text(response).strip() == str(info.references[row_ids[i]]).strip()
    return (exact / len(responses), hits / total) if responses and total else (float("nan"), float("nan"))


class CausalLMEvaluator(Evaluator):
    """``loss``, ``ppl``, ``acc`` on each split; with responses also ``exact`` (primary) and ``gen_acc``
    (module docstring)."""

    sample_unit = "seq"

    def __init__(self, splits: Mapping[str, TensorSplit], info: LMInfo, batch_size: int = 64) -> None:
        self.splits = dict(splits)
        self.info = info
        self.batch_size = batch_size
        self.generates = info.kind == "prompt_response"
        self.primary = "exact" if self.generates else "ppl"
        #: the last evaluation's generation: tokens, seconds (greedy, every split)
        self.generated = {"tokens": 0, "seconds": 0.0}

    def metric_names(self) -> tuple[str, ...]:
        return (*GENERATED, *TEACHER_FORCED) if self.generates else TEACHER_FORCED

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "min" if metric in ("loss", "ppl") else "max"

    def is_percent(self, metric: str) -> bool:
        return metric in ("acc", "exact", "gen_acc")

    def check_model(self, model: nn.Module) -> None:
        inner = unwrap(model)
        if not is_causal_lm(inner):
            raise ConfigError(f"model {type(inner).__name__} is not a causal language model: task 'causal_lm' needs "
                              "one that returns a logit row per target token and generates (hf_causal_lm)")

    def greedy(self) -> GenerateOptions:
        return GenerateOptions(strategy="greedy", max_new_tokens=self.info.max_new_tokens)

    def responses(self, model: nn.Module, x: LMText) -> list[list[int]]:
        """The model's greedy response to every prompt of ``x``, in row order (token ids, EOS last when made)."""
        prompts, lengths = x.prompts()
        t0 = time.perf_counter()
        out, tokens = generate_rows(model, prompts, lengths, self.greedy(), eos_id=self.info.eos_id,
                                    pad_id=self.info.pad_id, batch_size=self.batch_size)
        self.generated["tokens"] += tokens
        self.generated["seconds"] += time.perf_counter() - t0
        return out

    def evaluate_split(self, model: nn.Module, split: TensorSplit) -> dict[str, float]:
        x = split.x
        loss, acc, _ = teacher_forced(model, x, self.batch_size)
        out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)) if math.isfinite(loss) else float("nan"),
               "acc": 100.0 * acc}
        if self.generates:
            exact, gen_acc = response_scores(x, self.responses(model, x))
            out = {"exact": 100.0 * exact, "gen_acc": 100.0 * gen_acc, **out}
        return out

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        self.generated = {"tokens": 0, "seconds": 0.0}
        return {name: self.evaluate_split(model, split) for name, split in self.splits.items()}

    def report(self) -> dict[str, Any]:
        """The summary's ``generation`` block: greedy tokens generated in the last evaluation and their speed."""
        if not self.generates or not self.generated["tokens"]:
            return {}
        tokens, seconds = self.generated["tokens"], self.generated["seconds"]
        return {"generation": {"decoding": "greedy", "max_new_tokens": self.info.max_new_tokens, "tokens": tokens,
                               "seconds": round(seconds, 3),
                               "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}}

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: the batch's token accuracy x 100 x its rows (the engine divides by rows)."""
        y = batch.y
        if not isinstance(outputs, Tensor) or outputs.dim() != 2 or outputs.shape[0] != y.shape[0] or not y.numel():
            return {}
        hit = (outputs.detach().argmax(1) == y).float().mean()
        return {"train_acc": hit * (100.0 * batch.size)}


@EVALUATORS.register(CAUSAL_LM, "causal language modelling: token-weighted perplexity and token accuracy (teacher "
                                "forcing); prompt / response data also exact match and token accuracy of greedy "
                                "responses (primary: exact)")
def causal_lm_evaluator(splits: Splits, batch_size: int) -> Evaluator:
    info = getattr(splits.test.x, "info", None)
    if not isinstance(info, LMInfo):
        raise ConfigError(f"dataset {splits.name!r} has task 'causal_lm' but its inputs carry no token sequences; use "
                          "lm_text, prompt_response or addition")
    return CausalLMEvaluator(splits.eval_splits(), info, batch_size)
