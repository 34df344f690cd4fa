"""The model registry, :func:`build_model` and the shared input-shape / option checks.

``model.name`` is a registered name (``teachkit list models``) or an import path
``"package.module:factory"``: any importable callable returning an ``nn.Module`` (a class or a function).
The factory receives ``model.options`` as keyword arguments, plus ``input_shape`` (per sample, no batch
dim) and ``num_classes`` when its signature names them (or takes ``**kwargs``). Only the named module is
imported, and only when the user named it in this command or passed ``--trust-code`` (a name read from a run
folder or checkpoint is refused otherwise, see :mod:`teachkit.trust`); a callable of the Python standard
library or builtins is never a factory.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.options import Options, option, short_repr
from teachkit.registry import Registry, closest
from teachkit.trust import check_import, refuse_standard_library

Builder = Callable[..., nn.Module]

MODELS: Registry[Builder] = Registry("model")


@dataclass
class ModelConfig(Options):
    """A zoo model by ``name`` with keyword ``options``; ``taps`` names module paths for models without a
    tap spec (see :class:`teachkit.models.TapSpec`: embedding, stages, stages_pre, stages_bn, extra, logits)."""

    name: str = "mlp"
    options: dict[str, Any] = option(factory=dict)
    taps: dict[str, Any] = option(factory=dict)

    def validate(self) -> None:
        if is_import_path(self.name):
            import_factory(self.name)
        elif self.name.endswith("@python") and self.name not in {e.name for e in MODELS.entries()}:
            raise ConfigError(f"model {self.name!r} was given as a Python object (teachkit.train / distill / run) "
                              "in another process; load the run with teachkit.load(...) there, or name the "
                              "model as 'package.module:factory' so that any process can rebuild it")
        else:
            MODELS.entry(self.name)  # unknown names: one line with did-you-mean
        if self.taps:
            TapSpec.from_dict(self.taps)


def make_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Build ``cfg``'s model for ``input_shape`` / ``num_classes``, with ``cfg.taps`` as its tap spec."""
    for key in ("name", "input_shape", "num_classes"):
        if key in cfg.options:
            raise ConfigError(f"model.options.{key} is set by teachkit (from the data or model.name); remove it")
    model = build_model(cfg.name, input_shape, num_classes, **cfg.options)
    if cfg.taps:
        model.tap_spec = TapSpec.from_dict(cfg.taps)
    return model


def is_import_path(name: object) -> bool:
    """True for ``"package.module:factory"`` model names (a registered name has no colon)."""
    return isinstance(name, str) and ":" in name


def is_user_model(name: str) -> bool:
    """Whether ``name`` is the user's own model (an import path, or a Python object given to the API), which
    teachkit probes on the data before a run (:mod:`teachkit.models.probe`); zoo models are tested here."""
    return is_import_path(name) or name.endswith("@python")


def import_factory(path: str) -> Callable[..., Any]:
    """The callable ``"package.module:attr"`` names (``attr`` may be dotted), imported; else a ConfigError.

    A name read from disk needs the user's trust (:func:`teachkit.trust.check_import`); the standard library and
    builtins are refused before anything is called (:func:`teachkit.trust.refuse_standard_library`)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"model.name {path!r} must be a registered model or 'package.module:factory'")
    refuse_standard_library(path, None)
    check_import(path, "model factory")
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any import failure of user code is one line
        reason = first_line(e)
        raise ConfigError(f"model.name {path!r}: cannot import module {module_name!r} ({reason})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model.name {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    refuse_standard_library(path, obj)
    if not callable(obj):
        raise ConfigError(f"model.name {path!r}: {attr!r} is a {type(obj).__name__}, not a callable returning "
                          "an nn.Module")
    return obj


def build_from_factory(path: str, input_shape: Sequence[int], num_classes: int, **options: Any) -> nn.Module:
    """Import the factory ``path`` names and build it (:func:`call_factory`)."""
    return call_factory(import_factory(path), path, input_shape, num_classes, options)


def call_factory(factory: Callable[..., Any], label: str, input_shape: Sequence[int], num_classes: int,
                 options: dict[str, Any]) -> nn.Module:
    """Call ``factory`` with ``options`` (and ``input_shape`` / ``num_classes`` when it takes them); a factory
    that refuses its options or returns no ``nn.Module`` is a one-line ConfigError naming ``label``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = dict(options)
    for key, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes)):
        if key in options:
            raise ConfigError(f"model.options.{key} is set by teachkit from the data; remove it")
        if key in params or var_kw:
            kwargs[key] = value
    allowed = [n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY)]
    if params and not var_kw:
        for key in options:
            if key not in allowed:
                shown = [n for n in allowed if n not in ("input_shape", "num_classes")]
                raise ConfigError(f"model {label!r} has no option {key!r}{closest(key, shown)}; "
                                  f"allowed: {', '.join(shown) if shown else '(none)'}")
    try:
        model = factory(**kwargs)
    except TypeError as e:
        raise ConfigError(f"model {label!r} could not be built with options {short_repr(options)}: "
                          f"{first_line(e)}") from None
    except (KeyboardInterrupt, ConfigError):
        raise
    except Exception as e:  # noqa: BLE001 - user code: any failure is one line (--debug shows the traceback)
        raise ConfigError(f"model {label!r} raised {type(e).__name__} while being built: {first_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {label!r} returned a {type(model).__name__}, not an nn.Module")
    return model


def first_line(e: BaseException) -> str:
    """An exception's message as one short line (its type when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def input_shape_of(input_shape: Any, model: str = "") -> tuple[int, ...]:
    """``input_shape`` (per-sample, no batch dim) as a tuple of positive ints, else a ConfigError."""
    msg = f"model {model!r} needs" if model else "need"
    msg += f" an input shape of positive ints (no batch dim); got {short_repr(input_shape)}"
    if isinstance(input_shape, (str, bytes)):
        raise ConfigError(msg)
    try:
        dims = tuple(input_shape)
    except TypeError:
        raise ConfigError(msg) from None
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise ConfigError(msg)
    return dims


def check_input(model: str, input_shape: Sequence[int], layout: str, min_size: int) -> tuple[int, ...]:
    """Require ``input_shape`` to be ``layout`` (e.g. ``"(C, H, W)"``) with every spatial size >= min_size.

    The message names the model, e.g. "model 'resnet20' needs input (C, H, W) with H, W >= 8; got (1, 40)".
    """
    dims = input_shape_of(input_shape, model)
    names = [n.strip() for n in layout.strip("()").split(",")]
    spatial = ", ".join(names[1:])
    if len(dims) != len(names) or min(dims[1:]) < min_size:
        raise ConfigError(
            f"model {model!r} needs input {layout} with {spatial} >= {min_size}; got {fmt_shape(dims)}"
        )
    return dims


def check_classes(model: str, num_classes: Any) -> int:
    """``num_classes`` is the model's output width: classes, or targets of a regression (>= 1)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"model {model!r} needs num_classes (its output width) >= 1; got {short_repr(num_classes)}")
    return num_classes


def fmt_shape(dims: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + (",)" if len(dims) == 1 else ")")


def option_names(builder: Builder) -> tuple[list[str], bool]:
    """The builder's option names (everything after input_shape, num_classes) and whether it takes **kw."""
    params = list(inspect.signature(builder).parameters.values())[2:]
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]
    return names, var_kw


def describe_builder(builder: Builder) -> str:
    """A builder's options with defaults, as ``teachkit list models`` shows them: ``width=1, shortcut='B'``
    (``depth`` without a default is required); empty when it takes none."""
    params = list(inspect.signature(builder).parameters.values())[2:]
    parts = []
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parts.append("**any")
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            parts.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


def build_model(name: str, input_shape: Sequence[int], num_classes: int, **options: Any) -> nn.Module:
    """Build the registered model ``name`` for per-sample ``input_shape`` and ``num_classes``.

    Unknown option names, missing required options, input shapes the model cannot take and
    ``num_classes < 1`` are one-line :class:`ConfigError`s. ``name`` may be ``"package.module:factory"``.
    A model whose builder gave it no ``tap_spec`` gets an empty one (logits only; ``model.taps`` adds more).
    """
    if is_import_path(name):
        dims = input_shape_of(input_shape, name)
        model = build_from_factory(name, dims, num_classes, **options)
        check_has_parameters(model, name)
        if getattr(model, "tap_spec", None) is None:
            model.tap_spec = TapSpec()
        return model
    builder = MODELS.get(name)
    allowed, var_kw = option_names(builder)
    if not var_kw:
        for key in options:
            if key not in allowed:
                raise ConfigError(
                    f"model {name!r} has no option {key!r}{closest(key, allowed)}; "
                    f"allowed: {', '.join(allowed) if allowed else '(none)'}"
                )
    params = inspect.signature(builder).parameters
    for key in allowed:
        if params[key].default is inspect.Parameter.empty and key not in options:
            raise ConfigError(f"model {name!r} needs option {key!r}")
    dims = input_shape_of(input_shape, name)
    check_classes(name, num_classes)
    model = builder(dims, num_classes, **options)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {name!r} returned a {type(model).__name__}, not an nn.Module")
    check_has_parameters(model, name)
    if getattr(model, "tap_spec", None) is None:  # a plain user module: logits only unless model.taps says more
        model.tap_spec = TapSpec()
    return model


def check_has_parameters(model: nn.Module, label: str) -> None:
    """A ConfigError when ``model`` has no parameters, or none that trains (all ``requires_grad=False``): there
    is nothing to train or distil into."""
    params = list(model.parameters())
    if not params:
        raise ConfigError(f"model {label!r} ({type(model).__name__}) has no parameters: nothing to train; a model "
                          "needs at least one nn.Parameter (e.g. an nn.Linear)")
    if not any(p.requires_grad for p in params):
        raise ConfigError(f"model {label!r} ({type(model).__name__}) has no trainable parameters (every one has "
                          "requires_grad=False): nothing to train; unfreeze at least its last layer")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (each shared tensor counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def flat_size(features: Callable[[torch.Tensor], torch.Tensor], input_shape: Sequence[int]) -> int:
    """Per-sample size of ``features(x)`` flattened, by a dummy forward of one zero sample.

    ``features`` must hold no state a forward changes (no BatchNorm): it runs as is, under no_grad.
    """
    return int(features(torch.zeros(1, *input_shape))[0].numel())


def positive_int(model: str, option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model {model!r} option {option!r} must be a positive int; got {short_repr(value)}")
    return value


def fraction(model: str, option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"model {model!r} option {option!r} must be a number in [0, 1); got {short_repr(value)}")
    return float(value)


def init_weights(model: nn.Module, linear: str = "default") -> None:
    """The reference CIFAR initialisation: He-normal (fan_out) convs with zero bias, BN weight 1 / bias 0.

    ``linear``: ``default`` leaves Linear layers as PyTorch made them, ``zero_bias`` zeroes their bias
    (WRN, DenseNet), ``normal`` draws weights from N(0, 0.01) with zero bias (VGG, MobileNetV2).
    """
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear != "default":
            if linear == "normal":
                nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
