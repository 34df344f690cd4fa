"""Wide ResNets WRN-d-k (Zagoruyko & Komodakis 2016) in the CIFAR form of RepDistiller (Tian et al. 2020).

Stem conv3x3(16), three groups of n = (d - 4) / 6 pre-activation blocks of 16k / 32k / 64k filters (group 1
stride 1, the others stride 2), final BN-ReLU, global average pool, ``fc``. A block is BN-ReLU-conv3x3-BN-ReLU
(-dropout)-conv3x3 plus a shortcut: identity when the width is kept, else a 1x1 conv (``convShortcut``) on the
activated input. At 100 classes WRN-16-1 / 16-2 / 40-1 / 40-2 have 180,916 / 703,284 / 569,780 / 2,255,156
parameters; parameter names match RepDistiller's ``models/wrn.py`` checkpoints.

Taps. A pre-activation block ends with a plain residual sum (no activation), so a group's output only gets
its BN-ReLU as the first thing the *next* group (or the head) does. We tap that BN-ReLU:

- ``stages``     = ``block2.layer.0.relu1``, ``block3.layer.0.relu1``, ``relu``: relu(bn(group output)),
  the post-activation map of each group (16k x H, 32k x H/2, 64k x H/4);
- ``stages_pre`` = ``block2.layer.0.bn1``, ``block3.layer.0.bn1``, ``bn1``: the BN output that ReLU acts on,
  so relu(stages_pre[i]) == stages[i] exactly. These are RepDistiller's ``preact=True`` features and the
  "BN before ReLU" of Overhaul distillation (Heo et al. 2019).

The raw residual sums (RepDistiller's default WRN features, and what attention transfer uses) are the
outputs of ``block1`` / ``block2`` / ``block3``: pass ``TapSpec(stages=("block1", "block2", "block3"))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, fraction, init_weights

#: Smallest H, W a WRN takes (two stride-2 groups leave at least 2x2).
MIN_SIZE = 8


class WideBasicBlock(nn.Module):
    """Pre-activation block: BN-ReLU-conv3x3-BN-ReLU(-dropout)-conv3x3, plus the shortcut.

    When the width changes (``convShortcut`` present) the shortcut takes the *activated* input, as in
    RepDistiller / the WRN reference code; otherwise it is the raw input. ReLUs are not inplace, so
    hooks on ``bn1`` / ``bn2`` see their outputs intact.
    """

    def __init__(self, in_planes: int, out_planes: int, stride: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(out_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.equal_in_out = in_planes == out_planes and stride == 1
        self.convShortcut: nn.Conv2d | None = None  # noqa: N815  (RepDistiller's parameter name)
        if not self.equal_in_out:
            self.convShortcut = nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        act = self.relu1(self.bn1(x))
        out = self.conv2(self.dropout(self.relu2(self.bn2(self.conv1(act)))))
        return out + (x if self.convShortcut is None else self.convShortcut(act))


class NetworkBlock(nn.Module):
    """One group of ``n`` WideBasicBlocks in ``layer`` (a Sequential), as RepDistiller names it."""

    def __init__(self, n: int, in_planes: int, out_planes: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.Sequential(*[
            WideBasicBlock(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1, dropout)
            for i in range(n)
        ])

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    """WRN-``depth``-``width``: ``conv1``, ``block1..3`` (NetworkBlocks), ``bn1``, ``relu``, ``avgpool``, ``fc``."""

    def __init__(self, depth: int, width: int, in_channels: int = 3, num_classes: int = 10,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ConfigError(f"WRN depth must be 6n+4 with n >= 1; got {depth}")
        n = (depth - 4) // 6
        self.depth, self.width = depth, width
        channels = [16, 16 * width, 32 * width, 64 * width]
        self.conv1 = nn.Conv2d(in_channels, channels[0], kernel_size=3, padding=1, bias=False)
        self.block1 = NetworkBlock(n, channels[0], channels[1], 1, dropout)
        self.block2 = NetworkBlock(n, channels[1], channels[2], 2, dropout)
        self.block3 = NetworkBlock(n, channels[2], channels[3], 2, dropout)
        self.bn1 = nn.BatchNorm2d(channels[3])
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels[3], num_classes)
        self.tap_spec = TapSpec(
            embedding="fc",
            stages=("block2.layer.0.relu1", "block3.layer.0.relu1", "relu"),
            stages_pre=("block2.layer.0.bn1", "block3.layer.0.bn1", "bn1"),
            stages_bn=("block2.layer.0.bn1", "block3.layer.0.bn1", "bn1"),
        )
        init_weights(self, linear="zero_bias")

    def forward(self, x: Tensor) -> Tensor:
        x = self.block3(self.block2(self.block1(self.conv1(x))))
        x = self.relu(self.bn1(x))
        return self.fc(self.avgpool(x).flatten(1))


def _build(model: str, input_shape: Sequence[int], num_classes: int, depth: Any, width: Any,
           dropout: Any) -> WideResNet:
    dims = check_input(model, input_shape, "(C, H, W)", MIN_SIZE)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise ConfigError(f"model {model!r} option 'depth' must be 6n+4 (10, 16, 22, 28, 40, ...); got {depth!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"model {model!r} option 'width' must be a positive int (widen factor k); got {width!r}")
    return WideResNet(depth, width, dims[0], num_classes, fraction(model, "dropout", dropout))


@MODELS.register("wrn", "Wide ResNet WRN-depth-width of any depth 6n+4 (Zagoruyko & Komodakis 2016)")
def wrn(input_shape: tuple[int, ...], num_classes: int, *, depth: int, width: int = 1,
        dropout: float = 0.0) -> nn.Module:
    """WRN-``depth``-``width`` (depth 6n+4, integer widen factor), dropout between the block convs."""
    return _build("wrn", input_shape, num_classes, depth, width, dropout)


def _register(depth: int, width: int, size: str) -> None:
    name = f"wrn_{depth}_{width}"

    def builder(input_shape: tuple[int, ...], num_classes: int, dropout: float = 0.0) -> nn.Module:
        return _build(name, input_shape, num_classes, depth, width, dropout)

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = f"WRN-{depth}-{width} (Zagoruyko & Komodakis 2016); ``dropout`` between the block convs."
    MODELS.register(name, f"Wide ResNet WRN-{depth}-{width}, {size} params at 100 classes "
                          f"(Zagoruyko & Komodakis 2016)")(builder)
    globals()[name] = builder


for _depth, _width, _size in ((16, 1, "0.18M"), (16, 2, "0.70M"), (40, 1, "0.57M"), (40, 2, "2.26M"),
                              (28, 10, "36.5M"), (40, 10, "55.9M")):
    _register(_depth, _width, _size)
