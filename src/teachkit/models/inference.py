"""A frozen teacher as an inference model: BatchNorm folded into the convolution before it, weights cast once.

In eval mode a BatchNorm is a per-channel affine map with constant statistics, so when it reads a convolution's
(or a linear layer's) output and nothing else reads that output, it folds into that layer (Ioffe & Szegedy 2015,
Sec. 3.1; the usual inference-time fusion): with ``s = gamma / sqrt(var + eps)``,

    w' = w * s (per output channel),    b' = (b - mean) * s + beta.

Pairs are found by running the model once on an example input with forward hooks and autograd enabled (no
``torch.fx``): a BatchNorm is folded only when its input *is* the layer's output (the same autograd node, not
modified in place since), that node has no other consumer in the autograd graph of the outputs, both modules run
exactly once, neither carries another forward hook, and no tap reads the layer's output or the BatchNorm's input.
The BatchNorm is replaced by ``nn.Identity()`` at the same module path, so a tap on it still resolves and sees the
same tensor. DenseNet's pre-activation BatchNorms (after a concatenation) and a ResNet stem whose output is also
the shortcut are left alone by the same rule.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.models.taps import spec_of

__all__ = ["fold_batchnorm", "inference_teacher", "map_tensors"]

#: layer types a BatchNorm of the given type folds into
_FOLDS_INTO: dict[type[nn.Module], tuple[type[nn.Module], ...]] = {
    nn.BatchNorm2d: (nn.Conv2d,),
    nn.BatchNorm1d: (nn.Conv1d, nn.Linear),
}


def map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it (tensors, lists, tuples, named tuples, mappings)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):  # also a Hugging Face ModelOutput (an OrderedDict): copied, then its items replaced
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = map_tensors(v, fn)
        return out
    if isinstance(obj, Mapping):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)


def _call(model: nn.Module, example: Any) -> Any:
    return model(**example) if isinstance(example, Mapping) else model(example)


def _tapped_paths(model: nn.Module) -> tuple[set[str], set[str]]:
    """(paths whose output a tap reads, paths whose input a tap reads) in ``model.tap_spec``."""
    spec = spec_of(model)
    outputs = {*spec.stages, *spec.stages_pre, *([spec.embedding] if spec.embedding else [])}
    inputs = {path for path, where in spec.extra.values() if where == "input"}
    outputs |= {path for path, where in spec.extra.values() if where == "output"}
    return outputs, inputs


def _consumers(outputs: Any) -> dict[Any, int]:
    """How many times each autograd node is an input of another node (or an output) in the graph of ``outputs``."""
    refs: dict[Any, int] = {}
    stack = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    for node in stack:
        refs[node] = refs.get(node, 0) + 1
    seen = set(stack)
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is None:
                continue
            refs[nxt] = refs.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return refs


def _trace(model: nn.Module, example: Any, layers: dict[str, nn.Module],
           bns: dict[str, nn.Module]) -> tuple[dict[str, list], dict[str, list], dict[Any, int]]:
    """One forward with autograd on: each layer's outputs and each BatchNorm's inputs as (node, version, tensor),
    and the consumer counts of the outputs' graph."""
    produced: dict[str, list] = {p: [] for p in layers}
    read: dict[str, list] = {p: [] for p in bns}

    def record(into: list, t: Any) -> None:
        into.append((t.grad_fn, t._version, t) if isinstance(t, Tensor) else (None, -1, None))

    handles = [m.register_forward_hook(lambda _m, _a, out, p=p: record(produced[p], out)) for p, m in layers.items()]
    handles += [m.register_forward_pre_hook(lambda _m, args, p=p: record(read[p], args[0] if args else None))
                for p, m in bns.items()]
    params = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in params:
            p.requires_grad_(True)  # every layer output gets an autograd node, whatever the input's dtype
        with torch.enable_grad():
            outputs = _call(model, example)
        refs = _consumers(outputs)
    finally:
        for h in handles:
            h.remove()
        for p, flag in params:
            p.requires_grad_(flag)
    return produced, read, refs


def _foldable_pairs(model: nn.Module, example: Any, keep: Iterable[str]) -> list[tuple[str, str]]:
    """(layer path, BatchNorm path) pairs that fold exactly (module docstring)."""
    modules = dict(model.named_modules())
    tapped_out, tapped_in = _tapped_paths(model)
    kept = set(keep)
    layers = {p: m for p, m in modules.items() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear))
              and p not in tapped_out and not m._forward_hooks}
    bns = {p: m for p, m in modules.items() if type(m) in _FOLDS_INTO and not m.training
           and m.running_mean is not None and m.running_var is not None
           and p not in tapped_in and p not in kept and not m._forward_pre_hooks}
    if not layers or not bns:
        return []
    produced, read, refs = _trace(model, example, layers, bns)
    by_node = {calls[0][0]: p for p, calls in produced.items() if len(calls) == 1 and calls[0][0] is not None}
    pairs = []
    for bn_path, calls in read.items():
        if len(calls) != 1 or calls[0][0] not in by_node:
            continue
        node, version, seen = calls[0]
        layer_path = by_node[node]
        _, made_version, out = produced[layer_path][0]
        layer, bn = modules[layer_path], modules[bn_path]
        if seen is not out or version != made_version or refs.get(node, 0) != 1:
            continue  # modified in place, or read by something else too
        if not isinstance(layer, _FOLDS_INTO[type(bn)]) or out.dim() < 2 or out.shape[1] != bn.num_features:
            continue
        if isinstance(layer, nn.Linear) and out.dim() != 2:
            continue  # BatchNorm1d on (N, L, C) normalises L, not the linear layer's features
        pairs.append((layer_path, bn_path))
    return pairs


@torch.no_grad()
def _fold_into(layer: nn.Module, bn: nn.Module) -> None:
    """``layer``'s weight and bias absorb the eval-mode ``bn`` after it (computed in float64)."""
    weight = layer.weight
    mean, var = bn.running_mean.double(), bn.running_var.double()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + bn.eps)
    bias = layer.bias.double() if layer.bias is not None else torch.zeros_like(mean)
    shape = (-1,) + (1,) * (weight.dim() - 1)
    weight.copy_((weight.double() * scale.view(shape)).to(weight.dtype))
    new_bias = ((bias - mean) * scale + beta).to(weight.dtype)
    if layer.bias is not None:
        layer.bias.copy_(new_bias)
    else:
        layer.bias = nn.Parameter(new_bias, requires_grad=weight.requires_grad)


def _replace(model: nn.Module, target: nn.Module, new: nn.Module) -> None:
    """Put ``new`` at every module path that holds ``target``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if child is target:
                setattr(module, name, new)


def fold_batchnorm(model: nn.Module, example: Any, *, keep: Iterable[str] = ()) -> int:
    """Fold, in place, every eval-mode BatchNorm that reads only a convolution's (or linear layer's) output into
    that layer, and put ``nn.Identity()`` at its path (module docstring). ``example``: an input the model takes
    (a tensor or a mapping of named inputs; two rows are enough); ``keep``: BatchNorm paths never folded (a loss
    reads their parameters). Returns the number of BatchNorms folded."""
    pairs = _foldable_pairs(model, example, keep)
    modules = dict(model.named_modules())
    for layer_path, bn_path in pairs:
        _fold_into(modules[layer_path], modules[bn_path])
        _replace(model, modules[bn_path], nn.Identity())
    return len(pairs)


def _agree(reference: Any, folded: Any) -> bool:
    """Whether two outputs match to float tolerance (1e-3 of each tensor's largest magnitude)."""
    ref, got = list(_tensors(reference)), list(_tensors(folded))
    if len(ref) != len(got):
        return False
    for a, b in zip(ref, got, strict=True):
        if a.shape != b.shape:
            return False
        if a.is_floating_point():
            scale = float(a.detach().abs().max()) if a.numel() else 0.0
            if not torch.allclose(a.detach().double(), b.detach().double(), rtol=1e-3, atol=1e-3 * max(scale, 1e-6)):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def inference_teacher(model: nn.Module, example: Any = None, *, dtype: torch.dtype | None = None,
                      channels_last: bool = False, fold_bn: bool = True, keep: Iterable[str] = ()) -> nn.Module:
    """A deep copy of ``model`` in eval mode for inference: BatchNorms folded (:func:`fold_batchnorm`, on
    ``example``; skipped without one), floating weights and buffers cast to ``dtype`` (None: unchanged) and 4-D
    weights in channels_last layout, once. The folded copy is checked against ``model`` on ``example``; should
    they disagree (a consumer the trace cannot see), the copy is returned unfolded, with a warning. The number
    folded is ``copy.bn_folded``."""
    out = copy.deepcopy(model).eval()
    out.bn_folded = 0
    if fold_bn and example is not None:
        folded = fold_batchnorm(out, example, keep=keep)
        if folded:
            modes = [(m, m.training) for m in model.modules()]
            try:
                with torch.no_grad():
                    agree = _agree(_call(model.eval(), example), _call(out, example))
            finally:
                for m, mode in modes:
                    m.training = mode
            if agree:
                out.bn_folded = folded
            else:
                warnings.warn(f"{type(model).__name__}: folding {folded} BatchNorms changed the outputs; the teacher "
                              "runs unfolded", RuntimeWarning, stacklevel=2)
                out = copy.deepcopy(model).eval()
                out.bn_folded = 0
    if dtype is not None:
        out.to(dtype)
    if channels_last:
        out.to(memory_format=torch.channels_last)
    return out
