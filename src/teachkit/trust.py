"""Which code teachkit may import: the Hugging Face ``trust_remote_code`` convention.

A model factory (``model.name: "package.module:callable"``) or a plugin module that the user names in this
command (a CLI argument, ``--plugin``, ``TEACHKIT_PLUGINS``, the config file they pass, a Python API argument)
is theirs to run. One that is *read from disk* -- a run folder's ``config.yaml``, a checkpoint's metadata, a
teacher or trajectory checkpoint -- is data, not a choice the user made: it is imported only when the user
says so with ``--trust-code`` (CLI), ``trust_code=True`` (Python API) or ``TEACHKIT_TRUST_CODE=1``, or when
the same name was given in this command. Otherwise the command stops with one line naming the code, where it
was read and the flag.

Readers of disk wrap their work in :func:`reading_from`; :func:`check_import` is called by the two places
that import code named by a string (``teachkit.models.zoo.import_factory`` and
``teachkit.registry.import_plugins``). A factory must also resolve to a callable outside the Python standard
library and builtins (:func:`refuse_standard_library`): ``os:system`` is never a model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from teachkit.errors import ConfigError

TRUST_ENV = "TEACHKIT_TRUST_CODE"

_trusted: ContextVar[bool] = ContextVar("teachkit_trust_code", default=False)
_source: ContextVar[str | None] = ContextVar("teachkit_code_source", default=None)
#: code the user named in this process (factories as "module:callable", plugins as "module")
_named: set[str] = set()


class TrustError(ConfigError):
    """Code named by a file read from disk, refused without ``--trust-code``."""


def trusted() -> bool:
    """Whether code read from disk may be imported now (``trusting(True)`` or ``TEACHKIT_TRUST_CODE=1``)."""
    return _trusted.get() or os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


@contextmanager
def trusting(flag: bool = True) -> Iterator[None]:
    """Within the block, code read from disk is imported when ``flag`` (the user's ``--trust-code``)."""
    token = _trusted.set(bool(flag) or _trusted.get())
    try:
        yield
    finally:
        _trusted.reset(token)


@contextmanager
def reading_from(source: str) -> Iterator[None]:
    """Within the block, names of code come from ``source`` (e.g. ``"checkpoint 'runs/a/checkpoints/last
    .safetensors'"``), a file on disk: :func:`check_import` refuses them unless trusted or named by the user."""
    token = _source.set(source)
    try:
        yield
    finally:
        _source.reset(token)


def grant(name: str) -> None:
    """Record ``name`` (``"module:callable"`` or a plugin module) as named by the user in this process."""
    _named.add(name)


def check_import(name: str, kind: str) -> None:
    """Allow importing ``name`` (a ``kind``: ``"model factory"`` or ``"plugin"``), or raise :class:`TrustError`.

    Outside :func:`reading_from` the name is the user's and is remembered (:func:`grant`), so a run folder this
    command writes can be read back by it. Inside, it must have been named by the user or trusted."""
    source = _source.get()
    if source is None:
        grant(name)
        return
    if name in _named or trusted():
        return
    raise TrustError(f"{source} names {kind} {name!r}: code read from a run folder or checkpoint is imported only "
                     f"when you say so; pass --trust-code (Python: trust_code=True) if you trust its author, or "
                     f"name it yourself in this command")


def _top_module(name: Any) -> str:
    return str(name or "").partition(".")[0]


def is_standard_library(module: str) -> bool:
    """Whether ``module`` (dotted) belongs to the Python standard library or builtins."""
    top = _top_module(module)
    return top in sys.stdlib_module_names or top in ("builtins", "__main__", "__builtins__")


def refuse_standard_library(path: str, obj: Any) -> None:
    """A :class:`ConfigError` when factory ``path`` lives in the standard library or builtins, or resolves to
    an object defined there (a plugin re-exporting ``os.system``): those are never models."""
    module = path.partition(":")[0]
    defined = getattr(obj, "__module__", None)
    where = module if is_standard_library(module) else defined if defined and is_standard_library(defined) else None
    if where is not None:
        raise ConfigError(f"model.name {path!r} resolves to {where!r}, part of the Python standard library: a model "
                          f"factory must be your own callable returning an nn.Module (e.g. mylab.nets:Net)")
    if _top_module(module) == "teachkit" and not module.startswith("teachkit.models"):
        raise ConfigError(f"model.name {path!r} is part of teachkit, not a model factory: name a zoo model "
                          f"(teachkit list models) or your own callable returning an nn.Module")
    if (defined, getattr(obj, "__qualname__", None)) in LOADERS_THAT_RUN_CODE:
        raise ConfigError(f"model.name {path!r} is a loader of pickled or scripted objects, which can run any code: "
                          f"a model factory must build the model (load weights with teacher.checkpoint or your own "
                          f"factory reading safetensors)")


#: Third-party loaders that unpickle or download and run code: never a model factory, even when named.
LOADERS_THAT_RUN_CODE = frozenset({
    ("torch.serialization", "load"), ("torch.jit._serialization", "load"), ("torch.hub", "load"),
    ("torch.hub", "load_state_dict_from_url"), ("numpy", "load"), ("pandas", "read_pickle"),
    ("joblib.numpy_pickle", "load"), ("dill", "load"), ("dill", "loads"), ("cloudpickle", "load"),
    ("cloudpickle", "loads"),
})
