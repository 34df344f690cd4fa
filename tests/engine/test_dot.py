"""DOT (engine/dot.py): hand-computed update steps, label-only steps as SGD, micro-batch chunks, no host syncs,
the optimiser state through a checkpoint, and bit-identical resume of a distillation run."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from teachkit.engine import ClassificationEvaluator
from teachkit.engine.checkpoint import load_checkpoint, optimizer_from_flat, optimizer_to_flat, save_checkpoint
from teachkit.engine.dot import KD_BUFFER, TASK_BUFFER, TASK_TERMS, DistillationOrientedTrainer
from teachkit.engine.syncs import HostSyncCounter
from teachkit.recipes import distill, train_model
from teachkit.recipes.kd import LABEL_TERMS

LR, MU, DELTA, WD = 0.1, 0.9, 0.075, 0.01


class Interrupt(Exception):
    pass


def three_params():
    """``shared`` (task and kd gradient), ``task`` (task gradient only), ``reg`` (kd gradient only), float64."""
    return {"shared": nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64)),
            "task": nn.Parameter(torch.tensor([0.5], dtype=torch.float64)),
            "reg": nn.Parameter(torch.tensor([0.3, -0.1, 0.7], dtype=torch.float64))}


U, V = torch.tensor([0.2, 0.4], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)
R, S = torch.tensor([-0.5, 1.5], dtype=torch.float64), torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)


def quadratic_terms(p):
    """ce = |shared - U|^2 / 2 + 3 |task - V|^2 / 2,  kd = 2 |shared - R|^2 / 2 + |reg - S|^2 / 2."""
    ce = 0.5 * (p["shared"] - U).pow(2).sum() + 1.5 * (p["task"] - V).pow(2).sum()
    kd = (p["shared"] - R).pow(2).sum() + 0.5 * (p["reg"] - S).pow(2).sum()
    return {"ce": ce, "kd": kd}


def hand_dot(steps):
    """The three parameters after ``steps`` DOT steps, written out from the rules (the paper's Sec. 4.2 and the
    reference's weight-decay placement): task momentum MU - DELTA where a parameter also has a kd gradient, else
    MU; kd momentum MU + DELTA where it also has a task gradient, else MU with weight decay from the 2nd step."""
    sh, ta, rg = (t.detach().clone() for t in three_params().values())
    for i in range(steps):
        g_sh_task, g_ta, g_sh_kd, g_rg = sh - U, 3 * (ta - V), 2 * (sh - R), rg - S
        d_sh, d_ta = g_sh_task + WD * sh, g_ta + WD * ta
        if i == 0:
            b_sh, b_ta, k_sh, k_rg = d_sh, d_ta, g_sh_kd, g_rg
        else:
            b_sh = (MU - DELTA) * b_sh + d_sh
            b_ta = MU * b_ta + d_ta
            k_sh = (MU + DELTA) * k_sh + g_sh_kd
            k_rg = MU * k_rg + (g_rg + WD * rg)
        sh = sh - LR * b_sh - LR * k_sh
        ta = ta - LR * b_ta
        rg = rg - LR * k_rg
    return {"shared": sh, "task": ta, "reg": rg}


def run_dot(steps, chunks=1):
    p = three_params()
    opt = DistillationOrientedTrainer(list(p.values()), lr=LR, momentum=MU, delta=DELTA, weight_decay=WD)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        for _ in range(chunks):
            opt.backward(quadratic_terms(p), None if chunks == 1 else 1.0 / chunks)
        opt.step()
    return p, opt


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_steps_match_the_hand_computed_updates(steps):
    p, opt = run_dot(steps)
    want = hand_dot(steps)
    for name in p:
        torch.testing.assert_close(p[name].detach(), want[name], rtol=1e-12, atol=1e-12, msg=name)
    assert set(opt.state[p["shared"]]) == {TASK_BUFFER, KD_BUFFER}
    assert set(opt.state[p["task"]]) == {TASK_BUFFER} and set(opt.state[p["reg"]]) == {KD_BUFFER}


def test_chunks_weighted_by_their_share_equal_one_whole_batch():
    p1, _ = run_dot(3)
    p4, _ = run_dot(3, chunks=4)
    for name in p1:
        torch.testing.assert_close(p4[name], p1[name], rtol=1e-12, atol=1e-12, msg=name)


def linear_step(model, opt, x, y, kd_target=None):
    opt.zero_grad(set_to_none=True)
    logits = model(x)
    terms = {"ce": F.cross_entropy(logits, y)}
    if kd_target is not None:
        terms["kd"] = F.kl_div(F.log_softmax(logits, 1), F.softmax(kd_target, 1), reduction="batchmean")
    if isinstance(opt, DistillationOrientedTrainer):
        opt.backward(terms, None)
    else:
        sum(terms.values()).backward()
    opt.step()


def test_label_only_steps_are_momentum_sgd_bit_for_bit():
    """No distillation term: every parameter is task-only, so DOT is SGD with momentum mu (not mu -+ delta)."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    a, b = nn.Linear(5, 3), nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    dot = DistillationOrientedTrainer(a.parameters(), lr=LR, momentum=MU, delta=DELTA, weight_decay=WD)
    sgd = torch.optim.SGD(b.parameters(), lr=LR, momentum=MU, weight_decay=WD, foreach=False)
    for _ in range(4):
        linear_step(a, dot, x, y)
        linear_step(b, sgd, x, y)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k


def test_kd_terms_take_the_larger_momentum():
    """With a kd term the update differs from SGD's on the summed loss, and from DOT with delta 0 (which is SGD)."""
    torch.manual_seed(0)
    x, y, zt = torch.randn(16, 5), torch.randint(0, 3, (16,)), torch.randn(16, 3)
    models = [nn.Linear(5, 3) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [DistillationOrientedTrainer(models[0].parameters(), lr=LR, momentum=MU, delta=DELTA),
            DistillationOrientedTrainer(models[1].parameters(), lr=LR, momentum=MU, delta=0.0),
            torch.optim.SGD(models[2].parameters(), lr=LR, momentum=MU)]
    for _ in range(3):
        for m, o in zip(models, opts, strict=True):
            linear_step(m, o, x, y, zt)
    torch.testing.assert_close(models[1].weight, models[2].weight, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(models[0].weight, models[2].weight, rtol=1e-4, atol=1e-5)


def test_backward_and_step_read_no_tensor_value():
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    opt = DistillationOrientedTrainer(model.parameters(), lr=LR, weight_decay=WD)
    x, y, zt = torch.randn(8, 5), torch.randint(0, 3, (8,)), torch.randn(8, 3)
    linear_step(model, opt, x, y, zt)  # the buffers' first step
    with HostSyncCounter() as counter:
        for _ in range(2):
            linear_step(model, opt, x, y, zt)
    assert counter.total == 0, counter.counts


def test_default_task_terms_are_the_kd_recipes_label_terms():
    assert set(TASK_TERMS) == set(LABEL_TERMS)


def test_both_buffers_survive_the_checkpoint(tmp_path):
    """The flat (pickle-free) optimiser state keeps both momenta; continuing from it equals continuing in memory."""
    p, opt = run_dot(2)
    tensors, struct = optimizer_to_flat(opt)
    assert {k.rsplit("/", 1)[1] for k in tensors} == {TASK_BUFFER, KD_BUFFER}
    save_checkpoint(tmp_path / "o.safetensors", tensors, {"optimizer": struct})
    loaded, state = load_checkpoint(tmp_path / "o.safetensors")
    q = {k: nn.Parameter(v.detach().clone()) for k, v in p.items()}
    opt2 = DistillationOrientedTrainer(list(q.values()), lr=1.0, momentum=0.5, delta=0.1)  # groups come from file
    optimizer_from_flat(opt2, loaded, state["optimizer"])
    assert opt2.param_groups[0]["momentum"] == MU and opt2.param_groups[0]["delta"] == DELTA
    for name in p:
        for key in opt.state[p[name]]:
            assert torch.equal(opt.state[p[name]][key], opt2.state[q[name]][key]), (name, key)
    for params, o in ((p, opt), (q, opt2)):
        o.zero_grad()
        o.backward(quadratic_terms(params), None)
        o.step()
    for name in p:
        assert torch.equal(p[name], q[name]), name


def _crash_after(monkeypatch, evaluations):
    real = ClassificationEvaluator.evaluate
    calls = {"n": 0}

    def evaluate(self, model):
        calls["n"] += 1
        if calls["n"] == evaluations + 1:
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", evaluate)


def test_distill_with_dot_resumes_bit_identically(tiny, tmp_path, monkeypatch):
    """FitNet (its regressor gets only a kd gradient) with DOT: 4 epochs straight == 2, crash, resume for 2."""
    teacher = train_model(tiny(name="teacher", model={"name": "mlp", "options": {"hidden": [32]}}))
    run = {"optim": {"name": "dot", "lr": 0.05, "weight_decay": 5e-4},
           "kd": {"method": ["fitnet", "kd"], "options": {"fitnet": {"stage": 0}}},
           "teacher": {"checkpoint": str(teacher.run_dir)}, "train": {"epochs": 4, "progress": False}}
    straight = distill(tiny(name="straight", **run))
    with monkeypatch.context() as m:
        _crash_after(m, 2)
        with pytest.raises(Interrupt):
            distill(tiny(name="resumed", **run))
    _, state = load_checkpoint(tmp_path / "runs" / "resumed" / "checkpoints" / "last.safetensors")
    assert state["epoch"] == 2
    resumed = distill(tiny(name="resumed", **run), resume=True)
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    tensors, state = load_checkpoint(straight.run_dir / "checkpoints" / "last.safetensors")
    buffers = {}
    for key in tensors:
        if key.startswith("optim/"):
            _, index, name = key.split("/")
            buffers.setdefault(index, set()).add(name)
    kinds = set(map(frozenset, buffers.values()))
    # the student's weights carry both momenta, the regressor's only the kd one
    assert frozenset({TASK_BUFFER, KD_BUFFER}) in kinds and frozenset({KD_BUFFER}) in kinds
    assert state["optimizer"]["param_groups"][0]["delta"] == 0.075


def test_micro_batches_equal_whole_batches_through_the_engine(tiny):
    teacher = train_model(tiny(name="teacher", model={"name": "mlp", "options": {"hidden": [32]}}))
    run = {"optim": {"name": "dot", "lr": 0.05}, "kd": {"method": "dkd"},
           "teacher": {"checkpoint": str(teacher.run_dir)}}
    whole = distill(tiny(name="whole", **run))
    chunked = distill(tiny(name="chunked", **run, train={"epochs": 2, "progress": False, "micro_batch": 8}))
    for (k, a), b in zip(whole.model.state_dict().items(), chunked.model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=k)
