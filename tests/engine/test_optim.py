"""OptimConfig and build_optimizer: the optimiser each ``optim.name`` builds, and DOT's option checks."""

import pytest
import torch

from teachkit.config import from_dict
from teachkit.engine import OptimConfig, build_optimizer
from teachkit.engine.dot import DistillationOrientedTrainer
from teachkit.errors import ConfigError
from teachkit.options import from_mapping


def params():
    return list(torch.nn.Linear(3, 2).parameters())


def test_dot_builds_with_the_two_momenta_and_task_terms():
    cfg = from_mapping(OptimConfig, {"name": "dot", "lr": 0.05, "dot_delta": 0.05, "weight_decay": 1e-4,
                                     "dot_task_terms": ["ce", "aux_ce"]}, "optim")
    opt = build_optimizer(params(), cfg)
    assert isinstance(opt, DistillationOrientedTrainer)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["delta"], group["weight_decay"]) == (0.05, 0.9, 0.05, 1e-4)
    assert opt.task_terms == {"ce", "aux_ce"}
    assert from_mapping(OptimConfig, {"name": "dot"}, "optim").dot_delta == 0.075  # mdistiller's CFG.SOLVER.DOT


@pytest.mark.parametrize("name, kind", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_sgd_and_adamw_are_unchanged(name, kind):
    opt = build_optimizer(params(), from_mapping(OptimConfig, {"name": name}, "optim"))
    assert type(opt) is kind


@pytest.mark.parametrize("fields, fragment", [
    ({"dot_delta": 0.1}, "optim.dot_delta=0.1 is out of range for optim.momentum=0.9: DOT's momenta momentum - "
                         "dot_delta = 0.8 and momentum + dot_delta = 1 must lie in [0, 1)"),
    ({"momentum": 0.05}, "momentum - dot_delta = -0.025"),
    ({"dot_task_terms": []}, "optim.dot_task_terms=[] is not allowed"),
    ({"nesterov": True}, "optim.nesterov=true is not supported by optim.name=dot"),
    ({"grad_clip": 1.0}, "optim.name=dot does not support optim.grad_clip=1.0"),
])
def test_dot_options_out_of_range_are_one_line_errors(fields, fragment):
    with pytest.raises(ConfigError) as e:
        from_mapping(OptimConfig, {"name": "dot", **fields}, "optim")
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_dot_fields_are_ignored_by_sgd():
    assert from_mapping(OptimConfig, {"name": "sgd", "dot_delta": 0.5, "grad_clip": 1.0}, "optim").grad_clip == 1.0


@pytest.mark.parametrize("key", ["optim", "teacher.optim"])
def test_dot_with_fp16_is_refused_when_the_config_loads(key):
    section = {"optim": {"name": "dot"}}
    data = {"train": {"precision": "fp16"}, **(section if key == "optim" else {"teacher": section})}
    with pytest.raises(ConfigError, match=f"^{key}.name=dot keeps the task and distillation gradients apart"):
        from_dict(data)
    from_dict({**data, "train": {"precision": "bf16"}})  # fine otherwise


def resnet_like():
    """A small conv net with BatchNorm (weights, biases, affine parameters: tensors of several shapes)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5))


def run_steps(fields, implementation, steps=4):
    """``steps`` optimiser steps of ``fields`` with ``implementation`` on fixed gradients; final weights and state."""
    model = resnet_like()
    params = list(model.parameters())
    opt = build_optimizer(params, from_mapping(OptimConfig, {**fields, "implementation": implementation}, "optim"))
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return [p.detach() for p in params], state, opt


def reference_sgd(fields, steps=4):
    """SGD with momentum, weight decay and Nesterov written out (Sutskever et al. 2013; PyTorch's form:
    g += wd p; b = mu b + g (b = g at the first step); d = g + mu b (Nesterov) or b; p -= lr d)."""
    model = resnet_like()
    params = [p.detach().clone() for p in model.parameters()]
    lr, mu, wd, nesterov = fields["lr"], fields["momentum"], fields["weight_decay"], fields.get("nesterov", False)
    bufs = [None] * len(params)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen) + wd * p
            bufs[i] = g.clone() if bufs[i] is None else mu * bufs[i] + g
            p -= lr * (g + mu * bufs[i] if nesterov else bufs[i])
    return params


SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}
CASES = [SGD, {**SGD, "nesterov": True}, {"name": "adamw", "lr": 1e-2, "weight_decay": 0.05}]


@pytest.mark.parametrize("fields", CASES, ids=["sgd", "nesterov", "adamw"])
def test_auto_runs_foreach_bit_identical_to_the_loop(fields):
    """``auto`` builds the multi-tensor (foreach) kernels, whose weights and state after 4 steps equal the
    per-parameter loop's bit for bit (so switching changed no run's numbers)."""
    auto_w, auto_s, opt = run_steps(fields, "auto")
    loop_w, loop_s, loop_opt = run_steps(fields, "loop")
    assert opt.param_groups[0]["foreach"] is True and loop_opt.param_groups[0]["foreach"] is False
    assert all(torch.equal(a, b) for a, b in zip(auto_w + auto_s, loop_w + loop_s, strict=True))


@pytest.mark.parametrize("fields", CASES[:2], ids=["sgd", "nesterov"])
def test_every_implementation_follows_the_sgd_update(fields):
    """loop, foreach and fused SGD all match the update written out (fused within float rounding)."""
    expected = reference_sgd(fields)
    for implementation in ("loop", "foreach", "fused"):
        weights, _, _ = run_steps(fields, implementation)
        for w, e in zip(weights, expected, strict=True):
            torch.testing.assert_close(w, e, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fields", CASES, ids=["sgd", "nesterov", "adamw"])
def test_fused_builds_or_falls_back_to_foreach_with_a_warning(fields, recwarn):
    weights, state, opt = run_steps(fields, "fused")
    loop_w, loop_s, _ = run_steps(fields, "loop")
    group = opt.param_groups[0]
    if group.get("fused"):
        for a, b in zip(weights + state, loop_w + loop_s, strict=True):  # float rounding apart, the same update
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        assert group["foreach"] is True
        assert any("optim.implementation=fused is not available here" in str(w.message) for w in recwarn)


def test_the_state_is_the_same_in_every_implementation_and_resume_keeps_this_runs_kernels():
    """The optimiser state (keys, shapes) does not depend on the implementation, and loading a checkpoint's state
    keeps the implementation the loading run was built with (the saving run's flags are not adopted)."""
    from teachkit.engine.checkpoint import optimizer_from_flat, optimizer_to_flat

    _, _, saved = run_steps(SGD, "foreach")
    tensors, structure = optimizer_to_flat(saved)
    _, _, loop_opt = run_steps(SGD, "loop", steps=1)
    assert sorted(optimizer_to_flat(loop_opt)[0]) == sorted(tensors)
    optimizer_from_flat(loop_opt, tensors, structure)
    assert loop_opt.param_groups[0]["foreach"] is False
    for i, param in enumerate(loop_opt.param_groups[0]["params"]):
        assert torch.equal(loop_opt.state[param]["momentum_buffer"], tensors[f"optim/{i}/momentum_buffer"])


def test_unknown_implementation_is_a_one_line_error():
    with pytest.raises(ConfigError) as e:
        from_mapping(OptimConfig, {"implementation": "simd"}, "optim")
    assert "optim.implementation='simd' is not allowed" in str(e.value) and "\n" not in str(e.value)


def test_a_torch_without_fused_kernels_runs_foreach_with_a_warning(monkeypatch):
    real = torch.optim.SGD

    class OldSGD(real):  # torch 2.2's SGD: no ``fused`` argument
        def __init__(self, params, fused=None, **kwargs):
            if fused is not None:
                raise TypeError("SGD.__init__() got an unexpected keyword argument 'fused'")
            super().__init__(params, **kwargs)

    monkeypatch.setattr(torch.optim, "SGD", OldSGD)
    with pytest.warns(UserWarning, match=r"^optim.implementation=fused is not available here \(SGD.__init__\(\) got"):
        opt = build_optimizer(params(), from_mapping(OptimConfig, {"implementation": "fused"}, "optim"))
    assert type(opt) is OldSGD and opt.param_groups[0]["foreach"] is True
