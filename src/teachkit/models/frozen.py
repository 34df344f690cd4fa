"""A frozen teacher: always in eval mode, no gradients, in no optimiser; fed inputs normalised its own way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data.text import tokenisation
from teachkit.models.inference import map_tensors
from teachkit.types import Inputs, call_model


def _vector(values: Sequence[float] | Tensor | None) -> Tensor | None:
    if values is None:
        return None
    return torch.as_tensor(values, dtype=torch.float32).detach().flatten().cpu()


class FrozenTeacher(nn.Module):
    """A teacher that stays in eval mode, never takes gradients and is not in any optimiser.

    Its forward runs under ``torch.no_grad`` and takes a tensor or a mapping of named inputs. After
    :meth:`renormalise`, tensor inputs normalised with the student's per-channel statistics (channel = dim 1)
    are re-expressed in the teacher's: ``x_t = (x * std_s + mean_s - mean_t) / std_t``.

    With ``inference=True`` (``teacher.inference=fold``: ``module`` comes from
    :func:`teachkit.models.inference.inference_teacher`) the forward runs under ``torch.inference_mode``, floating
    inputs are cast to the weights' dtype, and :meth:`release_inference_outputs` turns its outputs (and the taps
    ``Tapped`` recorded) into normal tensors a loss can save for backward: cloned, and back in float32 when a
    bf16/fp16 teacher is called outside autocast (beam search, evaluators), as the fp32 teacher would return them.
    """

    def __init__(self, module: nn.Module, inference: bool = False) -> None:
        super().__init__()
        self.module = module.eval()
        #: runs as an inference model (see the class docstring)
        self.inference = bool(inference)
        #: the weights' floating dtype when it is not float32 (bf16/fp16 weights), else None
        self.compute_dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
        if self.compute_dtype in (torch.float32, torch.float64):
            self.compute_dtype = None
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.register_buffer("in_scale", None, persistent=False)
        self.register_buffer("in_shift", None, persistent=False)
        super().train(False)

    def train(self, mode: bool = True) -> FrozenTeacher:  # noqa: ARG002 - always eval
        return super().train(False)

    @property
    def renormalises(self) -> bool:
        """True when inputs are re-normalised to the teacher's statistics before its forward."""
        return self.in_scale is not None

    def renormalise(self, student_mean: Sequence[float] | Tensor | None, student_std: Sequence[float] | Tensor | None,
                    teacher_mean: Sequence[float] | Tensor | None,
                    teacher_std: Sequence[float] | Tensor | None) -> bool:
        """Feed the teacher ``(x * std_s + mean_s - mean_t) / std_t`` when its statistics differ from the
        student's (beyond float noise); no change when either side's are unknown (None: an older checkpoint)
        or their channel counts differ. Returns whether inputs are re-normalised."""
        ms, ss, mt, st = (_vector(v) for v in (student_mean, student_std, teacher_mean, teacher_std))
        self.in_scale = self.in_shift = None
        if ms is None or ss is None or mt is None or st is None or not (len(ms) == len(ss) == len(mt) == len(st)):
            return False
        if torch.allclose(ms, mt, rtol=1e-5, atol=1e-6) and torch.allclose(ss, st, rtol=1e-5, atol=1e-6):
            return False
        device = next(self.module.parameters(), torch.empty(0)).device
        self.in_scale = (ss / st).to(device)
        self.in_shift = ((ms - mt) / st).to(device)
        return True

    def forward(self, x: Inputs | None = None, **named: Tensor) -> Any:
        """The teacher's output for ``x`` (a tensor or a mapping of named inputs, also accepted as keywords).
        Tokenised text carrying the teacher's own tokenisation (keys prefixed ``teacher.``) feeds it those."""
        if x is None:
            x = named
        if isinstance(x, Mapping):
            x = tokenisation(x, "teacher")
        if self.inference:
            return self.release_inference_outputs(self._infer(x))
        with torch.no_grad():
            return call_model(self.module, self._renormalised(x))

    def _renormalised(self, x: Inputs) -> Inputs:
        if self.in_scale is not None and isinstance(x, Tensor) and x.dim() >= 2 \
                and x.shape[1] == self.in_scale.numel():
            shape = (1, -1) + (1,) * (x.dim() - 2)
            x = x * self.in_scale.view(shape).to(x.dtype) + self.in_shift.view(shape).to(x.dtype)
        return x

    def _infer(self, x: Inputs) -> Any:
        """The forward under ``torch.inference_mode``, floating inputs cast to the weights' dtype."""
        with torch.inference_mode():
            x = self._renormalised(x)
            if self.compute_dtype is not None:
                x = map_tensors(x, lambda t: t.to(self.compute_dtype) if t.is_floating_point() else t)
            return call_model(self.module, x)

    def release_inference_outputs(self, outputs: Any) -> Any:
        """``outputs`` of an inference-mode forward as normal tensors (cloned; float32 outside autocast for a
        bf16/fp16 teacher); unchanged for a teacher that does not run in inference mode."""
        if not self.inference:
            return outputs
        low, device = self.compute_dtype, self.in_device()
        upcast = low is not None and not torch.is_autocast_enabled(device.type)

        def normal(t: Tensor) -> Tensor:
            if upcast and t.dtype == low:
                return t.to(torch.float32)
            return t.clone() if t.is_inference() else t

        return map_tensors(outputs, normal)

    def in_device(self) -> torch.device:
        """The device of the teacher's weights (CPU for a model without any)."""
        return next(self.module.parameters(), torch.empty(0)).device
