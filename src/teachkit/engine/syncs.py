"""Count host syncs: the points where Python reads a tensor's value (``.item()``, ``bool(t)``, ``float(t)``,
``.tolist()``, ...), each of which waits for the device to finish its queued work on a GPU.

Used by the throughput benchmark and the engine's tests to check "one host sync per step" on any device
(on CPU the reads are cheap, but they are the same reads that stall a GPU).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.overrides import TorchFunctionMode

#: Tensor methods that return a Python value read from the tensor's data.
READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy"})


def _off_cpu(t: Any) -> bool:
    device = getattr(t, "device", None)
    return device is not None and device.type != "cpu"


class HostSyncCounter(TorchFunctionMode):
    """``with HostSyncCounter() as c: ...`` counts tensor reads by method name in ``c.counts``
    (also ``.cpu()`` / ``.to(cpu)`` of a tensor on another device); ``c.total`` is their sum."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS:
            self.counts[name] += 1
        elif name in ("cpu", "to") and args and _off_cpu(args[0]) and (
                name == "cpu" or "cpu" in map(str, (*args[1:], *(kwargs or {}).values()))):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())
