"""The registry of distillation losses (one module per objective registers itself here)."""

from __future__ import annotations

from teachkit.losses.base import DistillLoss
from teachkit.registry import Entry, Registry


def _name_class(entry: Entry[type[DistillLoss]]) -> None:
    """Give the registered class its name (``method_name``), which its error messages use."""
    entry.obj.method_name = entry.name


LOSSES: Registry[type[DistillLoss]] = Registry("distillation loss", on_register=_name_class)
