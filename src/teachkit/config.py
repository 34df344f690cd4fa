"""Typed run configuration: small YAML files validated into dataclasses, with dotted overrides.

Every bad key, type or value is reported as one :class:`ConfigError` line naming the key, the value
and what is allowed (with a did-you-mean hint for misspelt keys). No code runs from YAML
(``yaml.safe_load`` only).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from teachkit.errors import ConfigError
from teachkit.registry import closest


def _f(default: Any = dataclasses.MISSING, *, factory: Any = None, **rules: Any) -> Any:
    """A dataclass field with validation rules (gt, ge, le, lt) stored in its metadata."""
    if factory is not None:
        return field(default_factory=factory, metadata=rules)
    return field(default=default, metadata=rules)


@dataclass
class DataConfig:
    """Which dataset, how it is split, batched and augmented."""

    name: str = "digits"
    root: str | None = None
    val_fraction: float = _f(0.1, gt=0.0, lt=1.0)
    split_seed: int = 0
    train_subset: int | None = _f(None, ge=1)
    omit_classes: list[int] = _f(factory=list)
    few_shot: int = _f(0, ge=0)
    augment: Literal["auto", "none", "crop", "flip", "crop_flip"] = "auto"
    batch_size: int = _f(128, ge=1)
    eval_batch_size: int = _f(1000, ge=1)
    options: dict[str, Any] = _f(factory=dict)


@dataclass
class ModelConfig:
    """A zoo model by name with keyword options; ``taps`` names module paths for user models."""

    name: str = "mlp"
    options: dict[str, Any] = _f(factory=dict)
    taps: dict[str, Any] = _f(factory=dict)


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule (per-step warm-up, then step/multistep/cosine/constant)."""

    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = _f(0.1, gt=0.0)
    momentum: float = _f(0.9, ge=0.0, lt=1.0)
    nesterov: bool = False
    weight_decay: float = _f(5e-4, ge=0.0)
    betas: list[float] = _f(factory=lambda: [0.9, 0.999])
    schedule: Literal["constant", "step", "multistep", "cosine"] = "cosine"
    milestones: list[int] = _f(factory=list)
    step_size: int = _f(30, ge=1)
    gamma: float = _f(0.1, gt=0.0, le=1.0)
    warmup_epochs: float = _f(0.0, ge=0.0)
    grad_clip: float | None = _f(None, gt=0.0)


@dataclass
class TrainConfig:
    """How long and how one model trains, and what the run folder keeps."""

    epochs: int = _f(10, ge=1)
    loss: str = "ce"
    label_smoothing: float = _f(0.0, ge=0.0, lt=1.0)
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"
    precision: Literal["fp32", "bf16"] = "fp32"
    channels_last: bool = False
    save_every: int = _f(0, ge=0)
    tensorboard: bool = False
    progress: bool = True


@dataclass
class KDConfig:
    """Student loss = ce_weight * CE + sum_m gamma_m * L_m (ECCV 2024 supplement Eq. 24).

    ``method`` is one distillation loss or a list (``[crd, kd]``); ``gamma`` overrides the paper's
    weights by method; ``alpha`` is Hinton KD's weight (with CE at 1 - alpha when KD is alone) and
    ``temperature`` its T; ``options`` passes per-method options (``{crd: {feat_dim: 128}}``).
    """

    method: str | list[str] = "kd"
    alpha: float = _f(0.9, ge=0.0, le=1.0)
    temperature: float = _f(4.0, gt=0.0)
    gamma: dict[str, Any] = _f(factory=dict)
    ce_weight: float | None = _f(None, ge=0.0)
    options: dict[str, Any] = _f(factory=dict)


@dataclass
class TeacherConfig:
    """The teacher: a checkpoint (file or run folder) or a model trained in the same command.

    A teacher trained in-command uses the full training split (``data.train_subset`` applies to the
    student only), its own model, loss (``ce`` or ``mse``), epochs and optimiser.
    """

    checkpoint: str | None = None
    select: Literal["last", "best"] = "last"
    model: ModelConfig = _f(factory=ModelConfig)
    optim: OptimConfig = _f(factory=OptimConfig)
    epochs: int = _f(10, ge=1)
    loss: str = "ce"


@dataclass
class ProKDConfig:
    """Pro-KD (student follows the teacher's trajectory) and Annealing-KD schedules (METHODS.md sec. 3-4).

    Phase I: after teacher epoch i the student trains ``student_epochs`` (n_i; an int for every i, or
    one entry per teacher epoch) epochs on ||z_s - z_t(theta_i) / T_i||^2; T starts at ``tau_max`` and
    drops by 1 every ``stage_epochs`` teacher epochs, floored at 1. Phase II: CE for the remaining
    ``train.epochs``. ``mode``: ``online`` trains the teacher (``teacher.model``, ``teacher.epochs``) in
    the same run, interleaved epoch by epoch; ``replay`` follows the trajectory recorded in the run
    folder ``teacher.checkpoint`` (a teacher trained with ``train.save_every=1``). ``checkpoint_at``:
    student stage i distils from the teacher after its epoch i (``end``) or before it (``start``).
    ``reduction``: ``sum`` over classes then batch mean (the paper's ||.||^2), or ``mean`` over all
    elements (``F.mse_loss``: C times smaller gradients at the same lr).
    """

    mode: Literal["online", "replay"] = "online"
    tau_max: float = _f(10.0, ge=1.0)
    stage_epochs: int = _f(1, ge=1)
    student_epochs: int | list[int] = 1
    checkpoint_at: Literal["end", "start"] = "end"
    reduction: Literal["sum", "mean"] = "sum"


@dataclass
class RCOConfig:
    """Route-constrained optimisation (Jin et al. 2019): anchors = teacher checkpoints at equal intervals."""

    anchors: int = _f(4, ge=1)


@dataclass
class TAKDConfig:
    """Teacher-assistant KD (Mirzadeh et al. 2020): teacher -> assistant (KD) -> student (KD)."""

    assistant: ModelConfig = _f(factory=lambda: ModelConfig(name="resnet20"))
    assistant_epochs: int | None = _f(None, ge=1)


@dataclass
class ESKDConfig:
    """Early-stopped teacher (Cho & Hariharan 2019) and checkpoint search over a teacher trajectory."""

    epoch: int | None = _f(None, ge=1)
    search: bool = False


@dataclass
class L2TConfig:
    """Learning to Teach with Dynamic Loss Functions (Wu et al. 2018; METHODS.md sec. 5).

    The student minimises L_Phi(p, y) = -sigmoid(y^T W log p + b) (optionally mixed with CE by
    ``ce_alpha``); a teacher model maps the student's state to Phi_t and is trained with Adam on a
    dev-set objective by reverse-mode differentiation through ``inner_steps`` momentum-SGD steps
    (``optim.lr``, ``optim.momentum``). ``memory``: ``full``, ``checkpoint`` or ``truncate:K``.
    """

    teacher_model: Literal["static", "gated", "attention"] = "gated"
    teacher_steps: int = _f(60, ge=1)
    inner_steps: int = _f(20, ge=1)
    memory: str = "full"
    objective: Literal["smooth_error", "dev_ce"] = "smooth_error"
    smooth_k: float = _f(50.0, gt=0.0)
    ce_alpha: float = _f(0.0, ge=0.0, le=1.0)
    teacher_lr: float = _f(1e-4, gt=0.0)
    teacher_betas: list[float] = _f(factory=lambda: [0.9, 0.999])
    teacher_eps: float = _f(1e-8, gt=0.0)
    warm_start_steps: int = _f(0, ge=0)
    dev_batch_size: int = _f(500, ge=1)
    #: each episode ``continue``s the teacher-training student where the last one ended, or ``reset``s it to
    #: the warm start; ``episode_gap`` plain steps under the current teacher separate episodes
    episode_start: Literal["continue", "reset"] = "continue"
    episode_gap: int = _f(0, ge=0)
    #: gated teacher: hidden width and number of gates of h(s_t)
    gate_hidden: int = _f(16, ge=1)
    gate_rank: int = _f(4, ge=1)


@dataclass
class RunConfig:
    """One run: ``teachkit train`` uses data/model/optim/train; ``distill`` adds teacher and kd;
    ``teachkit run RECIPE`` reads the recipe's own section (prokd, rco, takd, eskd, l2t)."""

    name: str = "run"
    out_dir: str = "runs"
    data: DataConfig = _f(factory=DataConfig)
    model: ModelConfig = _f(factory=ModelConfig)
    optim: OptimConfig = _f(factory=OptimConfig)
    train: TrainConfig = _f(factory=TrainConfig)
    teacher: TeacherConfig = _f(factory=TeacherConfig)
    kd: KDConfig = _f(factory=KDConfig)
    prokd: ProKDConfig = _f(factory=ProKDConfig)
    rco: RCOConfig = _f(factory=RCOConfig)
    takd: TAKDConfig = _f(factory=TAKDConfig)
    eskd: ESKDConfig = _f(factory=ESKDConfig)
    l2t: L2TConfig = _f(factory=L2TConfig)


# ----------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number",
            str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` converted to type ``tp`` or a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{key}={value!r} is not allowed: expected {_type_name(tp)}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        allowed = [str(a) for a in typing.get_args(tp)]
        raise ConfigError(f"{key}={value!r} is not allowed{closest(str(value), allowed)}; "
                          f"choose one of: {', '.join(allowed)}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                pass
        raise bad
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise bad
        (inner,) = typing.get_args(tp)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not allowed: expected a finite number")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    raise bad


def _check_range(value: Any, rules: dict, key: str) -> None:
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = {"gt": (lambda v, b: v > b, ">"), "ge": (lambda v, b: v >= b, ">="),
              "lt": (lambda v, b: v < b, "<"), "le": (lambda v, b: v <= b, "<=")}
    allowed = [f"{sym} {rules[r]}" for r, (_, sym) in checks.items() if r in rules]
    for r, (ok, _sym) in checks.items():
        if r in rules and not ok(value, rules[r]):
            raise ConfigError(f"{key}={value!r} is out of range: must be {' and '.join(allowed)}")


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(f"unknown config key {full!r}{closest(str(key), list(fields))}; "
                              f"allowed under {prefix or 'the top level'}: {', '.join(fields)}")
        kwargs[key] = _coerce(value, hints[key], full)
        _check_range(kwargs[key], dict(fields[key].metadata), full)
    return cls(**kwargs)


def from_dict(data: dict | None, cls: type = RunConfig) -> Any:
    """Validate a plain mapping into ``cls`` (default :class:`RunConfig`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of keys, got {type(data).__name__}")
    return _build(cls, data)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


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
