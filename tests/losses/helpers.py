"""Shared helpers for distillation-loss tests: probe taps, build a DistillObjective, run one training step."""

from __future__ import annotations

import torch
from torch import nn

from teachkit.losses import Progress, build_objective, needs_of
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.types import Batch


def make_pair(student: str, teacher: str, shape=(3, 32, 32), classes=10, student_opts=None, teacher_opts=None):
    torch.manual_seed(0)
    return (build_model(student, shape, classes, **(student_opts or {})),
            build_model(teacher, shape, classes, **(teacher_opts or {})))


def probe(student: nn.Module, teacher: nn.Module, methods: str | list[str], shape=(3, 32, 32), n: int = 2,
          x: torch.Tensor | None = None):
    """(tapped student, tapped frozen teacher, student probe, teacher probe) as the kd recipe builds them:
    each side asked for the taps the methods read of it, probed on ``n`` samples (or ``x``) in eval mode,
    no grad."""
    names = [methods] if isinstance(methods, str) else list(methods)
    s_needs, t_needs = needs_of(names)
    s_tap, t_tap = Tapped(student, want=s_needs), Tapped(FrozenTeacher(teacher), want=t_needs)
    if x is None:
        x = torch.randn(n, *shape)
    with torch.no_grad():
        was = student.training
        student.eval()
        s_probe, t_probe = s_tap(x), t_tap(x)
        student.train(was)
    return s_tap, t_tap, s_probe, t_probe


def one_step(method: str | list[str], student: nn.Module, teacher: nn.Module, shape=(3, 32, 32), classes=10,
             batch_size=8, num_samples=64, options=None, gamma=None, epoch=0):
    """Build the DistillObjective from probes exactly as the kd recipe does, run one SGD step.

    Returns (terms, objective, teacher) so tests can check values and where gradients went.
    """
    names = [method] if isinstance(method, str) else method
    x = torch.randn(batch_size, *shape)
    y = torch.arange(batch_size) % classes
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, names, x=x[:2])
    student.train()
    kd = {k: v for k, v in (("options", options), ("gamma", gamma)) if v is not None}
    objective = build_objective(names, s_probe, t_probe, num_classes=classes, num_samples=num_samples, **kd)
    params = list(student.parameters()) + list(objective.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    batch = Batch(x, y, torch.arange(batch_size) % num_samples)
    terms = objective(s_tap(x), t_tap(x), batch, Progress(epoch, 0, 240, 10))
    loss = sum(terms.values())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return terms, objective, teacher
