"""Shared helpers for distillation-loss tests: probe taps, build a Distiller, run one training step."""

from __future__ import annotations

import torch
from torch import nn

from teachkit.data.base import Batch
from teachkit.losses import LOSSES, Progress, build_distiller
from teachkit.models import Tapped, build_model
from teachkit.recipes.common import FrozenTeacher


def make_pair(student: str, teacher: str, shape=(3, 32, 32), classes=10, student_opts=None, teacher_opts=None):
    torch.manual_seed(0)
    return (build_model(student, shape, classes, **(student_opts or {})),
            build_model(teacher, shape, classes, **(teacher_opts or {})))


def one_step(method: str | list[str], student: nn.Module, teacher: nn.Module, shape=(3, 32, 32), classes=10,
             batch_size=8, num_samples=64, options=None, gamma=None, epoch=0):
    """Build the Distiller from probes exactly as the kd recipe does, run one SGD step.

    Returns (terms, distiller, teacher) so tests can check values and where gradients went.
    """
    names = [method] if isinstance(method, str) else method
    needs = {"logits"}
    for n in names:
        needs.update(LOSSES.get(n).needs)
    frozen = FrozenTeacher(teacher)
    s_tap, t_tap = Tapped(student, want=needs), Tapped(frozen, want=needs)
    x = torch.randn(batch_size, *shape)
    y = torch.arange(batch_size) % classes
    with torch.no_grad():
        student.eval()
        s_probe, t_probe = s_tap(x[:2]), t_tap(x[:2])
        student.train()
    distiller = build_distiller(names, s_probe, t_probe, num_classes=classes, num_samples=num_samples,
                                options=options, gamma=gamma)
    params = list(student.parameters()) + list(distiller.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    batch = Batch(x, y, torch.arange(batch_size) % num_samples)
    terms = distiller(s_tap(x), t_tap(x), batch, Progress(epoch, 0, 240, 10))
    loss = sum(terms.values())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return terms, distiller, teacher
