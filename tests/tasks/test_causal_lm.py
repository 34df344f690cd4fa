"""Causal language modelling through the engine (task ``causal_lm``): the evaluator's token-weighted perplexity,
teacher-forced accuracy, exact match and token accuracy of greedy responses checked by hand, the generation speed
in the summary, the MSE teacher per token, a classifier refused, and plain text scored by perplexity."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.errors import ConfigError
from teachkit.losses.label_losses import softmax_mse
from teachkit.models import build_model
from teachkit.recipes import train_model
from teachkit.tasks.causal_lm import CausalLMEvaluator, response_scores, teacher_forced
from tests.lm_setup import ADDITION, lm_config


@pytest.fixture(scope="module")
def splits():
    return load_splits(from_dict({"data": ADDITION}).data)


def by_hand(model, x) -> tuple[float, float]:
    """(token-weighted CE, token accuracy) of ``model`` on ``x``, row by row through the Hugging Face model's own
    full logits (no packing), summed over every target token of the split."""
    loss, hits, tokens = 0.0, 0, 0
    with torch.no_grad():
        for i in range(x.num_rows):
            n, start = int(x.lengths[i]), int(x.starts[i])
            ids = x.ids[i:i + 1, :n].long()
            logits = model.hf(input_ids=ids).logits[0, start - 1:n - 1].float()
            target = ids[0, start:n]
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            hits += int((logits.argmax(1) == target).sum())
            tokens += n - start
    return loss / tokens, hits / tokens


def test_teacher_forced_metrics_are_token_weighted(splits):
    torch.manual_seed(0)
    model = build_model("hf_causal_lm", splits.input_shape, splits.num_classes, preset="llama-tiny").eval()
    x = splits.test.x
    loss, acc, tokens = teacher_forced(model, x, batch_size=5)  # batches of 5 rows: the weighting matters
    want_loss, want_acc = by_hand(model, x)
    assert tokens == int(x.tgt_lengths().sum())
    assert loss == pytest.approx(want_loss, rel=1e-5) and acc == pytest.approx(want_acc)
    metrics = CausalLMEvaluator({"test": splits.test}, x.info, batch_size=7).evaluate(model)["test"]
    assert metrics["loss"] == pytest.approx(want_loss, rel=1e-5)
    assert metrics["ppl"] == pytest.approx(math.exp(want_loss), rel=1e-5)
    assert metrics["acc"] == pytest.approx(100 * want_acc)


def test_exact_match_and_token_accuracy_by_hand(splits):
    x = splits.test.x[:3]
    refs = [x.ids[i, x.starts[i]:x.lengths[i]].tolist() for i in range(3)]  # the answer digits and EOS
    eos = x.info.eos_id
    wrong_digit = [refs[1][0] + 1 if refs[1][0] + 1 != eos else refs[1][0] - 1, *refs[1][1:]]
    responses = [refs[0], wrong_digit, refs[2][:1]]  # right; one digit wrong; cut after its first token
    exact, token_acc = response_scores(x, responses)
    assert exact == pytest.approx(1 / 3)
    total = sum(len(r) for r in refs)
    assert token_acc == pytest.approx((len(refs[0]) + len(refs[1]) - 1 + 1) / total)
    text = [x.info.text(r) for r in responses]
    assert text[0] == x.info.references[int(x.row_ids[0])] and text[1] != x.info.references[int(x.row_ids[1])]


def test_training_reports_generation_and_selects_on_exact_match(tmp_path):
    result = train_model(from_dict(lm_config(tmp_path, train={"epochs": 2, "progress": False, "precision": "fp32"})))
    s = result.summary
    assert s["select_metric"] == "exact" and s["task"] == "causal_lm"
    assert {f"test_{m}" for m in ("exact", "gen_acc", "loss", "ppl", "acc")} <= set(s)
    assert s["test_ppl"] == pytest.approx(math.exp(s["test_loss"]))
    gen = s["generation"]
    assert gen["decoding"] == "greedy" and gen["tokens"] > 0 and gen["tokens_per_s"] > 0
    assert (result.run_dir / "tokenizer.json").is_file()
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "generation" not in json.dumps(record)  # a measured speed is not an epoch metric


def test_mse_teacher_is_the_per_token_softmax_mse(tmp_path, splits):
    """train.loss=mse on a causal LM: sum over the vocabulary of (onehot - softmax)^2 per target token, averaged over
    the batch's target tokens (the ECCV 2024 estimator applied to the next-token head)."""
    torch.manual_seed(0)
    model = build_model("hf_causal_lm", splits.input_shape, splits.num_classes, preset="llama-tiny")
    batch = next(iter(splits.train.x.batch_source(8, True, 0).batches(0)))
    logits = model(batch.x)
    p = torch.softmax(logits.double(), dim=1)
    onehot = F.one_hot(batch.y, splits.num_classes).double()
    want = ((onehot - p) ** 2).sum(1).mean().detach()
    assert float(softmax_mse(logits, batch.y).detach()) == pytest.approx(float(want), rel=1e-5)
    result = train_model(from_dict(lm_config(tmp_path, train={"epochs": 1, "loss": "mse", "progress": False})))
    assert result.summary["loss"] == "mse" and math.isfinite(result.summary["test_loss"])


def test_a_classifier_cannot_be_a_causal_lm(tmp_path):
    with pytest.raises(ConfigError, match="is not a causal language model"):
        train_model(from_dict(lm_config(tmp_path, model={"name": "mlp", "options": {}})))


def test_plain_text_is_scored_by_perplexity(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    lines = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog", "bird", "fox"] * 10)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    data = {"name": "lm_text", "root": str(tmp_path / "train.txt"), "batch_size": 8,
            "options": {"tokenizer": "char", "max_length": 16}}
    result = train_model(from_dict(lm_config(tmp_path, data=data, train={"epochs": 1, "progress": False})))
    s = result.summary
    assert s["select_metric"] == "ppl" and "test_exact" not in s and "generation" not in s
    assert math.isfinite(s["test_ppl"]) and s["test_ppl"] < result.summary["num_classes"] * 2
