"""The bucketed gradient average of multi-process steps, in one process: a spy all-reduce with the semantics of two
identical processes (every sum is twice the value) records when each bucket starts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from teachkit import distributed
from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import LoopConfig, OptimConfig
from teachkit.engine import grad_buckets as gb
from teachkit.engine.grad_buckets import GradientBuckets, plan_buckets
from teachkit.engine.trainer import Trainer
from teachkit.types import StepOutput
from tests.engine.test_trainer import Scripted


class SpyPending:
    def __init__(self, t):
        self.t = t

    def wait(self):
        return self.t * 2  # two identical processes


@pytest.fixture
def spy(monkeypatch):
    """Every bucket sum started, as (event index, numel), into a shared event list."""
    events: list[str] = []
    sizes: list[int] = []

    def start(t):
        events.append(f"start {len(sizes)}")
        sizes.append(t.numel())
        return SpyPending(t.clone())

    monkeypatch.setattr(distributed, "all_reduce_sum_async", start)
    return events, sizes


def deep_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def test_buckets_respect_the_cap_in_reverse_order_and_split_by_dtype():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 30, 5, 20, 40)] + [nn.Parameter(torch.zeros(4).double())]
    buckets = plan_buckets(params, cap_bytes=25 * 4)  # 25 floats
    assert [[p.numel() for p in b] for b in buckets] == [[4], [40], [20, 5], [30], [10]]
    assert buckets[0][0].dtype == torch.float64
    for bucket in buckets:
        assert len(bucket) == 1 or sum(p.numel() * p.element_size() for p in bucket) <= 25 * 4
    assert gb.BUCKET_CAP_BYTES == 25 * 1024 * 1024


def test_buckets_start_during_the_backward_and_average_exactly(spy):
    events, sizes = spy
    net = deep_net()
    x, y = torch.randn(16, 6, requires_grad=True), torch.randint(0, 3, (16,))
    x.register_hook(lambda g: events.append("input grad"))  # the backward's very last gradient
    nn.functional.cross_entropy(net(x), y).backward()
    reference = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    events.clear()

    buckets = GradientBuckets(list(net.parameters()), world=2, cap_bytes=40 * 4)  # one parameter per bucket
    assert len(buckets.buckets) == 6
    buckets.arm()
    nn.functional.cross_entropy(net(x), y).backward()
    finished = events.index("input grad")
    assert "start 0" in events[:finished] and "start 3" in events[:finished]  # started while the backward ran
    buckets.flush()
    buckets.wait()
    assert sizes == [3 + 1, 96 + 1, 32 + 1, 1024 + 1, 32 + 1, 192 + 1]  # reverse order, one flag per parameter
    for p, ref in zip(net.parameters(), reference, strict=True):
        assert torch.equal(p.grad, ref)
    buckets.remove()


def test_earlier_chunks_only_accumulate_and_an_unused_parameter_keeps_no_gradient(spy):
    events, sizes = spy
    net = deep_net()
    unused = nn.Linear(4, 4)
    params = [*net.parameters(), *unused.parameters()]  # the unused layer is bucket 0: it never becomes ready
    buckets = GradientBuckets(params, world=2, cap_bytes=40 * 4)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    nn.functional.cross_entropy(net(x[:8]), y[:8]).backward()  # not armed: accumulates only
    assert events == []
    buckets.arm()
    nn.functional.cross_entropy(net(x[8:]), y[8:]).backward()
    assert events == []  # bucket 0 waits for a gradient that never comes, and the others wait for it (in order)
    buckets.flush()
    assert events == [f"start {i}" for i in range(len(buckets.buckets))]
    assert unused.bias in buckets.buckets[0]
    buckets.wait()
    assert unused.weight.grad is None and unused.bias.grad is None
    net.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(net(x[:8]), y[:8]).backward()
    nn.functional.cross_entropy(net(x[8:]), y[8:]).backward()
    assert all(p.grad is not None for p in net.parameters())
    buckets.remove()


def two_process_trainer(tmp_path, monkeypatch, name, micro_batch, hooks):
    """A Trainer that believes it is rank 0 of 2 whose peer has its gradients (the spy doubles every sum)."""
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda t: t * 2)
    monkeypatch.setattr(distributed, "all_gather_cat", lambda t: torch.cat([t, t]))
    monkeypatch.setattr(gb, "hooks_available", lambda: hooks)
    monkeypatch.setattr("teachkit.engine.trainer.hooks_available", lambda: hooks)
    net = deep_net()
    torch.manual_seed(1)
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))

    def step(batch, progress):
        logits = net(batch.x)
        return StepOutput({"ce": nn.functional.cross_entropy(logits, batch.y)}, logits)

    trainer = Trainer(net, step, BatchLoader(TensorSplit(x, y), 16, shuffle=True, seed=0), OptimConfig(lr=0.1),
                      Scripted([{"acc": 1.0, "loss": 1.0}]), tmp_path / name,
                      loop=LoopConfig(epochs=2, progress=False, micro_batch=micro_batch))
    while not trainer.done:
        trainer.run_epoch()
    return trainer, net


@pytest.mark.parametrize("micro_batch", [None, 3])
def test_trainer_buckets_equal_the_all_reduce_after_the_backward(tmp_path, monkeypatch, spy, micro_batch):
    events, sizes = spy
    with_buckets, a = two_process_trainer(tmp_path, monkeypatch, "buckets", micro_batch, hooks=True)
    assert with_buckets.buckets is not None and len(events) == 2 * 4  # 2 epochs x 4 steps, one bucket each
    assert sizes[0] == sum(p.numel() + 1 for p in a.parameters())
    fallback, b = two_process_trainer(tmp_path, monkeypatch, "fallback", micro_batch, hooks=False)
    assert fallback.buckets is None and len(events) == 8
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    with_buckets.finish()
    assert with_buckets.buckets is None  # the hooks come off with the run
