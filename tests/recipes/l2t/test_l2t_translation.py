"""L2T-DLF on translation: the dynamic loss per target token (diagonal Phi), its exact hypergradient through a
tiny LSTM-attention student's momentum-SGD steps against finite differences, and checkpoint == full memory."""

import pytest
import torch

from teachkit.data.parallel import EOS, PAD, ParallelText, TokenBatchLoader, TranslationInfo, Vocab
from teachkit.models import build_model
from teachkit.recipes.l2t.hypergrad import FunctionalStudent, InnerOptimizer, hypergradient, unroll
from teachkit.recipes.l2t.loss import dev_cross_entropy, dynamic_loss, l2t_student_loss, phi_stats, smooth_error
from teachkit.recipes.l2t.teachers import build_teacher

F64 = torch.float64
V = 11


def corpus(n: int, seed: int) -> ParallelText:
    """``n`` random pairs over a vocabulary of ``V`` (source and target of 1-5 tokens, EOS-terminated)."""
    g = torch.Generator().manual_seed(seed)

    def side() -> torch.Tensor:
        out = torch.full((n, 6), PAD, dtype=torch.int32)
        for i in range(n):
            k = int(torch.randint(1, 6, (1,), generator=g))
            out[i, :k] = torch.randint(4, V, (k,), generator=g, dtype=torch.int32)
            out[i, k] = EOS
        return out

    tokens = ("<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(V - 4)))
    return ParallelText(side(), side(), torch.arange(n), TranslationInfo(Vocab(tokens), target_texts=[""] * n))


def problem(T: int, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model("lstm_attn", (6,), V, embed_dim=6, hidden=6, dropout=0.0).to(F64)
    batches = list(TokenBatchLoader(corpus(4 * T, seed), 4, shuffle=True, seed=seed).batches(0))[:T]
    dev = next(iter(TokenBatchLoader(corpus(6, seed + 100), 6, shuffle=False).batches(0)))
    states = torch.rand(T, 5, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return FunctionalStudent(model), batches, dev, states


def perturbed(kind: str) -> torch.nn.Module:
    torch.manual_seed(1)
    teacher = build_teacher(kind, V, 5, hidden=3, rank=2, diagonal=True).to(F64)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return teacher


def loss_fn(logits, y, W, b):
    return l2t_student_loss(logits, y, W, b, ce_alpha=0.3)


def test_diagonal_dynamic_loss_reads_the_gold_tokens_probability_only():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(9, V, generator=g, dtype=F64), torch.randint(0, V, (9,), generator=g)
    w, b = torch.rand(V, dtype=F64, generator=g) + 0.5, torch.randn(V, dtype=F64, generator=g)
    logp_y = torch.log_softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    expected = -torch.sigmoid(w[y] * logp_y + b[y]).mean()
    torch.testing.assert_close(dynamic_loss(logits, y, w, b), expected)
    # the diagonal form equals the full form with W = diag(w)
    torch.testing.assert_close(dynamic_loss(logits, y, w, b), dynamic_loss(logits, y, torch.diag(w), b))
    stats = phi_stats(w, b)
    assert stats["W_diag_mean"] == pytest.approx(float(w.mean()))
    assert stats["W_offdiag_mean"] == pytest.approx(0, abs=1e-6)


def dev_value(student, start, batches, teacher, states, opt, dev, objective) -> float:
    end = unroll(student, start, batches, loss_fn, opt, teacher, states).end
    with torch.no_grad(), student.modes():
        logits, _ = student(end.params, end.buffers, dev.x, "dev")
        return float(objective(logits, dev.y))


def central_differences(teacher: torch.nn.Module, value, eps: float = 1e-6) -> torch.Tensor:
    """d value() / d theta by central differences on every trainable teacher parameter, in parameter order."""
    fd = []
    for p in [q for q in teacher.parameters() if q.requires_grad]:
        for i in range(p.numel()):
            vals = []
            for sign in (1, -1):
                with torch.no_grad():
                    p.view(-1)[i] += sign * eps
                vals.append(value())
                with torch.no_grad():
                    p.view(-1)[i] -= sign * eps
            fd.append((vals[0] - vals[1]) / (2 * eps))
    return torch.tensor(fd, dtype=F64)


@pytest.mark.parametrize("kind", ["static", "gated"])
def test_per_token_hypergradient_matches_finite_differences_on_a_tiny_lstm(kind):
    """The exact reverse-mode teacher gradient through 3 momentum-SGD steps of an LSTM-attention student whose
    loss is L_Phi per target token (packed batches), against central differences on every teacher parameter."""
    student, batches, dev, states = problem(T=3)
    teacher = perturbed(kind)
    start = student.initial_state()
    opt = InnerOptimizer(lr=0.5, momentum=0.9, weight_decay=1e-3)
    objective = dev_cross_entropy if kind == "static" else (lambda z, y: smooth_error(z, y, 5.0))
    res = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, objective, "full")
    fd_t = central_differences(teacher, lambda: dev_value(student, start, batches, teacher, states, opt, dev,
                                                          objective))
    got = torch.cat([g.flatten() for g in res.grads])
    assert fd_t.norm() > 1e-4
    assert float((got - fd_t).norm() / fd_t.norm()) < 1e-4
    assert all(b.y.shape[0] == int((b.x["tgt_in"] != PAD).sum()) for b in batches)  # per-token rows


def test_checkpoint_memory_equals_full_on_the_lstm():
    student, batches, dev, states = problem(T=4, seed=2)
    teacher = perturbed("gated")
    start = student.initial_state()
    opt = InnerOptimizer(0.3, 0.9, 0.0)
    full = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "full")
    ckpt = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "checkpoint")
    for a, b in zip(full.grads, ckpt.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    assert ckpt.peak_stored_weights < full.peak_stored_weights
