"""CIFAR VGGs with BatchNorm (Simonyan & Zisserman 2015) in the form of RepDistiller (Tian et al. 2020):
``vgg8`` (config "S"), ``vgg11`` ("A"), ``vgg13`` ("B"), ``vgg16`` ("D"), ``vgg19`` ("E").

Five conv blocks ``block0..block4`` (3x3 conv with bias, BN, ReLU; 64 / 128 / 256 / 512 / 512 filters),
max-pools ``pool0..pool2`` after the first three, ``pool3`` after block3 only for inputs of side >= 64
(RepDistiller pools there only for 64x64 inputs; at 32x32 block3 and block4 both run at 4x4), global
average pool ``pool4`` and a single ``classifier`` Linear(512, classes): no VGG FC layers. At 100 classes
VGG8 / 11 / 13 / 16 / 19 have 3,965,028 / 9,277,284 / 9,462,180 / 14,774,436 / 20,086,692 parameters;
parameter names match RepDistiller's ``vgg*_bn`` checkpoints (what CRD calls vgg8 / vgg13 ...).

Each ``block{k}`` is a Sequential ending with the BN of its last conv (as RepDistiller builds it); the
ReLU closing the block is the separate module ``relu{k}``. Taps: stages = ``relu0..relu4`` (post-ReLU block
outputs before pooling, RepDistiller's f0..f4), stages_pre = ``block0..block4`` (the BN outputs, so
relu(stages_pre[i]) == stages[i]), embedding = ``classifier`` (its input is the pooled 512-d feature).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, init_weights

#: Smallest H, W a CIFAR VGG takes (three 2x2 max-pools leave at least 2x2).
MIN_SIZE = 16
#: Inputs with both sides >= this also pool after block3 (RepDistiller does so for 64x64 inputs).
POOL3_SIZE = 64

CONFIGS: dict[str, list[list[int]]] = {
    "vgg8": [[64], [128], [256], [512], [512]],
    "vgg11": [[64], [128], [256, 256], [512, 512], [512, 512]],
    "vgg13": [[64, 64], [128, 128], [256, 256], [512, 512], [512, 512]],
    "vgg16": [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]],
    "vgg19": [[64, 64], [128, 128], [256, 256, 256, 256], [512, 512, 512, 512], [512, 512, 512, 512]],
}


def _block(widths: Sequence[int], in_channels: int) -> nn.Sequential:
    """conv3x3-BN-ReLU per width, without the final ReLU (the block ends on a BN)."""
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Conv2d(in_channels, w, kernel_size=3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
        in_channels = w
    return nn.Sequential(*layers[:-1])


class VGG(nn.Module):
    """``block{k}`` -> ``relu{k}`` -> ``pool{k}`` for k = 0..4 (``pool3`` only if ``pool3``), ``classifier``."""

    def __init__(self, cfg: Sequence[Sequence[int]], in_channels: int = 3, num_classes: int = 10,
                 pool3: bool = False) -> None:
        super().__init__()
        for k, widths in enumerate(cfg):
            setattr(self, f"block{k}", _block(widths, in_channels if k == 0 else cfg[k - 1][-1]))
            setattr(self, f"relu{k}", nn.ReLU())
        self.pool0 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.pool3 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.pool4 = nn.AdaptiveAvgPool2d(1)
        self.use_pool3 = pool3
        self.classifier = nn.Linear(cfg[-1][-1], num_classes)
        n = len(cfg)
        self.tap_spec = TapSpec(embedding="classifier", stages=tuple(f"relu{k}" for k in range(n)),
                                stages_pre=tuple(f"block{k}" for k in range(n)),
                                stages_bn=tuple(f"block{k}.{3 * len(cfg[k]) - 2}" for k in range(n)))
        init_weights(self, linear="normal")

    def forward(self, x: Tensor) -> Tensor:
        for k in range(5):
            x = getattr(self, f"relu{k}")(getattr(self, f"block{k}")(x))
            if k < 3 or (k == 3 and self.use_pool3):
                x = getattr(self, f"pool{k}")(x)
        return self.classifier(self.pool4(x).flatten(1))


def _register(name: str, layers: int, size: str) -> None:
    def builder(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        dims = check_input(name, input_shape, "(C, H, W)", MIN_SIZE)
        return VGG(CONFIGS[name], dims[0], num_classes, pool3=min(dims[1:]) >= POOL3_SIZE)

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = f"CIFAR VGG-{layers} with BatchNorm, classifier Linear(512, classes) (RepDistiller)."
    MODELS.register(name, f"CIFAR VGG-{layers} with BN, Linear(512) head, {size} params at 100 classes "
                          f"(RepDistiller)")(builder)
    globals()[name] = builder


for _name, _layers, _size in (("vgg8", 8, "3.97M"), ("vgg11", 11, "9.28M"), ("vgg13", 13, "9.46M"),
                              ("vgg16", 16, "14.77M"), ("vgg19", 19, "20.09M")):
    _register(_name, _layers, _size)
