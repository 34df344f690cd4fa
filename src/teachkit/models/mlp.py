"""Multi-layer perceptron; the default 784-500-10 is the MNIST student/teacher of the L2T-DLF seed
(Wu et al. 2018), in the tradition of LeCun et al. 1998's MNIST MLPs."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from torch import Tensor, nn

from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, fraction, input_shape_of, positive_int


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU (-> Dropout)] per hidden width -> Linear.

    Module paths: ``fc1``, ``relu1``, ``drop1``, ..., ``out``. Each ReLU is its own non-inplace module
    so hooks on the Linear (pre-activation) see their tensor unchanged.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (500,),
                 dropout: float = 0.0) -> None:
        super().__init__()
        layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
        width = in_features
        for i, h in enumerate(hidden, start=1):
            layers[f"fc{i}"] = nn.Linear(width, h)
            layers[f"relu{i}"] = nn.ReLU()
            if dropout > 0:
                layers[f"drop{i}"] = nn.Dropout(dropout)
            width = h
        self.body = nn.Sequential(layers)
        self.out = nn.Linear(width, num_classes)
        n = len(hidden)
        self.tap_spec = TapSpec(
            embedding="out",
            stages=tuple(f"body.relu{i}" for i in range(1, n + 1)),
            stages_pre=tuple(f"body.fc{i}" for i in range(1, n + 1)),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.body(x))


@MODELS.register("mlp", "MLP on flattened input; default 784-500-10 (L2T-DLF seed MNIST MLP)")
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (500,),
        dropout: float = 0.0) -> nn.Module:
    """MLP with ReLU hidden layers ``hidden`` (any input shape is flattened)."""
    dims = input_shape_of(input_shape, "mlp")
    if isinstance(hidden, int) or not isinstance(hidden, (list, tuple)):
        hidden = [hidden]  # type: ignore[list-item]
    widths = [positive_int("mlp", "hidden", h) for h in hidden]
    return MLP(math.prod(dims), num_classes, widths, fraction("mlp", "dropout", dropout))
