"""The registry of distillation losses (one module per objective registers itself here)."""

from __future__ import annotations

from teachkit.losses.base import DistillLoss
from teachkit.registry import Registry

LOSSES: Registry[type[DistillLoss]] = Registry("distillation loss")
