"""Training callbacks: hooks the engine calls around the run, each epoch and each optimiser step.

The hooks follow Hugging Face's ``TrainerCallback`` and Lightning's ``Callback``, in this order::

    on_train_start(trainer)                   once, before the first epoch this trainer runs (also after a resume)
      on_epoch_start(trainer, epoch)          before each epoch (0-based)
        on_step_end(trainer, step_info)       after each optimiser step (:class:`StepInfo`)
      on_epoch_end(trainer, record)           after the epoch's checkpoints and metrics line are written
    on_train_end(trainer, summary)            from ``Trainer.finish``, after summary.json is written

A callback stops a run with ``trainer.request_stop(reason)``: in one process the request is honoured after the
current optimiser step (the epoch ends there, is evaluated and checkpointed as usual) or, made from
``on_epoch_end``, before the next epoch; with several processes at the end of the epoch. The run then finishes
cleanly: ``summary.json`` and the ``last`` checkpoint note ``stopped`` (reason, epoch, steps of that epoch), and
resuming the run folder does not train further.

Named callbacks (``train.callbacks`` in a config) are classes registered with :func:`register_callback`, by
teachkit or by a plugin, with typed options like every other registry::

    @register_callback("print_loss", options=PrintLossOptions)
    class PrintLoss(Callback):
        def __init__(self, options: PrintLossOptions) -> None: ...

A config names them as ``train.callbacks: [print_loss, {name: print_loss, options: {every: 10}}]``; each trainer
of the run gets its own instances. The Python API passes :class:`Callback` objects instead
(``teachkit.train(..., callbacks=[...])``, through :func:`given_callbacks`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.options import Options, from_mapping, option
from teachkit.registry import Registry

if TYPE_CHECKING:
    from teachkit.engine.trainer import Trainer


@dataclass(frozen=True)
class StepInfo:
    """One optimiser step, as :meth:`Callback.on_step_end` sees it.

    ``terms`` and ``loss`` stay on the device, detached (float64): reading them (``float(info.loss)``) is the
    callback's own host sync. They are the step's means over its samples: each micro-batch chunk's value weighted
    by its share of the step's samples (with several processes: this process's rows), so that the per-step losses
    weighted by ``samples`` average to the epoch's ``train.loss`` in ``metrics.jsonl``."""

    #: the epoch (0-based) and the step within it (0-based)
    epoch: int
    step: int
    #: optimiser steps of the run so far, this one included (``epoch * steps_per_epoch + step + 1``)
    global_step: int
    steps_per_epoch: int
    #: the step's named loss terms and their sum
    terms: Mapping[str, Tensor]
    loss: Tensor
    #: samples of the step (this process's rows of the batch with several processes)
    samples: int
    #: the learning rate of the step
    lr: float


class Callback:
    """Hooks around the run, each epoch and each step; subclass and override what you need. A hook that is
    not overridden costs nothing (the engine builds :class:`StepInfo` only for callbacks overriding
    :meth:`on_step_end`)."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Once, before the first epoch this trainer runs (after a resume: the first epoch it resumes with)."""

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        """Before epoch ``epoch`` (0-based) trains."""

    def on_step_end(self, trainer: Trainer, info: StepInfo) -> None:
        """After each optimiser step (:class:`StepInfo`)."""

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After the epoch's record, checkpoints and metrics line are written."""

    def on_train_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """From ``Trainer.finish``, after ``summary.json`` is written."""


def overrides_step_end(callback: Callback) -> bool:
    """Whether ``callback`` overrides :meth:`Callback.on_step_end` (only those get a :class:`StepInfo`)."""
    return type(callback).on_step_end is not Callback.on_step_end


class EpochHooks(Callback):
    """A :class:`Callback` from plain functions: ``start(epoch)`` and ``end(record)``."""

    def __init__(self, start: Callable[[int], None] | None = None,
                 end: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.start, self.end = start, end

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        if self.start is not None:
            self.start(epoch)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.end is not None:
            self.end(record)


# ----------------------------------------------------------------------------- named callbacks

#: name -> Callback class; a class registered with options is called with its options instance, else with none
CALLBACKS: Registry[type[Callback]] = Registry("callback")


def register_callback(name: str, description: str = "", *,
                      options: type | None = None) -> Callable[[type[Callback]], type[Callback]]:
    """Decorator: ``@register_callback("early_stop", options=EarlyStopOptions)`` names a :class:`Callback` class
    for ``train.callbacks``; it is called as ``cls(options)`` (or ``cls()`` without options)."""
    return CALLBACKS.register(name, description, options=options)


@dataclass
class CallbackSpec(Options):
    """One entry of ``train.callbacks``: a registered callback's ``name`` and its ``options``."""

    name: str = ""
    options: dict[str, Any] = option(factory=dict)

    def validate(self) -> None:
        try:
            entry = CALLBACKS.entry(self.name)  # unknown: one line listing the registered ones
        except ConfigError as e:
            where = getattr(self, "_key", "")
            raise ConfigError(f"{where}: {e}" if where else str(e)) from None
        if entry.options is not None:
            from_mapping(entry.options, self.options, self.key("options"))
        elif self.options:
            raise ConfigError(f"{self.key('options')}: callback {self.name!r} takes no options")

    def build(self) -> Callback:
        """A fresh instance of the named callback with its options."""
        entry = CALLBACKS.entry(self.name)
        if entry.options is None:
            return entry.obj()
        return entry.obj(from_mapping(entry.options, self.options, self.key("options")))  # type: ignore[call-arg]


def callback_specs(value: Any, key: str = "train.callbacks") -> list[CallbackSpec]:
    """``train.callbacks`` as specs: each entry a registered name or a ``{name, options}`` mapping."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of callback names or {{name, options}} mappings, got "
                          f"{type(value).__name__}")
    specs = []
    for i, item in enumerate(value):
        if isinstance(item, CallbackSpec):
            specs.append(item)
        elif isinstance(item, str):
            specs.append(from_mapping(CallbackSpec, {"name": item}, f"{key}[{i}]"))
        elif isinstance(item, Mapping):
            specs.append(from_mapping(CallbackSpec, item, f"{key}[{i}]"))
        else:
            raise ConfigError(f"{key}[{i}]={item!r} is not allowed: expected a callback name or a mapping "
                              f"{{name, options}}")
    return specs


_GIVEN: contextvars.ContextVar[tuple[Callback, ...]] = contextvars.ContextVar("teachkit_callbacks", default=())


@contextlib.contextmanager
def with_callbacks(callbacks: Sequence[Callback]) -> Iterator[None]:
    """Within this block, every trainer a recipe builds also gets ``callbacks`` (the Python API's objects)."""
    for i, cb in enumerate(callbacks):
        if not isinstance(cb, Callback):
            raise ConfigError(f"callbacks[{i}] is a {type(cb).__name__}, not a teachkit.engine.Callback")
    token = _GIVEN.set((*_GIVEN.get(), *callbacks))
    try:
        yield
    finally:
        _GIVEN.reset(token)


def given_callbacks() -> list[Callback]:
    """The callback objects given by an enclosing :func:`with_callbacks` (none outside one)."""
    return list(_GIVEN.get())


# ----------------------------------------------------------------------------- built-in callbacks


@dataclass
class EarlyStopOptions(Options):
    """Stop when the selection metric has not improved for ``patience`` epochs."""

    #: epochs without an improvement of the validation selection metric before the run stops
    patience: int = option(5, ge=1)
    #: an improvement smaller than this does not count
    min_delta: float = option(0.0, ge=0.0)


@register_callback("early_stop", "stop when val's selection metric has not improved for `patience` epochs",
                   options=EarlyStopOptions)
class EarlyStop(Callback):
    """Early stopping on the trainer's selection metric (``train.select_metric``, its direction), checked at each
    epoch's end; its state is rebuilt from the run's history on start, so a resumed run stops where an
    uninterrupted one would."""

    def __init__(self, options: EarlyStopOptions | None = None) -> None:
        self.options = options or EarlyStopOptions()
        self.best = math.nan
        self.waited = 0

    def on_train_start(self, trainer: Trainer) -> None:
        self.best, self.waited = math.nan, 0
        for record in trainer.history:
            self._observe(trainer, record)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self._observe(trainer, record)
        if self.waited >= self.options.patience:
            trainer.request_stop(f"early_stop: val {trainer.select_metric} did not improve for {self.waited} epochs")

    def _observe(self, trainer: Trainer, record: Mapping[str, Any]) -> None:
        value = record.get("val", {}).get(trainer.select_metric, math.nan)
        if not math.isfinite(value):
            self.waited += 1
            return
        gain = (value - self.best) if trainer.maximise else (self.best - value)
        if math.isnan(self.best) or gain > self.options.min_delta:
            self.best, self.waited = value, 0
        else:
            self.waited += 1
