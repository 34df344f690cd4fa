"""Reverse-mode L2T-DLF teacher gradients: finite differences, memory modes, BatchNorm, bad input."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from teachkit.config import from_dict
from teachkit.errors import ConfigError
from teachkit.models import build_model
from teachkit.recipes.l2t.hypergrad import (
    FunctionalStudent,
    InnerOptimizer,
    MemoryMode,
    NonFiniteHypergradientError,
    hypergradient,
    parse_memory,
    teacher_params,
    unroll,
)
from teachkit.recipes.l2t.loss import dev_cross_entropy, l2t_student_loss, smooth_error
from teachkit.recipes.l2t.teachers import build_teacher
from teachkit.types import Batch

F64 = torch.float64
C, D = 3, 5


def batch(n, d=D, c=C, dtype=F64, g=None):
    return Batch(torch.randn(n, d, dtype=dtype, generator=g), torch.randint(0, c, (n,), generator=g), torch.arange(n))


def problem(T, seed=0, dropout=0.0):
    """A tiny float64 MLP student, T training batches, a dev batch and fixed teacher states."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layers = [nn.Linear(D, 6), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(6, C)]
    model = nn.Sequential(*layers).to(F64)
    batches = [batch(8, g=g) for _ in range(T)]
    dev = batch(16, g=g)
    states = torch.rand(T, 5, dtype=F64, generator=g)
    return FunctionalStudent(model), batches, dev, states


def perturbed_teacher(kind, seed=1):
    torch.manual_seed(seed)
    teacher = build_teacher(kind, C, 5, hidden=4, rank=2).to(F64)
    with torch.no_grad():  # move away from W = I, b = 0 (and W2 = 0) so every parameter matters
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return teacher


def loss_fn(logits, y, W, b):
    return l2t_student_loss(logits, y, W, b, ce_alpha=0.2)


def dev_objective_at(student, start, batches, teacher, states, opt, dev, objective):
    end = unroll(student, start, batches, loss_fn, opt, teacher, states).end
    with torch.no_grad(), student.modes():
        logits, _ = student(end.params, end.buffers, dev.x, "dev")
        return float(objective(logits, dev.y))


def finite_differences(student, start, batches, teacher, states, opt, dev, objective, eps=1e-6):
    theta = teacher_params(teacher)
    out = []
    for p in theta:
        fd = torch.zeros_like(p).flatten()
        for i in range(p.numel()):
            vals = []
            for sign in (1, -1):
                with torch.no_grad():
                    p.view(-1)[i] += sign * eps
                vals.append(dev_objective_at(student, start, batches, teacher, states, opt, dev, objective))
                with torch.no_grad():
                    p.view(-1)[i] -= sign * eps
            fd[i] = (vals[0] - vals[1]) / (2 * eps)
        out.append(fd)
    return torch.cat(out)


def flat(grads):
    return torch.cat([g.flatten() for g in grads])


@pytest.mark.parametrize("kind", ["static", "gated"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_hypergradient_matches_central_finite_differences(kind, momentum):
    student, batches, dev, states = problem(T=4)
    teacher = perturbed_teacher(kind)
    start = student.initial_state()
    opt = InnerOptimizer(lr=lambda s: 0.5 / (1 + s), momentum=momentum, weight_decay=0.01)  # per-step lr
    objective = dev_cross_entropy if momentum else (lambda z, y: smooth_error(z, y, 5.0))
    res = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, objective, "full")
    fd = finite_differences(student, start, batches, teacher, states, opt, dev, objective)
    assert fd.norm() > 1e-3
    assert float((flat(res.grads) - fd).norm() / fd.norm()) < 1e-4
    assert res.objective == pytest.approx(dev_objective_at(student, start, batches, teacher, states, opt, dev,
                                                           objective), rel=1e-12)


def test_checkpoint_equals_full_and_stores_fewer_weights():
    student, batches, dev, states = problem(T=9, dropout=0.3)  # dropout: recomputation must replay the masks
    teacher = perturbed_teacher("gated")
    start = student.initial_state()
    start.velocity = [0.1 * torch.ones_like(p) for p in start.params]  # a warm momentum buffer v_0
    opt = InnerOptimizer(0.3, 0.9, 1e-3)
    full = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "full")
    ckpt = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "checkpoint")
    torch.testing.assert_close(flat(ckpt.grads), flat(full.grads), rtol=1e-10, atol=1e-14)
    assert ckpt.objective == full.objective
    # full: (w_t, g_t) for 9 steps; checkpoint: 2 snapshots (w, v) + a 3-step segment + one graph (w, g)
    assert full.peak_stored_weights == 18 and ckpt.peak_stored_weights == 9


def test_truncation_with_k_equal_t_is_full_and_shorter_is_biased():
    student, batches, dev, states = problem(T=5)
    teacher = perturbed_teacher("static")
    start = student.initial_state()
    opt = InnerOptimizer(0.3, 0.9)
    full = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "full")
    same = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "truncate:5")
    torch.testing.assert_close(flat(same.grads), flat(full.grads), rtol=1e-12, atol=0)
    assert not same.biased and not full.biased
    short = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy,
                          "truncate:2")
    assert short.biased and short.steps_differentiated == 2 and short.phi_grads[0].shape[0] == 2
    assert float((flat(short.grads) - flat(full.grads)).norm()) > 1e-6


def test_identity_static_teacher_trains_on_minus_p_over_one_plus_p():
    student, batches, _, states = problem(T=3)
    teacher = build_teacher("static", C, 5).to(F64)  # W = I, b = 0
    start = student.initial_state()
    opt = InnerOptimizer(0.5, 0.9)

    def analytic(logits, y):
        p_y = logits.softmax(1).gather(1, y[:, None]).squeeze(1)
        return (-p_y / (1 + p_y)).mean()

    a = unroll(student, start, batches, l2t_student_loss, opt, teacher, states)
    b = unroll(student, start, batches, analytic, opt)
    assert a.losses == pytest.approx(b.losses, rel=1e-12)
    torch.testing.assert_close(flat(a.end.params), flat(b.end.params), rtol=1e-12, atol=1e-14)


def test_batchnorm_student_threads_buffers_and_gives_finite_gradient():
    torch.manual_seed(0)
    model = build_model("resnet8", (3, 8, 8), 4)
    student = FunctionalStudent(model)
    start = student.initial_state()
    batches = [Batch(torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,)), torch.arange(8)) for _ in range(2)]
    dev = Batch(torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,)), torch.arange(16))
    teacher = build_teacher("gated", 4, 5)
    with torch.no_grad():
        teacher.W2.normal_()
    res = hypergradient(student, start, teacher, torch.rand(2, 5), batches, l2t_student_loss,
                        InnerOptimizer(0.1, 0.9, 5e-4), dev, lambda z, y: smooth_error(z, y, 50.0), "checkpoint")
    assert all(torch.isfinite(g).all() for g in res.grads) and float(flat(res.grads).norm()) > 0
    assert int(res.end.buffers["bn1.num_batches_tracked"]) == 2
    assert not torch.equal(res.end.buffers["bn1.running_mean"], start.buffers["bn1.running_mean"])
    assert int(model.bn1.num_batches_tracked) == 0 and model.training  # the module itself is untouched


def test_memory_strings():
    assert parse_memory("full") == MemoryMode("full")
    assert parse_memory("checkpoint") == MemoryMode("checkpoint")
    assert parse_memory("truncate:7") == MemoryMode("truncate", 7) and parse_memory("truncate:7").biased
    for bad in ["truncate:0", "truncate:-1", "truncate:x", "truncate", "partial", "", 3]:
        with pytest.raises(ConfigError, match=r"l2t.memory=.* choose full, checkpoint or truncate:K .*K >= 1"):
            parse_memory(bad)


def test_bad_inputs_are_one_line_errors():
    student, batches, dev, states = problem(T=2)
    teacher = perturbed_teacher("static")
    start = student.initial_state()
    opt = InnerOptimizer(0.1, 0.9)
    with pytest.raises(ConfigError, match="inner_steps must be >= 1"):
        hypergradient(student, start, teacher, states[:0], [], loss_fn, opt, dev, dev_cross_entropy)
    with pytest.raises(ConfigError, match=r"l2t.inner_steps=0 is out of range: must be >= 1"):
        from_dict({"l2t": {"inner_steps": 0}})
    empty = Batch(dev.x[:0], dev.y[:0], dev.index[:0])
    with pytest.raises(ConfigError, match="teacher objective needs validation samples"):
        hypergradient(student, start, teacher, states, batches, loss_fn, opt, empty, dev_cross_entropy)
    frozen = nn.Linear(D, C)
    frozen.requires_grad_(False)
    with pytest.raises(ConfigError, match="has no differentiable parameters"):
        FunctionalStudent(frozen)
    bad_dev = Batch(torch.full_like(dev.x, float("nan")), dev.y, dev.index)
    before = [p.detach().clone() for p in teacher.parameters()]
    with pytest.raises(NonFiniteHypergradientError, match=r"hypergradient at teacher step 3/5 .*not updated"):
        hypergradient(student, start, teacher, states, batches, loss_fn, opt, bad_dev, dev_cross_entropy,
                      label="teacher step 3/5")
    assert all(torch.equal(a, b) for a, b in zip(before, teacher.parameters(), strict=True))
    assert "\n" not in str(ConfigError("x"))


def test_unknown_teacher_model_is_a_config_error():
    with pytest.raises(ConfigError, match="l2t.teacher_model='transformer' is not allowed"):
        build_teacher("transformer", C, 5)


def test_unroll_matches_torch_sgd():
    """The functional unroll takes the same steps as torch.optim.SGD (momentum, weight decay)."""
    student, batches, _, _ = problem(T=3)
    model = student.model
    start = student.initial_state()
    res = unroll(student, start, batches, lambda z, y: F.cross_entropy(z, y), InnerOptimizer(0.2, 0.9, 0.01))
    sgd = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=0.01)
    for bt in batches:
        sgd.zero_grad()
        F.cross_entropy(model(bt.x), bt.y).backward()
        sgd.step()
    torch.testing.assert_close(flat(res.end.params), flat([p.detach() for p in model.parameters()]),
                               rtol=1e-12, atol=1e-14)
