import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.nst import NST, nst_term
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), None)


def _reference_nst_loss(f_s, f_t):
    """TRANSCRIPTION of RepDistiller distiller_zoo/NST.py ``NSTLoss.nst_loss`` (full_loss=True), cross-check only."""
    s_h, t_h = f_s.shape[2], f_t.shape[2]
    if s_h > t_h:
        f_s = F.adaptive_avg_pool2d(f_s, (t_h, t_h))
    elif s_h < t_h:
        f_t = F.adaptive_avg_pool2d(f_t, (s_h, s_h))
    f_s = F.normalize(f_s.view(f_s.shape[0], f_s.shape[1], -1), dim=2)
    f_t = F.normalize(f_t.view(f_t.shape[0], f_t.shape[1], -1), dim=2)

    def poly_kernel(a, b):
        return (a.unsqueeze(1) * b.unsqueeze(2)).sum(-1).pow(2)

    return poly_kernel(f_t, f_t).mean().detach() + poly_kernel(f_s, f_s).mean() - 2 * poly_kernel(f_s, f_t).mean()


def taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 3, dtype=maps[0].dtype), stages=list(maps))


def test_hand_computed_one_channel_each():
    # one channel per side, 2 positions: s = (1, 0), t = (1, 1)/sqrt 2. k(t,t) = k(s,s) = 1, k(s,t) = 1/2:
    # MMD^2 = 1 + 1 - 2 * 1/2 = 1.
    s = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    t = torch.tensor([[[[3.0, 3.0]]]], dtype=torch.float64)
    assert nst_term(s, t).item() == pytest.approx(1.0, abs=1e-12)
    assert nst_term(t * 0.5, t).item() == pytest.approx(0.0, abs=1e-12)  # same pattern up to scale


def test_hand_computed_two_student_channels_with_pooling():
    # student channels s1 = (1, 0), s2 = (0, 1) over 2 positions; one teacher channel t = (1, 1)/sqrt 2.
    # k(t, t) = 1; k(s, s) = [[1, 0], [0, 1]], mean 1/2; k(s_j, t) = (1/sqrt 2)^2 = 1/2 each, mean 1/2.
    # MMD^2 = 1 + 1/2 - 2 * 1/2 = 1/2. The student is given at 2 x 4 and average-pooled to the teacher's 1 x 2:
    # each channel's left / right 2 x 2 blocks average to its two positions.
    s = torch.zeros(1, 2, 2, 4, dtype=torch.float64)
    s[0, 0, :, :2] = 4.0  # -> (4, 0), normalised (1, 0)
    s[0, 1, :, 2:] = 0.5  # -> (0, 0.5), normalised (0, 1)
    t = torch.tensor([[[[2.0, 2.0]]]], dtype=torch.float64)
    assert nst_term(s, t).item() == pytest.approx(0.5, abs=1e-12)
    # an all-zero channel normalises to 0 (eps 1e-12) and adds k = 0 pairs: channels (1, 0) and 0 against t
    # give k(s, s) mean 1/4, k(s, t) mean 1/4: 1 + 1/4 - 1/2 = 3/4, with a finite gradient
    z = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.0]]]], dtype=torch.float64, requires_grad=True)
    value = nst_term(z, t)
    assert value.item() == pytest.approx(0.75, abs=1e-12)
    assert torch.isfinite(torch.autograd.grad(value, z)[0]).all()


def test_one_dimensional_maps_are_read_as_width_one():
    g = torch.Generator().manual_seed(2)
    s, t = torch.rand(3, 4, 8, dtype=torch.float64, generator=g), torch.rand(3, 5, 4, dtype=torch.float64, generator=g)
    # (the reference pools to a square of the smaller height, so it is given the student pooled over L by hand)
    pooled = F.adaptive_avg_pool1d(s, 4)[..., None]
    torch.testing.assert_close(nst_term(s, t), _reference_nst_loss(pooled, t[..., None]), rtol=1e-12, atol=0)
    loss = NST(taps(s), taps(t))
    assert loss(taps(s), taps(t), BATCH, P)["nst"].item() == pytest.approx(nst_term(s, t).item(), rel=1e-12)


@pytest.mark.parametrize("shapes", [((4, 6, 4, 4), (4, 5, 4, 4)), ((3, 4, 8, 8), (3, 7, 4, 4)),
                                    ((3, 4, 2, 2), (3, 7, 4, 4))])
def test_matches_repdistiller_values_and_input_gradients(shapes):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shapes[0], dtype=torch.float64, generator=g, requires_grad=True)
    f_t = torch.relu(torch.randn(*shapes[1], dtype=torch.float64, generator=g))
    w = torch.randn(shapes[0][1], shapes[0][1], dtype=torch.float64, generator=g)
    f_s = torch.relu(torch.einsum("bchw,cd->bdhw", x, w))
    ours, ref = nst_term(f_s, f_t), _reference_nst_loss(f_s, f_t)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours, x, retain_graph=True)[0], torch.autograd.grad(ref, x)[0],
                               rtol=1e-8, atol=1e-12)


def test_sums_over_stage_pairs_and_never_touches_the_teacher():
    torch.manual_seed(0)
    s = [torch.rand(2, 4, 4, 4, requires_grad=True), torch.rand(2, 8, 2, 2, requires_grad=True)]
    t = [torch.rand(2, 5, 4, 4, requires_grad=True), torch.rand(2, 6, 2, 2, requires_grad=True)]
    loss = NST(taps(*s), taps(*t))
    out = loss(taps(*s), taps(*t), BATCH, P)["nst"]
    assert out.item() == pytest.approx((nst_term(s[0], t[0]) + nst_term(s[1], t[1])).item(), rel=1e-6)
    out.backward()
    assert s[0].grad.abs().sum() > 0 and t[0].grad is None and t[1].grad is None


def test_one_training_step_on_zoo_models():
    student, teacher = make_pair("resnet8", "resnet20", shape=(3, 16, 16))
    terms, objective, _ = one_step("nst", student, teacher, shape=(3, 16, 16), batch_size=4)
    assert set(terms) == {"ce", "nst"} and objective.weights["nst"] == 50.0 and terms["nst"].item() > 0


@pytest.mark.parametrize(("student", "teacher", "match"), [
    (Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2)), "'nst' needs the student's 'stages' tap"),
    (taps(torch.zeros(2, 4, 2, 2)), Taps(torch.zeros(2, 3)), "'nst' needs the teacher's 'stages' tap"),
    (taps(torch.zeros(2, 4)), taps(torch.zeros(2, 4, 2, 2)), r"'nst' needs spatial stage maps .* student stage 0"),
])
def test_models_without_spatial_stages_are_config_errors(student, teacher, match):
    with pytest.raises(ConfigError, match=match):
        NST(student, teacher)
