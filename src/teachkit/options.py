"""Typed options: dataclasses whose fields are coerced and checked (type, range, choices) when made.

Every configurable piece of teachkit (a dataset, the optimiser, a distillation loss, a recipe) declares
its options as a dataclass deriving from :class:`Options`, with :func:`option` fields carrying range
rules. Making one -- from YAML through :func:`from_mapping`, or directly in Python -- validates every
field in ``__post_init__``, so there is exactly one place where a value is checked, and a bad value is a
one-line :class:`~teachkit.errors.ConfigError` naming the full key (``kd.options.crd.nce_k=0 is out of
range: must be >= 1``), the value and what is allowed. Unknown keys get a did-you-mean hint. Values are
shown with :func:`short_repr`, so a message stays one short line whatever the value holds.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, ClassVar, Literal, TypeVar

from teachkit.errors import ConfigError
from teachkit.registry import closest

O = TypeVar("O", bound="Options")

#: The dotted key of the options object being made (``"kd.options.crd"``), for error messages.
_KEY: ContextVar[str] = ContextVar("teachkit_options_key", default="")
_HINTS: dict[type, dict[str, Any]] = {}
_RULES = {"gt": (lambda v, b: v > b, ">"), "ge": (lambda v, b: v >= b, ">="),
          "lt": (lambda v, b: v < b, "<"), "le": (lambda v, b: v <= b, "<=")}


def option(default: Any = dataclasses.MISSING, *, factory: Any = None, gt: float | None = None,
           ge: float | None = None, lt: float | None = None, le: float | None = None, path: bool = False) -> Any:
    """A dataclass field with range rules: ``lr: float = option(0.1, gt=0.0)``. ``path=True`` declares a
    file or folder path (``root: str | None = option(None, path=True)``): written in a config or sweep file it is
    relative to that file's folder, and the run's ``config.yaml`` records it absolute (:func:`is_path`)."""
    rules: dict[str, Any] = {k: v for k, v in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if v is not None}
    if path:
        rules[PATH] = True
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=rules)
    return dataclasses.field(default=default, metadata=rules)


#: the field metadata key marking a path option (:func:`option` ``path=True``)
PATH = "path"


def is_path(f: dataclasses.Field) -> bool:
    """Whether the dataclass field ``f`` was declared a path (``option(..., path=True)``)."""
    return bool(f.metadata.get(PATH))


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class _Full(Exception):
    """Raised inside :func:`short_repr` once the text is long enough."""


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (``...`` marks a cut), built piece by piece so a
    huge or self-referencing value (a YAML alias bomb) costs no more than ``limit`` characters of work."""
    parts: list[str] = []
    size = [0]

    def emit(text: str) -> None:
        parts.append(text)
        size[0] += len(text)
        if size[0] > limit:
            raise _Full

    def walk(v: Any) -> None:
        if isinstance(v, str):
            emit(repr(v[: limit + 1]) if len(v) > limit else repr(v))
        elif isinstance(v, Mapping):
            emit("{")
            for i, (k, item) in enumerate(v.items()):
                emit(", " if i else "")
                walk(k)
                emit(": ")
                walk(item)
            emit("}")
        elif isinstance(v, (list, tuple, set, frozenset)):
            if not v and isinstance(v, (set, frozenset)):
                emit(repr(v))
                return
            left, right = {list: "[]", tuple: "()"}.get(type(v), "{}")
            emit(left)
            for i, item in enumerate(v):
                emit(", " if i else "")
                walk(item)
            emit("," + right if isinstance(v, tuple) and len(v) == 1 else right)
        else:
            text = repr(v)
            emit(text if len(text) <= limit else text[: limit + 1])

    try:
        walk(value)
    except _Full:
        return "".join(parts)[: max(0, limit - 3)] + "..."
    return "".join(parts)


class Options:
    """Base of every options dataclass: fields are coerced and range-checked when an instance is made.

    A subclass may override :meth:`validate` for checks across fields; :meth:`key` gives a field's full
    dotted name for its messages. ``resumable`` names the fields that may change when a run folder is
    resumed because they do not change what was already computed (e.g. ``train.progress``).
    """

    resumable: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        prefix = _KEY.get()
        object.__setattr__(self, "_key", prefix)
        hints = type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            key = join(prefix, f.name)
            value = coerce(getattr(self, f.name), hints[f.name], key)
            check_range(value, {r: b for r, b in f.metadata.items() if r in _RULES}, key)
            object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Checks across fields (raise ConfigError naming ``self.key(field)``). Default: none."""

    def key(self, name: str) -> str:
        """The full dotted key of field ``name`` (``kd.options.crd.nce_k``)."""
        return join(getattr(self, "_key", ""), name)


def type_hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def type_name(tp: Any) -> str:
    """How a type reads in an error message ("a number", "one of 'sgd', 'adamw'", ...)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number",
            str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


#: the words YAML 1.1 reads as booleans (any case), by the boolean each becomes
BOOL_WORDS: dict[bool, tuple[str, ...]] = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def bool_word(value: Any, choices: tuple[Any, ...]) -> str | None:
    """The word among the string ``choices`` that YAML 1.1 read as the boolean ``value`` (``off``, ``no`` or
    ``false`` for False; ``on``, ``yes`` or ``true`` for True), or None: ``cache: off`` means ``"off"``."""
    if not isinstance(value, bool):
        return None
    for word in BOOL_WORDS[value]:
        for choice in choices:
            if isinstance(choice, str) and choice.lower() == word:
                return choice
    return None


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` converted to type ``tp`` (ints to floats, mappings to options dataclasses) or a
    one-line ConfigError naming ``key``."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)

    def bad() -> ConfigError:  # built only when raised: the value's repr is bounded and never computed in vain
        return ConfigError(f"{key}={short_repr(value)} is not allowed: expected {type_name(tp)}")

    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in typing.get_args(tp)):
            return value
        word = bool_word(value, typing.get_args(tp))
        if word is not None:  # `teacher.cache=off`: YAML 1.1 read the word as a boolean
            return word
        allowed = [str(a) for a in typing.get_args(tp)]
        if isinstance(value, bool):  # `teacher.cache=on` with no 'on' among the choices
            raise ConfigError(f"{key}={value} is not allowed (YAML reads {'/'.join(BOOL_WORDS[value])} as {value}); "
                              f"choose one of: {', '.join(allowed)}")
        raise ConfigError(f"{key}={short_repr(value)} is not allowed{closest(short_repr(value), allowed)}; "
                          f"choose one of: {', '.join(allowed)}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, key)
            except ConfigError:
                pass
        if isinstance(value, bool) and str in args:  # `teacher.checkpoint=no`: say how to write the word
            return coerce(value, str, key)
        raise bad()
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise bad()
        (inner,) = typing.get_args(tp)
        return [coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise bad()
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is not Any:
            return {k: coerce(v, args[1], join(key, str(k))) for k, v in value.items()}
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_mapping(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # 1e3 reads as a float
            raise ConfigError(f"{key}={short_repr(value)} is not allowed: expected an integer (write {int(value)})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{key}={short_repr(value)} is not allowed: expected a finite number")
        return value
    if tp is str:
        if isinstance(value, bool):  # `name=off`: YAML 1.1 read a word as a boolean
            words = "/".join(BOOL_WORDS[value])
            raise ConfigError(f"{key}={value} is not allowed: expected a string (YAML reads {words} as {value}; "
                              f"quote the word, e.g. {key}='{BOOL_WORDS[value][0]}')")
        if not isinstance(value, str):
            raise bad()
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise bad()
    return value


def check_range(value: Any, rules: dict, key: str) -> None:
    """ConfigError when a number breaks one of ``rules`` ({"gt": 0, "le": 1}), naming all of them."""
    if not rules or value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    allowed = [f"{sym} {rules[r]}" for r, (_, sym) in _RULES.items() if r in rules]
    for r, (ok, _sym) in _RULES.items():
        if r in rules and not ok(value, rules[r]):
            raise ConfigError(f"{key}={short_repr(value)} is out of range: must be {' and '.join(allowed)}")


def from_mapping(cls: type[O], data: Mapping[str, Any] | None, prefix: str = "") -> O:
    """Validate a plain mapping into the options dataclass ``cls``; keys in messages start with ``prefix``."""
    if data is None:
        data = {}
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if not isinstance(data, Mapping):
        raise ConfigError(not_a_mapping(prefix, names, data))
    for key in data:
        if key not in names:
            shown = key if isinstance(key, str) and len(key) <= 80 else short_repr(key, 40)
            raise ConfigError(f"unknown config key {join(prefix, shown)!r}{closest(shown, names)}; "
                              f"allowed under {prefix or 'the top level'}: {', '.join(names) or 'none'}")
    token = _KEY.set(prefix)
    try:
        return cls(**data)
    finally:
        _KEY.reset(token)


def not_a_mapping(prefix: str, names: list[str], value: Any) -> str:
    """``data must be a mapping of keys (data.name, ...), got int 5``."""
    what = prefix or "the config"
    example = f" ({join(prefix, names[0])}, ...)" if names else ""
    return f"{what} must be a mapping of keys{example}, got {type(value).__name__} {short_repr(value)}"


def to_plain(obj: Any) -> Any:
    """Options (nested, in lists and dicts) as plain Python values for YAML / JSON."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def describe(cls: type | None) -> str:
    """``name=default, ...`` of an options dataclass, for ``teachkit list``."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return ""
    parts = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = to_plain(f.default_factory())  # type: ignore[misc]
        else:
            default = "?"
        parts.append(f"{f.name}={default}")
    return ", ".join(parts)


@dataclasses.dataclass
class NoOptions(Options):
    """For methods and recipes without options."""
