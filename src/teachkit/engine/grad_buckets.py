"""The gradient average of a multi-process step, overlapped with its backward (DistributedDataParallel's buckets).

The trainable parameters are cut, in reverse order (the order a backward produces their gradients in), into
buckets of at most :data:`BUCKET_CAP_BYTES` of one dtype and device. A hook on each parameter
(``register_post_accumulate_grad_hook``) counts the gradients that became final in the step's last backward (with
``train.micro_batch`` the earlier chunks only accumulate: the hooks are armed for the last one alone); a bucket
whose gradients are all final is flattened and its sum over the processes starts at once (``async_op``), while
the backward goes on. Buckets start strictly in index order (a ready bucket waits for the ones before it), and
:meth:`GradientBuckets.flush` starts the rest -- those holding a parameter this process gave no gradient in that
backward -- before anything else is sent, so every process issues the same collectives in the same order and none
waits for a bucket another will never send (DDP's ``find_unused_parameters`` problem). Each bucket carries one
used-flag per parameter: after :meth:`GradientBuckets.wait` a parameter no process gave a gradient keeps none, so
the optimiser skips it as it would in one process. The sums are those of the one all-reduce after the backward
(the trainer's fallback), element for element.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from teachkit import distributed

#: the most bytes of gradients in one bucket (DistributedDataParallel's default ``bucket_cap_mb=25``); a
#: parameter larger than this is a bucket of its own
BUCKET_CAP_BYTES = 25 * 1024 * 1024


def hooks_available() -> bool:
    """Whether this torch has ``Tensor.register_post_accumulate_grad_hook`` (torch >= 2.1)."""
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def plan_buckets(params: Sequence[nn.Parameter], cap_bytes: int = BUCKET_CAP_BYTES) -> list[list[nn.Parameter]]:
    """``params`` in reverse order, cut into buckets of one dtype and device holding at most ``cap_bytes`` (a
    single larger parameter fills one alone)."""
    buckets: list[list[nn.Parameter]] = []
    size, kind = 0, None
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if not buckets or (p.dtype, p.device) != kind or size + nbytes > cap_bytes:
            buckets.append([])
            size, kind = 0, (p.dtype, p.device)
        buckets[-1].append(p)
        size += nbytes
    return buckets


class GradientBuckets:
    """Average the gradients of ``params`` over ``world`` processes bucket by bucket during the backward (module
    docstring): :meth:`arm` before the step's last backward, :meth:`flush` once it returned, then :meth:`wait`."""

    def __init__(self, params: Sequence[nn.Parameter], world: int, cap_bytes: int = BUCKET_CAP_BYTES) -> None:
        unique = list({id(p): p for p in params}.values())  # a parameter shared by two modules is summed once
        self.world = world
        self.buckets = plan_buckets(unique, cap_bytes)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._handles = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in unique]
        self.reset()

    def reset(self) -> None:
        """Forget the step in progress (nothing armed, counted or started)."""
        self.armed = False
        self._final = [0] * len(self.buckets)
        self._next = 0  # the first bucket not started
        self._pending: list[distributed.PendingSum] = []

    def arm(self) -> None:
        """The next backward is the step's last: a bucket starts once all its gradients are final."""
        self.armed = True

    def _on_gradient(self, p: Tensor) -> None:
        """A parameter's gradient is final for the step: count it, then start every ready bucket in order."""
        if not self.armed:
            return
        self._final[self._bucket_of[id(p)]] += 1
        while self._next < len(self.buckets) and self._final[self._next] == len(self.buckets[self._next]):
            self._start(self._next)

    def _start(self, i: int) -> None:
        """Flatten bucket ``i`` (gradients, zeros for none, then one used-flag per parameter) and start its sum."""
        params = self.buckets[i]
        flags = [p.grad is not None for p in params]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                         + [torch.tensor(flags, dtype=params[0].dtype, device=params[0].device)])
        self._pending.append(distributed.all_reduce_sum_async(flat))
        self._next = i + 1

    def flush(self) -> None:
        """Disarm and start, in order, every bucket the backward left (call on every process after its backward,
        before any other collective)."""
        self.armed = False
        while self._next < len(self.buckets):
            self._start(self._next)

    def wait(self) -> None:
        """Wait for every bucket's sum; each parameter some process gave a gradient gets the mean over the
        processes (a view of its bucket), the others keep none. One host read for all the flags."""
        self.flush()
        if not self.buckets:
            return
        flats = [pending.wait().div_(self.world) for pending in self._pending]
        used_host = torch.cat([flat[-len(params):].float().to(flats[0].device)
                               for flat, params in zip(flats, self.buckets, strict=True)]).tolist()
        k = 0
        for flat, params in zip(flats, self.buckets, strict=True):
            offset = 0
            for p in params:
                size = p.numel()
                if used_host[k] > 0:
                    p.grad = flat[offset:offset + size].view_as(p)
                offset, k = offset + size, k + 1
        self.reset()

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
