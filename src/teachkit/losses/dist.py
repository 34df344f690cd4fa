"""Huang, You, Wang, Qian & Xu 2022, "Knowledge Distillation from A Stronger Teacher" (DIST, NeurIPS 2022).

DIST swaps KD's exact match (KL) for a relational one. It keeps the *correlation* between the
student's and the teacher's predictions and ignores their scale and shift. With ``Y = softmax(Z / tau)``
row-wise (a B x C matrix, one row per sample), the paper's Sec. 3 defines:

- Pearson correlation ``rho_p(u, v) = Cov(u, v) / (Std(u) Std(v))`` and Pearson distance
  ``d_p(u, v) = 1 - rho_p(u, v)``;
- inter-class relation ``L_inter = tau^2 / B * sum_i d_p(Y^s_{i,:}, Y^t_{i,:})``: each sample's
  prediction over the classes (the rows);
- intra-class relation ``L_intra = tau^2 / C * sum_j d_p(Y^s_{:,j}, Y^t_{:,j})``: each class's
  probabilities over the batch (the columns);
- training loss ``L_tr = alpha L_cls + beta L_inter + gamma L_intra``.

The numbers are those of the authors' code. ``DIST`` in ``lib/models/losses/dist_kd.py`` of
hunto/image_classification_sota is the ``classification`` submodule of hunto/DIST_KD, and its
``segmentation/losses/dist_kd.py`` holds the same relations. It computes rho_p as the cosine of the
row-centred vectors, ``<a - mean(a), b - mean(b)> / (|a - mean(a)| |b - mean(b)| + 1e-8)``, so a
constant row has correlation 0, not NaN. The intra-class relation is the inter-class one on the
transposed matrices.

Dense predictions (segmentation). Logits (N, C, *spatial) are read as N x prod(spatial) rows of C
classes: ``(N, C, H, W) -> (N H W, C)`` (:func:`as_class_rows`), and the relations above run on those rows,
so L_inter averages over every pixel and L_intra correlates each class over all the batch's pixels. This
is the authors' ``segmentation/losses/dist_kd.py`` (hunto/DIST_KD), which flattens with
``transpose(1, 3).reshape(-1, C)``: its rows come in (n, w, h) order, ours in (n, h, w) order, and neither
relation depends on the order of the rows (a mean over rows; correlations of two equally permuted
vectors). Their segmentation loss has no temperature (softmax at tau = 1, no tau^2) and keeps the
``DIST`` class defaults beta = gamma = 1 (``train_kd.py``: ``DIST()`` with ``--lambda-kd 1`` on the main
head and 0.4 on the auxiliary one), so ``kd.options.dist: {beta: 1, gamma: 1, tau: 1}`` gives their
numbers; their ``use_sigmoid`` variant is not offered. Their code accepts 2-D and 4-D logits only; any
(N, C, *spatial) is accepted here (a 1-D map (N, C, L) included).

Defaults are the authors' CIFAR-100 setting: beta = gamma = 2, tau = 4, CE weight 1. The authors'
``configs/strategies/distill/dist_cifar.yaml`` (same repository) selects ``kd: dist_t4``, which is
``DIST(beta=1, gamma=1, tau=4)``, with ``ori_loss_weight: 1`` and ``kd_loss_weight: 2``. That gives
CE + 2 tau^2 (L_inter + L_intra): beta = gamma = 2 written as the outer loss weight. Here beta and
gamma carry the 2 and the method's weight (``default_weight``) is 1, with the same total. On ImageNet
(``resnet_dist.yaml``, ``dist_b2.yaml``: ``kd: dist``, ``kd_loss_weight: 2``) the authors use
beta = gamma = 2 with tau = 1. Their ``DIST`` class defaults to beta = gamma = tau = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from teachkit.losses.base import DistillLoss, LogitRanks
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast

#: Added to the product of norms in the correlation's denominator (the authors' value).
EPS = 1e-8


def pearson_correlation(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """rho_p of each row pair (Huang et al. 2022, Sec. 3): shape (N,) for (N, D) inputs.

    ``rho_p(u, v) = Cov(u, v) / (Std(u) Std(v))``, computed as the cosine of the row-centred vectors
    with ``eps`` added to the product of their norms, as in the authors' code. A constant row gives 0.
    Invariant to ``u -> m u + n`` for any m > 0 (up to eps).
    """
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    return (a * b).sum(dim=1) / (a.norm(dim=1) * b.norm(dim=1) + eps)


def inter_class_relation(y_s: Tensor, y_t: Tensor, eps: float = EPS) -> Tensor:
    """The paper's L_inter without tau^2: ``1/B sum_i d_p(y_s[i], y_t[i]) = 1 - mean_i rho_p(y_s[i], y_t[i])``.

    ``y_s`` / ``y_t``: (B, C) predicted probabilities. Each sample's correlation across the classes
    is compared, so a positive affine map of any row leaves the value unchanged. 0 when the rows agree.
    """
    return 1 - pearson_correlation(y_s, y_t, eps).mean()


def intra_class_relation(y_s: Tensor, y_t: Tensor, eps: float = EPS) -> Tensor:
    """The paper's L_intra without tau^2: ``1/C sum_j d_p(y_s[:, j], y_t[:, j])``.

    This is :func:`inter_class_relation` on the transposed (C, B) matrices: each class's
    probabilities across the batch. A batch of one sample has constant columns, so the value is
    exactly 1 with no gradient.
    """
    return inter_class_relation(y_s.t(), y_t.t(), eps)


def as_class_rows(logits: Tensor) -> Tensor:
    """(B, C) logits unchanged; dense (N, C, *spatial) ones as (N prod(spatial), C), one row per position
    (the authors' segmentation code flattens the pixels into rows)."""
    if logits.dim() <= 2:
        return logits
    return logits.movedim(1, -1).reshape(-1, logits.shape[1])


def dist_terms(student_logits: Tensor, teacher_logits: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Unweighted (L_inter, L_intra) of Huang et al. 2022, each times tau^2, on ``softmax(z / tau)`` of the
    (B, C) logits or of the rows of dense (N, C, *spatial) ones (:func:`as_class_rows`).

    The computation runs in at least float32; float64 inputs stay float64.
    """
    y_s = (as_class_rows(upcast(student_logits)) / tau).softmax(dim=1)
    y_t = (as_class_rows(upcast(teacher_logits)) / tau).softmax(dim=1)
    scale = tau**2
    return scale * inter_class_relation(y_s, y_t), scale * intra_class_relation(y_s, y_t)


@dataclass
class DISTOptions(Options):
    """``beta`` / ``gamma``: the weights of the inter- and intra-class relations. ``tau``: the softmax
    temperature. Defaults are the authors' CIFAR-100 setting, 2, 2 and 4; on ImageNet they use tau 1."""

    beta: float = option(2.0, ge=0.0)
    gamma: float = option(2.0, ge=0.0)
    tau: float = option(4.0, gt=0.0)


@LOSSES.register("dist", "DIST: tau^2 (beta (1 - Pearson per sample) + gamma (1 - Pearson per class)); 2, 2, tau 4",
                 options=DISTOptions)
class DIST(DistillLoss):
    """DIST (Huang et al. 2022): ``beta L_inter + gamma L_intra`` on ``softmax(z / tau)``, times tau^2.

    Returns the unweighted ``{"inter": tau^2 L_inter, "intra": tau^2 L_intra}``. beta and gamma are
    ``term_weights``, so the objective logs ``dist.inter`` / ``dist.intra``; with its weight
    (``default_weight`` 1, set by ``kd.gamma.dist``) and CE at 1 they form the paper's
    ``L_cls + beta L_inter + gamma L_intra``. Do not confuse ``kd.options.dist.gamma``, the weight of
    L_intra, with ``kd.gamma.dist``, the weight of the whole method. Logits are (B, C) or dense
    (N, C, *spatial), one row per position (module docstring); other ranks are refused at construction.
    """

    student_needs = teacher_needs = ("logits",)
    term_names = ("inter", "intra")
    default_weight = 1.0
    logit_ranks = LogitRanks(2, None, "(batch, classes) or dense (batch, classes, *spatial)")

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, options: DISTOptions | None = None,
                 *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or DISTOptions()
        self.beta, self.gamma, self.tau = self.options.beta, self.options.gamma, self.options.tau
        self.term_weights = {"inter": self.beta, "intra": self.gamma}

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        inter, intra = dist_terms(student.logits, teacher.logits.detach(), self.tau)
        return {"inter": inter, "intra": intra}

    def extra_repr(self) -> str:
        return f"beta={self.beta}, gamma={self.gamma}, tau={self.tau}"
