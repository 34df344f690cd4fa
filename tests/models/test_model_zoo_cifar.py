"""Model zoo, benchmark nets: WRN, VGG, MobileNetV2, ShuffleNetV1/V2, ResNet-50 (CIFAR), DenseNet-BC and the
ImageNet ResNet-18/34/50. Parameter counts against the published figures, forward shapes, options, errors.

Big models (WRN-28-10 / 40-10, DenseNet-BC-190-40, the ResNet-50s, ResNet-34) are only built and counted; each
family runs a forward in its smallest configuration, to keep the file fast.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models import MODELS, TapSpec, build_model, count_parameters
from tests.models.test_model_zoo import APPLIES

CIFAR = (3, 32, 32)
WRNS = ["wrn_16_1", "wrn_16_2", "wrn_40_1", "wrn_40_2", "wrn_28_10", "wrn_40_10"]
VGGS = ["vgg8", "vgg11", "vgg13", "vgg16", "vgg19"]
IMAGENET_RESNETS = ["resnet18", "resnet34", "resnet50"]
#: Every model this file covers, with the options a test build needs.
NEW = {name: {} for name in [*WRNS, *VGGS, *IMAGENET_RESNETS, "mobilenetv2", "shufflenetv1", "shufflenetv2",
                             "resnet50_cifar", "densenet_bc"]}
NEW["wrn"] = {"depth": 16}
NEW["hf_text"] = {"preset": "bert-tiny"}  # tests/models/test_text_models.py
NEW["hf_causal_lm"] = {"preset": "llama-tiny"}  # tests/models/test_causal_lm.py
# translation models: tests/models/test_seq2seq_models.py
NEW |= {name: {} for name in ("lstm_attn", "transformer_seq2seq", "transformer_small", "transformer_iwslt")}

#: Forward on (3, 32, 32): the small members of each family (see the module docstring).
FORWARD = [("wrn_16_1", {}), ("wrn_16_2", {}), ("wrn_40_1", {}), ("wrn_40_2", {}), ("wrn", {"depth": 10}),
           *[(v, {}) for v in VGGS], ("mobilenetv2", {}), ("shufflenetv1", {}), ("shufflenetv2", {}),
           ("densenet_bc", {"depth": 10, "growth": 4}), ("densenet_bc", {}), ("resnet18", {})]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def n_params(name: str, num_classes: int = 100, shape: tuple[int, ...] = CIFAR, **options: object) -> int:
    return count_parameters(build_model(name, shape, num_classes, **options))


def test_registered_and_described() -> None:
    # Together with test_model_zoo.APPLIES this covers the whole zoo (other tests register user models).
    zoo = {e.name for e in MODELS.entries() if getattr(e.obj, "__module__", "").startswith("teachkit.models")}
    assert zoo == set(APPLIES) | set(NEW)
    for entry in MODELS.entries():
        if entry.name in NEW:
            assert entry.description and "\n" not in entry.description


# --- parameter counts -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "classes", "options", "exact", "published"), [
    # CRD / RepDistiller CIFAR-100 table (Tian et al. 2020)
    ("wrn_40_2", 100, {}, 2_255_156, 2.26e6),
    ("wrn_16_2", 100, {}, 703_284, 0.70e6),
    ("wrn_40_1", 100, {}, 569_780, 0.57e6),
    ("vgg13", 100, {}, 9_462_180, 9.46e6),
    ("vgg8", 100, {}, 3_965_028, 3.96e6),
    ("mobilenetv2", 100, {}, 812_836, 0.81e6),
    ("shufflenetv1", 100, {}, 949_258, 0.95e6),
    ("shufflenetv2", 100, {}, 1_355_528, 1.36e6),
    ("resnet50_cifar", 100, {}, 23_705_252, 23.71e6),
    # Zagoruyko & Komodakis 2016, CIFAR-10
    ("wrn_28_10", 10, {}, 36_479_194, 36.5e6),
    # Huang et al. 2017, DenseNet-BC on CIFAR (0.8M is also within 1% at 100 classes: 800,032)
    ("densenet_bc", 100, {}, 800_032, 0.8e6),
    ("densenet_bc", 10, {"depth": 190, "growth": 40}, 25_624_430, 25.6e6),
    ("densenet_bc", 10, {"depth": 250, "growth": 24}, 15_324_406, 15.3e6),
    # torchvision / He et al. 2016, ImageNet
    ("resnet18", 1000, {}, 11_689_512, 11.69e6),
    ("resnet34", 1000, {}, 21_797_672, 21.80e6),
    ("resnet50", 1000, {}, 25_557_032, 25.56e6),
])
def test_param_counts_match_published(name: str, classes: int, options: dict, exact: int, published: float) -> None:
    shape = (3, 224, 224) if name in IMAGENET_RESNETS else CIFAR
    got = n_params(name, classes, shape, **options)
    assert got == exact
    assert abs(got - published) / published < 0.01


def test_densenet_bc_100_12_at_10_classes() -> None:
    # The paper prints 0.8M (one decimal): 769,162 is within half the last printed digit.
    got = n_params("densenet_bc", 10)
    assert got == 769_162
    assert abs(got - 0.8e6) <= 0.05e6


@pytest.mark.parametrize(("name", "exact"), [
    ("wrn_16_1", 180_916), ("wrn_40_10", 55_899_444), ("vgg11", 9_277_284), ("vgg16", 14_774_436),
    ("vgg19", 20_086_692),
])
def test_pinned_param_counts(name: str, exact: int) -> None:
    assert n_params(name) == exact


def test_generic_wrn_matches_named() -> None:
    assert n_params("wrn", depth=40, width=2) == 2_255_156
    assert n_params("wrn", depth=16) == 180_916
    assert n_params("wrn_40_2", dropout=0.3) == 2_255_156  # dropout adds no parameters


def test_mobilenetv2_width_mult() -> None:
    assert n_params("mobilenetv2", width_mult=1.0) == 2_353_060
    full = build_model("mobilenetv2", CIFAR, 100, width_mult=1.0)
    assert full.conv1[0].out_channels == 32 and full.classifier[0].in_features == 1280
    assert build_model("mobilenetv2", CIFAR, 100, width_mult=1.5).classifier[0].in_features == 1920
    half = build_model("mobilenetv2", CIFAR, 100)
    assert half.conv1[0].out_channels == 16 and half.blocks[6][0].conv[6].out_channels == 160


# --- forward shapes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "options"), FORWARD, ids=[f"{n}-{o}" if o else n for n, o in FORWARD])
def test_forward_shape(name: str, options: dict) -> None:
    model = build_model(name, CIFAR, 7, **options).eval()
    assert isinstance(model.tap_spec, TapSpec)
    with torch.no_grad():
        out = model(torch.randn(2, *CIFAR))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(("name", "shape", "options"), [
    ("wrn_16_1", (1, 28, 28), {}), ("wrn", (5, 8, 12), {"depth": 10}), ("vgg8", (1, 16, 20), {}),
    ("mobilenetv2", (1, 32, 40), {"width_mult": 0.25}), ("shufflenetv1", (4, 16, 16), {}),
    ("shufflenetv2", (2, 16, 24), {}), ("densenet_bc", (1, 8, 8), {"depth": 10, "growth": 4}),
    ("resnet18", (1, 32, 48), {}), ("resnet50_cifar", (2, 16, 16), {}),
])
def test_adapts_to_channels_size_and_classes(name: str, shape: tuple[int, ...], options: dict) -> None:
    model = build_model(name, shape, 3, **options).eval()
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert first.in_channels == shape[0]
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, 3)


def test_train_mode_step() -> None:
    model = build_model("wrn", CIFAR, 10, depth=10, dropout=0.3)
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.3 for m in model.modules()) == 3
    loss = model(torch.randn(4, *CIFAR)).logsumexp(1).mean()
    loss.backward()
    assert model.conv1.weight.grad.abs().sum() > 0


# --- structure ----------------------------------------------------------------------------------------------

def test_no_inplace_activations() -> None:
    for name, options in [("wrn_16_2", {}), ("vgg8", {}), ("mobilenetv2", {}), ("shufflenetv1", {}),
                          ("shufflenetv2", {}), ("densenet_bc", {"depth": 10}), ("resnet18", {}),
                          ("resnet50_cifar", {})]:
        model = build_model(name, CIFAR, 10, **options)
        assert not any(getattr(m, "inplace", False) for m in model.modules()), name


@pytest.mark.parametrize(("name", "keys"), [
    ("wrn_40_2", ["conv1.weight", "block1.layer.0.bn1.weight", "block1.layer.0.convShortcut.weight",
                  "block2.layer.5.conv2.weight", "bn1.running_var", "fc.weight"]),
    ("vgg13", ["block0.0.weight", "block0.0.bias", "block0.1.running_mean", "block0.3.weight", "block4.4.weight",
               "classifier.weight"]),
    ("mobilenetv2", ["conv1.0.weight", "conv1.1.weight", "blocks.1.0.conv.0.weight", "blocks.6.0.conv.7.bias",
                     "conv2.0.weight", "classifier.0.weight"]),
    ("shufflenetv1", ["conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer3.3.bn3.weight", "linear.weight"]),
    ("shufflenetv2", ["layer1.0.conv5.weight", "layer2.7.conv3.weight", "conv2.weight", "bn2.weight",
                      "linear.weight"]),
    ("resnet50_cifar", ["conv1.weight", "layer1.0.shortcut.0.weight", "layer4.2.bn3.weight", "linear.weight"]),
    ("resnet50", ["conv1.weight", "layer1.0.downsample.0.weight", "layer4.2.conv3.weight", "fc.weight"]),
    ("densenet_bc", ["conv1.weight", "block1.15.conv2.weight", "trans1.conv.weight", "trans2.bn.weight",
                     "block3.0.bn1.running_mean", "bn.weight", "fc.weight"]),
])
def test_state_dict_names(name: str, keys: list[str]) -> None:
    # RepDistiller's names for its CIFAR nets (its checkpoints load as is), torchvision's for ResNet-18/34/50.
    state = build_model(name, CIFAR, 100).state_dict()
    for key in keys:
        assert key in state


def test_wrn_structure() -> None:
    model = build_model("wrn_16_2", CIFAR, 100)
    assert [len(getattr(model, f"block{i}").layer) for i in (1, 2, 3)] == [2, 2, 2]
    assert model.block1.layer[0].convShortcut is not None and model.block1.layer[1].convShortcut is None
    assert model.fc.in_features == 128
    assert build_model("wrn_16_1", CIFAR, 100).block1.layer[0].convShortcut is None  # 16 -> 16: identity


def test_vgg_structure_and_pool3_rule() -> None:
    model = build_model("vgg13", CIFAR, 100)
    assert [len(getattr(model, f"block{k}")) for k in range(5)] == [5, 5, 5, 5, 5]
    assert isinstance(model.block0[-1], nn.BatchNorm2d) and not model.use_pool3
    assert build_model("vgg8", (3, 64, 64), 10).use_pool3
    assert not build_model("vgg8", (3, 64, 32), 10).use_pool3


def test_densenet_channel_arithmetic() -> None:
    model = build_model("densenet_bc", CIFAR, 10)
    assert len(model.block1) == 16 and model.conv1.out_channels == 24
    assert model.block_channels == [216, 300, 342]
    assert (model.trans1.conv.in_channels, model.trans1.conv.out_channels) == (216, 108)
    assert (model.trans2.conv.in_channels, model.trans2.conv.out_channels) == (300, 150)
    assert model.fc.in_features == 342


def test_imagenet_resnet_stem() -> None:
    model = build_model("resnet50", (3, 224, 224), 1000)
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d) and model.fc.in_features == 2048
    assert model.layer2[0].conv2.stride == (2, 2)  # stride on the 3x3 conv ("v1.5", torchvision)
    cifar = build_model("resnet50_cifar", CIFAR, 100)
    assert cifar.conv1.kernel_size == (3, 3) and cifar.maxpool is None and cifar.linear.in_features == 2048


# --- config errors -----------------------------------------------------------------------------------------

def test_too_small_input_message() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("resnet18", (3, 28, 28), 10)
    assert str(err.value) == "model 'resnet18' needs input (C, H, W) with H, W >= 32; got (3, 28, 28)"


@pytest.mark.parametrize(("name", "shape"), [
    ("wrn_40_2", (3, 4, 32)), ("wrn", (3, 32)), ("vgg8", (3, 8, 8)), ("vgg13", (1, 40)),
    ("mobilenetv2", (3, 16, 16)), ("shufflenetv1", (3, 8, 8)), ("shufflenetv2", (3, 32, 15)),
    ("resnet50_cifar", (3, 8, 8)), ("densenet_bc", (3, 4, 4)), ("resnet34", (3, 16, 16)),
    ("resnet50", (3, 224)), ("wrn_16_1", (3, 0, 32)),
])
def test_rejects_inputs_the_model_cannot_take(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=f"model '{name}' needs"):
        build_model(name, shape, 10, **NEW[name])


@pytest.mark.parametrize(("name", "options", "match"), [
    ("wrn", {"depth": 18}, "'depth' must be 6n\\+4"),
    ("wrn", {"depth": 4}, "'depth' must be 6n\\+4"),
    ("wrn", {"depth": "16"}, "'depth' must be 6n\\+4"),
    ("wrn", {"depth": True}, "'depth' must be 6n\\+4"),
    ("wrn", {"depth": 16, "width": 0}, "'width' must be a positive int"),
    ("wrn", {"depth": 16, "width": 1.5}, "'width' must be a positive int"),
    ("wrn", {"depth": 16, "dropout": 1.0}, "'dropout' must be a number in"),
    ("wrn_40_2", {"dropout": -0.1}, "'dropout' must be a number in"),
    ("densenet_bc", {"depth": 99}, "'depth' must be 6n\\+4"),
    ("densenet_bc", {"growth": 0}, "'growth' must be a positive int"),
    ("densenet_bc", {"growth": 12.0}, "'growth' must be a positive int"),
    ("mobilenetv2", {"width_mult": 0}, "'width_mult' must be a number >= 0.0625"),
    ("mobilenetv2", {"width_mult": 0.05}, "'width_mult' must be a number >= 0.0625"),
    ("mobilenetv2", {"width_mult": "half"}, "'width_mult' must be a number"),
    ("mobilenetv2", {"width_mult": float("inf")}, "'width_mult' must be a number"),
])
def test_rejects_bad_option_values(name: str, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_model(name, CIFAR, 10, **options)
    assert "\n" not in str(err.value)


def test_option_names() -> None:
    with pytest.raises(ConfigError, match="model 'wrn' needs option 'depth'"):
        build_model("wrn", CIFAR, 10)
    with pytest.raises(ConfigError, match="'depth'.*allowed: dropout"):
        build_model("wrn_40_2", CIFAR, 10, depth=16)
    with pytest.raises(ConfigError, match="allowed: \\(none\\)"):
        build_model("vgg8", CIFAR, 10, batch_norm=False)
    with pytest.raises(ConfigError, match="did you mean 'width_mult'"):
        build_model("mobilenetv2", CIFAR, 10, width=0.5)
    with pytest.raises(ConfigError, match="allowed: depth, growth"):
        build_model("densenet_bc", CIFAR, 10, k=12)
