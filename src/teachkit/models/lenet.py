"""LeNet-5-style CNN (LeCun et al. 1998), in the Caffe "LeNet" form: conv5x5(20) -> pool -> conv5x5(50)
-> pool -> FC 500 -> FC classes (431,080 parameters on 28x28 MNIST, 10 classes)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, flat_size, fmt_shape, positive_int

#: Smallest side that unpadded 5x5 convs take: 16 -> conv 12 -> pool 6 -> conv 2 -> pool 1.
UNPADDED_MIN = 16


def _side(size: int, padding: int) -> int:
    """Spatial side after conv5x5(padding) -> pool2 -> conv5x5(padding) -> pool2 (< 1: does not fit)."""
    for _ in range(2):
        size = size + 2 * padding - 4
        if size < 2:
            return 0
        size //= 2
    return size


class LeNet(nn.Module):
    """Two conv5x5 + ReLU + 2x2 max-pool blocks, FC ``fc`` + ReLU, FC classes (LeCun et al. 1998).

    Module paths: ``conv1 relu1 pool1 conv2 relu2 pool2 flatten fc1 relu3 fc2``.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: Sequence[int] = (20, 50),
                 fc: int = 500, padding: int = 0) -> None:
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(input_shape[0], c1, 5, padding=padding)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=padding)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(flat_size(self.features, input_shape), fc)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(fc, num_classes)
        self.tap_spec = TapSpec(embedding="fc2", stages=("pool1", "pool2"), stages_pre=("conv1", "conv2"))

    def features(self, x: Tensor) -> Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        return self.flatten(self.pool2(self.relu2(self.conv2(x))))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.relu3(self.fc1(self.features(x))))


@MODELS.register("lenet", "LeNet-5-style CNN: conv5x5(20)-pool-conv5x5(50)-pool-FC500 (LeCun et al. 1998)")
def lenet(input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int] = (20, 50), fc: int = 500,
          padding: int | None = None) -> nn.Module:
    """LeNet for (C, H, W) inputs of any channel count and size.

    Padding rule (``padding=None``): the classic unpadded 5x5 convs when min(H, W) >= 16 (MNIST 28x28 as in
    LeCun et al. 1998), else padding=2 ("same" convs; e.g. 8x8 digits -> 4x4 -> 2x2 maps). Inputs need
    H, W >= 4. An explicit ``padding`` is used as given and must leave at least a 1x1 map.
    """
    dims = check_input("lenet", input_shape, "(C, H, W)", 4)
    if not isinstance(channels, (list, tuple)) or len(channels) != 2:
        raise ConfigError(f"model 'lenet' option 'channels' must be two ints; got {channels!r}")
    channels = tuple(positive_int("lenet", "channels", c) for c in channels)
    fc = positive_int("lenet", "fc", fc)
    if padding is None:
        padding = 0 if min(dims[1:]) >= UNPADDED_MIN else 2
    elif isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ConfigError(f"model 'lenet' option 'padding' must be an int >= 0; got {padding!r}")
    if min(_side(s, padding) for s in dims[1:]) < 1:
        raise ConfigError(f"model 'lenet' with padding={padding} cannot take input {fmt_shape(dims)}: "
                          f"the feature map shrinks below 1x1 (use padding=2 or larger inputs)")
    return LeNet(dims, num_classes, channels, fc, padding)
