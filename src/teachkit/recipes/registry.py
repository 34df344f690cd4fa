"""The registry of recipes (who trains when)."""

from __future__ import annotations

from collections.abc import Callable

from teachkit.registry import Registry

RECIPES: Registry[Callable] = Registry("recipe")
