"""A frozen teacher: always in eval mode, no gradients, in no optimiser."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from teachkit.types import Inputs, call_model


class FrozenTeacher(nn.Module):
    """A teacher that stays in eval mode, never takes gradients and is not in any optimiser.

    Its forward runs under ``torch.no_grad`` and takes a tensor or a mapping of named inputs.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> FrozenTeacher:  # noqa: ARG002 - always eval
        return super().train(False)

    def forward(self, x: Inputs) -> Any:
        with torch.no_grad():
            return call_model(self.module, x)
