"""Translation (task ``translation``): BLEU two ways, token accuracy and perplexity of a decoded model.

The data sources of this task (``iwslt14``, ``parallel_text``, ``toy_translation``) live in
:mod:`teachkit.data`; a split's ``x`` is a :class:`~teachkit.data.parallel.ParallelText` whose shared
:class:`~teachkit.data.parallel.TranslationInfo` carries the vocabulary, the reference lines and the decoding
settings (``data.options.decode``, ``beam``, ``length_penalty``, ``max_len_a``, ``max_len_b``).

The evaluator ``translation`` reports on every evaluation split:

- ``bleu`` (primary, maximised): sacreBLEU (Post 2018) on detokenised text, its default ``13a`` tokenisation:
  hypotheses and references are BPE-merged and then detokenised with the Moses detokenizer (``sacremoses``,
  the target language's rules), the reproducible convention. The references are the prepared (tokenised) lines
  detokenised, since prepared IWSLT14 files hold no raw text;
- ``bleu_tok``: tokenised, case-insensitive BLEU on the prepared text, what IWSLT14 papers usually report:
  sacreBLEU with ``tokenize='none'`` and ``lowercase=True`` on BPE-merged hypotheses and the prepared
  references;
- ``loss``: mean token cross-entropy with teacher forcing on the gold prefix (nats), ``ppl`` = exp(loss),
  ``acc``: token accuracy (%) of the argmax prediction under teacher forcing.

BLEU is computed by the ``sacrebleu`` package, never re-implemented here. Decoding is greedy unless
``data.options.decode=beam`` (the L2T-DLF seed reports greedy BLEU; IWSLT14 papers beam 5); every metric
record names it in ``decoding`` of the summary via the evaluator's :meth:`TranslationEvaluator.describe`.
Training metrics: ``train_acc`` is the token accuracy of each batch, weighted by its sentences.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.base import Splits, TensorSplit
from teachkit.data.parallel import TRANSLATION, ParallelText, TokenBatchLoader, TranslationInfo
from teachkit.engine.evaluate import EVALUATORS
from teachkit.errors import ConfigError
from teachkit.models.decoding import translate_split
from teachkit.models.seq2seq import is_seq2seq
from teachkit.models.taps import unwrap
from teachkit.types import Batch, Evaluator

METRICS = ("bleu", "bleu_tok", "loss", "ppl", "acc")


def _sacrebleu() -> Any:
    try:
        import sacrebleu
    except ImportError:
        raise ConfigError("translation needs the sacrebleu package: pip install 'teachkit[nmt]'") from None
    return sacrebleu


class Detokenizer:
    """Moses detokenisation of tokenised text (``sacremoses``), for sacreBLEU's reproducible convention."""

    def __init__(self, lang: str) -> None:
        try:
            from sacremoses import MosesDetokenizer
        except ImportError:
            raise ConfigError("translation needs the sacremoses package: pip install 'teachkit[nmt]'") from None
        self.detok = MosesDetokenizer(lang=lang)

    def __call__(self, line: str) -> str:
        return self.detok.detokenize(line.split())


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenised: bool) -> float:
    """Corpus BLEU of tokenised ``hypotheses`` against one reference each: sacreBLEU with ``tokenize='none'`` and
    ``lowercase=True`` (``tokenised``), or with its defaults on the lines as given (already detokenised)."""
    sacrebleu = _sacrebleu()
    if not hypotheses:
        return float("nan")
    if tokenised:
        return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize="none", lowercase=True,
                                           force=True).score)  # force: tokenised on purpose (no warning)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def references(x: ParallelText) -> list[str]:
    """The reference line (tokenised, as prepared) of every row of ``x``."""
    texts = x.info.target_texts
    return [texts[i] for i in x.row_ids.tolist()]


@torch.no_grad()
def teacher_forced(model: nn.Module, x: ParallelText, batch_size: int) -> tuple[float, float]:
    """(mean token CE, token accuracy in [0, 1]) of ``model`` on ``x`` with teacher forcing, in eval mode."""
    was = model.training
    model.eval()
    loss, correct, tokens = 0.0, 0, 0
    try:
        loader = TokenBatchLoader(x, batch_size, shuffle=False, max_tokens=x.info.max_tokens)
        for batch in loader.batches(0):
            logits = model(**batch.x).float()
            loss += float(F.cross_entropy(logits, batch.y, reduction="sum"))
            correct += int((logits.argmax(1) == batch.y).sum())
            tokens += int(batch.y.numel())
    finally:
        model.train(was)
    return (loss / tokens, correct / tokens) if tokens else (float("nan"), float("nan"))


class TranslationEvaluator(Evaluator):
    """``bleu`` (primary), ``bleu_tok``, ``loss``, ``ppl`` and ``acc`` on each named split (module docstring)."""

    primary = "bleu"
    sample_unit = "sent"

    def __init__(self, splits: Mapping[str, TensorSplit], info: TranslationInfo, batch_size: int = 1000) -> None:
        self.splits = dict(splits)
        self.info = info
        self.batch_size = batch_size
        self._detok: Detokenizer | None = None

    def metric_names(self) -> tuple[str, ...]:
        return METRICS

    def direction(self, metric: str) -> Literal["max", "min"]:
        return "min" if metric in ("loss", "ppl") else "max"

    def is_percent(self, metric: str) -> bool:
        return metric == "acc"

    def format(self, metric: str, value: float) -> str:
        if metric.startswith("bleu"):
            return f"{value:.2f}"
        return super().format(metric, value)

    def describe(self) -> str:
        """The decoding behind the BLEU figures (``greedy`` or ``beam 5, length penalty 1``)."""
        return self.info.decode.describe()

    def detokenize(self, lines: Sequence[str]) -> list[str]:
        if self._detok is None:
            self._detok = Detokenizer(self.info.tgt_lang)
        return [self._detok(line) for line in lines]

    def check_model(self, model: nn.Module) -> None:
        inner = unwrap(model)
        if not is_seq2seq(inner):
            raise ConfigError(f"model {type(inner).__name__} cannot translate: task 'translation' needs an "
                              "encoder-decoder that decodes step by step (lstm_attn, transformer_seq2seq, "
                              "transformer_small, transformer_iwslt, or a teachkit.models.seq2seq.Seq2Seq)")

    def hypotheses(self, model: nn.Module, x: ParallelText) -> list[str]:
        """The model's translations of every row of ``x`` (tokenised text, BPE merged), in row order."""
        self.check_model(model)
        ids = translate_split(unwrap(model), x, self.info.decode, self.batch_size)
        return [self.info.text(h) for h in ids]

    def score(self, hyps: Sequence[str], refs: Sequence[str], loss: float, acc: float) -> dict[str, float]:
        return {"bleu": corpus_bleu(self.detokenize(hyps), self.detokenize(refs), tokenised=False),
                "bleu_tok": corpus_bleu(hyps, refs, tokenised=True),
                "loss": loss, "ppl": math.exp(min(loss, 50.0)) if math.isfinite(loss) else float("nan"),
                "acc": 100.0 * acc}

    def evaluate_split(self, model: nn.Module, split: TensorSplit) -> dict[str, float]:
        x = split.x
        loss, acc = teacher_forced(model, x, self.batch_size)
        return self.score(self.hypotheses(model, x), references(x), loss, acc)

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {name: self.evaluate_split(model, split) for name, split in self.splits.items()}

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """``train_acc``: the batch's token accuracy x 100 x its sentences (the engine divides by sentences)."""
        y = batch.y
        if not isinstance(outputs, Tensor) or outputs.shape[0] != y.shape[0] or y.numel() == 0:
            return {}
        hit = (outputs.detach().argmax(1) == y).float().mean()
        return {"train_acc": hit * (100.0 * batch.size)}


@EVALUATORS.register(TRANSLATION, "translation: sacreBLEU on detokenised text (primary) and tokenised BLEU, token "
                                  "accuracy and perplexity (teacher forcing), on val and test")
def translation_evaluator(splits: Splits, batch_size: int) -> Evaluator:
    info = getattr(splits.test.x, "info", None)
    if not isinstance(info, TranslationInfo):
        raise ConfigError(f"dataset {splits.name!r} has task 'translation' but its inputs carry no parallel text; use "
                          "iwslt14, parallel_text or toy_translation")
    return TranslationEvaluator(splits.eval_splits(), info, batch_size)
