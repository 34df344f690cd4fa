"""Model zoo: ``build_model(name, input_shape, num_classes, **options)`` and feature taps.

Registered models (``teachkit list``): ``mlp``, ``lenet``, ``cnn1d``, ``resnet8/14/20/32/44/56/110``,
``resnet_cifar`` (any depth), ``resnet8x4``, ``resnet32x4``. Every built model has ``model.tap_spec``.
"""

from __future__ import annotations

from teachkit.models import cnn1d, lenet, mlp, resnet  # noqa: F401  (fill the registry)
from teachkit.models.taps import Tapped, Taps, TapSpec, unwrap
from teachkit.models.zoo import MODELS, build_model, count_parameters

__all__ = ["MODELS", "TapSpec", "Tapped", "Taps", "build_model", "count_parameters", "unwrap"]
