"""One forward of a two-row batch before a run starts, on the meta device (shapes only, nothing computed) or,
for a model given as a built instance, on its own device (two rows, no_grad, eval mode: no state changes).

A user model (``package.module:factory`` or a Python object) that fails on the data's shape, or whose output
width is not the task's class count, is one line naming the model before anything is written, not a traceback
in the first step or a run that trains silently and reports 0%. Operations the meta device cannot run are
not checkable this way, and the probe says nothing about them.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def check_output_width(output: Any, rows: int, num_classes: int, label: str, dataset: str) -> None:
    """A :class:`ConfigError` when ``output`` (logits, or a mapping with ``logits``) is ``(rows, k)`` with
    ``k != num_classes``: the model would train on the wrong number of classes and report nonsense."""
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", output)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != rows:
        return
    width = int(logits.shape[1])
    if width != num_classes:
        raise ConfigError(f"model {label!r} outputs {width} values per sample but dataset {dataset!r} has "
                          f"{num_classes} {'targets' if num_classes == 1 else 'classes'}: its last layer must have "
                          f"num_classes outputs (a factory receives num_classes when its signature names it)")


def check_model_on_data(model: nn.Module, inputs: Any, rows: int, num_classes: int, task: str, label: str,
                        dataset: str) -> None:
    """:func:`probe_forward` on ``inputs`` (``rows`` rows), then the output width for row-output tasks."""
    output = probe_forward(model, inputs, label)
    if output is not None and task in ROW_OUTPUT_TASKS:
        check_output_width(output, rows, num_classes, label, dataset)
