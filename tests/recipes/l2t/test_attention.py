"""L2T-DLF's attention teacher Phi_t = W softmax(V s_t) (Wu et al. 2018, Sec. 3.2), and the gated teacher as the
authors' public demo's dynamic loss: exact hypergradient, start at the static teacher, exact resume, config errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

import teachkit.recipes.l2t.recipe as l2t
from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.errors import ConfigError
from teachkit.recipes.l2t.hypergrad import InnerOptimizer, hypergradient, teacher_params
from teachkit.recipes.l2t.loss import dev_cross_entropy, dynamic_loss, smooth_error
from teachkit.recipes.l2t.teachers import (
    AttentionTeacher,
    GatedTeacher,
    build_teacher,
    load_teacher,
    save_teacher,
)
from tests.conftest import tiny_config
from tests.recipes.l2t.test_hypergrad import F64, C, dev_objective_at, finite_differences, flat, loss_fn, problem
from tests.recipes.l2t.test_resume import KILLS, L2T, Killed, assert_same_run, config

K = 3  # not a power of two: softmax weights do not sum to 1 exactly in floating point


def attention_teacher(diagonal: bool, seed: int = 1) -> AttentionTeacher:
    """A float64 attention teacher moved away from its start, so the bank entries differ and dM/dV != 0."""
    torch.manual_seed(seed)
    teacher = build_teacher("attention", C, 5, diagonal=diagonal, attention_k=K).to(F64)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    assert isinstance(teacher, AttentionTeacher)
    return teacher


@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_attention_hypergradient_matches_central_finite_differences(diagonal, momentum):
    student, batches, dev, states = problem(T=4)
    teacher = attention_teacher(diagonal)
    start = student.initial_state()
    opt = InnerOptimizer(lr=lambda s: 0.5 / (1 + s), momentum=momentum, weight_decay=0.01)
    objective = dev_cross_entropy if momentum else (lambda z, y: smooth_error(z, y, 5.0))
    res = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, objective, "full")
    fd = finite_differences(student, start, batches, teacher, states, opt, dev, objective)
    names = [n for n, p in teacher.named_parameters() if p.requires_grad]
    assert names == ["W", "b", "V.weight", "V.bias"]
    sizes = [p.numel() for p in teacher_params(teacher)]
    for name, got, want in zip(names, flat(res.grads).split(sizes), fd.split(sizes), strict=True):
        assert want.norm() > 1e-4, name  # every block matters, the attention logits' V included
        assert float((got - want).norm() / want.norm()) < 1e-4, name
    assert float((flat(res.grads) - fd).norm() / fd.norm()) < 1e-4
    assert res.objective == pytest.approx(dev_objective_at(student, start, batches, teacher, states, opt, dev,
                                                           objective), rel=1e-12)


def test_attention_gradient_at_start_is_attention_weighted_and_zero_for_v():
    """With all W_k = I, b_k = 0: dM/dV = 0 and dM/dW_k = sum_t a_k(s_t) dM/dPhi_t (the symmetry of the start)."""
    student, batches, dev, states = problem(T=4)
    torch.manual_seed(0)
    teacher = build_teacher("attention", C, 5, attention_k=K).to(F64)
    opt = InnerOptimizer(0.3, 0.9)
    res = hypergradient(student, student.initial_state(), teacher, states, batches, loss_fn, opt, dev,
                        dev_cross_entropy)
    dW, db, dV, dc = res.grads
    a = teacher.attention(states).detach()  # (T, K)
    torch.testing.assert_close(dW, torch.einsum("tk,tij->kij", a, res.phi_grads[0]), rtol=1e-10, atol=1e-15)
    torch.testing.assert_close(db, torch.einsum("tk,ti->ki", a, res.phi_grads[1]), rtol=1e-10, atol=1e-15)
    assert float(dW.norm()) > 0 and not torch.equal(dW[0], dW[1])
    assert torch.equal(dV, torch.zeros_like(dV)) and torch.equal(dc, torch.zeros_like(dc))


@pytest.mark.parametrize("diagonal", [False, True])
def test_attention_teacher_starts_exactly_at_the_static_teacher(diagonal):
    torch.manual_seed(0)
    states = torch.randn(7, 5) * torch.tensor([1.0, 30.0, 1.0, 30.0, 1.0])
    n = 6
    w_shape = (n,) if diagonal else (n, n)
    for k in (1, 3, 4, 7):
        teacher = build_teacher("attention", n, 5, diagonal=diagonal, attention_k=k)
        static = build_teacher("static", n, 5, diagonal=diagonal)
        assert teacher.W.shape == (k, *w_shape) and teacher.b.shape == (k, n) and teacher.V.weight.shape == (k, 5)
        a = teacher.attention(states).detach()
        assert a.shape == (7, k) and (k == 1 or float((a - a[0]).abs().max()) > 0)  # a depends on the state
        W, b = teacher(states)
        Ws, bs = static(states)
        assert W.shape == (7, *w_shape) and b.shape == (7, n)
        assert torch.equal(W, Ws) and torch.equal(b, bs)
        W1, b1 = teacher(states[3])
        assert W1.shape == w_shape and b1.shape == (n,)
        assert torch.equal(W1, static.W) and torch.equal(b1, static.b)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # Phi stays fp32 under autocast
            Wa, ba = teacher(states.bfloat16())
        assert Wa.dtype == ba.dtype == torch.float32 and torch.equal(Wa, Ws)


def test_attention_and_hidden_free_gated_teachers_round_trip(tmp_path):
    states = torch.rand(4, 5)
    teachers = {"attention": build_teacher("attention", 4, 5, diagonal=True, attention_k=2),
                "gated0": build_teacher("gated", 4, 5, hidden=0, rank=1)}
    for name, teacher in teachers.items():
        with torch.no_grad():
            for p in teacher.parameters():
                p.add_(torch.randn_like(p))
        save_teacher(tmp_path / f"{name}.safetensors", teacher, {"teacher_steps_done": 1})
        loaded, state = load_teacher(tmp_path / f"{name}.safetensors")
        assert type(loaded) is type(teacher) and state["teacher"] == teacher.config()
        for a, c in zip(loaded(states), teacher(states), strict=True):
            assert torch.equal(a, c)
    assert teachers["attention"].config()["attention_k"] == 2 and teachers["gated0"].config()["hidden"] == 0
    assert len(teachers["gated0"].h) == 2  # Linear(S, rank) - tanh


def test_gated_rank_one_without_hidden_layer_is_the_demos_dynamic_loss():
    """The demo: W_t = W + w2 (2 sigmoid(theta . [iteration, batch_error] + b2) - 1), loss
    -mean sigmoid((log p)^T W_t + b)_y. 2 sigmoid(x) - 1 = tanh(x / 2): GatedTeacher(hidden=0, rank=1) with
    h = tanh(Linear(s)) at weights theta / 2, bias b2 / 2, W2 = w2 (transposed: our W reads row y)."""
    g = torch.Generator().manual_seed(0)
    n = 4
    W, b, w2 = (torch.randn(*shape, dtype=F64, generator=g) for shape in ((n, n), (n,), (n, n)))
    theta = torch.randn(2, dtype=F64, generator=g) * torch.tensor([1e-3, 3.0], dtype=F64)
    b2 = float(torch.randn((), dtype=F64, generator=g))
    teacher = GatedTeacher(n, 2, hidden=0, rank=1).to(F64)
    with torch.no_grad():
        teacher.W.copy_(W.T)
        teacher.b.copy_(b)
        teacher.W2[0].copy_(w2.T)
        teacher.B2.zero_()
        teacher.h[0].weight.copy_(theta[None] / 2)
        teacher.h[0].bias.fill_(b2 / 2)
    states = torch.tensor([[it, err] for it in (0.0, 10.0, 250.0, 1000.0, 4000.0) for err in (0.0, 0.3, 0.9)],
                          dtype=F64)
    W_demo = W + (2 * torch.sigmoid(states @ theta + b2) - 1)[:, None, None] * w2  # (T, C, C)
    with torch.no_grad():
        W_t, b_t = teacher(states)
    assert float((W_t - W_demo.transpose(1, 2)).abs().max()) < 1e-12
    assert float((b_t - b).abs().max()) == 0.0
    logits = torch.randn(16, n, dtype=F64, generator=g)
    y = torch.randint(0, n, (16,), generator=g)
    logp = F.log_softmax(logits, dim=1)
    for i, s in enumerate(states):
        with torch.no_grad():
            Wi, bi = teacher(s)
        demo = -torch.sigmoid(logp @ W_demo[i] + b)[torch.arange(16), y].mean()
        assert abs(float(dynamic_loss(logits, y, Wi, bi) - demo)) < 1e-12


@pytest.fixture(scope="module")
def straight_attention(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("straight_attention")
    result = l2t.l2t_dlf(config(root, "straight", teacher_model="attention"))
    teacher, state = load_teacher(result.run_dir / l2t.TEACHER_FILE)
    assert state["teacher_steps_done"] == L2T["teacher_steps"] and isinstance(teacher, AttentionTeacher)
    assert not torch.equal(teacher.W[0], teacher.W[1])  # the bank entries moved apart
    return result.run_dir


@pytest.mark.parametrize("kill", ["teacher: inside episode 3 (hypergradient)", "teacher: after episode 2's save",
                                  "teacher: episode 4's log line torn", "student: mid epoch 2"])
def test_interrupted_attention_run_resumes_bit_identical(tmp_path, straight_attention, kill, monkeypatch):
    cfg = config(tmp_path, "killed", teacher_model="attention")
    with monkeypatch.context() as m:
        KILLS[kill](m)
        with pytest.raises(Killed):
            l2t.l2t_dlf(cfg)
    run_dir = Path(cfg.out_dir) / "killed"
    if kill.startswith("teacher"):
        assert load_teacher(run_dir / l2t.TEACHER_FILE)[1]["teacher_steps_done"] < L2T["teacher_steps"]
    assert_same_run(straight_attention, l2t.l2t_dlf(cfg, resume=True).run_dir)


def test_attention_k_and_gate_hidden_reach_the_teacher(tmp_path):
    cfg = from_dict(tiny_config(tmp_path, name="k2", train={"epochs": 1, "progress": False},
                                l2t={**L2T, "teacher_steps": 1, "teacher_model": "attention", "attention_k": 2}))
    teacher, state = load_teacher(l2t.l2t_dlf(cfg).run_dir / l2t.TEACHER_FILE)
    assert state["teacher"]["attention_k"] == 2 and teacher.W.shape == (2, 4, 4)
    cfg = from_dict(tiny_config(tmp_path, name="h0", train={"epochs": 1, "progress": False},
                                l2t={**L2T, "teacher_steps": 1, "gate_hidden": 0, "gate_rank": 1}))
    teacher, state = load_teacher(l2t.l2t_dlf(cfg).run_dir / l2t.TEACHER_FILE)
    assert state["teacher"]["hidden"] == 0 and isinstance(teacher, GatedTeacher) and len(teacher.h) == 2


@pytest.mark.parametrize("key, value, match", [
    ("attention_k", 0, r"^l2t.attention_k=0 is out of range: must be >= 1$"),
    ("attention_k", -1, r"^l2t.attention_k=-1 is out of range: must be >= 1$"),
    ("attention_k", "x", r"^l2t.attention_k='x' is not allowed: expected an integer$"),
    ("gate_hidden", -1, r"^l2t.gate_hidden=-1 is out of range: must be >= 0$"),
])
def test_bad_attention_k_is_a_one_line_config_error(tmp_path, capsys, key, value, match):
    with pytest.raises(ConfigError, match=match):
        from_dict({"l2t": {key: value}})
    path = tmp_path / "l2t.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, l2t={"teacher_model": "attention", key: value})))
    assert main(["run", "l2t", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"l2t.{key}=" in err
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_attention_is_a_teacher_model_of_the_options():
    assert from_dict({"l2t": {"teacher_model": "attention"}}).l2t.attention_k == 4
    assert json.dumps(build_teacher("attention", 3, 5).config()) == json.dumps(
        {"teacher_model": "attention", "num_classes": 3, "state_dim": 5, "diagonal": False, "attention_k": 4})
