"""1-D CNN for MNIST-1D: the ConvBase of Greydanus 2020 ("Scaling down deep learning", MNIST-1D)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, check_input, flat_size, positive_int


class CNN1d(nn.Module):
    """Conv1d(C, c, 5, s2, p1) -> ReLU -> 2 x [Conv1d(c, c, 3, s2, p1) -> ReLU] -> flatten -> Linear.

    Module paths: ``conv1 relu1 conv2 relu2 conv3 relu3 flatten fc``. On (1, 40) with c=25 the
    flattened feature is 25 x 5 = 125 and the model has 5,210 parameters (10 classes), as in Greydanus 2020.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: int = 25) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(input_shape[0], channels, 5, stride=2, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(flat_size(self.features, input_shape), num_classes)
        self.tap_spec = TapSpec(embedding="fc", stages=("relu1", "relu2", "relu3"),
                                stages_pre=("conv1", "conv2", "conv3"))

    def features(self, x: Tensor) -> Tensor:
        x = self.relu1(self.conv1(x))
        x = self.relu2(self.conv2(x))
        return self.flatten(self.relu3(self.conv3(x)))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


@MODELS.register("cnn1d", "1-D CNN for MNIST-1D, the ConvBase of Greydanus 2020")
def cnn1d(input_shape: tuple[int, ...], num_classes: int, channels: int = 25) -> nn.Module:
    """MNIST-1D ConvBase for (C, L) inputs with L >= 3 (MNIST-1D: (1, 40))."""
    dims = check_input("cnn1d", input_shape, "(C, L)", 3)
    return CNN1d(dims, num_classes, positive_int("cnn1d", "channels", channels))
