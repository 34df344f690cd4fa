"""CIFAR ResNets: depth 6n+2 with BasicBlocks (He et al. 2016, Sec. 4.2) and the wide
``resnet8x4`` / ``resnet32x4`` of RepDistiller (Tian et al. 2020, CRD).

- ``resnet8 ... resnet110``: 3x3 conv 16 stem, stages of 16/32/64 filters, parameter-free option-A
  shortcuts (stride-2 subsample + zero-padded channels): at 10 classes ResNet-8/20/32/56/110 have
  75,290 / 269,722 / 464,154 / 853,018 / 1,727,962 parameters. ``shortcut='B'`` (1x1 conv + BN, as in
  RepDistiller's resnet8..110) adds 2,752: e.g. 78,042 / 855,770 / 1,730,714 for ResNet-8/56/110.
- ``resnet8x4`` / ``resnet32x4``: stem 32, stages 64/128/256, option-B shortcuts (1x1 conv + BN) where
  the shape changes; parameter names match RepDistiller's ``models/resnet.py`` checkpoints.

All adapt to input channels, any H, W >= 8 (adaptive average pooling) and any class count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, init_weights

#: Smallest H, W a CIFAR ResNet takes (two stride-2 stages leave at least 2x2).
MIN_SIZE = 8


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class PadShortcut(nn.Module):
    """Option-A shortcut (He et al. 2016): subsample by ``stride`` and zero-pad channels; no parameters."""

    def __init__(self, in_planes: int, out_planes: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = out_planes - in_planes
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, *self.pad))

    def extra_repr(self) -> str:
        return f"stride={self.stride}, pad={self.pad}"


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus shortcut, then ``preact`` (Identity) and ``act`` (ReLU).

    Hook ``preact`` for the pre-activation sum; ``act`` is not inplace so that tensor stays intact.
    """

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, shortcut: str = "A") -> None:
        super().__init__()
        self.conv1 = conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            if shortcut == "A":
                self.downsample = PadShortcut(in_planes, planes, stride)
            else:
                self.downsample = nn.Sequential(
                    nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes),
                )
        self.preact = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(self.preact(out + shortcut))


class CifarResNet(nn.Module):
    """conv1-bn1-relu, ``layer1..layerK`` of n BasicBlocks each, global average pool, ``fc``.

    ``filters[0]`` is the stem width, ``filters[1:]`` the stage widths (stage 1 stride 1, the rest
    stride 2); ``depth = 6n + 2`` for three stages. Taps: stages = ``layerK`` outputs, stages_pre =
    ``layerK.{n-1}.preact``, embedding = the pooled feature entering ``fc``.
    """

    def __init__(self, depth: int, filters: Sequence[int], in_channels: int = 3, num_classes: int = 10,
                 shortcut: str = "A") -> None:
        super().__init__()
        stages = len(filters) - 1
        per = 2 * stages
        if stages < 1 or depth < per + 2 or (depth - 2) % per:
            raise ConfigError(f"CIFAR ResNet depth must be {per}n+2 with n >= 1; got {depth}")
        if shortcut not in ("A", "B"):
            raise ConfigError(f"CIFAR ResNet shortcut must be 'A' or 'B'; got {shortcut!r}")
        n = (depth - 2) // per
        self.depth = depth
        self.conv1 = nn.Conv2d(in_channels, filters[0], kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(filters[0])
        self.relu = nn.ReLU()
        in_planes = filters[0]
        names = []
        for i, planes in enumerate(filters[1:], start=1):
            blocks = [BasicBlock(in_planes, planes, 1 if i == 1 else 2, shortcut)]
            blocks += [BasicBlock(planes, planes, 1, shortcut) for _ in range(n - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*blocks))
            names.append(f"layer{i}")
            in_planes = planes
        self.stage_names = tuple(names)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        self.tap_spec = TapSpec(embedding="fc", stages=self.stage_names,
                                stages_pre=tuple(f"{s}.{n - 1}.preact" for s in self.stage_names),
                                stages_bn=tuple(f"{s}.{n - 1}.bn2" for s in self.stage_names))
        init_weights(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return self.fc(self.avgpool(x).flatten(1))


def _width(filters: Sequence[int], width: float) -> list[int]:
    if isinstance(width, bool) or not isinstance(width, (int, float)) or width <= 0:
        raise ConfigError(f"CIFAR ResNet option 'width' must be a positive number; got {width!r}")
    return [max(1, round(f * width)) for f in filters]


def _build(model: str, input_shape: Sequence[int], num_classes: int, depth: int, filters: Sequence[int],
           width: float, shortcut: str) -> CifarResNet:
    dims = check_input(model, input_shape, "(C, H, W)", MIN_SIZE)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ConfigError(f"model {model!r} option 'depth' must be 6n+2 (8, 14, 20, ...); got {depth!r}")
    if shortcut not in ("A", "B"):
        raise ConfigError(f"model {model!r} option 'shortcut' must be 'A' or 'B'; got {shortcut!r}")
    return CifarResNet(depth, _width(filters, width), dims[0], num_classes, shortcut)


@MODELS.register("resnet_cifar", "CIFAR ResNet of any depth 6n+2, 16/32/64 filters (He et al. 2016)")
def resnet_cifar(input_shape: tuple[int, ...], num_classes: int, *, depth: int, width: float = 1.0,
                 shortcut: str = "A") -> nn.Module:
    """CIFAR ResNet-``depth`` (6n+2) of He et al. 2016; ``width`` multiplies the 16/32/64 filters and
    ``shortcut`` is 'A' (parameter-free, the paper's CIFAR choice) or 'B' (1x1 conv + BN)."""
    return _build("resnet_cifar", input_shape, num_classes, depth, (16, 16, 32, 64), width, shortcut)


def _register_depth(depth: int, size: str) -> None:
    name = f"resnet{depth}"

    def builder(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0,
                shortcut: str = "A") -> nn.Module:
        return _build(name, input_shape, num_classes, depth, (16, 16, 32, 64), width, shortcut)

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = (f"CIFAR ResNet-{depth} (He et al. 2016); ``width`` scales the filters, "
                       f"``shortcut='B'`` gives RepDistiller's 1x1-conv shortcuts (Tian et al. 2020).")
    MODELS.register(name, f"CIFAR ResNet-{depth}, {size} params at 10 classes (He et al. 2016)")(builder)
    globals()[name] = builder


for _depth, _size in ((8, "0.08M"), (14, "0.17M"), (20, "0.27M"), (32, "0.46M"), (44, "0.66M"),
                      (56, "0.85M"), (110, "1.73M")):
    _register_depth(_depth, _size)


@MODELS.register("resnet8x4", "RepDistiller ResNet8x4: stem 32, stages 64/128/256 (Tian et al. 2020)")
def resnet8x4(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> nn.Module:
    """RepDistiller's ``ResNet(8, [32, 64, 128, 256])``: option-B shortcuts (Tian et al. 2020)."""
    return _build("resnet8x4", input_shape, num_classes, 8, (32, 64, 128, 256), width, "B")


@MODELS.register("resnet32x4", "RepDistiller ResNet32x4: stem 32, stages 64/128/256 (Tian et al. 2020)")
def resnet32x4(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> nn.Module:
    """RepDistiller's ``ResNet(32, [32, 64, 128, 256])``: option-B shortcuts (Tian et al. 2020)."""
    return _build("resnet32x4", input_shape, num_classes, 32, (32, 64, 128, 256), width, "B")
