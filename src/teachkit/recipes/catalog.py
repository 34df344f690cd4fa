"""What ``teachkit list KIND NAME`` shows: one registered entry's options as a table.

Each row is an option's name, type, default, allowed values and one line of help. The options come from the
typed options dataclass an entry was registered with (losses, recipes) or from the keyword parameters of its
factory (models: ``model.options``, datasets: ``data.options``). The help line is, in order: the ``#:`` comment
above the field, the ``name``: clause of the class's or factory's docstring, or the docstring clause that names
the option; no method file needs anything else.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import re
import typing
from collections import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from teachkit.data import DATASETS
from teachkit.engine import CALLBACKS, EVALUATORS
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, OBJECTIVES
from teachkit.models import MODELS
from teachkit.options import to_plain, type_hints
from teachkit.recipes.registry import RECIPES
from teachkit.registry import Entry, Registry

#: where the configuration reference is, for every ``--help`` and table
REFERENCE = "docs/configuration.md"
#: the kinds ``teachkit list`` takes, with the registries each one covers
KINDS: dict[str, tuple[Registry, ...]] = {"models": (MODELS,), "datasets": (DATASETS,),
                                          "losses": (OBJECTIVES, LOSSES), "recipes": (RECIPES,),
                                          "evaluators": (EVALUATORS,), "callbacks": (CALLBACKS,)}
SINGULAR = {"models": "model", "datasets": "dataset", "losses": "loss", "recipes": "recipe", "evaluators": "evaluator",
            "callbacks": "callback"}
#: the longest help line shown (cut at a word, with ``...``)
HELP_WIDTH = 100
_RANGES = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


@dataclass(frozen=True)
class OptionRow:
    """One option of a table: every column as text."""

    name: str
    type: str
    default: str
    allowed: str
    help: str


def find_entry(kind: str, name: str) -> tuple[Registry, Entry]:
    """The registry and entry called ``name`` among ``kind``'s; a one-line ConfigError with close matches."""
    for registry in KINDS[kind]:
        if name in registry:
            return registry, registry.entry(name)
    names = sorted(n for registry in KINDS[kind] for n in registry.names())
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise ConfigError(f"no {SINGULAR[kind]} named {name!r} ({hint}); teachkit list {kind} shows all {len(names)}")


def where_set(kind: str, registry: Registry, name: str) -> str:
    """The config keys an entry's options go under (``kd.options.crd.<option>``)."""
    if registry is OBJECTIVES:
        return f"train.loss={name} (no options)"
    return {"models": f"model.name={name}; options as model.options.<option>",
            "datasets": f"data.name={name}; options as data.options.<option>",
            "losses": f"kd.method={name}; options as kd.options.{name}.<option>, weight kd.gamma.{name}",
            "recipes": f"teachkit run {name} CONFIG; options in the {name}: section ({name}.<option>)",
            "evaluators": "chosen by the dataset's task (no options)",
            "callbacks": f"train.callbacks: [{{name: {name}, options: {{<option>: ...}}}}] (or just [{name}])"}[kind]


def entry_rows(kind: str, entry: Entry) -> list[OptionRow]:
    """The option rows of ``entry``: its options dataclass, else its factory's keyword parameters."""
    if entry.options is not None and dataclasses.is_dataclass(entry.options):
        return dataclass_rows(entry.options)
    if kind == "models":
        return signature_rows(entry.obj, skip=2)  # (input_shape, num_classes, **options)
    if kind == "datasets":
        return signature_rows(entry.obj, skip=1)  # (root, **options)
    return []


def dataclass_rows(cls: type) -> list[OptionRow]:
    """Rows of an options dataclass: type hints, defaults, Literal choices and range rules, help lines."""
    hints, doc, comments = type_hints(cls), inspect.getdoc(cls) or "", field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = to_plain(f.default_factory())
        else:
            default = dataclasses.MISSING
        ranges = [f"{sym} {f.metadata[rule]}" for rule, sym in _RANGES.items() if rule in f.metadata]
        rows.append(OptionRow(f.name, type_text(hints[f.name]), default_text(default),
                              " and ".join([*choices_of(hints[f.name]), *ranges]) or "-",
                              comments.get(f.name) or doc_help(doc, f.name)))
    return rows


def signature_rows(func: Callable[..., Any], skip: int) -> list[OptionRow]:
    """Rows of a factory's keyword parameters after the first ``skip`` (annotations as written)."""
    try:
        params = list(inspect.signature(func).parameters.values())[skip:]
    except (TypeError, ValueError):
        return []
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - a plugin's annotation that does not resolve: show it as written
        hints = {}
    doc, rows = inspect.getdoc(func) or "", []
    module_doc = inspect.getdoc(inspect.getmodule(func)) or ""  # a source's options are often listed there
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            rows.append(OptionRow(f"**{p.name}", "any", "-", "any key", "passed on unchecked"))
            continue
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        default = dataclasses.MISSING if p.default is inspect.Parameter.empty else p.default
        tp = hints.get(p.name, p.annotation)
        if tp is inspect.Parameter.empty or tp is Any or tp == "Any":
            shown = "any" if default in (None, dataclasses.MISSING) else type(to_plain(default)).__name__
        else:
            shown = type_text(tp)
        rows.append(OptionRow(p.name, shown, default_text(default), " and ".join(choices_of(tp)) or "-",
                              doc_help(doc, p.name) or doc_help(module_doc, p.name)))
    return rows


def type_text(tp: Any) -> str:
    """A type as the table shows it: ``int``, ``float or null``, ``list[int]``, ``choice``."""
    if isinstance(tp, str):
        return tp.replace("None", "null").replace(" | ", " or ")
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "choice"
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        return " or ".join(type_text(a) for a in typing.get_args(tp))
    if origin in (list, tuple, abc.Sequence):
        return f"list[{', '.join(type_text(a) for a in typing.get_args(tp) if a is not Ellipsis)}]"
    if origin is dict or tp is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}.get(tp, getattr(tp, "__name__",
                                                                                                       str(tp)))


def choices_of(tp: Any) -> list[str]:
    """The allowed values a Literal (also inside a union) spells out: ``['auto' | 'online' | 'replay']``."""
    if isinstance(tp, str):
        return []
    if typing.get_origin(tp) is Literal:
        return [" | ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in typing.get_args(tp))]
    if typing.get_origin(tp) is typing.Union or type(tp).__name__ == "UnionType":
        return [c for a in typing.get_args(tp) for c in choices_of(a)]
    return []


def default_text(value: Any) -> str:
    """A default as YAML would write it (``null``, ``true``, ``[500]``); ``required`` when there is none."""
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, str):
        return value or "''"
    try:
        return json.dumps(to_plain(value))
    except (TypeError, ValueError):
        return repr(value)


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines right above each field of a dataclass's source (none when it has no source)."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    pending: list[str] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        match = re.match(r"([A-Za-z_]\w*)\s*:", text)
        if match and pending:
            out[match.group(1)] = one_line(" ".join(pending))
        pending = []
    return out


def doc_help(doc: str, name: str) -> str:
    """The help a docstring gives option ``name``: the text after ``name``: up to the next option or sentence
    end, else the clause that mentions ``name``; '' when it names none."""
    text = " ".join(doc.split())
    defined = re.search(rf"``{re.escape(name)}``\s*(?::|=)\s*", text)
    if defined:
        rest = text[defined.end():]
        end = re.search(r";\s+``\w+``|\.\s+(?=[A-Z`])|\s``\w+``\s*:|\s-\s``", rest)
        return one_line(rest[:end.start()] if end else rest)
    for clause in clauses(text):
        if f"``{name}``" in clause:
            return one_line(clause)
    return ""


def clauses(text: str) -> Iterator[str]:
    """Sentences and list items (`` - ``) of ``text``, split further at semicolons."""
    for sentence in re.split(r"(?<=\.)\s+(?=[A-Z`])|\s+-\s+(?=\S)", text):
        yield from (c.strip() for c in sentence.split("; ") if c.strip())


def one_line(text: str) -> str:
    """``text`` without reST backticks, cut to :data:`HELP_WIDTH` characters at a word."""
    text = text.replace("``", "").strip().rstrip(".;,:")
    if len(text) <= HELP_WIDTH:
        return text
    return text[:HELP_WIDTH - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def option_table(rows: list[OptionRow]) -> str:
    """The rows as aligned columns under a header (``option  type  default  allowed  help``)."""
    header = OptionRow("option", "type", "default", "allowed", "help")
    cells = [[r.name, r.type, r.default, r.allowed, r.help] for r in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
                     for row in cells).rstrip()


def describe_entry(kind: str, name: str) -> str:
    """The text of ``teachkit list KIND NAME``: what it is, where its options go, and their table."""
    registry, entry = find_entry(kind, name)
    lines = [f"{entry.name}: {entry.description}", f"set with: {where_set(kind, registry, entry.name)}"]
    rows = entry_rows(kind, entry)
    if rows:
        lines += ["", option_table(rows)]
    elif registry is not OBJECTIVES and kind != "evaluators":
        lines.append("options: none")
    lines += ["", f"every config key: {REFERENCE}"]
    return "\n".join(lines)
