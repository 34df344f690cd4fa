import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.reviewkd import ReviewKD, ReviewKDOptions, hcl_loss
from teachkit.models import Tapped
from teachkit.types import Batch, Taps

from .helpers import make_pair

NEEDS = ("logits", "stages", "stages_pre", "embedding")


def _probe(student, teacher, shape=(3, 32, 32)):
    x = torch.randn(2, *shape)
    with torch.no_grad():
        student.eval()
        teacher.eval()
        s, t = Tapped(student, want=NEEDS)(x), Tapped(teacher, want=NEEDS)(x)
    return s, t


def _shapes(tensors):
    return [tuple(v.shape) for v in tensors]


def test_registry_defaults():
    cls = LOSSES.get("reviewkd")
    assert cls is ReviewKD and cls.default_weight == 1.0 and cls.term_names == ("hcl",)
    assert cls.student_needs == ("stages", "embedding") and cls.teacher_needs == ("stages_pre", "embedding")


def test_shapes_probed_resnet8_from_resnet20():
    s, t = make_pair("resnet8", "resnet20")
    s_taps, t_taps = _probe(s, t)
    loss = ReviewKD(s_taps, t_taps, num_classes=10, num_samples=64)
    # levels: layer1..3 (16x32x32, 32x16x16, 64x8x8) + pooled 64x1x1 on both sides; mid = min(512, 64)
    assert loss.mid_channel == 64 and len(loss.abfs) == 4
    assert [a.conv1[0].in_channels for a in loss.abfs] == [16, 32, 64, 64]
    assert [a.conv2[0].out_channels for a in loss.abfs] == [16, 32, 64, 64]
    assert [a.att_conv is not None for a in loss.abfs] == [True, True, True, False]  # the deepest does not fuse
    assert loss.out_sizes == [(32, 32), (16, 16), (8, 8), (1, 1)]
    fused = loss.fuse(s_taps)
    assert _shapes(fused) == _shapes(loss.teacher_levels(t_taps)) == [(2, 16, 32, 32), (2, 32, 16, 16),
                                                                       (2, 64, 8, 8), (2, 64, 1, 1)]


def test_shapes_probed_lenet_from_resnet20_pairs_deepest_stages():
    s, t = make_pair("lenet", "resnet20")
    s_taps, t_taps = _probe(s, t)
    loss = ReviewKD(s_taps, t_taps, num_classes=10, num_samples=64)
    # lenet has 2 stages (20x14x14, 50x5x5) + 500-d embedding; resnet20's deepest 2 pre-ReLU stages are paired
    assert loss.mid_channel == 500 and len(loss.abfs) == 3
    assert [a.conv1[0].in_channels for a in loss.abfs] == [20, 50, 500]
    assert loss.out_sizes == [(16, 16), (8, 8), (1, 1)]
    assert _shapes(loss.fuse(s_taps)) == _shapes(loss.teacher_levels(t_taps)) == [(2, 32, 16, 16), (2, 64, 8, 8),
                                                                                 (2, 64, 1, 1)]
    assert _shapes(loss.teacher_levels(t_taps)) == _shapes(t_taps.stages_pre[1:]) + [(2, 64, 1, 1)]


def test_teacher_with_fewer_stages_and_mid_channel_option():
    s, t = make_pair("resnet20", "lenet")
    s_taps, t_taps = _probe(s, t)
    loss = ReviewKD(s_taps, t_taps, ReviewKDOptions(mid_channel=24), num_classes=10, num_samples=64)
    # student's deepest 2 stages (32x16x16, 64x8x8) -> lenet's pre-ReLU conv maps (20x28x28, 50x10x10)
    assert [a.conv1[0].in_channels for a in loss.abfs] == [32, 64, 64]
    assert [a.conv1[0].out_channels for a in loss.abfs] == [24, 24, 24]
    assert _shapes(loss.fuse(s_taps)) == [(2, 20, 28, 28), (2, 50, 10, 10), (2, 500, 1, 1)]


def test_mlp_and_missing_taps_are_config_errors():
    s, t = make_pair("mlp", "resnet20")
    s_taps, t_taps = _probe(s, t)
    with pytest.raises(ConfigError, match=r"reviewkd needs 4-D \(N, C, H, W\) stage maps, but the student's "
                                          r"'stages' tap 0 has shape \(2, 500\)"):
        ReviewKD(s_taps, t_taps, num_classes=10, num_samples=64)
    with pytest.raises(ConfigError, match="reviewkd needs the student's 'stages' tap"):
        ReviewKD(Taps(s_taps.logits, s_taps.embedding), t_taps, num_classes=10, num_samples=64)
    with pytest.raises(ConfigError, match="reviewkd needs the teacher's 'stages_pre' tap"):
        ReviewKD(t_taps, Taps(t_taps.logits, t_taps.embedding, t_taps.stages), num_classes=10, num_samples=64)
    with pytest.raises(ConfigError, match="reviewkd needs the teacher's 'embedding' tap"):
        ReviewKD(t_taps, Taps(t_taps.logits, None, t_taps.stages, t_taps.stages_pre), num_classes=10,
                 num_samples=64)
    with pytest.raises(ConfigError, match=r"kd.options.reviewkd.warmup=-1.0 is out of range: must be >= 0"):
        build_objective("reviewkd", t_taps, t_taps, num_classes=10, num_samples=64,
                        options={"reviewkd": {"warmup": -1}})


def test_hcl_identical_is_zero_and_hand_value():
    feats = [torch.randn(2, 3, 8, 8), torch.randn(2, 4, 2, 2), torch.randn(2, 5, 1, 1)]
    assert hcl_loss(feats, [f.clone() for f in feats]).item() == 0.0
    # a constant offset d is kept by every pool: each level is (d^2 (1 + sum w)) / (1 + sum w) = d^2
    d = 0.5
    assert hcl_loss(feats, [f + d for f in feats]).item() == pytest.approx(3 * d**2, rel=1e-6)
    # 8x8: full + pools 4, 2, 1 with weights 1, 1/2, 1/4, 1/8; a checkerboard averages out in every pool
    board = (torch.arange(8)[:, None] + torch.arange(8)[None, :]) % 2 * 2.0 - 1.0
    value = hcl_loss([board.expand(1, 1, 8, 8)], [torch.zeros(1, 1, 8, 8)]).item()
    assert value == pytest.approx(1.0 / (1 + 0.5 + 0.25 + 0.125), rel=1e-6)
    # 2x2 map: only the 1x1 pool applies (4 and 2 are not smaller than the map)
    x = torch.tensor([[[[1.0, -1.0], [3.0, 1.0]]]])
    assert hcl_loss([x], [torch.zeros_like(x)]).item() == pytest.approx((3.0 + 0.5 * 1.0) / 1.5, rel=1e-6)


@pytest.mark.parametrize(("epoch", "step", "factor"), [(0, 0, 0.0), (10, 0, 0.5), (4, 5, 0.225), (20, 0, 1.0),
                                                       (50, 0, 1.0)])
def test_warmup_factor(epoch, step, factor):
    s, t = make_pair("resnet8", "resnet20")
    s_taps, t_taps = _probe(s, t)
    objective = build_objective("reviewkd", s_taps, t_taps, num_classes=10, num_samples=64).eval()
    loss = objective.methods["reviewkd"]
    batch = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), torch.arange(2))
    full = hcl_loss(loss.fuse(s_taps), loss.teacher_levels(t_taps)).item()
    terms = objective(s_taps, t_taps, batch, Progress(epoch, step, 240, 10))
    assert set(terms) == {"ce", "reviewkd"}  # one term: logged under the method's name, weighted
    value = terms["reviewkd"].item()
    assert full > 0 and value == pytest.approx(factor * full, rel=1e-6, abs=1e-9)
    # the loss returns HCL unweighted; the warm-up is its ramp
    assert loss(s_taps, t_taps, batch, Progress(epoch, step, 240, 10))["hcl"].item() == pytest.approx(full, rel=1e-6)
    assert loss.ramp(Progress(epoch, step, 240, 10)) == pytest.approx(factor)


def test_training_batch_of_one_is_finite():
    # the pooled level is 1x1: with one sample BN has no batch statistics (the trainer keeps a last
    # partial batch), so the ABFs fall back to running statistics there
    s, t = make_pair("resnet8", "resnet20")
    s_taps, t_taps = _probe(s, t)
    loss = ReviewKD(s_taps, t_taps, num_classes=10, num_samples=64).train()
    one = Taps(s_taps.logits[:1], s_taps.embedding[:1], [m[:1] for m in s_taps.stages])
    t_one = Taps(t_taps.logits[:1], t_taps.embedding[:1], [], [m[:1] for m in t_taps.stages_pre])
    batch = Batch(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), torch.arange(1))
    assert torch.isfinite(loss(one, t_one, batch, Progress(30, 0, 240, 10))["hcl"])
