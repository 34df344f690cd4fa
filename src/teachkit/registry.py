"""Name -> factory registries, filled by decorators next to each definition.

``teachkit list`` prints every registry with one-line descriptions.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from teachkit.errors import ConfigError

T = TypeVar("T")


def closest(name: str, options: list[str]) -> str:
    """A ' (did you mean X?)' hint for ``name`` among ``options``, or ''."""
    match = difflib.get_close_matches(str(name), options, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """A named collection of factories (models, datasets, losses, recipes)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator: ``@MODELS.register("resnet20", "CIFAR ResNet-20 (He et al. 2016)")``."""

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, obj, doc)
            return obj

        return deco

    def get(self, name: str) -> T:
        """The factory registered as ``name``; a one-line ConfigError naming the options otherwise."""
        if name not in self._entries:
            options = sorted(self._entries)
            raise ConfigError(
                f"unknown {self.kind} {name!r}{closest(name, options)}; choose one of: {', '.join(options)}"
            )
        return self._entries[name].obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        for name in sorted(self._entries):
            yield self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def describe(obj: Any) -> str:
    return (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
