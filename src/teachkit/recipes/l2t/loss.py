"""The dynamic loss of L2T-DLF (Wu et al., "Learning to Teach with Dynamic Loss Functions", NeurIPS 2018).

The student minimises the parametric loss (paper Sec. 3.2)

    L_Phi(p, y) = -sigmoid(y^T W log p + b_y),        Phi = (W, b),  W in R^{C x C},  b in R^C,

averaged over the batch, where ``p = softmax(z)`` and ``y`` is the one-hot label, so ``y^T W log p =
sum_j W[y, j] log p_j`` reads row ``y`` of W and ``b_y`` is a per-class bias (``y^T b``). With W = I and
b = 0 it is ``-sigmoid(log p_y) = -p_y / (1 + p_y)``, a bounded, monotone function of p_y. The student's
objective is optionally mixed with cross-entropy: ``ce_alpha * CE + (1 - ce_alpha) * L_Phi``.

``Phi`` is produced by a teacher model (:mod:`teachkit.recipes.l2t.teachers`) from the student's state
(:mod:`teachkit.recipes.l2t.state`); this loss is the student's objective driven by the teacher, so it
lives with the L2T-DLF recipe and is deliberately *not* a distillation loss in ``teachkit.losses.LOSSES``.

With a vocabulary of thousands of classes (translation: the loss applies per target token, ``y`` the gold
token) a full C x C matrix is out of reach (10k^2 entries, times the gated teacher's rank); the *diagonal*
form keeps only ``W_yy``: ``L_Phi(p, y) = -sigmoid(w_y log p_y + b_y)`` with ``w, b`` in R^C, i.e. L_Phi on
each position's probability of the gold token (the form the L2T-DLF NMT experiment needs); ``W`` given as a
vector (C,) selects it. Per-token losses are averaged over the target tokens (the batch's packed rows).

The teacher's dev-set objective is a smooth surrogate of the error rate (paper Sec. 3.3):

    M = mean_i ( 2 sigmoid(k (max_j p_ij - p_i,y_i)) - 1 ),     k = 50,

or the dev cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def dynamic_loss(logits: Tensor, y: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """Batch mean of L_Phi(p, y) = -sigmoid(y^T W log p + y^T b) with p = softmax(logits).

    ``logits`` (N, C), ``y`` (N,) int64 labels, ``W`` (C, C) or its diagonal (C,) (then the score is
    ``W[y] log p_y + b_y``), ``b`` (C,). Differentiable in the logits and in (W, b).
    """
    logp = F.log_softmax(logits, dim=1)
    if W.dim() == 1:  # diagonal: the gold class's own log-probability only
        score = W[y] * logp.gather(1, y[:, None]).squeeze(1) + b[y]
    else:
        score = (W[y] * logp).sum(dim=1) + b[y]  # y^T W log p + y^T b, one row of W per sample
    return -torch.sigmoid(score).mean()


def l2t_student_loss(logits: Tensor, y: Tensor, W: Tensor, b: Tensor, ce_alpha: float = 0.0) -> Tensor:
    """The student's objective ``ce_alpha * CE + (1 - ce_alpha) * L_Phi`` (``ce_alpha = 0``: L_Phi alone)."""
    dlf = dynamic_loss(logits, y, W, b)
    if ce_alpha == 0.0:
        return dlf
    return ce_alpha * F.cross_entropy(logits, y) + (1.0 - ce_alpha) * dlf


def l2t_loss_terms(logits: Tensor, y: Tensor, W: Tensor, b: Tensor, ce_alpha: float = 0.0) -> dict[str, Tensor]:
    """The weighted terms of :func:`l2t_student_loss` by name (``dlf``, and ``ce`` when ``ce_alpha > 0``),
    for the engine's per-term logging; their sum is the student's loss."""
    terms = {"dlf": (1.0 - ce_alpha) * dynamic_loss(logits, y, W, b)}
    if ce_alpha > 0.0:
        terms["ce"] = ce_alpha * F.cross_entropy(logits, y)
    return terms


def smooth_error(logits: Tensor, y: Tensor, k: float = 50.0) -> Tensor:
    """Smooth dev error ``mean(2 sigmoid(k (max_j p_j - p_y)) - 1)`` (Wu et al. 2018, Sec. 3.3).

    The max runs over *all* classes, the target included, exactly as in the formula: a correctly
    classified sample has ``max_j p_j = p_y`` and contributes exactly 0 (and no gradient), a
    misclassified one contributes ``2 sigmoid(k * margin) - 1`` in (0, 1), tending to 1 as its margin
    grows. The value is therefore a lower bound on the 0/1 error rate that approaches it for large k.
    (Excluding y from the max would also reward correct samples' margins; we keep the published form.)
    """
    p = F.softmax(logits, dim=1)
    p_y = p.gather(1, y[:, None]).squeeze(1)
    return (2.0 * torch.sigmoid(k * (p.max(dim=1).values - p_y)) - 1.0).mean()


def dev_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Mean dev-set cross-entropy (the alternative teacher objective)."""
    return F.cross_entropy(logits, y)


def phi_stats(W: Tensor, b: Tensor) -> dict[str, float]:
    """Summary numbers of Phi = (W, b) for logs and plots: mean of diag(W), mean off-diagonal entry of W,
    Frobenius distance from the identity, mean / min / max of b. ``W`` (C, C) or a stack (T, C, C) whose
    entries are averaged; a diagonal ``W`` (C,) or (T, C) counts as that diagonal matrix."""
    W = W.detach().float()
    b = b.detach().float()
    if W.dim() == b.dim():  # diagonal form
        W = torch.diag_embed(W)
    if W.dim() == 2:
        W, b = W[None], b[None]
    c = W.shape[-1]
    eye = torch.eye(c, dtype=W.dtype, device=W.device)
    diag = torch.diagonal(W, dim1=-2, dim2=-1)
    off = (W.sum(dim=(-2, -1)) - diag.sum(-1)) / max(1, c * c - c)
    return {"W_diag_mean": float(diag.mean()), "W_offdiag_mean": float(off.mean()),
            "W_dist_identity": float((W - eye).pow(2).sum(dim=(-2, -1)).sqrt().mean()),
            "b_mean": float(b.mean()), "b_min": float(b.min()), "b_max": float(b.max())}
