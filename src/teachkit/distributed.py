"""Multi-process data parallelism under ``torchrun``: the process group, this process's rank and the few
collectives the engine and the losses use.

``torchrun --nproc_per_node N -m teachkit.cli train ...`` starts N processes with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``MASTER_ADDR``/``MASTER_PORT`` set; :func:`init_from_env` (called when a run resolves its
device) joins them in one process group: NCCL on CUDA (process ``LOCAL_RANK`` on ``cuda:LOCAL_RANK``), gloo
on CPU. Without ``torchrun`` (``WORLD_SIZE`` unset or 1) everything here is a no-op for one process, so the
same code runs single-process unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def launched() -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher) with more than one process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def active() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def is_main() -> bool:
    """Whether this process writes the run folder and prints (rank 0, or the only process); before the process
    group is joined, the launcher's ``RANK`` says."""
    if active():
        return rank() == 0
    try:
        return int(os.environ.get("RANK", "0")) == 0 or not launched()
    except ValueError:
        return True


def local_rank() -> int:
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def init_from_env(device_type: str) -> None:
    """Join the ``torchrun`` process group (NCCL for ``cuda``, gloo otherwise) once; a no-op when not launched
    with several processes or already joined."""
    if not launched() or not dist.is_available() or dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend)


def barrier() -> None:
    if active():
        dist.barrier()


def _on_backend(t: Tensor) -> Tensor:
    """``t`` on a device the process group's backend takes (NCCL: CUDA tensors only)."""
    if dist.get_backend() == "nccl" and t.device.type != "cuda":
        return t.to(f"cuda:{torch.cuda.current_device()}")
    return t


def all_reduce_sum(t: Tensor) -> Tensor:
    """The element-wise sum of ``t`` over all processes (a new tensor; ``t`` itself when alone)."""
    if not active():
        return t
    out = _on_backend(t.clone())
    dist.all_reduce(out)
    return out.to(t.device)


class PendingSum:
    """A sum over the processes in flight (:func:`all_reduce_sum_async`); :meth:`wait` returns it."""

    def __init__(self, buffer: Tensor, work: Any, device: torch.device) -> None:
        self.buffer, self.work, self.device = buffer, work, device

    def wait(self) -> Tensor:
        """Block until the sum is done; it, on the device of the tensor that was summed."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.buffer.to(self.device)


def all_reduce_sum_async(t: Tensor) -> PendingSum:
    """Start summing ``t`` over all processes, in place (``async_op``), and return at once. Collectives pair up in
    the order the processes issue them, so every process must start its sums in the same order."""
    if not active():
        return PendingSum(t, None, t.device)
    buffer = _on_backend(t)
    return PendingSum(buffer, dist.all_reduce(buffer, async_op=True), t.device)


def broadcast_(t: Tensor, src: int = 0) -> None:
    """Overwrite ``t`` with process ``src``'s value, in place."""
    if not active():
        return
    buf = _on_backend(t)
    dist.broadcast(buf, src)
    if buf is not t:
        t.copy_(buf)


def all_gather_cat(t: Tensor) -> Tensor:
    """Every process's ``t`` concatenated along dim 0 in rank order (the processes' row counts may differ)."""
    if not active():
        return t
    n = world_size()
    size = torch.tensor([t.shape[0]], dtype=torch.long)
    sizes = [_on_backend(torch.zeros_like(size)) for _ in range(n)]
    dist.all_gather(sizes, _on_backend(size))
    counts = [int(s.item()) for s in sizes]
    top = max(counts)
    padded = _on_backend(t)
    if t.shape[0] < top:
        padded = torch.cat([padded, padded.new_zeros(top - t.shape[0], *t.shape[1:])])
    parts = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)]).to(t.device)


def shard_bounds(rows: int, world: int, rank_: int) -> tuple[int, int]:
    """Rows ``start:stop`` of a global batch of ``rows`` that process ``rank_`` of ``world`` trains on:
    consecutive, as equal as possible (the first ``rows % world`` processes take one more)."""
    base, extra = divmod(rows, world)
    start = rank_ * base + min(rank_, extra)
    return start, start + base + (1 if rank_ < extra else 0)
