"""The run configuration: small YAML files validated into typed options, with dotted overrides.

A :class:`RunConfig` composes the sections the layers below own -- ``data`` (:class:`DataConfig`),
``model`` (:class:`ModelConfig`), ``optim`` (:class:`OptimConfig`), ``kd`` (:class:`KDConfig`, whose
``options`` are validated against each method's registered options dataclass) -- with ``train`` and
``teacher`` defined here, and one section per recipe that registered options
(``@RECIPES.register("prokd", options=ProKDOptions)`` declares the ``prokd`` section): a new method or
recipe never edits this file. Every bad key, type or value is one :class:`ConfigError` line naming the
key, the value and what is allowed (with a did-you-mean hint for misspelt keys). No code runs from YAML
(``yaml.safe_load`` only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

import teachkit.tasks  # noqa: F401  (task datasets and evaluators register before any config is validated)
from teachkit.data import DataConfig
from teachkit.engine import LoopConfig, OptimConfig
from teachkit.errors import ConfigError
from teachkit.losses import OBJECTIVES, KDConfig
from teachkit.models import ModelConfig
from teachkit.options import Options, from_mapping, option, to_plain
from teachkit.registry import Entry, closest

__all__ = ["DataConfig", "KDConfig", "ModelConfig", "OptimConfig", "RunConfig", "TeacherConfig", "TrainConfig",
           "dump_yaml", "from_dict", "load_config", "merge", "parse_overrides", "read_yaml", "register_section",
           "to_dict", "with_changes"]


@dataclass
class TrainConfig(LoopConfig):
    """How long and how one model trains, how the best epoch is selected and what the run folder keeps:
    the engine's :class:`LoopConfig` (epochs, seed, precision, channels_last, save_every, tensorboard,
    progress, select_metric, select_mode) plus the objective on labels (``loss``, ``label_smoothing``),
    the device and determinism.

    ``select_metric`` names the validation metric that picks the best checkpoint (default: the task's
    primary metric, accuracy for classification); ``select_mode`` says whether it is maximised or
    minimised (``auto``: the task knows, e.g. a loss is minimised).
    """

    loss: str = "ce"
    label_smoothing: float = option(0.0, ge=0.0, lt=1.0)
    deterministic: bool = False
    device: str = "auto"

    resumable = frozenset({"progress", "device", "tensorboard"})

    def validate(self) -> None:
        OBJECTIVES.entry(self.loss)  # unknown names: one line with did-you-mean

    def loop(self, **changes: Any) -> LoopConfig:
        """The engine's :class:`LoopConfig` for this section (``changes`` override fields)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(LoopConfig)}
        return LoopConfig(**{**fields, **changes})


@dataclass
class TeacherConfig(Options):
    """The teacher: a checkpoint (file or run folder) or a model trained in the same command.

    A teacher trained in-command uses the full training split (``data.train_subset`` applies to the
    student only), its own model, loss (``ce`` or ``mse``), epochs and optimiser.
    """

    checkpoint: str | None = None
    select: Literal["last", "best"] = "last"
    model: ModelConfig = option(factory=ModelConfig)
    optim: OptimConfig = option(factory=OptimConfig)
    epochs: int = option(10, ge=1)
    loss: str = "ce"

    def validate(self) -> None:
        OBJECTIVES.entry(self.loss)


#: Recipe sections: name -> options dataclass (filled by ``RECIPES.register(..., options=...)``).
SECTIONS: dict[str, type] = {}
CORE = ("name", "out_dir", "data", "model", "optim", "train", "teacher", "kd")


def register_section(entry: Entry) -> None:
    """Declare the config section ``entry.name`` with options ``entry.options`` (the recipes registry calls
    this for every recipe registered with options)."""
    if entry.options is None:
        return
    if entry.name in CORE or entry.name in SECTIONS:
        raise ValueError(f"config section {entry.name!r} declared twice")
    SECTIONS[entry.name] = entry.options


@dataclass
class RunConfig(Options):
    """One run: ``teachkit train`` uses data/model/optim/train; ``distill`` adds teacher and kd;
    ``teachkit run RECIPE`` also reads the recipe's own section (``prokd``, ``rco``, ``takd``, ``eskd``,
    ``l2t``, ...), available as an attribute (``cfg.prokd``)."""

    name: str = "run"
    out_dir: str = "runs"
    data: DataConfig = option(factory=DataConfig)
    model: ModelConfig = option(factory=ModelConfig)
    optim: OptimConfig = option(factory=OptimConfig)
    train: TrainConfig = option(factory=TrainConfig)
    teacher: TeacherConfig = option(factory=TeacherConfig)
    kd: KDConfig = option(factory=KDConfig)
    #: the recipe sections by name (every registered one, defaults where the file gives none)
    sections: dict[str, Any] = option(factory=dict)

    def validate(self) -> None:
        sections = {}
        for name, cls in SECTIONS.items():
            given = self.sections.get(name)
            sections[name] = given if isinstance(given, cls) else from_mapping(cls, given, self.key(name))
        object.__setattr__(self, "sections", sections)

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no section {name!r}")


# ----------------------------------------------------------------------------- reading and writing


def from_dict(data: dict | None, cls: type = RunConfig) -> Any:
    """Validate a plain mapping into ``cls`` (default :class:`RunConfig`, whose recipe sections are
    top-level keys like ``prokd:``)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of keys, got {type(data).__name__}")
    if cls is not RunConfig:
        return from_mapping(cls, data)
    core = {k: v for k, v in data.items() if k in CORE}
    sections = {}
    for key, value in data.items():
        if key in CORE:
            continue
        if key not in SECTIONS:
            allowed = [*CORE, *SECTIONS]
            raise ConfigError(f"unknown config key {key!r}{closest(str(key), allowed)}; allowed under the top "
                              f"level: {', '.join(allowed)}")
        sections[key] = value
    return from_mapping(RunConfig, {**core, "sections": sections})


def to_dict(cfg: Any) -> dict:
    """A config as plain values; a :class:`RunConfig`'s sections come back as top-level keys."""
    out = to_plain(cfg)
    if isinstance(cfg, RunConfig):
        out.update(out.pop("sections"))
    return out


def with_changes(cfg: RunConfig, **sections: Any) -> RunConfig:
    """A copy of ``cfg`` with fields of sections replaced: ``with_changes(cfg, train={"epochs": 3})``."""
    out = cfg
    for section, changes in sections.items():
        if section in SECTIONS:
            value = dataclasses.replace(out.sections[section], **changes) if isinstance(changes, dict) else changes
            out = dataclasses.replace(out, sections={**out.sections, section: value})
            continue
        value = getattr(out, section)
        if isinstance(changes, dict) and dataclasses.is_dataclass(value):
            value = dataclasses.replace(value, **changes)
        else:
            value = changes
        out = dataclasses.replace(out, **{section: value})
    return out


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


class Replace(dict):
    """A mapping given whole on the command line (``model.options={}``): replaces, never merges."""


def parse_overrides(items: list[str]) -> dict:
    """``["optim.lr=0.05", "model.name=resnet20"]`` -> nested dict; values parsed as YAML.

    ``model.options.hidden=[8]`` sets one option; ``model.options={depth: 8}`` replaces all of them.
    """
    tree: dict = {}
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.05)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), Replace(value) if isinstance(value, dict) else value)
    return tree


def merge(base: dict, update: dict) -> dict:
    """``update`` merged into ``base`` key by key (a :class:`Replace` mapping replaces)."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and not isinstance(v, Replace) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = dict(v) if isinstance(v, Replace) else v
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{line}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read ({type(e).__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys, not {type(data).__name__}")
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or defaults when ``path`` is None), apply dotted overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides or []))
    return from_dict(data)


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
