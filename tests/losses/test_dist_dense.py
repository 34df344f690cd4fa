"""DIST on dense predictions (N, C, *spatial): each position is a row of C class probabilities, as in the
authors' segmentation code (hunto/DIST_KD ``segmentation/losses/dist_kd.py``)."""

import math

import numpy as np
import pytest
import torch

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective
from teachkit.losses.dist import DIST, DISTOptions, dist_terms
from teachkit.types import Batch, Taps

P = Progress(0, 0, 1, 1)
EPS = 1e-8

# A 1 x 3 x 2 x 2 map at tau = 1 whose logits are log-probabilities. Pixels (h, w) in row-major order:
#   student: (0,0) [1/6, 1/3, 1/2]  (0,1) [1/4, 1/4, 1/2]  (1,0) [1/6, 1/3, 1/2]  (1,1) [1/4, 1/4, 1/2]
#   teacher: (0,0) [1/4, 1/4, 1/2]  (0,1) [1/6, 1/3, 1/2]  (1,0) [1/4, 1/4, 1/2]  (1,1) [1/6, 1/3, 1/2]
# Inter-class (each pixel across the classes): centred [-1/6, 0, 1/6] (norm sqrt(2)/6) against
# [-1/12, -1/12, 1/6] (norm sqrt(6)/12): dot 1/24, norm product sqrt(3)/36, rho = sqrt(3)/2 at every pixel.
# Intra-class (each class across the 4 pixels): class 0 student [1/6, 1/4, 1/6, 1/4] centred
# [-1/24, 1/24, -1/24, 1/24] (norm 1/12), teacher its negative: dot -4/576 = -1/144, norm product 1/144,
# rho = -1; class 1 likewise -1; class 2 is 1/2 everywhere on both sides, constant, rho = 0.
# So L_inter = 1 - sqrt(3)/2 and L_intra = 1 - (-1 - 1 + 0) / 3 = 5/3, up to the authors' eps = 1e-8.
ROW_A, ROW_B = [1 / 6, 1 / 3, 1 / 2], [1 / 4, 1 / 4, 1 / 2]
RHO_PIXEL = (1 / 24) / (math.sqrt(3) / 36 + EPS)
RHO_CLASS = -(1 / 144) / (1 / 144 + EPS)
INTER = 1 - RHO_PIXEL
INTRA = 1 - 2 * RHO_CLASS / 3


def _map(pixels):
    """(1, 3, 2, 2) float64 log-probabilities from the 4 pixels' rows in (h, w) row-major order."""
    return torch.tensor(pixels, dtype=torch.float64).log().t().reshape(1, 3, 2, 2)


def _dense_by_loops(z_s: np.ndarray, z_t: np.ndarray, tau: float) -> tuple[float, float]:
    """tau^2 (1 - mean Pearson over pixels), tau^2 (1 - mean Pearson over classes) of (N, C, H, W) logits,
    with explicit loops over the pixels and the classes (eps 1e-8 in the denominator, as the authors)."""
    n, c, h, w = z_s.shape

    def softmax(v):
        e = np.exp(v / tau - np.max(v / tau))
        return e / e.sum()

    def pearson(u, v):
        du, dv = u - u.mean(), v - v.mean()
        return float((du * dv).sum() / (np.sqrt((du * du).sum()) * np.sqrt((dv * dv).sum()) + EPS))

    rows_s, rows_t = [], []
    for i in range(n):
        for y in range(h):
            for x in range(w):
                rows_s.append(softmax(z_s[i, :, y, x]))
                rows_t.append(softmax(z_t[i, :, y, x]))
    ps, pt = np.array(rows_s), np.array(rows_t)
    inter = 1 - sum(pearson(ps[r], pt[r]) for r in range(len(ps))) / len(ps)
    intra = 1 - sum(pearson(ps[:, j], pt[:, j]) for j in range(c)) / c
    return tau**2 * inter, tau**2 * intra


def test_tiny_map_hand_computed():
    z_s, z_t = _map([ROW_A, ROW_B, ROW_A, ROW_B]), _map([ROW_B, ROW_A, ROW_B, ROW_A])
    assert z_s.softmax(dim=1)[0, :, 0, 1].tolist() == pytest.approx(ROW_B)  # the layout the comment describes
    inter, intra = dist_terms(z_s, z_t, 1.0)
    assert inter.item() == pytest.approx(INTER, abs=1e-12) and intra.item() == pytest.approx(INTRA, abs=1e-12)
    assert INTER == pytest.approx(1 - math.sqrt(3) / 2, abs=1e-6) and INTRA == pytest.approx(5 / 3, abs=1e-5)
    # tau = 2 on doubled logits: the same probabilities, each term times tau^2 = 4
    inter2, intra2 = dist_terms(2 * z_s, 2 * z_t, 2.0)
    assert inter2.item() == pytest.approx(4 * INTER, abs=1e-12) and intra2.item() == pytest.approx(4 * INTRA,
                                                                                                    abs=1e-12)
    assert _dense_by_loops(z_s.numpy(), z_t.numpy(), 1.0) == pytest.approx((INTER, INTRA), abs=1e-12)


def test_random_non_square_maps_match_explicit_loops():
    g = torch.Generator().manual_seed(7)
    z_s = 3 * torch.randn(2, 4, 2, 3, dtype=torch.float64, generator=g)
    z_t = 3 * torch.randn(2, 4, 2, 3, dtype=torch.float64, generator=g)
    inter, intra = dist_terms(z_s, z_t, 2.5)
    by_loops = _dense_by_loops(z_s.numpy(), z_t.numpy(), 2.5)
    assert (inter.item(), intra.item()) == pytest.approx(by_loops, abs=1e-10)
    assert inter.item() > 0 and intra.item() > 0


def test_dense_equals_the_2d_form_on_the_flattened_rows_in_either_order():
    g = torch.Generator().manual_seed(8)
    z_s = 2 * torch.randn(3, 5, 4, 2, dtype=torch.float64, generator=g)
    z_t = 2 * torch.randn(3, 5, 4, 2, dtype=torch.float64, generator=g)
    dense = dist_terms(z_s, z_t, 4.0)
    # (N, H, W, C) rows, and the authors' transpose(1, 3) rows, in (n, w, h) order: the same values
    for rows in (lambda z: z.permute(0, 2, 3, 1).reshape(-1, 5), lambda z: z.transpose(1, 3).reshape(-1, 5)):
        flat = dist_terms(rows(z_s), rows(z_t), 4.0)
        for a, b in zip(dense, flat, strict=True):
            assert a.item() == pytest.approx(b.item(), abs=1e-12)
    # a sequence of positions (N, C, L) is the same rows again
    seq = dist_terms(z_s.flatten(2), z_t.flatten(2), 4.0)
    assert [t.item() for t in seq] == pytest.approx([t.item() for t in dense], abs=1e-12)


def test_the_loss_builds_from_dense_probes_and_trains():
    probe = Taps(torch.zeros(2, 3, 4, 4))
    objective = build_objective("dist", probe, probe, num_classes=3, num_samples=2,
                                options={"dist": {"beta": 1.0, "gamma": 1.0, "tau": 1.0}})
    loss = objective.methods["dist"]
    assert isinstance(loss, DIST) and loss.options == DISTOptions(beta=1.0, gamma=1.0, tau=1.0)
    g = torch.Generator().manual_seed(9)
    z_s = torch.randn(2, 3, 4, 4, generator=g, requires_grad=True)
    z_t = torch.randn(2, 3, 4, 4, generator=g)
    batch = Batch(torch.zeros(2, 1), torch.zeros(2, 4, 4, dtype=torch.long), torch.arange(2))
    out = loss(Taps(z_s), Taps(z_t), batch, P)
    by_loops = _dense_by_loops(z_s.detach().double().numpy(), z_t.double().numpy(), 1.0)
    assert (out["inter"].item(), out["intra"].item()) == pytest.approx(by_loops, abs=1e-5)
    (out["inter"] + out["intra"]).backward()
    assert z_s.grad is not None and torch.isfinite(z_s.grad).all() and z_s.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(4,), ()])
def test_logits_below_rank_2_are_one_config_error_line(shape):
    with pytest.raises(ConfigError) as info:
        DIST(Taps(torch.zeros(shape)), Taps(torch.zeros(2, 3)))
    message = str(info.value)
    assert message == (f"dist needs (batch, classes) or dense (batch, classes, *spatial) logits; the student's are "
                       f"shaped {shape} (rank {len(shape)})")
