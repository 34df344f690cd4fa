"""The frozen teacher as an inference model: BatchNorm folding, one-time casts, inference mode.

Folded and unfolded teachers agree on the logits and every tap the feature methods read (random, non-trivial BN
statistics, so the fold is exercised); the number folded matches a count read off each architecture; BatchNorms
that do not read a convolution's output alone are left alone; a bf16 teacher works outside autocast.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from teachkit.models import FrozenTeacher, Tapped, TapSpec, build_model
from teachkit.models.inference import fold_batchnorm, inference_teacher

ALL = ("logits", "embedding", "stages", "stages_pre")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _randomise_bn(model: nn.Module) -> nn.Module:
    """Eval mode, with running statistics and affine parameters far from the identity map."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model.eval()


def _names(model: nn.Module, cls: type = _BatchNorm) -> list[str]:
    return [p for p, m in model.named_modules() if isinstance(m, cls)]


def _ends(suffix: str):
    return lambda model: sum(p.endswith(suffix) for p in _names(model))


# (model, options, input shape, BatchNorms that fold, counted from the architecture: every BN of a post-activation
# net; a WRN's bn2, plus block1.layer.0.bn1 when group 1 widens (width 2: the stem's output then feeds only that BN;
# at width 1 it is also the identity shortcut), every other bn1 reading a residual sum; a DenseNet's bottleneck bn2
# (bn1 and the transitions' bn read concatenations))
ZOO = [
    ("resnet8", {}, (3, 16, 16), lambda m: len(_names(m))),
    ("resnet20", {}, (3, 16, 16), lambda m: len(_names(m))),
    ("resnet8x4", {}, (3, 16, 16), lambda m: len(_names(m))),
    ("resnet18", {}, (3, 32, 32), lambda m: len(_names(m))),
    ("wrn_16_1", {}, (3, 16, 16), _ends("bn2")),
    ("wrn_16_2", {}, (3, 16, 16), lambda m: _ends("bn2")(m) + 1),
    ("vgg8", {}, (3, 32, 32), lambda m: len(_names(m))),
    ("mobilenetv2", {}, (3, 32, 32), lambda m: len(_names(m))),
    ("shufflenetv1", {}, (3, 16, 16), lambda m: len(_names(m))),
    ("shufflenetv2", {}, (3, 16, 16), lambda m: len(_names(m))),
    ("densenet_bc", {"depth": 16, "growth": 4}, (3, 16, 16), _ends("bn2")),
]


def _taps(model: nn.Module, x: Tensor) -> list[Tensor]:
    with Tapped(model, want=ALL) as tapped, torch.no_grad():
        t = tapped(x)
    return [t.logits, t.embedding, *t.stages, *t.stages_pre]


@pytest.mark.parametrize(("name", "options", "shape", "expected"), ZOO, ids=[z[0] for z in ZOO])
def test_folded_zoo_models_agree_on_logits_and_every_tap(name, options, shape, expected) -> None:
    model = _randomise_bn(build_model(name, shape, 10, **options))
    x = torch.randn(3, *shape)
    before = _taps(model, x)
    n_bn = len(_names(model))
    folded = inference_teacher(model, x[:2])
    assert folded.bn_folded == expected(model) > 0
    assert len(_names(model)) == n_bn  # the original is untouched
    assert len(_names(folded)) == n_bn - folded.bn_folded
    assert len(_names(folded, nn.Identity)) >= folded.bn_folded  # each folded BN is an Identity at its path
    after = _taps(folded, x)  # the taps resolve on the folded model: same paths
    assert len(after) == len(before)
    for a, b in zip(before, after, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(a.abs().max()))


def test_densenet_pre_activation_batchnorms_are_left_alone() -> None:
    model = _randomise_bn(build_model("densenet_bc", (3, 16, 16), 10, depth=16, growth=4))
    folded = inference_teacher(model, torch.randn(2, 3, 16, 16))
    modules = dict(folded.named_modules())
    for path, m in model.named_modules():
        if isinstance(m, _BatchNorm):
            kept = not path.endswith("bn2")  # bn1 and the transitions' / head's bn read concatenations
            assert isinstance(modules[path], nn.BatchNorm2d) == kept, path
            if kept:
                assert torch.equal(modules[path].running_mean, m.running_mean)


def _fold_by_hand(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[Tensor, Tensor]:
    s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(s)
    return conv.weight * s.view(-1, 1, 1, 1), (bias - bn.running_mean) * s + bn.bias


def test_the_folded_weights_are_the_formula() -> None:
    net = _randomise_bn(nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4), nn.ReLU()))
    w, b = _fold_by_hand(net[0], net[1])
    assert fold_batchnorm(net, torch.randn(2, 3, 8, 8)) == 1
    assert isinstance(net[1], nn.Identity)
    assert torch.allclose(net[0].weight, w, atol=1e-6) and torch.allclose(net[0].bias, b, atol=1e-6)


def test_batchnorm1d_after_a_linear_layer_folds() -> None:
    net = _randomise_bn(nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)))
    x = torch.randn(4, 5)
    with torch.no_grad():
        before = net(x)
    assert fold_batchnorm(net, x) == 1
    with torch.no_grad():
        assert torch.allclose(net(x), before, atol=1e-5)


def test_a_tapped_convolution_or_batchnorm_input_is_not_folded() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    x = torch.randn(2, 3, 16, 16)
    model.tap_spec = TapSpec(extra={"stem": ("conv1", "output"), "pre": ("layer1.0.bn2", "input")})
    folded = inference_teacher(model, x)
    assert folded.bn_folded == len(_names(model)) - 2
    assert isinstance(folded.bn1, nn.BatchNorm2d) and isinstance(folded.layer1[0].bn2, nn.BatchNorm2d)
    assert torch.equal(folded.conv1.weight, model.conv1.weight)
    for want in ("stem", "pre"):
        with Tapped(model, want=(want,)) as a, Tapped(folded, want=(want,)) as b, torch.no_grad():
            assert torch.allclose(a(x).extra[want], b(x).extra[want], atol=1e-6)


class _SharedStem(nn.Module):
    """conv -> BN, the conv's output also added back (a shortcut): folding would change the shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class _InPlace(nn.Module):
    """conv, an in-place change of its output, then BN: the BN does not read the conv's output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x).mul_(2.0))


class _HiddenReader(nn.Module):
    """conv -> BN, the conv's output also read outside autograd (a mask): only the output check sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        return self.bn(y) * (y > 0).float()


@pytest.mark.parametrize("cls", [_SharedStem, _InPlace])
def test_a_batchnorm_that_does_not_read_only_the_conv_output_is_not_folded(cls) -> None:
    model = _randomise_bn(cls())
    assert fold_batchnorm(model, torch.randn(2, 3, 8, 8)) == 0
    assert isinstance(model.bn, nn.BatchNorm2d)


def test_a_fold_that_changes_the_outputs_is_undone_with_a_warning() -> None:
    model = _randomise_bn(_HiddenReader())
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(RuntimeWarning, match="runs unfolded"):
        folded = inference_teacher(model, x)
    assert folded.bn_folded == 0 and isinstance(folded.bn, nn.BatchNorm2d)
    with torch.no_grad():
        assert torch.equal(folded(x), model(x))


def test_training_mode_and_kept_batchnorms_are_not_folded() -> None:
    x = torch.randn(2, 3, 16, 16)
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    kept, n_bn = model.tap_spec.stages_bn, len(_names(model))
    assert fold_batchnorm(model, x, keep=kept) == n_bn - len(kept) == 4
    assert sorted(_names(model)) == sorted(kept)
    training = build_model("resnet8", (3, 16, 16), 10).train()
    assert fold_batchnorm(training, x) == 0


def test_inference_teacher_casts_weights_and_layout_once() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    out = inference_teacher(model, torch.randn(2, 3, 16, 16), dtype=torch.bfloat16, channels_last=True)
    assert all(p.dtype == torch.bfloat16 for p in out.parameters())
    assert out.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the original is untouched
    plain = inference_teacher(model, None, fold_bn=True)  # no example: nothing folded
    assert plain.bn_folded == 0 and len(_names(plain)) == len(_names(model))


def _bf16_teacher(model: nn.Module, x: Tensor) -> FrozenTeacher:
    return FrozenTeacher(inference_teacher(model, x[:2], dtype=torch.bfloat16), inference=True)


def test_a_bf16_teacher_works_outside_autocast_and_agrees_with_fp32() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    x = torch.randn(4, 3, 16, 16)
    reference = FrozenTeacher(model)
    teacher = _bf16_teacher(model, x)
    got, want = teacher(x), reference(x)
    assert got.dtype == torch.float32 and not got.is_inference()  # as the fp32 teacher returns them
    assert torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max()))
    with Tapped(teacher, want=ALL, side="teacher") as tapped, Tapped(reference, want=ALL) as ref:
        a, b = tapped(x), ref(x)
    for got_tap, want_tap in zip([a.embedding, *a.stages, *a.stages_pre], [b.embedding, *b.stages, *b.stages_pre],
                                 strict=True):
        assert got_tap.dtype == torch.float32 and not got_tap.is_inference()
        assert torch.allclose(got_tap, want_tap, rtol=0.05, atol=0.05 * float(want_tap.abs().max()))


def test_inference_outputs_can_be_saved_for_a_losss_backward() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    x = torch.randn(4, 3, 16, 16)
    teacher = FrozenTeacher(inference_teacher(model, x[:2]), inference=True)
    student = nn.Linear(64, 64)
    with Tapped(teacher, want=("logits", "embedding")) as tapped:
        t = tapped(x)
    assert not t.logits.is_inference() and not t.embedding.is_inference()
    # a product saves the teacher's tensor for backward: an inference tensor would raise here
    (student(t.embedding) * t.embedding).sum().backward()
    assert student.weight.grad is not None


def test_under_autocast_a_bf16_teacher_returns_the_autocast_dtype() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    x = torch.randn(4, 3, 16, 16)
    teacher = _bf16_teacher(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = teacher(x), FrozenTeacher(model)(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want.float(), rtol=0.05, atol=0.05 * float(want.abs().max()))


def test_a_plain_frozen_teacher_is_unchanged() -> None:
    model = _randomise_bn(build_model("resnet8", (3, 16, 16), 10))
    x = torch.randn(4, 3, 16, 16)
    teacher = FrozenTeacher(model)
    assert not teacher.inference and teacher.compute_dtype is None
    with torch.no_grad():
        assert torch.equal(teacher(x), model(x))
