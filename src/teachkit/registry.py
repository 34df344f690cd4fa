"""Name -> factory registries, filled by decorators next to each definition.

An entry may carry its typed options dataclass (``@LOSSES.register("crd", options=CRDOptions)``); the
run configuration validates a method's or recipe's options against it generically, so adding one never
edits ``config.py``. ``teachkit list`` prints every registry with one-line descriptions and options.

Plugins are importable modules outside teachkit (``plugins: [mylab.models]`` in a config, ``--plugin``,
``TEACHKIT_PLUGINS``) whose imports register more entries; :func:`import_plugins` imports them.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from teachkit.errors import ConfigError
from teachkit.trust import check_import

T = TypeVar("T")

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class DuplicateNameError(ConfigError, ValueError):
    """A name registered twice in one registry (by a plugin that reuses a built-in name, say)."""


def closest(name: str, options: list[str]) -> str:
    """A ' (did you mean X?)' hint for ``name`` among ``options``, or ''."""
    match = difflib.get_close_matches(str(name), options, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module and sub-package of ``package`` (``path`` is its ``__path__``), in name order, so
    that each registers what it defines: adding a model, dataset, loss, recipe or task is one new file,
    with no import line to add anywhere. Modules whose name starts with ``_`` are skipped."""
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def import_plugins(names: Iterable[str]) -> list[str]:
    """Import each plugin module in ``names`` (once; duplicates dropped) so that it registers its models,
    datasets, losses or recipes; returns the names imported, in order. A name that is not a module path,
    or a module that cannot be imported or raises anything while it is, is a one-line ConfigError naming it and
    the reason; a name read from a run folder needs the user's trust (:func:`teachkit.trust.check_import`)."""
    done: list[str] = []
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name.strip()):
            shown = repr(name) if isinstance(name, str) and len(name) <= 80 else type(name).__name__
            raise ConfigError(f"plugin {shown} is not a module name: expected a dotted import path "
                              f"such as mylab.models")
        name = name.strip()
        if name in done:
            continue
        check_import(name, "plugin")
        try:
            importlib.import_module(name)
        except ImportError as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            itself = isinstance(e, ModuleNotFoundError) and e.name is not None and name.startswith(e.name)
            hint = " (is its folder on PYTHONPATH or installed?)" if itself else ""
            raise ConfigError(f"plugin {name!r} cannot be imported: {type(e).__name__}: {reason}{hint}") from None
        except SyntaxError as e:
            raise ConfigError(f"plugin {name!r} cannot be imported: SyntaxError in {e.filename} line {e.lineno}: "
                              f"{e.msg}") from None
        except DuplicateNameError as e:
            raise ConfigError(f"plugin {name!r}: {e}") from None
        except (Exception, SystemExit) as e:  # noqa: BLE001 - user code: any failure on import is one line
            text = str(e).strip()
            reason = f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__
            raise ConfigError(f"plugin {name!r} failed while being imported ({reason})") from None
        done.append(name)
    return done


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str
    #: the options dataclass of this entry (None: it takes none)
    options: type | None = None
    #: options that name files (a dataset's ``train`` / ``val`` / ``test``): relative to ``data.root`` when it is
    #: set, else resolved like every path in a config file (relative to that file's folder)
    paths: tuple[str, ...] = ()


class Registry(Generic[T]):
    """A named collection of factories (models, datasets, losses, recipes, evaluators).

    ``on_register(entry)`` runs for every registration (the recipes registry uses it to declare each
    recipe's config section).
    """

    def __init__(self, kind: str, on_register: Callable[[Entry[T]], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._on_register = on_register

    def register(self, name: str, description: str = "", *, options: type | None = None,
                 paths: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator: ``@MODELS.register("resnet20", "CIFAR ResNet-20 (He et al. 2016)")``; ``paths``: the
        options that name files (:attr:`Entry.paths`)."""

        def deco(obj: T) -> T:
            if name in self._entries:
                where = getattr(self._entries[name].obj, "__module__", None)
                by = f" (first by {where})" if where else ""
                raise DuplicateNameError(f"{self.kind} {name!r} registered twice{by}; choose another name")
            doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            entry = Entry(name, obj, doc, options, tuple(paths))
            self._entries[name] = entry
            if self._on_register is not None:
                self._on_register(entry)
            return obj

        return deco

    def entry(self, name: str) -> Entry[T]:
        """The entry registered as ``name``; a one-line ConfigError naming the options otherwise."""
        if name not in self._entries:
            options = sorted(n for n in self._entries if "@" not in n)
            local = len(self._entries) - len(options)  # ``label@python``: objects the Python API registered
            more = f" (and {local} given as Python objects in this process)" if local else ""
            raise ConfigError(
                f"unknown {self.kind} {name!r}{closest(name, options)}; choose one of: {', '.join(options)}{more}"
            )
        return self._entries[name]

    def get(self, name: str) -> T:
        """The factory registered as ``name``; a one-line ConfigError naming the options otherwise."""
        return self.entry(name).obj

    def options_of(self, name: str) -> type | None:
        """The options dataclass registered with ``name`` (None when it takes none)."""
        return self.entry(name).options

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        for name in sorted(self._entries):
            yield self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

