import math

import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.kdsvd import (
    KDSVD,
    KDSVDOptions,
    TopRightSingular,
    align_to,
    canonical_signs,
    kdsvd_terms,
    right_singular,
)
from teachkit.types import Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)


class _Reference:
    """TRANSCRIPTION of RepDistiller distiller_zoo/KDSVD.py (``KDSVD.forward``, ``svd``, ``removenan``,
    ``align_rsv``), cross-check only."""

    def __init__(self, k=1):
        self.k = k

    def __call__(self, g_s, g_t):
        v_sb = v_tb = None
        losses = []
        for i, f_s, f_t in zip(range(len(g_s)), g_s, g_t, strict=False):
            _, s_t, v_t = self.svd(f_t, self.k)
            _, _, v_s = self.svd(f_s, self.k + 3)
            v_s, v_t = self.align_rsv(v_s, v_t)
            s_t = s_t.unsqueeze(1)
            v_t = v_t * s_t
            v_s = v_s * s_t
            if i > 0:
                s_rbf = torch.exp(-(v_s.unsqueeze(2) - v_sb.unsqueeze(1)).pow(2) / 8)
                t_rbf = torch.exp(-(v_t.unsqueeze(2) - v_tb.unsqueeze(1)).pow(2) / 8)
                l2loss = (s_rbf - t_rbf.detach()).pow(2)
                l2loss = torch.where(torch.isfinite(l2loss), l2loss, torch.zeros_like(l2loss))
                losses.append(l2loss.sum())
            v_tb = v_t
            v_sb = v_s
        bsz = g_s[0].shape[0]
        return [loss / bsz for loss in losses]

    def svd(self, feat, n=1):
        size = feat.shape
        x = feat.view(-1, size[1], size[2] * size[2]).transpose(-2, -1)
        u, s, v = torch.svd(x)
        u, s, v = self.removenan(u), self.removenan(s), self.removenan(v)
        return F.normalize(u[:, :, :n], dim=1), F.normalize(s[:, :n], dim=1), F.normalize(v[:, :, :n], dim=1)

    @staticmethod
    def removenan(x):
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))

    @staticmethod
    def align_rsv(a, b):
        cosine = torch.matmul(a.transpose(-2, -1), b)
        max_abs_cosine, _ = torch.max(torch.abs(cosine), 1, keepdim=True)
        mask = torch.where(torch.eq(max_abs_cosine, torch.abs(cosine)), torch.sign(cosine), torch.zeros_like(cosine))
        return torch.matmul(a, mask), b


def maps(generator, specs, requires_grad=False):
    return [torch.randn(3, c, h, h, dtype=torch.float64, generator=generator, requires_grad=requires_grad)
            for c, h in specs]


@pytest.mark.parametrize("k", [1, 2])
def test_matches_repdistiller_values_and_gradients(k):
    g = torch.Generator().manual_seed(3)
    x = maps(g, ((4, 4), (6, 4), (8, 2)), requires_grad=True)
    g_s = [v * 2.0 for v in x]
    g_t = maps(g, ((4, 8), (6, 4), (8, 2)))
    ours = sum(kdsvd_terms(g_s, g_t, k, canonical=False))
    ref = sum(_Reference(k)(g_s, g_t))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(ours, x, retain_graph=True), torch.autograd.grad(ref, x),
                               rtol=1e-6, atol=1e-12)
    assert ours.item() > 0


def test_alignment_and_canonical_signs_by_hand():
    # student vectors e1, -e2 (C = 2); teacher vector (0, 1): the best match is -e2 with cosine -1, so the
    # aligned student vector is -(-e2) = e2.
    s = torch.tensor([[[1.0, 0.0], [0.0, -1.0]]])
    t = torch.tensor([[[0.0], [1.0]]])
    assert align_to(s, t).flatten().tolist() == [0.0, 1.0]
    assert canonical_signs(torch.tensor([[[0.2], [-0.9]]])).flatten().tolist() == pytest.approx([-0.2, 0.9])
    # the singular vectors of a rank-1 matrix x = a b^T are +-b/|b|
    a, b = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([3.0, 4.0])
    feat = (b[:, None] * a[None, :]).reshape(1, 2, 3, 1)  # x[p, c] = a[p] b[c] over 3 positions, 2 channels
    v, s = right_singular(feat, 1)
    assert v.abs().flatten().tolist() == pytest.approx([0.6, 0.8], abs=1e-6) and s.flatten().tolist() == [1.0]


def test_canonical_signs_make_the_loss_independent_of_the_backends_sign_choice(monkeypatch):
    g = torch.Generator().manual_seed(5)
    g_s, g_t = maps(g, ((4, 4), (4, 2))), maps(g, ((4, 4), (4, 2)))
    base = {c: sum(kdsvd_terms(g_s, g_t, 1, canonical=c)).item() for c in (True, False)}
    svd, calls = torch.linalg.svd, [0]

    def flipped(x, full_matrices=True):  # another valid SVD for the first stage's teacher: (-U, S, -Vh)
        u, s, vh = svd(x, full_matrices=full_matrices)
        calls[0] += 1
        return (-u, s, -vh) if calls[0] in (1, 5) else (u, s, vh)

    monkeypatch.setattr(torch.linalg, "svd", flipped)
    again = {c: sum(kdsvd_terms(g_s, g_t, 1, canonical=c)).item() for c in (True, False)}
    assert again[True] == pytest.approx(base[True], rel=1e-12)
    assert again[False] != pytest.approx(base[False], rel=1e-6)  # the reference's value depends on the signs


def _rank_one(b, a=(1.0, 2.0, 2.0, 4.0)):
    """A (1, C, 2, 2) map x[p, c] = a[p] b[c]: its only right singular vector is +-b/|b|."""
    return (torch.tensor(b, dtype=torch.float64)[:, None] * torch.tensor(a, dtype=torch.float64)).reshape(1, -1, 2, 2)


def test_hand_computed_two_stages():
    # C = 2, k = 1, one sample, rank-1 maps. Teacher vectors: stage 1 (0.6, 0.8), stage 2 (1, 0); student:
    # stage 1 -(0.8, 0.6) (its second vector is the orthogonal (-0.6, 0.8) with singular value 0, the other
    # two of its k + 3 = 4 are zero padding), stage 2 (1, 0). Alignment picks the cosine +-0.96 vector with its
    # sign, so v_s1 = (0.8, 0.6); the normalised singular value of k = 1 is 1. RBF[c, c'] =
    # exp(-(v2[c] - v1[c'])^2 / 8): student differences [[0.2, 0.4], [-0.8, -0.6]], teacher [[0.4, 0.2],
    # [-0.6, -0.8]], so the loss is 2 (e^-0.005 - e^-0.02)^2 + 2 (e^-0.08 - e^-0.045)^2
    # = 2 (0.99501248 - 0.98019867)^2 + 2 (0.92311635 - 0.95599748)^2 = 0.0026012358.
    g_s = [_rank_one((-0.8, -0.6)), _rank_one((1.0, 0.0))]
    g_t = [_rank_one((3.0, 4.0)), _rank_one((2.0, 0.0))]
    v, s = right_singular(g_s[0], 4)
    assert v.shape == (1, 2, 4) and s.flatten().tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-12)
    (term,) = kdsvd_terms(g_s, g_t)
    assert term.item() == pytest.approx(0.0026012358261493043, rel=1e-9)
    assert kdsvd_terms(g_t, g_t)[0].item() == pytest.approx(0.0, abs=1e-15)  # student = teacher


@pytest.mark.parametrize(("m", "c", "n"), [(16, 8, 4), (5, 8, 4), (3, 8, 5), (8, 8, 1)])
def test_truncated_svd_backward_is_torchs(m, c, n):
    # random float64 matrices (distinct singular values): same gradients as differentiating torch.linalg.svd,
    # and the same as finite differences; a sign-invariant function of the vectors plus the values
    g = torch.Generator().manual_seed(m * c + n)
    x = torch.randn(2, m, c, dtype=torch.float64, generator=g, requires_grad=True)
    kept = min(n, m, c)
    w, w_s = torch.randn(2, c, kept, dtype=torch.float64, generator=g), torch.randn(2, kept, dtype=torch.float64,
                                                                                    generator=g)

    def f(v, s):
        return ((v * w).sum(1) ** 2).sum() + (s * w_s).sum()

    _, s_ref, vh_ref = torch.linalg.svd(x, full_matrices=False)
    ours, ref = f(*TopRightSingular.apply(x, n)), f(vh_ref[:, :kept].transpose(1, 2), s_ref[:, :kept])
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0], rtol=1e-8,
                               atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: f(*TopRightSingular.apply(x, n)), (x,))


def test_dead_channels_exact_gradient_where_the_reference_gives_nan():
    # 3 all-zero channels: three equal (zero) singular values among the dropped ones. The kept 4 are simple, so
    # the loss is smooth there: our gradient passes the finite-difference check; torch.svd's is NaN.
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(2, 8, 4, 4, dtype=torch.float64, generator=g), torch.randn(2, 8, 2, 2, dtype=torch.float64,
                                                                                generator=g)]
    x[0][:, 5:] = 0
    x = [t.requires_grad_(True) for t in x]
    g_t = [torch.randn(2, 8, 4, 4, dtype=torch.float64, generator=g).relu(),
           torch.randn(2, 8, 2, 2, dtype=torch.float64, generator=g).relu()]
    ours = sum(kdsvd_terms(x, g_t, canonical=False))
    ref = sum(_Reference()(x, g_t))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)  # the values agree
    assert not torch.isfinite(torch.autograd.grad(ref, x[0])[0]).all()
    grad = torch.autograd.grad(ours, x[0])[0]
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert torch.autograd.gradcheck(lambda a: sum(kdsvd_terms([a, x[1]], g_t)), (x[0],))


def test_rank_deficient_features_give_finite_values_and_gradients():
    # stage 1: an all-zero map (every singular value 0: value finite, gradient exactly 0); stage 2: one
    # position (rank 1: one singular vector, not k or k + 3, the rest zero columns); stage 3: 1 x 2 positions,
    # fewer than k = 3.
    f_s = [torch.zeros(3, 4, 4, 4, dtype=torch.float64, requires_grad=True),
           torch.rand(3, 4, 1, 1, dtype=torch.float64, requires_grad=True),
           torch.rand(3, 4, 1, 2, dtype=torch.float64, requires_grad=True)]
    f_t = [torch.zeros(3, 4, 4, 4, dtype=torch.float64), torch.ones(3, 4, 1, 1, dtype=torch.float64),
           torch.rand(3, 4, 1, 2, dtype=torch.float64)]
    for k in (1, 3):
        value = sum(kdsvd_terms(f_s, f_t, k))
        grads = torch.autograd.grad(value, f_s)
        assert torch.isfinite(value) and all(torch.isfinite(g).all() for g in grads)
        assert torch.count_nonzero(grads[0]) == 0 and grads[2].abs().sum() > 0
    v, s = right_singular(f_s[1].detach(), 4)  # one position: one singular vector, three zero columns
    assert v.shape == (3, 4, 4) and torch.count_nonzero(v[..., 1:]) == 0
    assert s[:, 0].tolist() == pytest.approx([1.0] * 3) and torch.count_nonzero(s[:, 1:]) == 0
    # C = 2 channels give 2 vectors, the next stage 3: the reference cannot broadcast 3 against 2; ours pads
    g_s = [torch.rand(3, 2, 4, 4, dtype=torch.float64), torch.rand(3, 4, 4, 4, dtype=torch.float64)]
    g_t = [torch.rand(3, 2, 4, 4, dtype=torch.float64), torch.rand(3, 4, 4, 4, dtype=torch.float64)]
    with pytest.raises(RuntimeError, match="size of tensor"):
        _Reference(3)(g_s, g_t)
    assert torch.isfinite(sum(kdsvd_terms(g_s, g_t, 3)))


def test_one_training_step_on_zoo_models_and_options():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    terms, objective, _ = one_step("kdsvd", student, teacher, shape=SHAPE, batch_size=4,
                                   options={"kdsvd": {"k": 2}})
    assert set(terms) == {"ce", "kdsvd"} and torch.isfinite(terms["kdsvd"]) and objective.weights["kdsvd"] == 1.0
    assert objective.methods["kdsvd"].options == KDSVDOptions(k=2)


def test_training_step_with_dead_student_channels_stays_finite():
    # a very negative BN shift kills 3 of the student's 16 first-stage channels after the ReLU (repeated zero
    # singular values, float32): the step's gradients and updated weights stay finite and the stage trains
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    with torch.no_grad():
        student.layer1[0].bn2.bias[:3] = -100.0
    before = student.layer1[0].conv1.weight.detach().clone()
    terms, _, _ = one_step("kdsvd", student, teacher, shape=SHAPE, batch_size=4)
    assert torch.isfinite(terms["kdsvd"]) and terms["kdsvd"].item() > 0
    assert all(torch.isfinite(p).all() and (p.grad is None or torch.isfinite(p.grad).all())
               for p in student.parameters())
    assert not torch.equal(student.layer1[0].conv1.weight, before)


def taps(*stage_maps):
    return Taps(torch.zeros(stage_maps[0].shape[0], 3), stages=list(stage_maps))


@pytest.mark.parametrize(("student", "teacher", "match"), [
    (Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2)), "'kdsvd' needs the student's 'stages' tap"),
    (taps(torch.zeros(2, 4, 2, 2)), taps(torch.zeros(2, 4, 2, 2)), "needs at least 2 stage maps"),
    (taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 8, 2, 2)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 6, 2, 2)),
     "student stage 1 / teacher stage 1 have 8 and 6 channels"),
    (taps(torch.zeros(2, 4), torch.zeros(2, 4)), taps(torch.zeros(2, 4), torch.zeros(2, 4)), "spatial stage maps"),
])
def test_bad_models_are_one_line_config_errors(student, teacher, match):
    with pytest.raises(ConfigError, match=match):
        KDSVD(student, teacher)


# --- layout: mdistiller -------------------------------------------------------------------------------------------


class _MdistillerReference:
    """mdistiller's ``kdsvd_loss`` (megvii-research/mdistiller ``mdistiller/distillers/KDSVD.py``), written from its
    steps, cross-check only: each (B, C, H, W) map viewed as (B, C H, W) and cast to ``dtype`` (their
    ``.float()``), ``torch.svd``, non-finite entries zeroed, the first n vectors / values L2-normalised, the
    student's k + 3 vectors aligned to the teacher's k by the largest |cosine| with its sign, both scaled by the
    teacher's values, RBF exp(-d^2 / 8) between consecutive stages, finite-masked squared error summed / B."""

    def __init__(self, k=1, dtype=torch.float32):
        self.k, self.dtype = k, dtype

    def svd(self, feat, n):
        b, c, h, w = feat.shape
        _, s, v = torch.svd(feat.view(b, c * h, w).to(self.dtype))
        s, v = (torch.where(torch.isfinite(t), t, torch.zeros_like(t)) for t in (s, v))
        return F.normalize(s[:, :n], dim=1), F.normalize(v[:, :, :n], dim=1)

    def __call__(self, g_s, g_t):
        losses, previous = [], None
        for f_s, f_t in zip(g_s, g_t, strict=True):
            s_t, v_t = self.svd(f_t, self.k)
            _, v_s = self.svd(f_s, self.k + 3)
            cosine = v_s.transpose(-2, -1) @ v_t
            best = cosine.abs().max(dim=1, keepdim=True).values
            v_s = v_s @ torch.where(best == cosine.abs(), torch.sign(cosine), torch.zeros_like(cosine))
            v_t, v_s = v_t * s_t.unsqueeze(1), v_s * s_t.unsqueeze(1)
            if previous is not None:
                v_sb, v_tb = previous
                s_rbf = torch.exp(-(v_s.unsqueeze(2) - v_sb.unsqueeze(1)).pow(2) / 8)
                t_rbf = torch.exp(-(v_t.unsqueeze(2) - v_tb.unsqueeze(1)).pow(2) / 8)
                l2 = (s_rbf - t_rbf.detach()).pow(2)
                losses.append(torch.where(torch.isfinite(l2), l2, torch.zeros_like(l2)).sum())
            previous = (v_s, v_t)
        return [loss / g_s[0].shape[0] for loss in losses]


def nonsquare_maps(generator, specs, dtype=torch.float64, requires_grad=False):
    """(3, C, H, W) maps for (C, H, W) in ``specs``."""
    return [torch.randn(3, c, h, w, dtype=dtype, generator=generator, requires_grad=requires_grad)
            for c, h, w in specs]


@pytest.mark.parametrize("k", [1, 2])
def test_mdistiller_layout_matches_mdistillers_steps(k):
    # non-square maps whose widths (5, 4, 3) exceed k + 3 only in part: the student's padding is exercised too
    g = torch.Generator().manual_seed(11)
    x = nonsquare_maps(g, ((4, 3, 5), (6, 2, 4), (8, 2, 3)), requires_grad=True)
    g_s = [v * 2.0 for v in x]
    g_t = nonsquare_maps(g, ((2, 4, 5), (3, 3, 4), (5, 1, 3)))  # other channel counts: only the widths must agree
    ours = sum(kdsvd_terms(g_s, g_t, k, canonical=False, layout="mdistiller"))
    ref = sum(_MdistillerReference(k, torch.float64)(g_s, g_t))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(ours, x, retain_graph=True), torch.autograd.grad(ref, x),
                               rtol=1e-6, atol=1e-12)
    # float32, mdistiller's dtype: the same to float32 round-off
    s32, t32 = [t.detach().float() for t in g_s], [t.float() for t in g_t]
    ours32 = sum(kdsvd_terms(s32, t32, k, canonical=False, layout="mdistiller"))
    assert ours32.dtype == torch.float32
    torch.testing.assert_close(ours32, sum(_MdistillerReference(k)(s32, t32)), rtol=1e-4, atol=1e-6)
    assert ours.item() > 0


def test_mdistiller_layout_differs_from_repdistillers_on_non_square_maps():
    g = torch.Generator().manual_seed(12)
    g_s, g_t = nonsquare_maps(g, ((4, 3, 5), (4, 2, 4))), nonsquare_maps(g, ((4, 3, 5), (4, 2, 4)))
    rep = sum(kdsvd_terms(g_s, g_t, canonical=False)).item()
    mdi = sum(kdsvd_terms(g_s, g_t, canonical=False, layout="mdistiller")).item()
    assert rep > 0 and mdi > 0 and abs(rep - mdi) > 1e-3 * max(rep, mdi)
    assert mdi == pytest.approx(sum(_MdistillerReference(1, torch.float64)(g_s, g_t)).item(), rel=1e-10)


def _rank_one_over_width(b, a=(1.0, 2.0, 2.0, 4.0)):
    """A (1, 2, 2, W) map x[c, h, w] = a[c H + h] b[w]: its (C H) x W matrix is a b^T, so its only right singular
    vector over W is +-b/|b|."""
    return (torch.tensor(a, dtype=torch.float64)[:, None] * torch.tensor(b, dtype=torch.float64)).reshape(1, 2, 2, -1)


def test_mdistiller_layout_hand_computed_two_stages():
    # the numbers of test_hand_computed_two_stages with the vectors over the width W = 2: teacher (0.6, 0.8)
    # then (1, 0), student -(0.8, 0.6) then (1, 0): 2 (e^-0.005 - e^-0.02)^2 + 2 (e^-0.08 - e^-0.045)^2.
    g_s = [_rank_one_over_width((-0.8, -0.6)), _rank_one_over_width((1.0, 0.0))]
    g_t = [_rank_one_over_width((3.0, 4.0)), _rank_one_over_width((2.0, 0.0))]
    v, _ = right_singular(g_t[0], 1, "mdistiller")
    assert v.abs().flatten().tolist() == pytest.approx([0.6, 0.8], abs=1e-12)
    (term,) = kdsvd_terms(g_s, g_t, layout="mdistiller")
    expected = 2 * (math.exp(-0.005) - math.exp(-0.02)) ** 2 + 2 * (math.exp(-0.08) - math.exp(-0.045)) ** 2
    assert term.item() == pytest.approx(expected, rel=1e-9) and expected == pytest.approx(0.0026012358, rel=1e-7)
    assert kdsvd_terms(g_s, g_t)[0].item() != pytest.approx(expected, rel=1e-3)  # over the channels: another value


def test_layout_option_trains_on_zoo_models():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    terms, objective, _ = one_step("kdsvd", student, teacher, shape=SHAPE, batch_size=4,
                                   options={"kdsvd": {"layout": "mdistiller"}})
    assert torch.isfinite(terms["kdsvd"]) and terms["kdsvd"].item() > 0
    assert objective.methods["kdsvd"].options == KDSVDOptions(layout="mdistiller")
    assert "layout=mdistiller" in repr(objective.methods["kdsvd"]) and KDSVDOptions().layout == "repdistiller"


def test_mdistiller_layout_pairs_stages_by_width():
    wide = taps(torch.zeros(2, 4, 2, 4), torch.zeros(2, 8, 2, 2))
    narrow = taps(torch.zeros(2, 6, 2, 4), torch.zeros(2, 6, 2, 3))
    KDSVD(wide, taps(torch.zeros(2, 6, 3, 4), torch.zeros(2, 3, 1, 2)), KDSVDOptions(layout="mdistiller"))
    with pytest.raises(ConfigError) as info:
        KDSVD(wide, narrow, KDSVDOptions(layout="mdistiller"))
    assert str(info.value) == ("'kdsvd' with kd.options.kdsvd.layout=mdistiller aligns singular vectors over the map "
                               "width W, so paired stages need equal widths: student stage 1 / teacher stage 1 have "
                               "W = 2 and 3 (use layout repdistiller, or pair stages of equal widths in "
                               "model.taps.stages)")
    with pytest.raises(ConfigError, match="needs at least 2 paired spatial stage maps"):
        KDSVD(taps(torch.zeros(2, 4, 2, 2)), taps(torch.zeros(2, 4, 2, 2)), KDSVDOptions(layout="mdistiller"))
    with pytest.raises(ConfigError, match="'kdsvd' needs the student's 'stages' tap"):
        KDSVD(Taps(torch.zeros(2, 3)), wide, KDSVDOptions(layout="mdistiller"))


def test_bad_layout_is_a_one_line_error_naming_the_choices():
    from teachkit.losses import KDConfig
    from teachkit.options import from_mapping

    with pytest.raises(ConfigError) as info:
        from_mapping(KDConfig, {"method": "kdsvd", "options": {"kdsvd": {"layout": "hw_c"}}}, "kd")
    assert "kd.options.kdsvd.layout='hw_c'" in str(info.value) and "repdistiller, mdistiller" in str(info.value)
