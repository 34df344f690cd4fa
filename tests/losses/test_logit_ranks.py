"""Every registered method that reads logits refuses logits of a rank it does not support in one ConfigError line
naming the method, the shape and what it accepts (``DistillLoss.logit_ranks``), and computes on the ranks it does.

The methods are discovered from the registry, so a new logit method is checked by registering it: unless it is
listed in ``ACCEPTED`` below, it must accept (batch, classes) logits only.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.kd import kd_kl
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.types import Batch, Taps

LOGIT_METHODS = [m for m in LOSSES.names()
                 if "logits" in LOSSES.get(m).student_needs or "logits" in LOSSES.get(m).teacher_needs]
#: the ranks each method accepts beyond the default (batch, classes), written down here, not read from the code
ACCEPTED = {"kd": {2, 3, 4}, "dist": {2, 3, 4}, "logit_l2": {1, 2, 3, 4}}
RANKS = (0, 1, 2, 3, 4)
#: a logit tensor of each rank: B = 4 samples, C = 5 classes, then positions
SHAPES = {0: (), 1: (4,), 2: (4, 5), 3: (4, 5, 3), 4: (4, 5, 2, 3)}
CLASSES, IMAGE = 5, (3, 8, 8)
P = Progress(0, 0, 1, 1)


@pytest.fixture(scope="module")
def probes() -> tuple[Taps, Taps]:
    """Every tap of a resnet8 student and a frozen resnet14 teacher, probed as the kd recipe does."""
    torch.manual_seed(0)
    wanted = {"logits", "embedding", "stages", "stages_pre"}
    student = Tapped(build_model("resnet8", IMAGE, CLASSES).eval(), want=wanted)
    teacher = Tapped(FrozenTeacher(build_model("resnet14", IMAGE, CLASSES)), want=wanted)
    with torch.no_grad():
        x = torch.randn(2, *IMAGE)
        return student(x), teacher(x)


def build(name: str, probes: tuple[Taps, Taps], student_rank: int, teacher_rank: int):
    s, t = probes
    s = dataclasses.replace(s, logits=torch.zeros(SHAPES[student_rank]))
    t = dataclasses.replace(t, logits=torch.zeros(SHAPES[teacher_rank]))
    return build_objective(name, s, t, num_classes=CLASSES, num_samples=64).methods[name]


def test_the_registry_has_the_logit_methods():
    assert {"kd", "dkd", "mlkd", "dist", "logit_l2", "hsakd"} <= set(LOGIT_METHODS)


@pytest.mark.parametrize("name", LOGIT_METHODS)
@pytest.mark.parametrize("rank", RANKS)
def test_unsupported_ranks_are_one_config_error_line(name, rank, probes):
    accepted = ACCEPTED.get(name, {2})
    if rank in accepted:
        build(name, probes, rank, rank)  # builds
        return
    for side, ranks in (("student", (rank, 2)), ("teacher", (2, rank))):
        with pytest.raises(ConfigError) as info:
            build(name, probes, *ranks)
        message = str(info.value)
        shape = re.escape(str(SHAPES[rank]))
        assert re.fullmatch(rf"{name} needs \(batch,[^;]*\) logits; the {side}'s are shaped {shape} \(rank {rank}\)",
                            message), message


@pytest.mark.parametrize(("name", "rank"), [(n, r) for n in sorted(ACCEPTED) for r in sorted(ACCEPTED[n]) if r != 2])
def test_accepted_ranks_compute_finite_terms_and_gradients(name, rank, probes):
    loss = build(name, probes, rank, rank)
    g = torch.Generator().manual_seed(rank)
    z_s = torch.randn(SHAPES[rank], generator=g, requires_grad=True)
    z_t = torch.randn(SHAPES[rank], generator=g)
    terms = loss(Taps(z_s), Taps(z_t), Batch(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), torch.arange(4)), P)
    total = sum(terms.values())
    assert torch.isfinite(total) and total.item() > 0
    (grad,) = torch.autograd.grad(total, z_s)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def _per_position(value_2d, z_s, z_t):
    """The mean over the positions of a (B, C) loss applied to each position's (B, C) slice."""
    flat_s, flat_t = z_s.flatten(2), z_t.flatten(2)
    return sum(value_2d(flat_s[..., i], flat_t[..., i]) for i in range(flat_s.shape[-1])) / flat_s.shape[-1]


@pytest.mark.parametrize("options", [{}, {"divergence": "reverse_kl"}, {"divergence": "jsd", "jsd_beta": 0.3},
                                     {"divergence": "tv"}, {"logit_standardize": True}, {"top_k": 2}])
def test_kd_on_positions_is_the_mean_of_the_per_position_losses(options, probes):
    # a QA model's (B, L, 2) start / end logits, or a dense (B, C, H, W) map: a distribution over axis 1 at every
    # position, whichever divergence; equal to the (B, C) loss on each position's slice, averaged
    g = torch.Generator().manual_seed(3)
    z_s, z_t = 2 * torch.randn(4, 5, 2, 3, generator=g, dtype=torch.float64), 2 * torch.randn(4, 5, 2, 3, generator=g,
                                                                                               dtype=torch.float64)
    batch = Batch(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), torch.arange(4))
    dense, rows = build("kd", probes, 4, 4), build("kd", probes, 2, 2)
    if options:
        s, t = probes
        dense = build_objective("kd", dataclasses.replace(s, logits=z_s), dataclasses.replace(t, logits=z_t),
                                num_classes=CLASSES, num_samples=64, options={"kd": options}).methods["kd"]
        rows = build_objective("kd", s, t, num_classes=CLASSES, num_samples=64, options={"kd": options}).methods["kd"]
    value = dense(Taps(z_s), Taps(z_t), batch, P)["kl"]
    expected = _per_position(lambda a, b: rows(Taps(a), Taps(b), batch, P)["kl"], z_s, z_t)
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)
    if not options:  # Hinton's T^2 KL over axis 1, by its formula
        assert value.item() == pytest.approx(_per_position(lambda a, b: kd_kl(a, b, 4.0), z_s, z_t).item(), rel=1e-12)
