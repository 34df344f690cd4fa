"""The registry of recipes (who trains when). A recipe registered with ``options=`` declares the config
section of the same name (``@RECIPES.register("prokd", ..., options=ProKDOptions)`` -> ``prokd:``)."""

from __future__ import annotations

from collections.abc import Callable

from teachkit.config import register_section
from teachkit.registry import Registry

RECIPES: Registry[Callable] = Registry("recipe", on_register=register_section)
