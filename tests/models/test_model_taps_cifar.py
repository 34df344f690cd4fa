"""Feature taps of the benchmark nets: one model per family, stage shapes, pre/post activations, paths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from teachkit.models import Tapped, TapSpec, build_model

ALL = ("logits", "embedding", "stages", "stages_pre")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# (name, input shape, options, stage map shapes (C, H, W), embedding dim, relation of stages_pre to stages,
#  whether the embedding is the pooled last stage map)
FAMILIES = [
    ("wrn_16_2", (3, 32, 32), {}, [(32, 32, 32), (64, 16, 16), (128, 8, 8)], 128, "relu", True),
    ("vgg8", (3, 32, 32), {}, [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4), (512, 4, 4)], 512, "relu",
     True),
    ("vgg8", (3, 64, 64), {}, [(64, 64, 64), (128, 32, 32), (256, 16, 16), (512, 8, 8), (512, 4, 4)], 512, "relu",
     True),
    # linear bottlenecks: no activation ends a stage, stages_pre is the very same tensor
    ("mobilenetv2", (3, 32, 32), {}, [(12, 16, 16), (16, 8, 8), (48, 4, 4), (160, 2, 2)], 1280, "same", False),
    ("shufflenetv1", (3, 32, 32), {}, [(240, 16, 16), (480, 8, 8), (960, 4, 4)], 960, "relu", True),
    ("shufflenetv2", (3, 32, 32), {}, [(116, 16, 16), (232, 8, 8), (464, 4, 4)], 1024, "relu", False),
    ("densenet_bc", (3, 32, 32), {}, [(216, 32, 32), (300, 16, 16), (342, 8, 8)], 342, "relu", True),
    ("resnet18", (3, 32, 32), {}, [(64, 8, 8), (128, 4, 4), (256, 2, 2), (512, 1, 1)], 512, "relu", True),
    ("resnet50_cifar", (3, 16, 16), {}, [(256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2)], 2048, "relu",
     True),
]


@pytest.mark.parametrize(("name", "shape", "options", "stages", "emb", "relation", "pooled"), FAMILIES,
                         ids=[f"{f[0]}-{f[1][1]}" for f in FAMILIES])
def test_family_taps(name: str, shape: tuple[int, ...], options: dict, stages: list[tuple[int, ...]], emb: int,
                     relation: str, pooled: bool) -> None:
    model = build_model(name, shape, 10, **options).eval()
    spec = model.tap_spec
    modules = dict(model.named_modules())
    assert all(p in modules for p in (spec.embedding, *spec.stages, *spec.stages_pre))
    assert isinstance(modules[spec.embedding], nn.Linear) and modules[spec.embedding].in_features == emb
    x = torch.randn(2, *shape)
    with torch.no_grad(), Tapped(model, want=ALL) as tapped:
        taps = tapped(x)
        ref = model(x)
    assert torch.equal(taps.logits, ref)
    assert [tuple(t.shape[1:]) for t in taps.stages] == stages
    assert [t.shape for t in taps.stages_pre] == [t.shape for t in taps.stages]
    assert taps.embedding.shape == (2, emb)
    for pre, post in zip(taps.stages_pre, taps.stages, strict=True):
        assert (pre < 0).any()  # a real pre-activation, not overwritten by an inplace ReLU
        if relation == "relu":
            assert torch.equal(torch.relu(pre), post)
        else:
            assert torch.equal(pre, post)
    if pooled:
        assert torch.allclose(taps.embedding, taps.stages[-1].mean(dim=(2, 3)), atol=1e-5)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


@pytest.mark.parametrize(("name", "options", "spec"), [
    ("wrn_40_2", {}, TapSpec("fc", ("block2.layer.0.relu1", "block3.layer.0.relu1", "relu"),
                             ("block2.layer.0.bn1", "block3.layer.0.bn1", "bn1"),
                             stages_bn=("block2.layer.0.bn1", "block3.layer.0.bn1", "bn1"))),
    ("vgg13", {}, TapSpec("classifier", ("relu0", "relu1", "relu2", "relu3", "relu4"),
                          ("block0", "block1", "block2", "block3", "block4"),
                          stages_bn=("block0.4", "block1.4", "block2.4", "block3.4", "block4.4"))),
    ("mobilenetv2", {}, TapSpec("classifier.0", ("blocks.1", "blocks.2", "blocks.4", "blocks.6"),
                                ("blocks.1", "blocks.2", "blocks.4", "blocks.6"),
                                stages_bn=("blocks.1.1.conv.7", "blocks.2.2.conv.7", "blocks.4.2.conv.7",
                                           "blocks.6.0.conv.7"))),
    ("shufflenetv1", {}, TapSpec("linear", ("layer1", "layer2", "layer3"),
                                 ("layer1.3.preact", "layer2.7.preact", "layer3.3.preact"),
                                 stages_bn=("layer1.3.bn3", "layer2.7.bn3", "layer3.3.bn3"))),
    ("shufflenetv2", {}, TapSpec("linear", ("layer1", "layer2", "layer3"),
                                 ("layer1.3.preact", "layer2.7.preact", "layer3.3.preact"))),
    ("densenet_bc", {"depth": 40}, TapSpec("fc", ("trans1.relu", "trans2.relu", "relu"),
                                           ("trans1.bn", "trans2.bn", "bn"),
                                           stages_bn=("trans1.bn", "trans2.bn", "bn"))),
    ("resnet34", {}, TapSpec("fc", ("layer1", "layer2", "layer3", "layer4"),
                             ("layer1.2.preact", "layer2.3.preact", "layer3.5.preact", "layer4.2.preact"),
                             stages_bn=("layer1.2.bn2", "layer2.3.bn2", "layer3.5.bn2", "layer4.2.bn2"))),
    ("resnet50_cifar", {}, TapSpec("linear", ("layer1", "layer2", "layer3", "layer4"),
                                   ("layer1.2.preact", "layer2.3.preact", "layer3.5.preact", "layer4.2.preact"),
                                   stages_bn=("layer1.2.bn3", "layer2.3.bn3", "layer3.5.bn3", "layer4.2.bn3"))),
])
def test_tap_specs(name: str, options: dict, spec: TapSpec) -> None:
    assert build_model(name, (3, 32, 32), 100, **options).tap_spec == spec


def test_wrn_raw_residual_sums_are_the_group_outputs() -> None:
    # Pre-activation WRN: a group's output is a plain residual sum; stages_pre is BN(sum), stages ReLU(BN(sum)).
    model = build_model("wrn", (3, 16, 16), 10, depth=10, width=2).eval()
    raw_spec = TapSpec(stages=("block1", "block2", "block3"))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        raw = Tapped(model, raw_spec, want=("stages",))(x).stages
        taps = Tapped(model, want=ALL)(x)
        bns = [model.block2.layer[0].bn1, model.block3.layer[0].bn1, model.bn1]
        for sum_map, bn, pre, post in zip(raw, bns, taps.stages_pre, taps.stages, strict=True):
            assert torch.equal(bn(sum_map), pre)
            assert torch.equal(torch.relu(pre), post)
            assert not torch.equal(torch.relu(sum_map), post)  # relu(raw sum) is not the stage output


def test_densenet_block_outputs_feed_the_stage_bns() -> None:
    model = build_model("densenet_bc", (3, 8, 8), 10, depth=10, growth=4).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        raw = Tapped(model, TapSpec(stages=("block1", "block2", "block3")), want=("stages",))(x).stages
        taps = Tapped(model, want=ALL)(x)
        for sum_map, bn, pre in zip(raw, [model.trans1.bn, model.trans2.bn, model.bn], taps.stages_pre, strict=True):
            assert torch.equal(bn(sum_map), pre)
    assert [t.shape[1] for t in taps.stages] == [12, 10, 9]


def test_gradients_flow_through_wrn_taps() -> None:
    model = build_model("wrn", (3, 16, 16), 10, depth=10)
    taps = Tapped(model, want=ALL)(torch.randn(2, 3, 16, 16))
    loss = sum(t.pow(2).mean() for t in taps.stages) + taps.stages_pre[0].mean()
    loss.backward()
    assert model.conv1.weight.grad.abs().sum() > 0
    assert model.block3.layer[0].conv1.weight.grad.abs().sum() > 0  # reaches the last stage via bn1, relu
    assert model.fc.weight.grad is None
