"""Feature taps: read intermediate tensors of any ``nn.Module`` through forward hooks.

A :class:`TapSpec` names module paths (as in ``model.named_modules()``):

- ``embedding``: the classifier module whose *input* (flattened) is the pooled penultimate feature;
- ``stages``: modules whose *outputs* are each stage's post-activation map;
- ``stages_pre``: modules whose *outputs* are each stage's pre-activation map.

Zoo models carry ``model.tap_spec``; for a user model, pass a TapSpec naming its paths. Logits
are the model's output. Hooks resolve on the unwrapped module (``.module`` of DDP/DataParallel).
Stage maps come back in the order the spec lists them; a module run several times per forward
reports its last output. Recorded tensors are not detached, so losses on them backpropagate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from teachkit.errors import ConfigError

TAP_NAMES = ("logits", "embedding", "stages", "stages_pre")
_SPEC_KEYS = ("embedding", "stages", "stages_pre")


def _paths(value: Any, key: str) -> tuple[str, ...]:
    """A config value as a tuple of module paths (a lone string is one path, not its characters)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"model.taps.{key} must be a module path or a list of paths; got {value!r}")


@dataclass(frozen=True)
class TapSpec:
    embedding: str | None = None
    stages: tuple[str, ...] = ()
    stages_pre: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: dict) -> TapSpec:
        if not isinstance(d, dict):
            raise ConfigError(f"model.taps must be a mapping with keys {', '.join(_SPEC_KEYS)}; got {d!r}")
        bad = sorted(set(d) - set(_SPEC_KEYS))
        if bad:
            raise ConfigError(f"unknown key model.taps.{bad[0]}; allowed: {', '.join(_SPEC_KEYS)}")
        emb = d.get("embedding")
        if emb is not None and not isinstance(emb, str):
            raise ConfigError(f"model.taps.embedding must be one module path; got {emb!r}")
        return cls(emb, _paths(d.get("stages"), "stages"), _paths(d.get("stages_pre"), "stages_pre"))


@dataclass
class Taps:
    logits: Tensor
    embedding: Tensor | None = None
    stages: list[Tensor] = field(default_factory=list)
    stages_pre: list[Tensor] = field(default_factory=list)


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


class Tapped(nn.Module):
    """Wrap ``model`` so that calling it returns :class:`Taps` with the requested features.

    Only the taps in ``want`` are recorded, so plain KD (logits only) pays nothing for hooks.
    Hooks stay on the model until :meth:`remove` (or the end of a ``with Tapped(...)`` block);
    they record only while this wrapper's own forward runs.
    """

    def __init__(self, model: nn.Module, spec: TapSpec | None = None,
                 want: Iterable[str] = ("logits",)) -> None:
        super().__init__()
        self.model = model
        self.spec = spec_of(model, spec)
        want = (want,) if isinstance(want, str) else want
        self.want = frozenset(want)
        bad = self.want - set(TAP_NAMES)
        if bad:
            raise ConfigError(f"unknown tap {sorted(bad)[0]!r}; allowed: {', '.join(TAP_NAMES)}")
        inner = unwrap(model)
        modules = dict(inner.named_modules())
        self._records: dict[tuple[str, int], Tensor] = {}
        self._active = False
        self._handles: list[RemovableHandle] = []
        name = type(inner).__name__

        def need(path: str | None, tap: str) -> nn.Module:
            if not path:
                raise ConfigError(
                    f"model {name} has no {tap!r} tap; name its module path in model.taps.{tap}"
                )
            if path not in modules:
                raise ConfigError(f"model {name} has no module {path!r} for tap {tap!r}")
            return modules[path]

        # Resolve every path before registering anything, so a bad path leaves no hooks behind.
        pre_hooks: list[tuple[nn.Module, tuple[str, int]]] = []
        hooks: list[tuple[nn.Module, tuple[str, int]]] = []
        if "embedding" in self.want:
            pre_hooks.append((need(self.spec.embedding, "embedding"), ("embedding", 0)))
        for tap in ("stages", "stages_pre"):
            if tap in self.want:
                paths = getattr(self.spec, tap)
                if not paths:
                    need(None, tap)
                hooks += [(need(p, tap), (tap, i)) for i, p in enumerate(paths)]
        for mod, key in pre_hooks:
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook(key)))
        for mod, key in hooks:
            self._handles.append(mod.register_forward_hook(self._hook(key)))

    def _pre_hook(self, key: tuple[str, int]) -> Callable[[nn.Module, tuple], None]:
        def hook(_mod: nn.Module, args: tuple) -> None:
            if self._active and args:
                self._records[key] = torch.flatten(args[0], 1)
        return hook

    def _hook(self, key: tuple[str, int]) -> Callable[[nn.Module, tuple, Tensor], None]:
        def hook(_mod: nn.Module, _args: tuple, out: Tensor) -> None:
            if self._active:
                self._records[key] = out
        return hook

    def forward(self, x: Tensor) -> Taps:
        self._records = {}
        self._active = True
        try:
            logits = self.model(x)
        finally:
            self._active = False
            rec, self._records = self._records, {}

        def collect(tap: str) -> list[Tensor]:
            if tap not in self.want:
                return []
            paths = (self.spec.embedding,) if tap == "embedding" else getattr(self.spec, tap)
            for i, p in enumerate(paths):
                if (tap, i) not in rec:
                    raise ConfigError(
                        f"module {p!r} named in model.taps.{tap} did not run in the forward pass"
                    )
            return [rec[(tap, i)] for i in range(len(paths))]

        emb = collect("embedding")
        return Taps(logits, emb[0] if emb else None, collect("stages"), collect("stages_pre"))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> Tapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
