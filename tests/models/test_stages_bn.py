"""``TapSpec.stages_bn``: the BatchNorm before each stage's ReLU (mdistiller's ``get_bn_before_relu``), read by
OFD for its margins. Every zoo model with BatchNorm declares one per ``stages_pre`` entry."""

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models import MODELS, Tapped, TapSpec, build_model

#: image zoo models and the options that keep them small; every registered model with a BatchNorm must be here
BN_MODELS = {
    "resnet8": {}, "resnet14": {}, "resnet20": {}, "resnet32": {}, "resnet44": {}, "resnet56": {}, "resnet110": {},
    "resnet_cifar": {"depth": 14, "shortcut": "B"}, "resnet8x4": {}, "resnet32x4": {},
    "resnet18": {}, "resnet34": {}, "resnet50": {}, "resnet50_cifar": {},
    "wrn": {"depth": 10, "width": 2}, "wrn_16_1": {}, "wrn_16_2": {}, "wrn_40_1": {}, "wrn_40_2": {},
    "wrn_28_10": {}, "wrn_40_10": {},
    "vgg8": {}, "vgg11": {}, "vgg13": {}, "vgg16": {}, "vgg19": {},
    "mobilenetv2": {}, "mobilenetv2@1.0": {"width_mult": 1.0},
    "shufflenetv1": {}, "densenet_bc": {"depth": 16},
}
#: no single BatchNorm feeds its stage's ReLU: a V2 block's last BN covers half the channels, the other half
#: passes through (mdistiller refuses ShuffleNets as OFD teachers too)
NO_BN_BEFORE_RELU = {"shufflenetv2"}

#: what mdistiller's get_bn_before_relu() returns, in teachkit's module paths
MDISTILLER = {
    "resnet20": ("layer1.2.bn2", "layer2.2.bn2", "layer3.2.bn2"),
    "resnet8x4": ("layer1.0.bn2", "layer2.0.bn2", "layer3.0.bn2"),
    "resnet50_cifar": ("layer1.2.bn3", "layer2.3.bn3", "layer3.5.bn3", "layer4.2.bn3"),
    "resnet34": ("layer1.2.bn2", "layer2.3.bn2", "layer3.5.bn2", "layer4.2.bn2"),
    "wrn_40_2": ("block2.layer.0.bn1", "block3.layer.0.bn1", "bn1"),
    "vgg13": ("block0.4", "block1.4", "block2.4", "block3.4", "block4.4"),
    "vgg8": ("block0.1", "block1.1", "block2.1", "block3.1", "block4.1"),
    "mobilenetv2": ("blocks.1.1.conv.7", "blocks.2.2.conv.7", "blocks.4.2.conv.7", "blocks.6.0.conv.7"),
}


def _build(key: str) -> nn.Module:
    return build_model(key.split("@")[0], (3, 32, 32), 10, **BN_MODELS[key])


def test_every_model_with_batchnorm_is_covered():
    names = {k.split("@")[0] for k in BN_MODELS} | NO_BN_BEFORE_RELU
    for name in MODELS.names():
        if name in names:
            continue
        try:
            model = build_model(name, (3, 32, 32), 10)
        except ConfigError:  # text / sequence models, or a required option: none of these has a BatchNorm
            continue
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()), name
        assert model.tap_spec.stages_bn == (), name


def _run(model: nn.Module) -> tuple[list[nn.Module], list[torch.Tensor], list[torch.Tensor]]:
    """(the stages_bn modules, their outputs, the stages_pre maps) on one random input."""
    modules = dict(model.named_modules())
    bns = [modules[p] for p in model.tap_spec.stages_bn]
    outputs: dict[int, torch.Tensor] = {}
    handles = [bn.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, out)) for i, bn in enumerate(bns)]
    try:
        with Tapped(model, want=("stages_pre",)) as tap, torch.no_grad():
            pre = tap(torch.randn(1, 3, 32, 32)).stages_pre
    finally:
        for h in handles:
            h.remove()
    return bns, [outputs[i] for i in range(len(bns))], pre


@pytest.mark.parametrize("key", sorted(BN_MODELS))
def test_one_batchnorm_per_stage_before_its_relu(key):
    model = _build(key).eval()
    spec = model.tap_spec
    assert len(spec.stages_bn) == len(spec.stages_pre) > 0
    bns, outputs, pre = _run(model)
    for i, (bn, out, f) in enumerate(zip(bns, outputs, pre, strict=True)):
        assert type(bn) is nn.BatchNorm2d and bn.affine, (key, i)
        assert bn.num_features == f.shape[1], (key, i)
        assert out.shape == f.shape, (key, i)  # the BN runs at the stage's resolution, feeding its ReLU
    if key in MDISTILLER:
        assert spec.stages_bn == MDISTILLER[key]


@pytest.mark.parametrize("key", ["wrn_16_2", "densenet_bc", "vgg8", "vgg13"])
def test_bn_output_is_the_pre_activation_where_no_residual_is_added(key):
    _, outputs, pre = _run(_build(key).eval())
    assert all(torch.equal(out, f) for out, f in zip(outputs, pre, strict=True))


@pytest.mark.parametrize("name", sorted(NO_BN_BEFORE_RELU))
def test_models_without_one_bn_before_the_relu_declare_none(name):
    assert build_model(name, (3, 32, 32), 10).tap_spec.stages_bn == ()


def test_from_dict_parses_stages_bn_like_stages_pre():
    spec = TapSpec.from_dict({"stages_pre": ["a.preact", 3], "stages_bn": ["a.bn2", 3]})
    assert spec.stages_bn == ("a.bn2", "3") and spec.stages_pre == ("a.preact", "3")
    assert TapSpec.from_dict({"stages_bn": "bn"}).stages_bn == ("bn",)
    assert TapSpec.from_dict({"stages_pre": ["x"]}).stages_bn == ()  # older configs: none declared
    assert TapSpec().stages_bn == ()
    assert TapSpec("fc", ("s",), ("p",)) == TapSpec(embedding="fc", stages=("s",), stages_pre=("p",))
    with pytest.raises(ConfigError, match=r"^model.taps.stages_bn must be a module path or a list of paths"):
        TapSpec.from_dict({"stages_bn": {"a": 1}})
    with pytest.raises(ConfigError, match=r"^unknown key model.taps.stage_bn \(did you mean 'stages_bn'\?\); allowed: "
                                              r"embedding, stages, "
                                          r"stages_pre, stages_bn, extra, logits"):
        TapSpec.from_dict({"stage_bn": ["x"]})


def test_stages_bn_is_not_hooked():
    model = build_model("resnet8", (3, 16, 16), 10)
    spec = TapSpec(stages_pre=model.tap_spec.stages_pre, stages_bn=("no.such.module",) * 3)
    with Tapped(model, spec, want=("stages_pre",)) as tap, torch.no_grad():
        assert len(tap(torch.randn(1, 3, 16, 16)).stages_pre) == 3
