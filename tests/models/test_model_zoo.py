"""Model zoo: registry, build_model checks, parameter counts, forward shapes, init."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models import MODELS, TapSpec, build_model, count_parameters
from teachkit.models.resnet import PadShortcut

MNIST = (1, 28, 28)
DIGITS = (1, 8, 8)
CIFAR = (3, 32, 32)
MNIST1D = (1, 40)

#: Required options per model, for loops over the registry.
REQUIRED = {"resnet_cifar": {"depth": 20}}
IMAGE = (MNIST, DIGITS, CIFAR)
RESNETS = [f"resnet{d}" for d in (8, 14, 20, 32, 44, 56, 110)] + ["resnet_cifar", "resnet8x4", "resnet32x4"]
APPLIES = {"mlp": (MNIST, DIGITS, CIFAR, MNIST1D), "lenet": IMAGE, "cnn1d": (MNIST1D,)}
APPLIES |= {name: IMAGE for name in RESNETS}
CASES = [(name, shape) for name, shapes in APPLIES.items() for shape in shapes]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def n_params(name: str, num_classes: int = 10, shape: tuple[int, ...] = CIFAR, **options: object) -> int:
    return count_parameters(build_model(name, shape, num_classes, **{**REQUIRED.get(name, {}), **options}))


def test_every_registered_model_is_covered_and_described() -> None:
    assert set(APPLIES) <= set(MODELS.names())
    for entry in MODELS.entries():
        assert entry.description and "\n" not in entry.description


# --- parameter counts -----------------------------------------------------------------------------------

def test_resnet20_param_count_exact() -> None:
    assert n_params("resnet20") == 269_722
    assert n_params("resnet_cifar", depth=20) == 269_722


@pytest.mark.parametrize(("name", "exact", "published", "tol"), [
    # Option A (He et al. 2016). ``published`` is the figure to compare with and ``tol`` its absolute
    # tolerance: half the last printed digit for rounded figures (0.46M), 0.5% for the exact ints.
    ("resnet8", 75_290, 0.075e6, 0.0005e6),  # ~0.078M is option B (78,042, RepDistiller): see below
    ("resnet14", 172_506, 0.17e6, 0.005e6),
    ("resnet32", 464_154, 0.46e6, 0.005e6),
    ("resnet44", 658_586, 0.66e6, 0.005e6),
    ("resnet56", 853_018, 855_770, 0.005 * 855_770),  # 855,770 is the option-B count, also exact below
    ("resnet110", 1_727_962, 1_730_714, 0.005 * 1_730_714),  # idem: 1,730,714 with option B
])
def test_cifar_resnet_param_counts(name: str, exact: int, published: float, tol: float) -> None:
    got = n_params(name)
    assert got == exact
    assert abs(got - published) <= tol


@pytest.mark.parametrize(("name", "exact"), [("resnet8", 78_042), ("resnet20", 272_474),
                                             ("resnet56", 855_770), ("resnet110", 1_730_714)])
def test_option_b_shortcuts_add_the_1x1_projections(name: str, exact: int) -> None:
    # 1x1 conv + BN at the two stride-2 stages: 16*32 + 64 + 32*64 + 128 = 2,752 parameters.
    assert n_params(name, shortcut="B") == exact
    assert exact - n_params(name) == 2_752


@pytest.mark.parametrize(("name", "exact", "published"), [("resnet8x4", 1_233_540, 1.23e6),
                                                          ("resnet32x4", 7_433_860, 7.43e6)])
def test_repdistiller_x4_param_counts(name: str, exact: int, published: float) -> None:
    got = n_params(name, num_classes=100)
    assert got == exact
    assert abs(got - published) / published < 0.01


def test_small_model_param_counts() -> None:
    assert n_params("mlp", shape=MNIST) == 397_510  # 784-500-10
    assert n_params("mlp", shape=MNIST, hidden=[]) == 7_850
    assert n_params("lenet", shape=MNIST) == 431_080  # Caffe LeNet
    assert n_params("cnn1d", shape=MNIST1D) == 5_210  # MNIST-1D ConvBase (125-dim flatten)


def test_count_parameters_skips_frozen() -> None:
    model = build_model("mlp", MNIST, 10)
    model.body.fc1.requires_grad_(False)
    assert count_parameters(model) == 397_510 - 392_500


# --- forward shapes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "shape"), CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
def test_forward_shape(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, shape, 7, **REQUIRED.get(name, {}))
    assert isinstance(model.tap_spec, TapSpec)
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_models_adapt_to_channels_and_size() -> None:
    model = build_model("resnet20", (5, 20, 12), 3)
    assert model.conv1.in_channels == 5
    assert model(torch.randn(2, 5, 20, 12)).shape == (2, 3)
    assert build_model("lenet", (3, 32, 32), 10).conv1.in_channels == 3
    assert build_model("cnn1d", (2, 100), 4)(torch.randn(3, 2, 100)).shape == (3, 4)
    assert build_model("resnet8", (1, 8, 8), 2)(torch.randn(1, 1, 8, 8)).shape == (1, 2)


def test_width_multiplies_filters() -> None:
    model = build_model("resnet20", CIFAR, 10, width=2)
    assert model.conv1.out_channels == 32 and model.fc.in_features == 128
    assert model(torch.randn(2, *CIFAR)).shape == (2, 10)
    assert build_model("resnet_cifar", CIFAR, 10, depth=14, width=0.5).fc.in_features == 32


def test_lenet_padding_rule() -> None:
    assert build_model("lenet", MNIST, 10).conv1.padding == (0, 0)  # classic 28 -> 24 -> 12 -> 8 -> 4
    small = build_model("lenet", DIGITS, 10)  # 8x8 digits: padding 2 -> 8 -> 4 -> 4 -> 2
    assert small.conv1.padding == (2, 2) and small.fc1.in_features == 50 * 2 * 2
    assert build_model("lenet", (1, 16, 16), 10).conv1.padding == (0, 0)
    assert build_model("lenet", (1, 15, 15), 10).conv1.padding == (2, 2)
    padded = build_model("lenet", MNIST, 10, padding=2)
    assert padded.fc1.in_features == 50 * 7 * 7
    assert build_model("lenet", MNIST, 10, channels=[6, 16], fc=120).fc1.in_features == 16 * 4 * 4


def test_mlp_options() -> None:
    model = build_model("mlp", MNIST1D, 10, hidden=[64, 32], dropout=0.5)
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [64, 32, 10]
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 2
    assert not any(getattr(m, "inplace", False) for m in model.modules())
    assert build_model("mlp", MNIST, 10, hidden=100).body.fc1.out_features == 100


# --- config errors -----------------------------------------------------------------------------------------

def test_bad_input_shape_message() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("resnet20", MNIST1D, 10)
    assert str(err.value) == "model 'resnet20' needs input (C, H, W) with H, W >= 8; got (1, 40)"


@pytest.mark.parametrize(("name", "shape"), [
    ("cnn1d", CIFAR), ("cnn1d", (40,)), ("cnn1d", (1, 2)), ("lenet", MNIST1D), ("lenet", (1, 3, 3)),
    ("resnet20", (3, 4, 32)), ("resnet32x4", MNIST1D), ("resnet_cifar", (3, 32)), ("mlp", (0, 3)),
    ("mlp", ()), ("mlp", "abc"),
])
def test_rejects_inputs_the_model_cannot_take(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=f"model '{name}' needs"):
        build_model(name, shape, 10, **REQUIRED.get(name, {}))


def test_unknown_option_names_option_and_allowed() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("mlp", MNIST, 10, hiden=[10])
    msg = str(err.value)
    assert "'hiden'" in msg and "did you mean 'hidden'" in msg and "allowed: hidden, dropout" in msg
    with pytest.raises(ConfigError, match="'depth'.*allowed: width, shortcut"):
        build_model("resnet20", CIFAR, 10, depth=32)


def test_missing_required_option() -> None:
    with pytest.raises(ConfigError, match="model 'resnet_cifar' needs option 'depth'"):
        build_model("resnet_cifar", CIFAR, 10)


@pytest.mark.parametrize("num_classes", [0, -3, 2.5, True])
def test_rejects_bad_num_classes(num_classes: object) -> None:
    with pytest.raises(ConfigError, match=r"num_classes \(its output width\) >= 1"):
        build_model("mlp", MNIST, num_classes)


def test_unknown_model_name() -> None:
    with pytest.raises(ConfigError, match="unknown model 'resnet2O'.*resnet20"):
        build_model("resnet2O", CIFAR, 10)


@pytest.mark.parametrize(("name", "shape", "options", "match"), [
    ("mlp", MNIST, {"hidden": [500, -1]}, "'hidden' must be a positive int"),
    ("mlp", MNIST, {"dropout": 1.5}, "'dropout' must be a number in"),
    ("resnet_cifar", CIFAR, {"depth": 21}, "'depth' must be 6n\\+2"),
    ("resnet_cifar", CIFAR, {"depth": 20, "shortcut": "C"}, "'shortcut' must be 'A' or 'B'"),
    ("resnet20", CIFAR, {"width": 0}, "'width' must be a positive number"),
    ("lenet", DIGITS, {"padding": 0}, "padding=0 cannot take input \\(1, 8, 8\\)"),
    ("lenet", MNIST, {"padding": -1}, "'padding' must be an int >= 0"),
    ("lenet", MNIST, {"channels": [20]}, "'channels' must be two ints"),
    ("cnn1d", MNIST1D, {"channels": 0}, "'channels' must be a positive int"),
])
def test_rejects_bad_option_values(name: str, shape: tuple[int, ...], options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model(name, shape, 10, **options)


# --- structure and init -----------------------------------------------------------------------------------

def test_resnet20_structure_option_a() -> None:
    model = build_model("resnet20", CIFAR, 10)
    top = [name for name, _ in model.named_children()]
    assert top == ["conv1", "bn1", "relu", "layer1", "layer2", "layer3", "avgpool", "fc"]
    assert [len(getattr(model, f"layer{i}")) for i in (1, 2, 3)] == [3, 3, 3]
    shortcuts = [m for m in model.modules() if isinstance(m, PadShortcut)]
    assert len(shortcuts) == 2 and all(not list(m.parameters()) for m in shortcuts)
    assert not any(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in model.modules())
    assert not any(getattr(m, "inplace", False) for m in model.modules())


def test_repdistiller_state_dict_names() -> None:
    keys = set(build_model("resnet8x4", CIFAR, 100).state_dict())
    for key in ("conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight", "layer1.0.downsample.0.weight",
                "layer1.0.downsample.1.weight", "layer3.0.downsample.0.weight", "fc.weight", "fc.bias"):
        assert key in keys
    assert build_model("resnet8x4", CIFAR, 100).layer1[0].downsample[0].weight.shape == (64, 32, 1, 1)


def test_resnet_init() -> None:
    model = build_model("resnet56", CIFAR, 10)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    conv = model.layer3[0].conv2  # 64 -> 64, 3x3: kaiming normal, fan_out = 576
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / 576), rel=0.1)
