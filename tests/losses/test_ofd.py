import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective
from teachkit.losses.ofd import OFD, OFDOptions, bn_margin, normal_cdf, partial_l2
from teachkit.models import FrozenTeacher, Tapped, TapSpec
from teachkit.types import Batch, Taps

from .helpers import make_pair, probe

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)


# ----------------------------------------------------------------------------------------------------------------
# THE REFERENCE'S FORMULAS, transcribed from mdistiller (megvii-research/mdistiller, mdistiller/distillers/OFD.py:
# ``feat_loss``, ``OFD.init_ofd_modules`` (the margins, with scipy's norm.cdf) and ``OFD.ofd_loss``). They are
# written inline here only as a cross-check of teachkit.losses.ofd. The one change: the margins are returned in
# float64 instead of ``torch.FloatTensor``, so that the comparison runs in float64 throughout.
# ----------------------------------------------------------------------------------------------------------------
def _reference_feat_loss(source, target, margin):
    margin = margin.to(source)
    loss = (
        (source - margin) ** 2 * ((source > margin) & (target <= margin)).float()
        + (source - target) ** 2
        * ((source > target) & (target > margin) & (target <= 0)).float()
        + (source - target) ** 2 * (target > 0).float()
    )
    return torch.abs(loss).mean(dim=0).sum()


def _reference_get_margin_from_bn(bn_before_relu):
    margins = []
    for bn in bn_before_relu:
        margin = []
        std = bn.weight.data
        mean = bn.bias.data
        for (s, m) in zip(std, mean, strict=True):
            s = abs(s.item())
            m = m.item()
            if norm.cdf(-m / s) > 0.001:
                margin.append(-s * math.exp(-((m / s) ** 2) / 2) / math.sqrt(2 * math.pi) / norm.cdf(-m / s) + m)
            else:
                margin.append(-3 * s)
        margin = torch.tensor(margin, dtype=torch.float64)  # reference: torch.FloatTensor(margin)
        margins.append(margin.unsqueeze(1).unsqueeze(2).unsqueeze(0).detach())
    return margins


def _reference_ofd_loss(feature_student, feature_teacher, connectors, margins):
    def align_list(*input_list):
        min_len = min([len(a) for a in input_list])
        return [a[-min_len:] for a in input_list]

    feature_student, feature_teacher = align_list(feature_student, feature_teacher)
    feature_student = [connectors[idx](feat) for idx, feat in enumerate(feature_student)]
    loss_distill = 0
    feat_num = len(feature_student)
    for i in range(feat_num):
        loss_distill = loss_distill + _reference_feat_loss(
            feature_student[i],
            F.adaptive_avg_pool2d(feature_teacher[i], feature_student[i].shape[-2:]).detach(),
            margins[i],
        ) / 2 ** (feat_num - i - 1)
    return loss_distill
# ----------------------------------------------------------------------------------------------------------------


def _randomise_bns(model, seed=1):
    """Spread the BN affine parameters so that the margins differ per channel, with negative weights and
    some channels in the -3 s fallback (Phi(-m/s) <= 0.001 when the bias exceeds ~3.1 |weight|)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.weight.copy_(torch.randn(c, generator=g, dtype=torch.float64) * 0.8)
                m.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64) * 1.5)
                m.bias[: max(1, c // 8)] = 4.0 * m.weight[: max(1, c // 8)].abs() + 0.5  # fallback channels
                m.running_mean.copy_(torch.randn(c, generator=g, dtype=torch.float64) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g, dtype=torch.float64) + 0.5)


def _float64_pair(student_name, teacher_name):
    student, teacher = make_pair(student_name, teacher_name, shape=SHAPE)
    student, teacher = student.double(), teacher.double()
    _randomise_bns(teacher)
    return student, teacher


def _leaves(maps):
    return [m.detach().clone().requires_grad_(True) for m in maps]


def test_margin_hand_computed():
    # s = |weight|, m = bias; margin = m - s phi(m/s) / Phi(-m/s) unless Phi(-m/s) <= 0.001, then -3 s:
    #   (1, 0):    -phi(0) / Phi(0) = -(1/sqrt(2 pi)) / 0.5 = -2 / sqrt(2 pi) = -0.7978845608
    #   (-2, 0):   s = 2, twice that: -1.5957691216
    #   (1, -1):   -1 - phi(1) / Phi(1) = -1 - 0.2419707245 / 0.8413447461 = -1.2875999709
    #   (1, 4):    Phi(-4) = 3.2e-5 <= 0.001 -> -3
    #   (0.5, 3):  Phi(-6) <= 0.001 -> -1.5
    #   (0, -0.5): the reference divides by zero; the limit of a point mass at -0.5 is -0.5
    #   (0, 1):    Phi(-inf) = 0 -> -3 * 0 = 0
    weight = torch.tensor([1.0, -2.0, 1.0, 1.0, 0.5, 0.0, 0.0], dtype=torch.float64)
    bias = torch.tensor([0.0, 0.0, -1.0, 4.0, 3.0, -0.5, 1.0], dtype=torch.float64)
    expected = [-2 / math.sqrt(2 * math.pi), -4 / math.sqrt(2 * math.pi), -1.2875999709, -3.0, -1.5, -0.5, 0.0]
    got = bn_margin(weight, bias)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert (got <= 0).all()


def test_margin_equals_scipy_reference_in_float64():
    bn = nn.BatchNorm2d(512).double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        bn.weight.copy_(torch.randn(512, generator=g, dtype=torch.float64))
        bn.bias.copy_(torch.randn(512, generator=g, dtype=torch.float64) * 3)
    ref = _reference_get_margin_from_bn([bn])[0].flatten()
    fallback = norm.cdf(-bn.bias.detach().numpy() / bn.weight.detach().abs().numpy()) <= 0.001
    assert 10 < fallback.sum() < 500  # both branches are exercised
    torch.testing.assert_close(bn_margin(bn.weight, bn.bias), ref, rtol=1e-12, atol=1e-14)
    x = torch.linspace(-8, 8, 161, dtype=torch.float64)
    torch.testing.assert_close(normal_cdf(x), torch.from_numpy(norm.cdf(x.numpy())), rtol=1e-13, atol=0)


def test_partial_l2_hand_computed():
    # One channel, margin -1; (teacher t, student s) per position and what Eqs. 2-3 give (t' = max(t, -1)):
    #   sample 0: (-2, -0.5): t' = -1, s > t' -> 0.25 | (-2, -1.5): s <= t' <= 0 -> 0
    #             (-0.5, -0.2): s > t -> 0.09       | (-0.5, -0.7): s <= t <= 0 -> 0
    #   sample 1: (1, 3): t > 0 -> 4 | (1, 0): t > 0 -> 1 | (0, 0.5): s > t -> 0.25 | (0, -3): s <= t = 0 -> 0
    # sum 5.59 over the batch of 2 -> 2.795; d/ds = 2 (s - t') * mask / 2.
    t = torch.tensor([[[[-2.0, -2.0, -0.5, -0.5]]], [[[1.0, 1.0, 0.0, 0.0]]]], dtype=torch.float64)
    s = torch.tensor([[[[-0.5, -1.5, -0.2, -0.7]]], [[[3.0, 0.0, 0.5, -3.0]]]], dtype=torch.float64,
                     requires_grad=True)
    margin = torch.tensor([-1.0], dtype=torch.float64)
    loss = partial_l2(s, t, margin)
    assert loss.item() == pytest.approx(2.795, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, s)
    expected = torch.tensor([[[[0.5, 0.0, 0.3, 0.0]]], [[[2.0, -1.0, 0.5, 0.0]]]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    ref = _reference_feat_loss(s, t, margin.view(1, -1, 1, 1))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)


@pytest.mark.parametrize(("student_name", "teacher_name", "options", "stages"), [
    ("resnet8", "resnet14", {}, 3),  # same sizes, 16 -> 16 / 32 / 64 channels
    ("vgg8", "resnet14", {}, 3),     # student 5 stages aligned to the teacher's 3; teacher maps pooled down
    ("resnet8", "vgg8", {"kernel_size": 3}, 3),  # teacher maps (4, 2, 2) pooled "up" to (16, 8, 4) as mdistiller
    ("vgg8", "vgg13", {"num_stages": 4}, 4),     # mdistiller's VGG pair: preact_feats[1:], without block0
])
def test_matches_reference_values_and_gradients_float64(student_name, teacher_name, options, stages):
    student, teacher = _float64_pair(student_name, teacher_name)
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, "ofd", x=x)
    loss = OFD(s_probe, t_probe, OFDOptions(**options), teacher_model=t_tap).double().train()
    assert loss.num_stages == stages and len(loss.connectors) == stages
    with torch.no_grad():  # non-trivial connector BN affines (the reference initialises them to 1 and 0)
        for c in loss.connectors:
            c[1].weight.uniform_(0.5, 1.5)
            c[1].bias.uniform_(-0.5, 0.5)
    xb = torch.randn(4, *SHAPE, dtype=torch.float64)
    s_out, t_out = s_tap(xb), t_tap(xb)
    s_maps = _leaves(s_out.stages_pre)
    t_maps = [m.detach() for m in t_out.stages_pre]
    ours = loss(Taps(s_out.logits, stages_pre=s_maps), Taps(t_out.logits, stages_pre=t_maps), None, P)["feat"]
    # the reference's inputs: mdistiller's preact_feats[1:] and get_bn_before_relu() of the distilled stages
    bns = dict(teacher.named_modules())
    bn_list = [bns[p] for p in teacher.tap_spec.stages_bn][-stages:]
    ref = _reference_ofd_loss(s_maps[-stages:], t_maps[-stages:], loss.connectors,
                              _reference_get_margin_from_bn(bn_list))
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    assert ours.item() > 0
    g_ours = torch.autograd.grad(ours, s_maps, allow_unused=True)
    g_ref = torch.autograd.grad(ref, s_maps, allow_unused=True)
    for i, (a, b) in enumerate(zip(g_ours, g_ref, strict=True)):
        if i < len(s_maps) - stages:
            assert a is None and b is None  # stages beyond the pairing take no part
        else:
            assert a.abs().sum() > 0
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)
    for i, margin in enumerate(loss.margins()):
        torch.testing.assert_close(margin, _reference_get_margin_from_bn(bn_list)[i].flatten(), rtol=1e-12, atol=0)


def test_one_training_step_through_build_objective():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    _randomise_bns(teacher)
    teacher = teacher.float()
    x, y = torch.randn(8, *SHAPE), torch.arange(8) % 10
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, "ofd", x=x[:2])
    student.train()
    objective = build_objective("ofd", s_probe, t_probe, num_classes=10, num_samples=64, teacher_model=t_tap)
    assert objective.weights == {"ofd": 0.001} and objective.ce_weight == 1.0
    method = objective.methods["ofd"]
    assert [c[0].in_channels for c in method.connectors] == [16, 32, 64]
    assert all(m.dtype == torch.float32 for m in method.margins())
    teacher_state = {k: v.clone() for k, v in teacher.state_dict().items()}
    params = list(student.parameters()) + list(objective.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    terms = objective(s_tap(x), t_tap(x), Batch(x, y, torch.arange(8)), P)
    assert set(terms) == {"ce", "ofd"} and all(torch.isfinite(v) for v in terms.values())
    opt.zero_grad()
    sum(terms.values()).backward()
    aux = list(method.connectors.parameters())
    assert aux and all(p.grad is not None and p.grad.abs().sum() > 0 for p in aux)
    assert student.layer1[0].conv1.weight.grad.abs().sum() > 0
    opt.step()
    assert all(torch.equal(v, teacher_state[k]) for k, v in teacher.state_dict().items())


def test_margins_are_buffers_in_the_state_dict():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    _randomise_bns(teacher)
    teacher = teacher.float()
    _, t_tap, s_probe, t_probe = probe(student, teacher, "ofd", shape=SHAPE)
    objective = build_objective("ofd", s_probe, t_probe, num_classes=10, num_samples=64, teacher_model=t_tap)
    state = objective.state_dict()
    keys = [f"methods.ofd.margin_{i}" for i in range(3)]
    assert all(k in state for k in keys)
    bns = [dict(teacher.named_modules())[p] for p in teacher.tap_spec.stages_bn]
    for k, bn in zip(keys, bns, strict=True):
        assert state[k].shape == (bn.num_features,)
        torch.testing.assert_close(state[k], bn_margin(bn.weight, bn.bias).float())
    assert not any(b.requires_grad for b in objective.buffers())
    # a resumed objective takes the saved margins, whatever its teacher's BNs now say
    other_student, other_teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    _, t2, s2, tp2 = probe(other_student, other_teacher, "ofd", shape=SHAPE)
    fresh = build_objective("ofd", s2, tp2, num_classes=10, num_samples=64, teacher_model=t2)
    assert not torch.equal(fresh.state_dict()[keys[0]], state[keys[0]])
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state_dict()[k], state[k]) for k in keys)


def _with_spec(model, **changes):
    return dataclasses.replace(model.tap_spec, **changes)


def _bad_cases():
    """(label, student, teacher, teacher spec changes or None, options, message regex)."""
    return [
        ("lenet teacher", "resnet8", "lenet", None, {},
         r"^'ofd' needs the BatchNorm before each stage's ReLU for its margins, but teacher model LeNet declares "
         r"none; name them in teacher.model.taps.stages_bn$"),
        ("mlp teacher", "resnet8", "mlp", None, {}, r"teacher model MLP declares none; name them in "
                                                    r"teacher.model.taps.stages_bn$"),
        ("shufflenetv2 teacher", "resnet8", "shufflenetv2", None, {}, r"teacher model ShuffleNetV2 declares none"),
        ("too few", "resnet8", "resnet14", {"stages_bn": ("layer1.1.bn2", "layer2.1.bn2")}, {},
         r"^'ofd': teacher model CifarResNet declares 2 stages_bn for 3 stages_pre; name one BatchNorm per stage"),
        ("not a BN", "resnet8", "resnet14", {"stages_bn": ("layer1.1.bn2", "layer2.1.conv2", "layer3.1.bn2")}, {},
         r"^'ofd': teacher.model.taps.stages_bn\[1\]='layer2.1.conv2' of teacher model CifarResNet is a Conv2d, "
         r"not an affine BatchNorm"),
        ("no such module", "resnet8", "resnet14", {"stages_bn": ("layer1.1.bn2", "layer2.9.bn2", "layer3.1.bn2")},
         {}, r"^'ofd': teacher model CifarResNet has no module teacher.model.taps.stages_bn\[1\]='layer2.9.bn2'$"),
        ("wrong channels", "resnet8", "resnet14", {"stages_bn": ("layer1.1.bn2", "layer1.1.bn2", "layer3.1.bn2")},
         {}, r"stages_bn\[1\]='layer1.1.bn2' of teacher model CifarResNet has 16 channels but stages_pre\[1\] has 32"),
        ("too many stages", "resnet8", "resnet14", None, {"num_stages": 4},
         r"^kd.options.ofd.num_stages=4 is out of range: the student has 3 and the teacher 3 stages_pre, so at most 3"),
    ]


@pytest.mark.parametrize(("label", "student_name", "teacher_name", "spec", "options", "message"), _bad_cases(),
                         ids=[c[0] for c in _bad_cases()])
def test_model_dependent_errors(label, student_name, teacher_name, spec, options, message):
    shape = (3, 32, 32) if teacher_name == "lenet" else SHAPE
    student, teacher = make_pair(student_name, teacher_name, shape=shape)
    s_tap, _, s_probe, _ = probe(student, teacher, "ofd", shape=shape)
    t_tap = Tapped(FrozenTeacher(teacher), _with_spec(teacher, **spec) if spec else None, want=("stages_pre",))
    with torch.no_grad():
        t_probe = t_tap(torch.randn(2, *shape))
    with pytest.raises(ConfigError, match=message) as info:
        build_objective("ofd", s_probe, t_probe, num_classes=10, num_samples=64, teacher_model=t_tap,
                        options={"ofd": options})
    assert "\n" not in str(info.value)


def test_missing_teacher_model_or_stages_pre():
    student, teacher = make_pair("resnet8", "resnet14", shape=SHAPE)
    _, t_tap, s_probe, t_probe = probe(student, teacher, "ofd", shape=SHAPE)
    with pytest.raises(ConfigError, match=r"^'ofd' reads the teacher's BatchNorm parameters for its margins but "
                                          r"was given no teacher model; pass teacher_model="):
        build_objective("ofd", s_probe, t_probe, num_classes=10, num_samples=64)
    with pytest.raises(ConfigError, match=r"^'ofd' needs the teacher's 'stages_pre' tap but the probed teacher has "
                                          r"none; name its module path\(s\) in teacher.model.taps.stages_pre$"):
        OFD(s_probe, Taps(t_probe.logits), teacher_model=t_tap)
    with pytest.raises(ConfigError, match=r"^'ofd' needs the student's 'stages_pre' tap"):
        OFD(Taps(s_probe.logits), t_probe, teacher_model=t_tap)
    bn_free = BNFree()
    tap = Tapped(FrozenTeacher(bn_free), want=("stages_pre",))
    with pytest.raises(ConfigError, match="is a BatchNorm without affine parameters, not an affine BatchNorm"):
        OFD(s_probe, tap(torch.randn(2, *SHAPE)), teacher_model=tap)


class BNFree(nn.Module):
    """A one-stage teacher whose stage BN has no affine parameters (nothing to read margins from)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, affine=False)
        self.fc = nn.Linear(8, 10)
        self.tap_spec = TapSpec(embedding="fc", stages_pre=("bn",), stages_bn=("bn",))

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))
