"""The run configuration: small YAML files validated into typed options, with dotted overrides.

A :class:`RunConfig` composes the sections the layers below own -- ``data`` (:class:`DataConfig`),
``model`` (:class:`ModelConfig`), ``optim`` (:class:`OptimConfig`), ``kd`` (:class:`KDConfig`, whose
``options`` are validated against each method's registered options dataclass) -- with ``train`` and
``teacher`` defined here, and one section per recipe that registered options
(``@RECIPES.register("prokd", options=ProKDOptions)`` declares the ``prokd`` section): a new method or
recipe never edits this file. Every bad key, type or value is one :class:`ConfigError` line naming the
key, the value and what is allowed (with a did-you-mean hint for misspelt keys). No code runs from YAML:
files and overrides are read by a ``yaml.SafeLoader`` that also reads YAML 1.2 numbers (``1e-3``) and
refuses repeated keys and anchors/aliases that expand beyond :data:`ALIAS_BUDGET` nodes.

``plugins:`` lists modules (outside teachkit) imported before anything else is validated, so the models,
datasets, losses and recipes they register can be named in the same config; the list is kept in the run's
``config.yaml``, so ``teachkit eval`` and ``--resume`` import them again when the user names them again or
trusts code read from disk (``--trust-code``, :mod:`teachkit.trust`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

import teachkit.tasks  # noqa: F401  (task datasets and evaluators register before any config is validated)
from teachkit.data import DATASETS, DataConfig
from teachkit.engine import LoopConfig, OptimConfig
from teachkit.engine.callbacks import callback_specs
from teachkit.engine.dot import scaler_conflict
from teachkit.errors import ConfigError
from teachkit.losses import OBJECTIVES, KDConfig
from teachkit.models import ModelConfig, TapSpec
from teachkit.options import Options, coerce, from_mapping, is_path, option, short_repr, to_plain, type_hints
from teachkit.registry import DuplicateNameError, Entry, closest, import_plugins
from teachkit.trust import reading_from

__all__ = ["DataConfig", "KDConfig", "ModelConfig", "OptimConfig", "RunConfig", "TeacherConfig", "TrainConfig",
           "absolute_paths", "dump_yaml", "from_dict", "load_config", "map_paths", "merge", "parse_overrides",
           "path_values", "read_yaml", "register_section", "resolve_path", "resolve_paths", "to_dict", "with_changes",
           "yaml_load"]


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
    #: engine callbacks by registered name, or ``{name, options}`` (teachkit.engine.callbacks; plugins add more)
    callbacks: list[str | dict[str, Any]] = option(factory=list)

    resumable = frozenset({"progress", "device", "tensorboard", "callbacks"})

    def validate(self) -> None:
        OBJECTIVES.entry(self.loss)  # unknown names: one line with did-you-mean
        callback_specs(self.callbacks, self.key("callbacks"))  # unknown names and bad options: one line

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

    checkpoint: str | None = option(None, path=True)
    select: Literal["last", "best"] = "last"
    model: ModelConfig = option(factory=ModelConfig)
    #: taps of the teacher by module path, like ``model.taps``; for a teacher loaded from a checkpoint they
    #: override or extend the taps it recorded, without retraining it
    taps: dict[str, Any] = option(factory=dict)
    optim: OptimConfig = option(factory=OptimConfig)
    epochs: int = option(10, ge=1)
    loss: str = "ce"
    #: the in-command teacher's seed (init and batch order); None: the student's ``train.seed``
    seed: int | None = None
    #: run with a teacher whose training data may overlap the student's val/test split (recorded in the summary)
    allow_overlap: bool = False
    #: compute the frozen teacher's outputs once and reuse them (auto: whenever the inputs do not change across
    #: epochs and the method reads only logits/embedding; see teachkit.recipes.teacher_cache)
    cache: Literal["auto", "off"] = "auto"
    #: storage of cached outputs: float32 (exact) or float16 (half the memory, rounded)
    cache_dtype: Literal["float32", "float16"] = "float32"
    #: sequences (translation, causal LMs: per-token outputs): keep the teacher's k largest logits per target token
    #: and the probability of all the others (0: the whole distribution); Hinton KD's divergences compare the
    #: (k + 1)-outcome distributions, other methods get the top-k renormalised -- biased estimates of the full
    #: one, stated in the run summary
    cache_topk: int = option(0, ge=0)
    #: the frozen teacher as an inference model: ``fold`` folds its BatchNorms into the convolutions before them,
    #: stores its weights in the run's compute dtype and runs it under torch.inference_mode; ``plain`` runs it as
    #: trained (under the step's autocast); ``auto`` picks (teachkit.recipes.teacher.resolve_teacher_inference).
    #: Not resumable: folding changes outputs at float rounding
    inference: Literal["auto", "fold", "plain"] = "auto"
    resumable = frozenset({"cache"})

    def validate(self) -> None:
        OBJECTIVES.entry(self.loss)
        if self.taps:
            TapSpec.from_dict(self.taps, self.key("taps"))


#: Recipe sections: name -> options dataclass (filled by ``RECIPES.register(..., options=...)``).
SECTIONS: dict[str, type] = {}
CORE = ("name", "out_dir", "plugins", "data", "model", "optim", "train", "teacher", "kd")


def register_section(entry: Entry) -> None:
    """Declare the config section ``entry.name`` with options ``entry.options`` (the recipes registry calls
    this for every recipe registered with options)."""
    if entry.options is None:
        return
    if entry.name in CORE or entry.name in SECTIONS:
        raise DuplicateNameError(f"config section {entry.name!r} declared twice (recipe {entry.name!r} takes the "
                                 f"name of a section); choose another recipe name")
    SECTIONS[entry.name] = entry.options


@dataclass
class RunConfig(Options):
    """One run: ``teachkit train`` uses data/model/optim/train; ``distill`` adds teacher and kd;
    ``teachkit run RECIPE`` also reads the recipe's own section (``prokd``, ``rco``, ``takd``, ``eskd``,
    ``l2t``, ...), available as an attribute (``cfg.prokd``)."""

    name: str = "run"
    out_dir: str = "runs"
    #: modules imported before the rest is validated (their registrations become nameable)
    plugins: list[str] = option(factory=list)
    data: DataConfig = option(factory=DataConfig)
    model: ModelConfig = option(factory=ModelConfig)
    optim: OptimConfig = option(factory=OptimConfig)
    train: TrainConfig = option(factory=TrainConfig)
    teacher: TeacherConfig = option(factory=TeacherConfig)
    kd: KDConfig = option(factory=KDConfig)
    #: the recipe sections by name (every registered one, defaults where the file gives none)
    sections: dict[str, Any] = option(factory=dict)

    def validate(self) -> None:
        import_plugins(self.plugins)  # already imported by from_dict; checks the names of a config made in Python
        for key, optim in (("optim", self.optim), ("teacher.optim", self.teacher.optim)):
            if optim.name == "dot" and self.train.precision == "fp16":  # refused here, before a teacher trains
                raise ConfigError(scaler_conflict(f"{key}.name"))
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
        raise ConfigError(f"config must be a mapping of keys, got {type(data).__name__} {short_repr(data)}")
    if cls is not RunConfig:
        return from_mapping(cls, data)
    plugins = data.get("plugins")
    plugins = import_plugins(coerce(plugins, list[str], "plugins") if plugins is not None else [])
    core = {k: v for k, v in data.items() if k in CORE}
    core["plugins"] = plugins
    sections = {}
    for key, value in data.items():
        if key in CORE:
            continue
        if key not in SECTIONS:
            allowed = [*CORE, *SECTIONS]
            shown = key if isinstance(key, str) and len(key) <= 80 else short_repr(key, 40)
            raise ConfigError(f"unknown config key {shown!r}{closest(shown, allowed)}; allowed under the top "
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


#: How many YAML nodes anchors and aliases may add to a document when expanded (a "billion laughs" file
#: adds billions; a config reusing a section with ``*alias`` adds a few dozen).
ALIAS_BUDGET = 10_000
#: The largest config file read (configs are small text files; a checkpoint given by mistake is not read).
MAX_CONFIG_BYTES = 16 << 20

_FLOAT_1_2 = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


class YAMLRefused(yaml.YAMLError):
    """A YAML document refused by :class:`SafeLoader12` (repeated key, alias bomb); ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message, self.line = message, line


class SafeLoader12(yaml.SafeLoader):
    """``yaml.safe_load``'s loader (no tags that run code) reading YAML 1.2 floats too (``1e-3``, ``1e3``,
    ``1.0e5``: strings under YAML 1.1), refusing repeated keys and aliases that expand beyond
    :data:`ALIAS_BUDGET` nodes or refer to themselves."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_document(self, node: yaml.Node) -> Any:
        check_aliases(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *base`` then a key of base: an override, not a repeat
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:
                continue  # unhashable: the base constructor reports it
            if first is not None:
                raise YAMLRefused(f"repeats key {short_repr(key, 40)} (line {line}; first given on line {first})",
                                  line)
        return super().construct_mapping(node, deep)


SafeLoader12.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


def check_aliases(root: yaml.Node, budget: int = ALIAS_BUDGET) -> None:
    """YAMLRefused when anchors and aliases make ``root`` expand to more than ``budget`` nodes beyond those
    written (a "billion laughs" bomb), or when an alias refers to the collection holding it."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YAMLRefused(f"has an alias inside its own anchor (line {node.start_mark.line + 1}): a recursive "
                              f"structure is not a config", node.start_mark.line + 1)
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        total = 1 + sum(size(child) for child in children)
        active.discard(key)
        sizes[key] = total
        return total

    total = size(root)
    if total - len(sizes) > budget:
        raise YAMLRefused(f"has anchors and aliases that expand to {total:,} values from {len(sizes):,} written "
                          f"(at most {budget:,} more are allowed)")


def yaml_load(text: str) -> Any:
    """``text`` parsed like ``yaml.safe_load`` by :class:`SafeLoader12` (yaml.YAMLError when it is not valid or
    refused; RecursionError when it nests too deeply)."""
    loader = SafeLoader12(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_problem(e: yaml.YAMLError) -> str:
    """``line 3: expected ',' or ']'`` from a YAML error (one line)."""
    if isinstance(e, YAMLRefused):
        return e.message
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"override key {short_repr(dotted)} has an empty part: expected dotted names such as "
                          f"optim.lr")
    node = tree
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {short_repr(dotted)}: {p!r} is not a section")
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
            raise ConfigError(f"override {short_repr(item)} is not of the form key=value (e.g. optim.lr=0.05)")
        key, raw = item.split("=", 1)
        try:
            value = yaml_load(raw) if raw != "" else ""
        except YAMLRefused as e:
            raise ConfigError(f"override {short_repr(item)} {e.message}") from None
        except RecursionError:
            raise ConfigError(f"override {short_repr(item)} nests too deeply") from None
        except yaml.YAMLError as e:
            first = raw.lstrip()[:1]
            if first in ("[", "{", '"', "'"):  # meant as a list, mapping or quoted string
                example = {"[": "[8, 8]", "{": "{depth: 8}"}.get(first, "'text'")
                raise ConfigError(f"override {short_repr(item)} is malformed: {short_repr(raw.strip())} is not valid "
                                  f"YAML ({_yaml_problem(e)}); e.g. {key.strip()}={example}") from None
            value = raw  # a plain word YAML cannot read (``name=@home``): the text itself
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
    """The mapping in the YAML file ``path`` (empty file: ``{}``), or a one-line ConfigError saying why not:
    missing, a folder, binary, too large, invalid YAML (with the line), a repeated key, an alias bomb."""
    path = Path(path)
    what = f"config file {str(path)!r}"
    try:
        if path.is_dir():
            raise ConfigError(f"{what} is a folder, not a YAML file")
        if not path.exists():
            raise ConfigError(f"{what} does not exist")
        if not path.is_file():
            raise ConfigError(f"{what} is not a regular file (a YAML config file is expected)")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} is {path.stat().st_size / 2**20:.0f} MiB: not a config (at most "
                              f"{MAX_CONFIG_BYTES >> 20} MiB of YAML text)")
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} cannot be read: {e.strerror or type(e).__name__}") from None
    if b"\x00" in raw:
        raise ConfigError(f"{what} is a binary file (it holds NUL bytes at byte {raw.index(0)}), not YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); a YAML "
                          f"config file is expected") from None
    try:
        data = yaml_load(text)
    except yaml.reader.ReaderError as e:
        raise ConfigError(f"{what} is not YAML text: character {e.character!r} at offset {e.position} is not "
                          f"allowed") from None
    except YAMLRefused as e:
        raise ConfigError(f"{what} {e.message}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML ({_yaml_problem(e)})") from None
    except RecursionError:
        raise ConfigError(f"{what} nests too deeply to be a config") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must hold a mapping of keys (name: ..., data: ...), not {type(data).__name__} "
                          f"{short_repr(data, 40)}")
    return data


# ----------------------------------------------------------------------------- paths


def resolve_path(value: Any, folder: str | Path | None = None) -> Any:
    """A path option's ``value`` made absolute. ``folder``: the folder of the file that wrote it (None: the value
    was typed on the command line or given from Python, so relative to the working directory).

    ``~`` expands; an absolute path stays. A relative path is taken under ``folder`` when it exists there. Else a
    value that does not look like a path -- no ``/`` and not starting with ``.`` -- is a name and stays as written
    (a bundled model name, a Hub id without a folder). Else, for a file value, a path that exists relative to the
    working directory is taken there (files written before this rule, such as the shipped configs' ``teacher.
    checkpoint: runs/NAME``, named outputs of runs started from the working directory); otherwise the path under
    ``folder`` (where a missing file is then reported)."""
    if not isinstance(value, str) or not value:
        return value
    path = os.path.expanduser(value)
    if os.path.isabs(path):
        return path
    base = os.path.abspath(folder) if folder is not None else os.getcwd()
    here = os.path.normpath(os.path.join(base, path))
    if os.path.exists(here):
        return here
    if "/" not in path and os.sep not in path and not path.startswith("."):
        return value
    if folder is not None and os.path.exists(path):
        return os.path.abspath(path)
    return here


PathFn = Callable[[str, Any], Any]


def _map_fields(cls: type, tree: dict, fn: PathFn, prefix: str = "") -> dict:
    """``tree`` (a plain mapping of the options dataclass ``cls``) with ``fn(dotted key, value)`` applied to every
    declared path field, nested options sections included; anything else is kept as it is."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = type_hints(cls)
    out = dict(tree)
    for key, value in tree.items():
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            continue
        if is_path(f):
            out[key] = fn(f"{prefix}{key}", value)
            continue
        inner = _options_type(hints[key])
        if inner is not None and isinstance(value, dict):
            out[key] = _map_fields(inner, value, fn, f"{prefix}{key}.")
    return out


def map_paths(tree: dict, fn: PathFn) -> dict:
    """A plain config mapping with ``fn(dotted key, value)`` applied to every declared path field (``data.root``,
    ``teacher.checkpoint``, a recipe section's ``option(path=True)`` fields)."""
    if not isinstance(tree, dict):
        return tree
    core = {k: v for k, v in tree.items() if k in CORE}
    out = {**tree, **_map_fields(RunConfig, core, fn)}
    for name, cls in SECTIONS.items():
        if isinstance(tree.get(name), dict):
            out[name] = _map_fields(cls, tree[name], fn, f"{name}.")
    if isinstance(out.get("data"), dict):
        out["data"] = _map_file_options(out["data"], fn)
    return out


def _map_file_options(data: dict, fn: PathFn) -> dict:
    """The ``data`` section with ``fn`` applied to the file options its dataset declares (``train``, ``val``,
    ``test`` of the csv source...) when ``data.root`` is unset: with a root they are relative to it."""
    name, options = data.get("name"), data.get("options")
    if data.get("root") is not None or not isinstance(name, str) or name not in DATASETS \
            or not isinstance(options, dict):
        return data
    declared = DATASETS.entry(name).paths
    mapped = {k: fn(f"data.options.{k}", v) if k in declared and isinstance(v, str) else v
              for k, v in options.items()}
    return data if mapped == options else {**data, "options": mapped}


def path_values(cfg: RunConfig) -> list[tuple[str, str]]:
    """(dotted key, value) of every declared path set in ``cfg``."""
    found: list[tuple[str, str]] = []

    def note(key: str, value: Any) -> Any:
        if isinstance(value, str) and value:
            found.append((key, value))
        return value

    map_paths(to_dict(cfg), note)
    return found


def _options_type(tp: Any) -> type | None:
    """The options dataclass in a field's type (``ModelConfig`` of ``ModelConfig | None``), or None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    for arg in getattr(tp, "__args__", ()):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def resolve_paths(tree: dict, folder: str | Path | None = None) -> dict:
    """A plain config mapping with every declared path field (``data.root``, ``teacher.checkpoint``, a recipe
    section's ``option(path=True)`` fields) resolved against ``folder``, the folder of the file that wrote it
    (None: the working directory); see :func:`resolve_path`. Keys that are not config keys are left for
    :func:`from_dict` to report."""
    return map_paths(tree, lambda _key, value: resolve_path(value, folder))


def resolve_dotted(key: str, value: Any, folder: str | Path | None) -> Any:
    """``value`` of the dotted config key ``key`` (``data.root``) resolved like :func:`resolve_paths` does."""
    tree: dict = {}
    _set_dotted(tree, key, value)
    node: Any = resolve_paths(tree, folder)
    for part in key.split("."):
        node = node[part]
    return node


def absolute_paths(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every declared path absolute (relative ones taken under the working directory): what a run
    folder's ``config.yaml`` and checkpoints record, so that they are read the same from any directory."""
    tree = to_dict(cfg)
    resolved = resolve_paths(tree)
    return cfg if resolved == tree else from_dict(resolved)


def _unique(names: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(names))


def recorded_plugins(data: dict) -> list[str]:
    """The plugins recorded in the ``config.yaml`` of the run folder ``data`` names (``out_dir/name``), if any."""
    name, out_dir = data.get("name", RunConfig.name), data.get("out_dir", RunConfig.out_dir)
    if not isinstance(name, str) or not isinstance(out_dir, str):
        return []
    saved = Path(out_dir) / name / "config.yaml"
    try:
        plugins = read_yaml(saved).get("plugins") if saved.is_file() else None
    except ConfigError:
        return []  # the resume check reports an unreadable config.yaml
    return [p for p in plugins if isinstance(p, str)] if isinstance(plugins, list) else []


def load_config(path: str | Path | None, overrides: list[str] | None = None, plugins: Iterable[str] = (),
                resume: bool = False) -> RunConfig:
    """Read a YAML config (or defaults when ``path`` is None), apply dotted overrides, validate.

    Paths written in the file (``data.root``, ``teacher.checkpoint``, ...) are relative to its folder
    (:func:`resolve_paths`); paths in ``overrides`` to the working directory.

    ``plugins`` (``--plugin``, ``TEACHKIT_PLUGINS``) are added to the config's ``plugins:``; with ``resume``
    the run folder's recorded plugins are added too, so a resumed run imports what it was made with: those are
    read from disk, so each must be named in this command as well or trusted (``--trust-code``)."""
    data = resolve_paths(read_yaml(path), Path(path).parent) if path is not None else {}
    data = merge(data, parse_overrides(overrides or []))
    given = data.get("plugins")
    if isinstance(given, list) or given is None:
        named = [*(given or []), *plugins]
        import_plugins(coerce(named, list[str], "plugins"))  # the user's own, before anything read from disk
        recorded = recorded_plugins(data) if resume else []
        if recorded:
            run_dir = Path(str(data.get("out_dir", RunConfig.out_dir))) / str(data.get("name", RunConfig.name))
            with reading_from(f"run folder {str(run_dir)!r} (its config.yaml)"):
                import_plugins(recorded)
        used = [*recorded, *named]
        if used:
            data = {**data, "plugins": _unique(used)}
    return from_dict(data)


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
