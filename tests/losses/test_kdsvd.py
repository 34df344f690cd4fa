import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.kdsvd import KDSVD, KDSVDOptions, align_to, canonical_signs, kdsvd_terms, right_singular
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


def test_rank_deficient_features_give_finite_values_and_gradients():
    f_s = [torch.zeros(3, 4, 4, 4, dtype=torch.float64, requires_grad=True),
           torch.ones(3, 4, 1, 1, dtype=torch.float64, requires_grad=True)]  # zero map; one position (rank 1)
    f_t = [torch.zeros(3, 4, 4, 4, dtype=torch.float64), torch.ones(3, 4, 1, 1, dtype=torch.float64)]
    value = sum(kdsvd_terms(f_s, f_t))
    value.backward()
    assert torch.isfinite(value) and all(torch.isfinite(f.grad).all() for f in f_s)
    v, s = right_singular(f_s[1].detach(), 4)  # one position: one singular vector, not 4
    assert v.shape == (3, 4, 1) and s.shape == (3, 1)


def test_one_training_step_on_zoo_models_and_options():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    terms, objective, _ = one_step("kdsvd", student, teacher, shape=SHAPE, batch_size=4,
                                   options={"kdsvd": {"k": 2}})
    assert set(terms) == {"ce", "kdsvd"} and torch.isfinite(terms["kdsvd"]) and objective.weights["kdsvd"] == 1.0
    assert objective.methods["kdsvd"].options == KDSVDOptions(k=2)


def taps(*stage_maps):
    return Taps(torch.zeros(stage_maps[0].shape[0], 3), stages=list(stage_maps))


@pytest.mark.parametrize(("student", "teacher", "match"), [
    (Taps(torch.zeros(2, 3)), taps(torch.zeros(2, 4, 2, 2)), "'kdsvd' needs the student's 'stages' tap"),
    (taps(torch.zeros(2, 4, 2, 2)), taps(torch.zeros(2, 4, 2, 2)), "needs at least 2 stage maps"),
    (taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 8, 2, 2)), taps(torch.zeros(2, 4, 2, 2), torch.zeros(2, 6, 2, 2)),
     "student stage 1 has 8, the paired teacher stage 6"),
    (taps(torch.zeros(2, 4), torch.zeros(2, 4)), taps(torch.zeros(2, 4), torch.zeros(2, 4)), "spatial stage maps"),
])
def test_bad_models_are_one_line_config_errors(student, teacher, match):
    with pytest.raises(ConfigError, match=match):
        KDSVD(student, teacher)
