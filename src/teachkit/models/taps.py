"""Feature taps: read intermediate tensors of any ``nn.Module`` through forward hooks.

A :class:`TapSpec` names module paths (as in ``model.named_modules()``):

- ``embedding``: the classifier module; the tap is that module's *input*, flattened to (B, D): the pooled
  penultimate feature the logits are computed from (``classifier(embedding) == logits``);
- ``stages``: modules whose *outputs* are each stage's post-activation map;
- ``stages_pre``: modules whose *outputs* are each stage's pre-activation map;
- ``stages_bn``: not a tap but a declaration, one per ``stages_pre`` entry: the BatchNorm whose output (plus,
  in a residual block, the shortcut) that stage's ReLU acts on (OFD reads its affine weight and bias for the
  margin; mdistiller's ``get_bn_before_relu``);
- ``extra``: any other named tap, ``name: "path"`` (the module's output) or ``"path:input"`` (its first
  input), e.g. ``model.taps.extra.block2="layer2.0:input"``;
- ``logits``: for models returning a structured output (a mapping such as a Hugging Face ``ModelOutput``,
  or a tuple), the field holding the logits (default ``logits``; a tuple's first element).

A loss may also ask for a field of a structured output by name (``hidden_states``, ``attentions``); such
fields come back in ``Taps.extra``. A model with a ``request_outputs(names)`` method is told the field names
before the forward (and an empty set after), so it returns a plain logits tensor to every other caller.
Zoo models carry ``model.tap_spec``; a user model gets one from
``model.taps`` in the config (a teacher loaded from a checkpoint also from ``teacher.taps``, which override the
recorded ones), and a plain ``nn.Module`` without any works for logit-only methods. When the ``embedding`` tap is
wanted but not named, it is inferred as the input of the model's last ``nn.Linear`` (in module order) provided that
module's output is the model's logits on the first forward (:attr:`Tapped.inferred`); otherwise the error lists the
``nn.Linear`` paths. Every tap error names the side (``student model MLP``, ``teacher model MLP``) and the key where
that side's taps are set. Hooks
resolve on the unwrapped module (``.module`` of DDP/DataParallel, ``._orig_mod`` of torch.compile). Stage
maps come back in the order the spec lists them; a module run several times per forward reports its last
output. Recorded tensors are not detached, so losses on them backpropagate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from teachkit.errors import ConfigError
from teachkit.options import short_repr
from teachkit.registry import closest
from teachkit.types import Inputs, Taps, call_model

__all__ = ["TAP_NAMES", "TapSpec", "Tapped", "Taps", "spec_of", "unwrap"]

TAP_NAMES = ("logits", "embedding", "stages", "stages_pre")
_SPEC_KEYS = ("embedding", "stages", "stages_pre", "stages_bn", "extra", "logits")
#: where each side of a distillation names its taps in a config
SIDE_KEYS = {"student": "model.taps", "teacher": "teacher.taps", "model": "model.taps"}


def _path_text(value: Any) -> Any:
    """A module path as text: YAML reads an ``nn.Sequential`` index such as ``3`` as an int."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _paths(value: Any, key: str, prefix: str = "model.taps") -> tuple[str, ...]:
    """A config value as a tuple of module paths (a lone string is one path, not its characters)."""
    if value is None:
        return ()
    value = [_path_text(v) for v in value] if isinstance(value, (list, tuple)) else _path_text(value)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{prefix}.{key} must be a module path or a list of paths; got {short_repr(value)}")


def _extra(value: Any, prefix: str = "model.taps") -> dict[str, tuple[str, str]]:
    """``{name: "path[:input|:output]"}`` as ``{name: (path, "input" | "output")}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{prefix}.extra must be a mapping of name: module path; got {short_repr(value)}")
    out = {}
    for name, spec in value.items():
        spec = _path_text(spec)
        if name in TAP_NAMES:
            raise ConfigError(f"{prefix}.extra.{name}: {name!r} is a built-in tap; choose another name")
        if not isinstance(spec, str) or not spec:
            raise ConfigError(f"{prefix}.extra.{name} must be a module path, optionally ending in :input or "
                              f":output; got {short_repr(spec)}")
        path, _, where = spec.rpartition(":") if spec.endswith((":input", ":output")) else (spec, "", "output")
        out[str(name)] = (path, where)
    return out


@dataclass(frozen=True)
class TapSpec:
    embedding: str | None = None
    stages: tuple[str, ...] = ()
    stages_pre: tuple[str, ...] = ()
    extra: dict[str, tuple[str, str]] = field(default_factory=dict)
    logits: str | None = None
    #: the BatchNorm before each stage's ReLU, one per ``stages_pre`` entry (read by OFD; never hooked)
    stages_bn: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Any, prefix: str = "model.taps") -> TapSpec:
        """The spec a config mapping names (``prefix``: its key in messages, ``model.taps`` or ``teacher.taps``)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{prefix} must be a mapping with keys {', '.join(_SPEC_KEYS)}; got {short_repr(d)}")
        bad = sorted(set(d) - set(_SPEC_KEYS), key=str)
        if bad:
            raise ConfigError(f"unknown key {prefix}.{bad[0]}{closest(str(bad[0]), list(_SPEC_KEYS))}; allowed: "
                              f"{', '.join(_SPEC_KEYS)}")
        emb = _path_text(d.get("embedding"))
        if emb is not None and not isinstance(emb, str):
            raise ConfigError(f"{prefix}.embedding must be one module path; got {short_repr(emb)}")
        logits = d.get("logits")
        if logits is not None and not isinstance(logits, str):
            raise ConfigError(f"{prefix}.logits must be the name of an output field; got {short_repr(logits)}")
        return cls(emb, _paths(d.get("stages"), "stages", prefix), _paths(d.get("stages_pre"), "stages_pre", prefix),
                   _extra(d.get("extra"), prefix), logits, _paths(d.get("stages_bn"), "stages_bn", prefix))

    def updated(self, d: Mapping[str, Any], prefix: str = "teacher.taps") -> TapSpec:
        """This spec with the keys the mapping ``d`` gives replaced (``extra`` entries added or replaced)."""
        given = TapSpec.from_dict(d, prefix)
        changes: dict[str, Any] = {k: getattr(given, k) for k in d if k != "extra"}
        if "extra" in d:
            changes["extra"] = {**self.extra, **given.extra}
        return replace(self, **changes)


def _is_wrapper(model: nn.Module) -> bool:
    """DDP / DataParallel, or any module whose only child is ``.module`` (a user model that merely
    *has* a submodule called ``module`` among others is not a wrapper)."""
    inner = getattr(model, "module", None)
    if not isinstance(inner, nn.Module):
        return False
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return True
    return [name for name, _ in model.named_children()] == ["module"]


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        if _is_wrapper(model):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def spec_of(model: nn.Module, spec: TapSpec | None = None) -> TapSpec:
    if spec is not None:
        return spec
    found = getattr(unwrap(model), "tap_spec", None)
    return found if found is not None else TapSpec()


def split_output(out: Any, field_name: str | None) -> tuple[Tensor, Mapping[str, Any]]:
    """(logits, fields) of a model's output: a tensor is the logits; a mapping (Hugging Face ``ModelOutput``)
    gives ``out[field_name or "logits"]`` and its fields; a tuple gives its first element."""
    if isinstance(out, Tensor):
        return out, {}
    if isinstance(out, Mapping):
        key = field_name or "logits"
        if key not in out:
            raise ConfigError(f"the model's output has no field {key!r} (fields: {', '.join(map(str, out))}); "
                              "name the logits field in model.taps.logits")
        return out[key], out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0], {}
    raise ConfigError(f"the model returned {type(out).__name__}; a model must return its logits as a tensor, "
                      "a mapping with a logits field, or a tuple starting with them")


class Tapped(nn.Module):
    """Wrap ``model`` so that calling it returns :class:`Taps` with the requested features.

    Only the taps in ``want`` are recorded, so plain KD (logits only) pays nothing for hooks. Names beyond
    the four built-in ones are extras: a module input/output declared in ``spec.extra``, else a field of
    the model's structured output. Hooks stay on the model until :meth:`remove` (or the end of a
    ``with Tapped(...)`` block); they record only while this wrapper's own forward runs.
    """

    def __init__(self, model: nn.Module, spec: TapSpec | None = None,
                 want: Iterable[str] = ("logits",), side: str = "model") -> None:
        super().__init__()
        self.model = model
        self.spec = spec_of(model, spec)
        want = (want,) if isinstance(want, str) else want
        self.want = frozenset(want)
        inner = unwrap(model)
        modules = dict(inner.named_modules())
        self._records: dict[tuple[str, Any], Tensor] = {}
        self._active = False
        self._handles: list[RemovableHandle] = []
        self.name = type(inner).__name__
        #: ``student``, ``teacher`` or ``model``: named in every tap error, with the key where its taps are set
        self.side, self.prefix = side, SIDE_KEYS.get(side, "model.taps")
        self.who = f"model {self.name}" if side == "model" else f"{side} model {self.name}"
        #: the module path of an inferred ``embedding`` tap (:meth:`infer_embedding`), None when it was named
        self.inferred: str | None = None
        self.inferred_checked = False
        self._linears = [p for p, m in modules.items() if p and isinstance(m, nn.Linear)]
        if "embedding" in self.want and not self.spec.embedding and self._linears:
            self.inferred = self._linears[-1]
            self.spec = replace(self.spec, embedding=self.inferred)
        #: extras read from the model's structured output rather than from a hook
        self.output_fields = sorted(n for n in self.want - set(TAP_NAMES) if n not in self.spec.extra)

        def need(path: str | None, tap: str, key: str) -> nn.Module:
            if not path:
                why = " (it has no nn.Linear to infer it from)" if tap == "embedding" else ""
                raise ConfigError(f"{self.who} has no {tap!r} tap{why}; name its module path in {self.prefix}.{key}")
            if path not in modules:
                raise ConfigError(f"{self.who} has no module {path!r} for tap {tap!r} ({self.prefix}.{key})"
                                  f"{closest(path, [p for p in modules if p])}")
            return modules[path]

        # Resolve every path before registering anything, so a bad path leaves no hooks behind.
        inputs: list[tuple[nn.Module, tuple[str, Any], bool]] = []  # (module, key, flatten)
        outputs: list[tuple[nn.Module, tuple[str, Any]]] = []
        if "embedding" in self.want:
            inputs.append((need(self.spec.embedding, "embedding", "embedding"), ("embedding", 0), True))
        for tap in ("stages", "stages_pre"):
            if tap in self.want:
                paths = getattr(self.spec, tap)
                if not paths:
                    need(None, tap, tap)
                outputs += [(need(p, tap, tap), (tap, i)) for i, p in enumerate(paths)]
        for name in sorted(self.want - set(TAP_NAMES)):
            if name in self.spec.extra:
                path, where = self.spec.extra[name]
                mod = need(path, name, f"extra.{name}")
                if where == "input":
                    inputs.append((mod, ("extra", name), False))
                else:
                    outputs.append((mod, ("extra", name)))
        for mod, key, flat in inputs:
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook(key, flat)))
        if "embedding" in self.want:  # the classifier's output, to check that it is the logits
            outputs.append((modules[self.spec.embedding], ("classifier", 0)))
        for mod, key in outputs:
            self._handles.append(mod.register_forward_hook(self._hook(key)))

    def _pre_hook(self, key: tuple[str, Any], flatten: bool) -> Callable[[nn.Module, tuple], None]:
        def hook(_mod: nn.Module, args: tuple) -> None:
            if self._active and args:
                value = args[0]
                self._records[key] = torch.flatten(value, 1) if flatten and isinstance(value, Tensor) else value
        return hook

    def _hook(self, key: tuple[str, Any]) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(_mod: nn.Module, _args: tuple, out: Any) -> None:
            if self._active:
                self._records[key] = out
        return hook

    def forward(self, x: Inputs) -> Taps:
        self._records = {}
        self._active = True
        # models that build structured outputs only on request (teachkit's Hugging Face wrappers)
        request = getattr(unwrap(self.model), "request_outputs", None) if self.output_fields else None
        if request is not None:
            request(set(self.output_fields))
        try:
            out = call_model(self.model, x)
        finally:
            self._active = False
            if request is not None:
                request(set())
            rec, self._records = self._records, {}
        release = getattr(self.model, "release_inference_outputs", None)  # FrozenTeacher (inference mode)
        if rec and release is not None:
            rec = release(rec)
        try:
            logits, fields = split_output(out, self.spec.logits)
        except ConfigError as e:  # name the side, and where its taps are set
            raise ConfigError(f"{self.who}: {str(e).replace('model.taps.', f'{self.prefix}.')}") from None

        def collect(tap: str) -> list[Tensor]:
            if tap not in self.want:
                return []
            paths = (self.spec.embedding,) if tap == "embedding" else getattr(self.spec, tap)
            for i, p in enumerate(paths):
                if (tap, i) not in rec:
                    raise ConfigError(f"{self.who}: module {p!r} named in {self.prefix}.{tap} did not run in the "
                                      "forward pass")
                what = "input" if tap == "embedding" else "output"
                if not isinstance(rec[(tap, i)], Tensor):
                    raise ConfigError(f"{self.who}: module {p!r} named in {self.prefix}.{tap} has a "
                                      f"{type(rec[(tap, i)]).__name__} {what}, not a tensor")
            if tap == "embedding" and not self.inferred_checked:
                self._check_classifier(rec.get(("classifier", 0)), logits)
            return [rec[(tap, i)] for i in range(len(paths))]

        extra: dict[str, Any] = {}
        for name in self.want - set(TAP_NAMES):
            if name in self.spec.extra:
                if ("extra", name) not in rec:
                    raise ConfigError(f"{self.who}: module {self.spec.extra[name][0]!r} named in "
                                      f"{self.prefix}.extra.{name} did not run in the forward pass")
                extra[name] = rec[("extra", name)]
            elif name in fields:
                extra[name] = fields[name]
            else:
                known = [*TAP_NAMES, *self.spec.extra, *map(str, fields)]
                raise ConfigError(f"{self.who} has no tap {name!r}{closest(name, known)}: declare it as "
                                  f"{self.prefix}.extra.{name}=<module path>[:input] or return it as a field of the "
                                  "model's output")
        emb = collect("embedding")
        return Taps(logits, emb[0] if emb else None, collect("stages"), collect("stages_pre"), extra)

    def _check_classifier(self, out: Any, logits: Tensor) -> None:
        """The ``embedding`` tap names the classifier: the module whose output is the logits, so that its
        input is the penultimate feature. Anything else is a one-line error naming the module."""
        if self.inferred is not None:  # inferred: the last nn.Linear must output the logits themselves
            if isinstance(out, Tensor) and (out is logits or (out.shape == logits.shape and torch.equal(out, logits))):
                self.inferred_checked = True
                return
            shown = ", ".join(repr(p) for p in self._linears[-8:])
            raise ConfigError(f"{self.who} has no 'embedding' tap and it cannot be inferred: its last nn.Linear "
                              f"{self.inferred!r} does not output the logits; name the classifier's module path in "
                              f"{self.prefix}.embedding (nn.Linear modules: {shown})")
        if isinstance(out, Tensor) and tuple(out.shape) == tuple(logits.shape):
            return
        got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else f"a {type(out).__name__}"
        raise ConfigError(f"{self.prefix}.embedding={self.spec.embedding!r} of the {self.who} is not its classifier: "
                          f"its output has {got}, the logits {tuple(logits.shape)}; name the module that maps the "
                          "penultimate feature to the logits (e.g. 'fc' or 'head')")

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> Tapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
