"""CIFAR ShuffleNetV1 (Zhang et al. 2018) and ShuffleNetV2 (Ma et al. 2018) in the form of RepDistiller
(Tian et al. 2020): a 1x1 conv stem of 24 channels (no stride, no max-pool), three stages that each halve
H and W, global average pool, ``linear``. Parameter names match RepDistiller's checkpoints; initialisation is
PyTorch's default, as there.

- ``shufflenetv1``: groups 3, stage widths 240 / 480 / 960 with 4 / 8 / 4 bottlenecks (grouped 1x1 convs,
  channel shuffle, 3x3 depthwise; a stage's first block concatenates a 3x3 stride-2 average-pooled shortcut);
  949,258 parameters at 100 classes, 862,768 at 10.
- ``shufflenetv2``: the 1x net, stage widths 116 / 232 / 464 with a down-sampling block plus 3 / 7 / 3 basic
  blocks (channel split, shuffle), then ``conv2`` 1x1 to 1024 + BN + ReLU; 1,355,528 parameters at 100 classes,
  1,263,278 at 10.

Taps: stages = ``layer1..layer3`` (post-ReLU stage outputs), stages_pre = ``layerK.{last}.preact`` (the last
block's map right before its final ReLU), embedding = ``linear``; relu(stages_pre[i]) == stages[i] for both.
For ShuffleNetV2 ``preact`` is taken *after* the block's channel shuffle (RepDistiller's pre-activation
feature is the unshuffled concatenation, a channel permutation of ours). A V2 basic block applies its final
ReLU to the whole shuffled map, i.e. also to the passed-through half: that half is already non-negative
inside the network (every stage input is a ReLU output), so the outputs equal RepDistiller's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input

#: Smallest H, W a CIFAR ShuffleNet takes (three stride-2 stages leave at least 2x2).
MIN_SIZE = 16
STEM = 24


class ShuffleBlock(nn.Module):
    """Channel shuffle: (N, g*c, H, W) -> view (N, g, c, H, W) -> transpose g and c -> (N, c*g, H, W)."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        g = self.groups
        return x.view(n, g, c // g, h, w).transpose(1, 2).reshape(n, c, h, w)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


class ShuffleV1Block(nn.Module):
    """Grouped 1x1-BN-ReLU, shuffle, 3x3 depthwise (stride)-BN-ReLU, grouped 1x1-BN; plus the shortcut
    (identity, or a 3x3 stride-2 average pool concatenated when ``stride == 2``); ``preact``; ReLU ``act``."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, groups: int, first: bool = False) -> None:
        super().__init__()
        self.stride = stride
        mid = out_planes // 4
        g = 1 if first else groups  # the network's first 1x1 conv is not grouped (24 input channels)
        self.conv1 = nn.Conv2d(in_planes, mid, kernel_size=1, groups=g, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.relu1 = nn.ReLU()
        self.shuffle1 = ShuffleBlock(g)
        self.conv2 = nn.Conv2d(mid, mid, kernel_size=3, stride=stride, padding=1, groups=mid, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(mid, out_planes, kernel_size=1, groups=groups, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = nn.Sequential(nn.AvgPool2d(3, stride=2, padding=1)) if stride == 2 else nn.Sequential()
        self.preact = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.shuffle1(self.relu1(self.bn1(self.conv1(x))))
        out = self.bn3(self.conv3(self.relu2(self.bn2(self.conv2(out)))))
        res = self.shortcut(x)
        out = torch.cat([out, res], 1) if self.stride == 2 else out + res
        return self.act(self.preact(out))


class ShuffleNetV1(nn.Module):
    """``conv1``-``bn1``-``relu``, ``layer1..3``, ``avgpool``, ``linear``."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, out_planes: tuple[int, ...] = (240, 480, 960),
                 num_blocks: tuple[int, ...] = (4, 8, 4), groups: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, STEM, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(STEM)
        self.relu = nn.ReLU()
        in_planes = STEM
        for k, (planes, n) in enumerate(zip(out_planes, num_blocks, strict=True), start=1):
            blocks = []
            for i in range(n):
                # A stage's first block concatenates its pooled input: its branch makes planes - in_planes.
                blocks.append(ShuffleV1Block(in_planes, planes - (in_planes if i == 0 else 0), 2 if i == 0 else 1,
                                             groups, first=k == 1 and i == 0))
                in_planes = planes
            setattr(self, f"layer{k}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(in_planes, num_classes)
        self.stage_names = tuple(f"layer{k}" for k in range(1, len(out_planes) + 1))
        self.tap_spec = TapSpec(embedding="linear", stages=self.stage_names,
                                stages_pre=tuple(f"layer{k}.{n - 1}.preact"
                                                 for k, n in enumerate(num_blocks, start=1)),
                                stages_bn=tuple(f"layer{k}.{n - 1}.bn3" for k, n in enumerate(num_blocks, start=1)))

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return self.linear(self.avgpool(x).flatten(1))


class SplitBlock(nn.Module):
    def __init__(self, ratio: float) -> None:
        super().__init__()
        self.ratio = ratio

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        c = int(x.size(1) * self.ratio)
        return x[:, :c], x[:, c:]


class ShuffleV2Block(nn.Module):
    """Split channels in half; one half passes, the other goes 1x1-BN-ReLU, 3x3 depthwise-BN, 1x1-BN; concat,
    shuffle, ``preact``, ReLU ``act`` (see the module docstring for why the ReLU comes after the shuffle)."""

    def __init__(self, in_channels: int, split_ratio: float = 0.5) -> None:
        super().__init__()
        self.split = SplitBlock(split_ratio)
        c = int(in_channels * split_ratio)
        self.conv1 = nn.Conv2d(c, c, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, kernel_size=3, stride=1, padding=1, groups=c, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.shuffle = ShuffleBlock(2)
        self.preact = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x1, x2 = self.split(x)
        out = self.bn3(self.conv3(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x2)))))))
        return self.act(self.preact(self.shuffle(torch.cat([x1, out], 1))))


class ShuffleV2DownBlock(nn.Module):
    """Two stride-2 branches, each ending in 1x1-BN-ReLU to out/2 channels: left 3x3 depthwise-BN then
    1x1; right 1x1-BN-ReLU, 3x3 depthwise-BN, 1x1. Concat, shuffle."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        mid = out_channels // 2
        self.conv1 = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=2, padding=1, groups=in_channels,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv2 = nn.Conv2d(in_channels, mid, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(in_channels, mid, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid)
        self.relu3 = nn.ReLU()
        self.conv4 = nn.Conv2d(mid, mid, kernel_size=3, stride=2, padding=1, groups=mid, bias=False)
        self.bn4 = nn.BatchNorm2d(mid)
        self.conv5 = nn.Conv2d(mid, mid, kernel_size=1, bias=False)
        self.bn5 = nn.BatchNorm2d(mid)
        self.relu5 = nn.ReLU()
        self.shuffle = ShuffleBlock(2)

    def forward(self, x: Tensor) -> Tensor:
        left = self.relu2(self.bn2(self.conv2(self.bn1(self.conv1(x)))))
        right = self.bn4(self.conv4(self.relu3(self.bn3(self.conv3(x)))))
        right = self.relu5(self.bn5(self.conv5(right)))
        return self.shuffle(torch.cat([left, right], 1))


class ShuffleNetV2(nn.Module):
    """``conv1``-``bn1``-``relu``, ``layer1..3``, ``conv2``-``bn2``-``relu2``, ``avgpool``, ``linear``."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10,
                 out_channels: tuple[int, ...] = (116, 232, 464, 1024),
                 num_blocks: tuple[int, ...] = (3, 7, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, STEM, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(STEM)
        self.relu = nn.ReLU()
        channels = STEM
        for k, (out, n) in enumerate(zip(out_channels[:-1], num_blocks, strict=True), start=1):
            blocks: list[nn.Module] = [ShuffleV2DownBlock(channels, out)]
            blocks += [ShuffleV2Block(out) for _ in range(n)]
            setattr(self, f"layer{k}", nn.Sequential(*blocks))
            channels = out
        self.conv2 = nn.Conv2d(channels, out_channels[-1], kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels[-1])
        self.relu2 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(out_channels[-1], num_classes)
        self.stage_names = tuple(f"layer{k}" for k in range(1, len(num_blocks) + 1))
        self.tap_spec = TapSpec(embedding="linear", stages=self.stage_names,
                                stages_pre=tuple(f"layer{k}.{n}.preact" for k, n in enumerate(num_blocks, start=1)))

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        for name in self.stage_names:
            x = getattr(self, name)(x)
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.linear(self.avgpool(x).flatten(1))


@MODELS.register("shufflenetv1", "CIFAR ShuffleNetV1, groups 3, 0.95M params at 100 classes (RepDistiller)")
def shufflenetv1(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """RepDistiller's ``ShuffleV1``: groups 3, stage widths 240/480/960, 4/8/4 blocks (Zhang et al. 2018)."""
    dims = check_input("shufflenetv1", input_shape, "(C, H, W)", MIN_SIZE)
    return ShuffleNetV1(dims[0], num_classes)


@MODELS.register("shufflenetv2", "CIFAR ShuffleNetV2 1x, 1.36M params at 100 classes (RepDistiller)")
def shufflenetv2(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """RepDistiller's ``ShuffleV2``: the 1x net, stage widths 116/232/464, 3/7/3 blocks (Ma et al. 2018)."""
    dims = check_input("shufflenetv2", input_shape, "(C, H, W)", MIN_SIZE)
    return ShuffleNetV2(dims[0], num_classes)
