"""Sweep files: a base config plus a grid and/or lists of overrides, expanded into named runs.

A sweep file (YAML, read with the same safe loader as configs)::

    sweep: mse-teacher-small      # the sweep's name: its runs go to out_dir/<sweep>/<run>
    out_dir: runs/sweeps          # shared by sweeps: out_dir/teachers (shared teachers), out_dir/_cache
    base: ../configs/demo.yaml    # optional base config file, relative to this file
    config: {train: {epochs: 5}}  # optional config merged over the base
    recipe: kd                    # default recipe (teachkit list recipes; distill = kd)
    grid:                         # the product of every key's values
      train.seed: [0, 1, 2]
    list:                         # alternatives, each crossed with the grid
      - {label: no-kd, recipe: train}
      - {label: kd, kd.method: kd, grid: {teacher.loss: [ce, mse]}}
    report: {baseline: variant=no-kd}   # optional: options of the report written at the end

``list`` is a list of override mappings (one axis, named ``variant``) or a mapping of axis names to such lists
(each axis crossed with the others: ``pair: [...]``, ``method: [...]``). An entry's keys are dotted config keys
plus ``label`` (its name in run names and reports), ``recipe``, ``base`` (another base config file) and
``grid`` (a grid crossed with this entry only). A config string value that is exactly ``${dotted.key}`` is
replaced by that key's value in the expanded run (``data.subset_seed: ${train.seed}``).

Paths (``data.root``, ``teacher.checkpoint``, any ``option(path=True)`` field): written in a base config, relative
to that config's folder; written in the sweep file (``config:``, ``grid:``, ``list:``), relative to the sweep
file's folder; given on the command line, relative to the working directory (:func:`teachkit.config.resolve_path`).

Everything is checked before anything runs: every key against the config schema (with did-you-mean), empty
grids and lists, keys given twice (grid and a list entry, two axes), duplicate run names; each run's config is
then validated like ``teachkit run`` validates a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teachkit.config import CORE, SECTIONS, RunConfig, merge, parse_overrides, read_yaml, resolve_dotted, resolve_paths
from teachkit.errors import ConfigError
from teachkit.options import short_repr, type_hints
from teachkit.registry import closest

#: keys of a sweep file
SWEEP_KEYS = ("sweep", "out_dir", "base", "config", "recipe", "grid", "list", "report", "plugins")
#: keys of which a sweep file needs at least one, or it defines no runs
RUN_KEYS = ("base", "config", "grid", "list")
#: keys of a list entry that are not config keys
ENTRY_KEYS = ("label", "recipe", "base", "grid")
#: the axis name of a plain ``list:``
DEFAULT_AXIS = "variant"
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class RunSpec:
    """One expanded run: its name inside the sweep, recipe, full config mapping and sweep labels."""

    name: str
    recipe: str
    config: dict[str, Any]
    #: axis key -> value for every axis of the sweep (None where this run's entry has no such key)
    labels: dict[str, Any]


@dataclass
class SweepSpec:
    """A parsed sweep file."""

    path: Path
    name: str
    out_dir: Path
    recipe: str
    runs: list[RunSpec]
    seed_keys: list[str]
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        """``out_dir/<sweep>``: the sweep's runs, status file and report."""
        return self.out_dir / self.name


# ----------------------------------------------------------------------------- schema


def _schema_children(tp: Any) -> dict[str, Any] | None:
    """The fields of a dataclass type (name -> type), or None for a free-form value (mapping, scalar)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        for arg in typing.get_args(tp):
            children = _schema_children(arg)
            if children is not None:
                return children
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return type_hints(tp)
    return None


def check_key(key: str) -> None:
    """ConfigError unless the dotted ``key`` names a config key (or lies inside a free-form mapping such as
    ``model.options``), with a did-you-mean among the keys allowed where it goes wrong."""
    if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
        raise ConfigError(f"sweep key {short_repr(key)} is not a dotted config key (e.g. kd.method, train.seed)")
    parts = key.split(".")
    top = {name: tp for name, tp in type_hints(RunConfig).items() if name in CORE}
    top.update(SECTIONS)
    children: dict[str, Any] | None = top
    for depth, part in enumerate(parts):
        if children is None:
            return  # inside a free-form mapping: validated with the run's config
        if part not in children:
            where = ".".join(parts[:depth]) or "the top level"
            allowed = sorted(children)
            raise ConfigError(f"sweep key {key!r} does not exist: no {part!r} under {where}"
                              f"{closest(part, allowed)}; allowed there: {', '.join(allowed)}")
        children = _schema_children(children[part])


# ----------------------------------------------------------------------------- expansion


def _value_text(value: Any) -> str:
    """A value as it reads in a run name: scalars as text, anything else as compact JSON, cut with a hash."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "_", str(text)) or "_"
    if len(text) > 32:
        text = f"{text[:20]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return text


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key's last part (``train.seed`` -> ``seed``) unless two keys share it (then the full key)."""
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def _set(tree: dict, dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = node[p] = {}
        node = child
    node[parts[-1]] = value


def _get(tree: Mapping, dotted: str) -> Any:
    node: Any = tree
    for p in dotted.split("."):
        if not isinstance(node, Mapping) or p not in node:
            raise KeyError(dotted)
        node = node[p]
    return node


def resolve_references(tree: dict, where: str) -> dict:
    """Replace every string ``${a.b}`` in ``tree`` by the value of key ``a.b`` (one level; no nesting)."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            m = _REFERENCE.match(node)
            if m:
                try:
                    value = _get(tree, m.group(1))
                except KeyError:
                    raise ConfigError(f"{where}: {node} refers to key {m.group(1)!r}, which the config does not "
                                      f"set") from None
                if isinstance(value, str) and _REFERENCE.match(value):
                    raise ConfigError(f"{where}: {node} refers to another reference ({value}); refer to the value")
                return value
        return node

    return walk(tree)


def _grid_axes(grid: Any, where: str) -> list[tuple[str, list[Any]]]:
    if grid is None:
        return []
    if not isinstance(grid, dict):
        raise ConfigError(f"{where} must be a mapping of dotted keys to lists of values, not {short_repr(grid, 40)}")
    if not grid:
        raise ConfigError(f"{where} is empty: give at least one key with a list of values, or leave it out")
    axes = []
    for key, values in grid.items():
        if key != "recipe":
            check_key(key)
        values = values if isinstance(values, list) else None
        if values is None:
            raise ConfigError(f"{where}.{key} must be a list of values, not {short_repr(grid[key], 40)}")
        if not values:
            raise ConfigError(f"{where}.{key} is an empty list: the grid would have no runs")
        axes.append((key, values))
    return axes


@dataclass
class _Entry:
    axis: str
    label: str
    overrides: dict[str, Any]
    recipe: str | None
    base: Path | None
    grid: list[tuple[str, list[Any]]]


def _entries(raw: Any, axis: str, root: Path, grid_keys: set[str]) -> list[_Entry]:
    where = f"list.{axis}" if axis != DEFAULT_AXIS else "list"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"sweep {where} must be a non-empty list of override mappings, not {short_repr(raw, 40)}")
    out, labels = [], []
    for i, item in enumerate(raw):
        here = f"{where}[{i}]"
        if not isinstance(item, dict) or not item:
            raise ConfigError(f"sweep {here} must be a mapping of dotted keys to values, not {short_repr(item, 40)}")
        overrides = {k: v for k, v in item.items() if k not in ENTRY_KEYS}
        for key in overrides:
            check_key(key)
        inner = _grid_axes(item.get("grid"), f"sweep {here}.grid")
        for key in [*overrides, *(k for k, _ in inner), *(["recipe"] if "recipe" in item else [])]:
            if key in grid_keys:
                raise ConfigError(f"sweep key {key!r} is given both in the grid and in {here}: keep it in one place")
        twice = set(overrides) & {k for k, _ in inner}
        if twice:
            raise ConfigError(f"sweep {here} sets {sorted(twice)[0]!r} both as a value and in its grid")
        label = item.get("label")
        if label is None:
            label = "_".join(_value_text(v) for v in overrides.values()) or (
                _value_text(item["recipe"]) if "recipe" in item else "")
            label = label if _NAME.match(label) else f"{axis}{i}"
        if not isinstance(label, (str, int)) or not _NAME.match(str(label)):
            raise ConfigError(f"sweep {here}.label={short_repr(label)} is not allowed: letters, digits and _.+- "
                              f"(it names run folders)")
        labels.append(str(label))
        base = None
        if item.get("base") is not None:
            if not isinstance(item["base"], str):
                raise ConfigError(f"sweep {here}.base must be a path to a config file, not {short_repr(item['base'])}")
            base = (root / item["base"]).resolve() if not Path(item["base"]).is_absolute() else Path(item["base"])
        recipe = item.get("recipe")
        out.append(_Entry(axis, str(label), overrides, recipe, base, inner))
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ConfigError(f"sweep {where} repeats the label {repeated[0]!r}: give each entry its own label")
    return out


def _check_sweep_keys(path: Path, raw: dict) -> None:
    """Only the keys of a sweep file, and at least one that defines runs."""
    unknown = [k for k in raw if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"sweep file {str(path)!r}: unknown key {short_repr(unknown[0])}"
                          f"{closest(str(unknown[0]), list(SWEEP_KEYS))}; allowed: {', '.join(SWEEP_KEYS)}")
    if not any(raw.get(k) for k in RUN_KEYS):
        what = "is empty" if not raw else f"sets only {', '.join(map(str, raw))}"
        raise ConfigError(f"sweep file {str(path)!r} defines no runs (it {what}): give it a base config (base: FILE "
                          f"and/or config: {{...}}) and a grid: and/or list: of overrides; allowed keys: "
                          f"{', '.join(SWEEP_KEYS)}")


def _name_and_out_dir(path: Path, raw: dict, out_dir: str | None) -> tuple[str, str]:
    """The sweep's name (``sweep:``, else the file's stem) and its out_dir (``out_dir`` given, else the file's)."""
    name = raw.get("sweep", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"sweep={short_repr(name)} is not allowed: a folder name of letters, digits and _.+-")
    folder = out_dir if out_dir is not None else raw.get("out_dir", "runs/sweeps")
    if not isinstance(folder, str) or not folder:
        raise ConfigError(f"sweep out_dir={short_repr(folder)} must be a folder path")
    return name, folder


def _report_options(raw: dict) -> dict[str, Any]:
    """The ``report:`` mapping (by, baseline, select, metric), empty when absent."""
    report = raw.get("report") or {}
    if not isinstance(report, dict):
        raise ConfigError(f"sweep report must be a mapping (by, baseline, select, metric), not {short_repr(report)}")
    unknown = [k for k in report if k not in ("by", "baseline", "select", "metric")]
    if unknown:
        raise ConfigError(f"sweep report: unknown key {short_repr(unknown[0])}; allowed: by, baseline, select, metric")
    return report


def _default_base(raw: dict, root: Path) -> Path | None:
    """The sweep's ``base:`` config file, relative to the sweep file's folder ``root``; None without one."""
    base_file = raw.get("base")
    if base_file is not None and not isinstance(base_file, str):
        raise ConfigError(f"sweep base must be a path to a config file, not {short_repr(base_file)}")
    return (root / base_file) if base_file else None


def _list_axes(lists: Any, root: Path, grid_keys: set[str]) -> list[list[_Entry]]:
    """The entries of each ``list:`` axis (one ``variant`` axis for a plain list); no key set by two axes, and
    base and recipe set by one axis at most."""
    axes: list[list[_Entry]] = []
    if lists is not None:
        if isinstance(lists, dict):
            if not lists:
                raise ConfigError("sweep list is empty: give alternatives (lists of override mappings) or leave it out")
            axes = [_entries(v, str(k), root, grid_keys) for k, v in lists.items()]
        else:
            axes = [_entries(lists, DEFAULT_AXIS, root, grid_keys)]
    for a, b in itertools.combinations(axes, 2):
        keys_a = {k for e in a for k in [*e.overrides, *(g for g, _ in e.grid)]}
        keys_b = {k for e in b for k in [*e.overrides, *(g for g, _ in e.grid)]}
        if keys_a & keys_b:
            raise ConfigError(f"sweep key {sorted(keys_a & keys_b)[0]!r} is set by two lists ({a[0].axis!r} and "
                              f"{b[0].axis!r}): keep it in one")
        if sum(1 for x in (a, b) if any(e.base for e in x)) > 1 or \
                sum(1 for x in (a, b) if any(e.recipe for e in x)) > 1:
            raise ConfigError(f"lists {a[0].axis!r} and {b[0].axis!r} both set base or recipe: keep it in one")
    return axes


def _base_config(file: Path | None, raw: dict, root: Path, given: dict) -> dict:
    """A run's config before its overrides: the base ``file`` (paths relative to it), the sweep's plugins, its
    ``config:`` (paths relative to ``root``) and the command line's ``given`` overrides, merged in that order."""
    data: dict = resolve_paths(read_yaml(file), file.parent) if file is not None else {}
    if raw.get("plugins"):
        data = merge(data, {"plugins": raw["plugins"]})
    inline = raw.get("config") or {}
    if not isinstance(inline, dict):
        raise ConfigError(f"sweep config must be a mapping of config keys, not {short_repr(inline, 40)}")
    return merge(merge(data, resolve_paths(inline, root)), resolve_paths(given))


def _label_keys(axes: list[list[_Entry]], grid: list[tuple[str, list[Any]]]) -> tuple[list[str], dict[str, str]]:
    """Every label key (the list axes, the grid keys, the entries' own grid keys) and the short names of the
    config keys among them, as run names show them."""
    axis_keys = [e[0].axis for e in axes] + [k for k, _ in grid]
    inner_keys = list(dict.fromkeys(k for a in axes for e in a for k, _ in e.grid))
    all_keys = [*axis_keys, *[k for k in inner_keys if k not in axis_keys]]
    shorts = _short_names([k for k in all_keys if k not in {e[0].axis for e in axes}])
    return all_keys, shorts


def _run_tree(base: dict, combo: tuple[_Entry, ...], chosen: dict[str, Any], root: Path) -> dict:
    """A copy of ``base`` with the list entries' overrides, then the grid's chosen values, set."""
    tree = json.loads(json.dumps(base))  # a deep copy of plain YAML values
    for e in combo:
        for k, v in e.overrides.items():
            _set(tree, k, resolve_dotted(k, v, root))
    for k, v in chosen.items():
        if k != "recipe":
            _set(tree, k, resolve_dotted(k, v, root))
    return tree


def _run_name(combo: tuple[_Entry, ...], chosen: dict[str, Any], values: dict[str, list[Any]], grid_keys: set[str],
              shorts: dict[str, str]) -> str:
    """The entries' labels, then ``key=value`` for each grid key that varies (an entry's grid keys always)."""
    parts = [e.label for e in combo]
    parts += [f"{shorts[k]}={_value_text(v)}" for k, v in chosen.items()
              if len(values[k]) > 1 or k not in grid_keys]
    if not parts:  # one run: named by what it sets
        parts = [f"{shorts[k]}={_value_text(v)}" for k, v in chosen.items()]
    return ",".join(parts) or "run"


def _expand(raw: dict, root: Path, given: dict, default_base: Path | None, recipe: Any,
            grid: list[tuple[str, list[Any]]], axes: list[list[_Entry]], all_keys: list[str],
            shorts: dict[str, str]) -> list[RunSpec]:
    """Every run: each combination of one entry per list axis, crossed with its entries' grids and the grid;
    labelled on every key of ``all_keys``."""
    grid_keys = {k for k, _ in grid}
    bases: dict[Path | None, dict] = {}
    runs: list[RunSpec] = []
    for combo in itertools.product(*axes) if axes else [()]:
        inner = [g for e in combo for g in e.grid]
        for values in itertools.product(*(v for _, v in [*inner, *grid])):
            chosen = dict(zip([k for k, _ in [*inner, *grid]], values, strict=True))
            base_path = next((e.base for e in combo if e.base), default_base)
            if base_path not in bases:
                bases[base_path] = _base_config(base_path, raw, root, given)
            run_recipe = next((e.recipe for e in combo if e.recipe), None) or chosen.get("recipe") or recipe
            tree = _run_tree(bases[base_path], combo, chosen, root)
            run_name = _run_name(combo, chosen, dict([*inner, *grid]), grid_keys, shorts)
            labels = {k: None for k in all_keys}
            labels.update({e.axis: e.label for e in combo})
            labels.update(chosen)
            if not isinstance(run_recipe, str):
                raise ConfigError(f"sweep recipe={short_repr(run_recipe)} must be a recipe name")
            runs.append(RunSpec(run_name, "kd" if run_recipe == "distill" else run_recipe,
                                resolve_references(tree, f"sweep run {run_name!r}"), labels))
    return runs


def read_sweep(path: str | Path, out_dir: str | None = None, overrides: list[str] | None = None) -> SweepSpec:
    """Parse and expand the sweep file ``path`` (``out_dir`` overrides the file's; ``overrides``, ``key=value``
    as on the command line, apply to every run, after the base and before the grid and lists); every run's
    config mapping is built but not yet validated (:func:`teachkit.experiments.sweep.plan_sweep` does that)."""
    path = Path(path)
    raw = read_yaml(path)
    given = parse_overrides(overrides or [])
    _check_sweep_keys(path, raw)
    root = path.resolve().parent
    name, folder = _name_and_out_dir(path, raw, out_dir)
    recipe = raw.get("recipe", "kd")
    report = _report_options(raw)
    default_base = _default_base(raw, root)
    for item in overrides or []:
        check_key(item.split("=", 1)[0].strip())
    grid = _grid_axes(raw.get("grid"), "sweep grid")
    axes = _list_axes(raw.get("list"), root, {k for k, _ in grid})
    all_keys, shorts = _label_keys(axes, grid)
    seed_keys = [k for k in all_keys if k.split(".")[-1] in ("seed", "subset_seed")]
    runs = _expand(raw, root, given, default_base, recipe, grid, axes, all_keys, shorts)
    names = [r.name for r in runs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"sweep expands to two runs named {repeated[0]!r}: give the list entries labels that "
                          f"tell them apart")
    return SweepSpec(path, name, Path(folder), "kd" if recipe == "distill" else recipe, runs, seed_keys, report)
