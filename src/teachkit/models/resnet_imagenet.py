"""ResNet-18/34/50 of He et al. 2016 with four stages of 64/128/256/512 filters (x4 for bottlenecks).

- ``resnet18`` / ``resnet34`` / ``resnet50``: the ImageNet network in torchvision's layout and parameter
  names (``conv1`` 7x7 stride 2, ``bn1``, ``relu``, ``maxpool`` 3x3 stride 2, ``layer1..4``, ``avgpool``,
  ``fc``; projection shortcuts ``downsample``; ResNet-50 strides its 3x3 conv, "v1.5"): 11,689,512 /
  21,797,672 / 25,557,032 parameters at 1000 classes. Any (C, H, W) with H, W >= 32 (layer4 at least 1x1).
- ``resnet50_cifar``: the CIFAR bottleneck ResNet-50 of RepDistiller's ``resnetv2.py``, the ResNet50 teacher
  of the CRD benchmark (Tian et al. 2020): ``conv1`` 3x3 stride 1 and no max-pool, projection shortcuts
  named ``shortcut``, classifier ``linear`` (RepDistiller's parameter names): 23,705,252 parameters at 100
  classes. H, W >= 16 (layer4 at least 2x2).

Blocks end in ``preact`` (Identity) on the residual sum, then a non-inplace ReLU ``act``, as in
:mod:`teachkit.models.resnet`. Taps: stages = ``layer1..4`` outputs, stages_pre = ``layerK.{last}.preact``
(relu(stages_pre[i]) == stages[i]), embedding = ``fc`` / ``linear`` (its input is the pooled feature).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, init_weights

IMAGENET_MIN_SIZE = 32
CIFAR_MIN_SIZE = 16


def _projection(in_planes: int, out_planes: int, stride: int) -> nn.Sequential:
    """1x1 conv + BN when the shape changes, else an empty Sequential (identity, no parameters)."""
    if stride == 1 and in_planes == out_planes:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_planes))


class BasicBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN + shortcut, ``preact``, ReLU ``act``; the shortcut is the
    attribute named ``proj`` ("downsample" as torchvision, "shortcut" as RepDistiller)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, proj: str = "downsample") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.proj = proj
        setattr(self, proj, _projection(in_planes, planes, stride))
        self.preact = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.act(self.preact(out + getattr(self, self.proj)(x)))


class Bottleneck(nn.Module):
    """conv1x1-BN-ReLU, conv3x3(stride)-BN-ReLU, conv1x1(4 x planes)-BN + shortcut, ``preact``, ReLU ``act``."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1, proj: str = "downsample") -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU()
        self.proj = proj
        setattr(self, proj, _projection(in_planes, out_planes, stride))
        self.preact = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.act(self.preact(out + getattr(self, self.proj)(x)))


class ResNet(nn.Module):
    """Stem, ``layer1..4``, ``avgpool``, classifier (``fc`` or ``linear``).

    ``stem='imagenet'``: conv7x7 stride 2 + BN + ReLU + ``maxpool``; ``stem='cifar'``: conv3x3 stride 1 + BN +
    ReLU. ``names='torchvision'`` or ``'repdistiller'`` picks the shortcut / classifier attribute names.
    """

    def __init__(self, block: type[BasicBlock | Bottleneck], layers: Sequence[int], in_channels: int = 3,
                 num_classes: int = 1000, stem: str = "imagenet", names: str = "torchvision") -> None:
        super().__init__()
        proj, head = ("downsample", "fc") if names == "torchvision" else ("shortcut", "linear")
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1) if stem == "imagenet" else None
        in_planes = 64
        for k, (planes, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True), start=1):
            blocks = []
            for i in range(n):
                blocks.append(block(in_planes, planes, 2 if i == 0 and k > 1 else 1, proj))
                in_planes = planes * block.expansion
            setattr(self, f"layer{k}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = head
        setattr(self, head, nn.Linear(in_planes, num_classes))
        self.stage_names = tuple(f"layer{k}" for k in range(1, len(layers) + 1))
        self.tap_spec = TapSpec(embedding=head, stages=self.stage_names,
                                stages_pre=tuple(f"layer{k}.{n - 1}.preact" for k, n in enumerate(layers, start=1)),
                                stages_bn=tuple(f"layer{k}.{n - 1}.{'bn3' if block is Bottleneck else 'bn2'}"
                                                for k, n in enumerate(layers, start=1)))
        init_weights(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return getattr(self, self.head)(self.avgpool(x).flatten(1))


_IMAGENET = {"resnet18": (BasicBlock, (2, 2, 2, 2), "11.69M"), "resnet34": (BasicBlock, (3, 4, 6, 3), "21.80M"),
             "resnet50": (Bottleneck, (3, 4, 6, 3), "25.56M")}


def _register(name: str) -> None:
    block, layers, size = _IMAGENET[name]
    depth = name.removeprefix("resnet")

    def builder(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        dims = check_input(name, input_shape, "(C, H, W)", IMAGENET_MIN_SIZE)
        return ResNet(block, layers, dims[0], num_classes, stem="imagenet", names="torchvision")

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = f"ImageNet ResNet-{depth} (He et al. 2016) in torchvision's layout and parameter names."
    MODELS.register(name, f"ImageNet ResNet-{depth}, torchvision layout, {size} params at 1000 classes "
                          f"(He et al. 2016)")(builder)
    globals()[name] = builder


for _name in _IMAGENET:
    _register(_name)


@MODELS.register("resnet50_cifar", "CIFAR bottleneck ResNet-50 (3x3 stem, no max-pool), 23.71M params at 100 "
                                   "classes (RepDistiller)")
def resnet50_cifar(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """RepDistiller's ``resnetv2.ResNet50``: the CRD benchmark's ResNet50 teacher for CIFAR-100."""
    dims = check_input("resnet50_cifar", input_shape, "(C, H, W)", CIFAR_MIN_SIZE)
    return ResNet(Bottleneck, (3, 4, 6, 3), dims[0], num_classes, stem="cifar", names="repdistiller")
