"""CIFAR MobileNetV2 (Sandler et al. 2018) in the form of RepDistiller (Tian et al. 2020), which takes it from
route-constrained optimisation (Jin et al. 2019).

``conv1`` (conv3x3 stride 2, BN, ReLU), seven groups ``blocks.0..6`` of inverted residuals (expansion 6 except
group 0; widths 16/24/32/64/96/160/320 and strides 1/1/2/2/1/2/1, every width scaled by ``width_mult`` and
truncated with ``int``), ``conv2`` (1x1 to 1280 channels, or 1280 * width_mult above 1, BN, ReLU), global
average pool, ``classifier.0`` Linear. The CRD benchmark's "MobileNetV2" is ``width_mult=0.5`` (RepDistiller's
``mobile_half``): 812,836 parameters at 100 classes, 697,546 at 10. Parameter names match RepDistiller's.

Taps. stages = ``blocks.1``, ``blocks.2``, ``blocks.4``, ``blocks.6``: the last group at each resolution
(H/2, H/4, H/8, H/16), RepDistiller's f1..f4. Inverted residuals end in a *linear* bottleneck (BN, plus the
residual, no ReLU), so these maps have no activation: stages_pre names the same modules and the same
tensors (stages_pre[i] == stages[i]; relu(stages_pre[i]) == stages[i] does not hold). embedding =
``classifier.0`` (its input is the pooled ``conv2`` feature).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, init_weights

#: Smallest H, W MobileNetV2 takes (four stride-2 steps leave at least 2x2).
MIN_SIZE = 32
#: (expansion t, width c, repeats n, stride s) per group; t = 6 is ``T`` in RepDistiller.
SETTING = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1))
STAGE_GROUPS = (1, 2, 4, 6)


def conv_bn(inp: int, oup: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inp, oup, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(oup),
                         nn.ReLU())


class InvertedResidual(nn.Module):
    """1x1 expand-BN-ReLU, 3x3 depthwise-BN-ReLU, 1x1 project-BN (linear), plus identity when shapes match."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == oup
        self.conv = nn.Sequential(
            nn.Conv2d(inp, hidden, 1, 1, 0, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """``conv1``, ``blocks`` (ModuleList of 7 Sequentials), ``conv2``, ``avgpool``, ``classifier``."""

    def __init__(self, in_channels: int = 3, num_classes: int = 100, width_mult: float = 0.5) -> None:
        super().__init__()
        channels = int(32 * width_mult)
        self.conv1 = conv_bn(in_channels, channels, 3, 2)
        self.blocks = nn.ModuleList()
        for t, c, n, s in SETTING:
            out = int(c * width_mult)
            layers = []
            for i in range(n):
                layers.append(InvertedResidual(channels, out, s if i == 0 else 1, t))
                channels = out
            self.blocks.append(nn.Sequential(*layers))
        self.last_channel = int(1280 * width_mult) if width_mult > 1.0 else 1280
        self.conv2 = conv_bn(channels, self.last_channel, 1, 1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(self.last_channel, num_classes))
        stages = tuple(f"blocks.{g}" for g in STAGE_GROUPS)
        self.tap_spec = TapSpec(embedding="classifier.0", stages=stages, stages_pre=stages,
                                stages_bn=tuple(f"blocks.{g}.{SETTING[g][2] - 1}.conv.7" for g in STAGE_GROUPS))
        init_weights(self, linear="normal")

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for group in self.blocks:
            x = group(x)
        x = self.conv2(x)
        return self.classifier(self.avgpool(x).flatten(1))


@MODELS.register("mobilenetv2", "CIFAR MobileNetV2, width_mult 0.5 by default: 0.81M params at 100 classes "
                                "(RepDistiller)")
def mobilenetv2(input_shape: tuple[int, ...], num_classes: int, width_mult: float = 0.5) -> nn.Module:
    """RepDistiller's CIFAR MobileNetV2 (expansion 6); ``width_mult=0.5`` is CRD's "MobileNetV2"."""
    dims = check_input("mobilenetv2", input_shape, "(C, H, W)", MIN_SIZE)
    ok = isinstance(width_mult, (int, float)) and not isinstance(width_mult, bool)
    if not ok or not math.isfinite(width_mult) or int(16 * width_mult) < 1:
        raise ConfigError(f"model 'mobilenetv2' option 'width_mult' must be a number >= 0.0625 (every width "
                          f"at least 1 channel); got {width_mult!r}")
    return MobileNetV2(dims[0], num_classes, float(width_mult))
