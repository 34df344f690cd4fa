"""DenseNet-BC for CIFAR (Huang et al. 2017): bottleneck layers and compression 0.5.

``conv1`` (3x3, 2k filters), three dense blocks ``block1..3`` of n = (L - 4) / 6 bottleneck layers each
(BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k), output concatenated to the input), transitions ``trans1``,
``trans2`` (BN-ReLU-conv1x1 to half the channels-2x2 average pool), final ``bn``-``relu``, global average pool,
``fc``. DenseNet-BC-100-12 has 769,162 parameters at 10 classes (the paper's 0.8M), DenseNet-BC-190-40
(a CIFAR-10 student of L2T-DLF, Wu et al. 2018) 25,624,430 (the DenseNet paper's 25.6M).

Taps. Like a pre-activation ResNet, a dense block ends without an activation: its output gets BN-ReLU as the
first step of the next transition (or of the head). stages = ``trans1.relu``, ``trans2.relu``, ``relu``: the
post-activation map of each dense block (before the transition's 1x1 conv and pooling); stages_pre =
``trans1.bn``, ``trans2.bn``, ``bn``: the BN output that ReLU acts on, so relu(stages_pre[i]) == stages[i].
The raw concatenations are the outputs of ``block1..3``. embedding = ``fc``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, init_weights

#: Smallest H, W a CIFAR DenseNet takes (two 2x2 average pools leave at least 2x2).
MIN_SIZE = 8


class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k); returns the input with the k new maps concatenated."""

    def __init__(self, in_channels: int, growth: int) -> None:
        super().__init__()
        inner = 4 * growth
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_channels, inner, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(inner, growth, kernel_size=3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv2(self.relu2(self.bn2(self.conv1(self.relu1(self.bn1(x))))))
        return torch.cat([x, out], 1)


class Transition(nn.Module):
    """BN-ReLU-conv1x1-avgpool2x2 (``bn``, ``relu``, ``conv``, ``pool``)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_channels)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.conv(self.relu(self.bn(x))))


class DenseNetBC(nn.Module):
    """``conv1``, ``block1``, ``trans1``, ``block2``, ``trans2``, ``block3``, ``bn``, ``relu``, ``avgpool``, ``fc``."""

    def __init__(self, depth: int = 100, growth: int = 12, in_channels: int = 3, num_classes: int = 10,
                 compression: float = 0.5) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ConfigError(f"DenseNet-BC depth must be 6n+4 with n >= 1; got {depth}")
        n = (depth - 4) // 6
        self.depth, self.growth = depth, growth
        channels = 2 * growth
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1, bias=False)
        self.block_channels: list[int] = []
        for k in (1, 2, 3):
            setattr(self, f"block{k}", nn.Sequential(*[DenseLayer(channels + i * growth, growth) for i in range(n)]))
            channels += n * growth
            self.block_channels.append(channels)
            if k < 3:
                out = int(math.floor(channels * compression))
                setattr(self, f"trans{k}", Transition(channels, out))
                channels = out
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        self.tap_spec = TapSpec(embedding="fc", stages=("trans1.relu", "trans2.relu", "relu"),
                                stages_pre=("trans1.bn", "trans2.bn", "bn"), stages_bn=("trans1.bn", "trans2.bn", "bn"))
        init_weights(self, linear="zero_bias")

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        x = self.trans1(self.block1(x))
        x = self.trans2(self.block2(x))
        x = self.relu(self.bn(self.block3(x)))
        return self.fc(self.avgpool(x).flatten(1))


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@MODELS.register("densenet_bc", "CIFAR DenseNet-BC-L-k, default L=100 k=12: 0.77M params at 10 classes "
                                "(Huang et al. 2017)")
def densenet_bc(input_shape: tuple[int, ...], num_classes: int, depth: int = 100, growth: int = 12) -> nn.Module:
    """DenseNet-BC with depth L = 6n+4 (``depth``) and growth rate k (``growth``); L=190, k=40 is the
    CIFAR-10 student of L2T-DLF (Wu et al. 2018)."""
    dims = check_input("densenet_bc", input_shape, "(C, H, W)", MIN_SIZE)
    if not _positive(depth) or depth < 10 or (depth - 4) % 6:
        raise ConfigError(f"model 'densenet_bc' option 'depth' must be 6n+4 (10, 16, ..., 100, ..., 190); "
                          f"got {depth!r}")
    if not _positive(growth):
        raise ConfigError(f"model 'densenet_bc' option 'growth' must be a positive int; got {growth!r}")
    return DenseNetBC(depth, growth, dims[0], num_classes)
