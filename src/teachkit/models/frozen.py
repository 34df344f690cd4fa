"""A frozen teacher: always in eval mode, no gradients, in no optimiser; fed inputs normalised its own way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data.text import tokenisation
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
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module.eval()
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
        with torch.no_grad():
            if self.in_scale is not None and isinstance(x, Tensor) and x.dim() >= 2 \
                    and x.shape[1] == self.in_scale.numel():
                shape = (1, -1) + (1,) * (x.dim() - 2)
                x = x * self.in_scale.view(shape).to(x.dtype) + self.in_shift.view(shape).to(x.dtype)
            return call_model(self.module, x)
