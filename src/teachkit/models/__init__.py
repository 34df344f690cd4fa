"""Model zoo: ``build_model(name, input_shape, num_classes, **options)`` and feature taps.

Registered models (``teachkit list``): ``mlp``, ``lenet``, ``cnn1d``, ``resnet8/14/20/32/44/56/110``,
``resnet_cifar`` (any depth), ``resnet8x4``, ``resnet32x4``; the CIFAR benchmark nets of RepDistiller / CRD
``wrn_16_1/16_2/40_1/40_2/28_10/40_10`` and ``wrn`` (any depth), ``vgg8/11/13/16/19``, ``mobilenetv2``,
``shufflenetv1``, ``shufflenetv2``, ``resnet50_cifar``; ``densenet_bc`` (any L, k); ImageNet-style
``resnet18/34/50``. Every built model has ``model.tap_spec``.
"""

from __future__ import annotations

from teachkit.models.frozen import FrozenTeacher
from teachkit.models.taps import Tapped, Taps, TapSpec, unwrap
from teachkit.models.zoo import MODELS, ModelConfig, build_model, count_parameters, make_model
from teachkit.registry import import_all

import_all(__name__, __path__)  # every model family registers itself

__all__ = ["MODELS", "FrozenTeacher", "ModelConfig", "TapSpec", "Tapped", "Taps", "build_model", "count_parameters",
           "make_model", "unwrap"]
