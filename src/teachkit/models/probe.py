"""One forward of a two-row batch before a run starts, on the meta device (shapes only, nothing computed) or,
for a model given as a built instance, on its own device (two rows, no_grad, eval mode: no state changes).

A user model (``package.module:factory`` or a Python object) that fails on the data's shape, or whose output
width is not the task's class count, is one line naming the model before anything is written, not a traceback
in the first step or a run that trains silently and reports 0%. Operations the meta device cannot run are
not checkable this way, and the probe says nothing about them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.types import call_model, map_inputs

#: Tasks whose models output one row of ``num_classes`` values per sample (logits, or regression targets).
ROW_OUTPUT_TASKS = ("classification", "binary", "regression")


def _shape_of(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {tuple(v.shape)}" for k, v in x.items() if isinstance(v, torch.Tensor)) + "}"
    return type(x).__name__


def _meta_limit(e: BaseException) -> bool:
    """Whether ``e`` says the meta device cannot run an operation (not a fault of the model)."""
    text = str(e).lower()
    return isinstance(e, NotImplementedError) or "meta" in text or "data-dependent" in text


def probe_forward(model: nn.Module, inputs: Any, label: str) -> Any | None:
    """``model(inputs)`` (a mapping: keyword arguments) on the model's device (meta for a model built there)
    under no_grad, in eval mode.

    Returns the output, or None when the meta device cannot run the model; a model that fails on the inputs'
    shape is a :class:`ConfigError` naming it, the inputs' shape and the exception's first line."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(iter(model.parameters()), torch.empty(0, device="meta")).device
            return call_model(model, map_inputs(inputs, lambda t: t.to(device)))
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - user code: any failure is one line (--debug shows the traceback)
        if _meta_limit(e):
            return None
        message = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ConfigError(f"model {label!r} fails on a batch of the data (inputs {_shape_of(inputs)}): "
                          f"{type(e).__name__}: {message}") from None
    finally:
        model.train(was_training)


def check_output(output: Any, rows: int, num_classes: int, label: str, dataset: str) -> None:
    """A :class:`ConfigError` unless ``output`` is one tensor ``(rows, num_classes)`` (``(rows,)`` for one
    regression target): training on labels and evaluation read the output as the logits; a model with 13 outputs
    for 10 classes would train on the wrong classes and report nonsense."""
    expected = f"({rows}, {num_classes})"
    if not isinstance(output, torch.Tensor):
        raise ConfigError(f"model {label!r} returns a {type(output).__name__}, but dataset {dataset!r} needs its "
                          f"outputs as one tensor of shape {expected} (samples, classes): return the logits")
    shape = tuple(output.shape)
    if shape == (rows, num_classes) or (num_classes == 1 and shape == (rows,)):
        return
    if len(shape) == 2 and shape[0] == rows:
        raise ConfigError(f"model {label!r} outputs {shape[1]} values per sample but dataset {dataset!r} has "
                          f"{num_classes} {'targets' if num_classes == 1 else 'classes'}: its last layer must have "
                          f"num_classes outputs (a factory receives num_classes when its signature names it)")
    raise ConfigError(f"model {label!r} outputs shape {shape} for a batch of {rows} samples, but dataset {dataset!r} "
                      f"needs {expected} (samples, classes): flatten or pool before the last layer")


def check_model_on_data(model: nn.Module, inputs: Any, rows: int, num_classes: int, task: str, label: str,
                        dataset: str, rebuild: Callable[[], nn.Module] | None = None) -> None:
    """:func:`probe_forward` on ``inputs`` (``rows`` rows), then the output for row-output tasks. When the meta
    device cannot run ``model``, ``rebuild()`` gives a real one (built with the CPU random state restored
    afterwards, so the run's initialisation is unchanged) and the probe runs on it."""
    output = probe_forward(model, inputs, label)
    if output is None and rebuild is not None:
        with torch.random.fork_rng(devices=[]):
            output = probe_forward(rebuild(), inputs, label)
    if output is not None and task in ROW_OUTPUT_TASKS:
        check_output(output, rows, num_classes, label, dataset)
