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
