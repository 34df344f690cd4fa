"""Gradient accumulation (``train.micro_batch``) and the linear schedule."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import ClassificationEvaluator, LoopConfig, OptimConfig, fit
from teachkit.engine.schedule import lr_factor
from teachkit.types import Batch, StepOutput


def _train(tmp_path, name, micro_batch, batch_size=10):
    g = torch.Generator().manual_seed(0)
    split = TensorSplit(torch.randn(23, 5, generator=g), torch.randint(0, 3, (23,), generator=g))
    torch.manual_seed(1)
    model = nn.Linear(5, 3).double()
    split = TensorSplit(split.x.double(), split.y)

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": F.cross_entropy(logits, batch.y)}, logits)

    evaluator = ClassificationEvaluator({"val": split}, 3)
    fit({"model": model}, step, BatchLoader(split, batch_size, shuffle=True, seed=0),
        OptimConfig(lr=0.5, momentum=0.0, weight_decay=0.0, schedule="constant"), evaluator, tmp_path / name,
        loop=LoopConfig(epochs=2, progress=False, micro_batch=micro_batch))
    return model


@pytest.mark.parametrize("micro", [1, 3, 4, 7])
def test_micro_batches_give_the_full_batch_update(tmp_path, micro):
    """Chunks weighted by their real share of the batch (the last chunk of 10 by 3 holds 1 sample, and the
    last batch of 23 holds 3): the same parameters as whole batches, to float64 rounding."""
    whole = _train(tmp_path, "whole", None)
    parts = _train(tmp_path, f"micro{micro}", micro)
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_averaging_chunk_losses_by_count_would_differ(tmp_path):
    """The trap the weighting avoids: a plain mean over unequal chunks is a different gradient."""
    x, y = torch.randn(10, 4, dtype=torch.float64), torch.randint(0, 3, (10,))
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    full = torch.autograd.grad(F.cross_entropy(x @ w, y), w)[0]
    batch = Batch(x, y, torch.arange(10))
    chunks = batch.chunks(4)
    assert [c.size for c in chunks] == [4, 4, 2]
    weighted = sum(torch.autograd.grad(F.cross_entropy(c.x @ w, c.y) * c.size / 10, w)[0] for c in chunks)
    naive = sum(torch.autograd.grad(F.cross_entropy(c.x @ w, c.y) / len(chunks), w)[0] for c in chunks)
    torch.testing.assert_close(weighted, full)
    assert not torch.allclose(naive, full)


def test_linear_schedule_decays_to_zero_after_warmup():
    cfg = OptimConfig(schedule="linear", warmup_epochs=1.0)
    steps, epochs = 10, 5
    factors = [lr_factor(cfg, e, s, steps, epochs) for e in range(epochs) for s in range(steps)]
    assert factors[9] == pytest.approx(1.0)  # end of the warm-up epoch
    assert factors[10] == pytest.approx(1.0)
    assert factors[30] == pytest.approx(0.5)  # half way through the 4 decay epochs
    assert factors[-1] == pytest.approx(1 / 40)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))


class _BagTranslator(nn.Module):
    """A tiny stand-in for a translation model: per target position, logits from the position's input token and
    the mean source embedding, packed over ``tgt_in != PAD`` (the layout translation models return)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 6, padding_idx=0)
        self.out = nn.Linear(6, vocab)

    def forward(self, src_ids, tgt_in):
        src, tgt = src_ids.long(), tgt_in.long()
        context = self.emb(src).sum(1, keepdim=True) / (src != 0).sum(1)[:, None, None]
        hidden = torch.tanh(self.emb(tgt) + context)
        return self.out(hidden[tgt != 0])


def _parallel_text(n: int = 13, vocab: int = 12):
    from teachkit.data.parallel import EOS, PAD, ParallelText, TranslationInfo, Vocab

    g = torch.Generator().manual_seed(3)
    tokens = tuple(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab - 4)])

    def rows(max_len):
        out = torch.full((n, max_len + 1), PAD, dtype=torch.int32)
        for i in range(n):
            k = int(torch.randint(1, max_len + 1, (1,), generator=g))
            out[i, :k] = torch.randint(4, vocab, (k,), generator=g, dtype=torch.int32)
            out[i, k] = EOS
        return out

    info = TranslationInfo(Vocab(tokens), target_texts=[""] * n, max_tokens=None)
    return ParallelText(rows(7), rows(9), torch.arange(n), info)


@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_of_translation_weigh_chunks_by_target_tokens(tmp_path, micro):
    """Translation batches average the loss over target tokens: chunks weighted by their share of the batch's
    tokens (``Batch.items``) give the whole-batch update (float64), though their sentences hold unequal tokens."""
    from teachkit.data.parallel import TokenBatchLoader

    x = _parallel_text()

    def train(name, micro_batch):
        torch.manual_seed(1)
        model = _BagTranslator(12).double()

        def step(batch, progress):
            logits = model(**batch.x)
            return StepOutput({"ce": F.cross_entropy(logits, batch.y)}, logits)

        class NoEval(ClassificationEvaluator):
            def evaluate(self, model):
                return {"val": {"acc": 0.0, "loss": 0.0}}

        fit({"model": model}, step, TokenBatchLoader(x, 5, shuffle=True, seed=0),
            OptimConfig(lr=0.5, momentum=0.0, weight_decay=0.0, schedule="constant"), NoEval({}, 12),
            tmp_path / name, loop=LoopConfig(epochs=2, progress=False, micro_batch=micro_batch))
        return model

    whole, parts = train("whole", None), train(f"micro{micro}", micro)
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    batch = next(iter(TokenBatchLoader(x, 5, shuffle=True, seed=0).batches(0)))
    chunks = batch.chunks(2)
    assert sum(c.items for c in chunks) == batch.items == batch.y.shape[0]
    assert torch.equal(torch.cat([c.y for c in chunks]), batch.y)  # each chunk repacks its own rows' targets


def test_inverse_sqrt_schedule_is_fairseqs():
    """fairseq's inverse_sqrt: linear warm-up to 1, then sqrt(warm-up / t) (t in epochs, per step)."""
    cfg = OptimConfig(schedule="inverse_sqrt", warmup_epochs=2.0)
    steps = 4
    assert lr_factor(cfg, 0, 0, steps, 10) == pytest.approx(0.125)  # (0 + 1/4) / 2
    assert lr_factor(cfg, 1, 3, steps, 10) == pytest.approx(1.0)  # last warm-up step
    assert lr_factor(cfg, 2, 0, steps, 10) == pytest.approx(1.0)
    assert lr_factor(cfg, 8, 0, steps, 10) == pytest.approx(0.5)  # sqrt(2 / 8)
    with pytest.raises(Exception, match="inverse_sqrt decays as sqrt"):
        from teachkit.options import from_mapping

        from_mapping(OptimConfig, {"schedule": "inverse_sqrt"}, "optim")
