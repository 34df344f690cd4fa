"""Lee, Kim, Kwak & Cho 2018, "Self-supervised Knowledge Distillation Using Singular Value Decomposition"
(KDSVD, ECCV 2018), Sec. 3.

Each stage map, read as a (H W) x C matrix per sample, is compressed to its leading right singular
vectors (one C-vector each), scaled by the teacher's normalised singular values. The knowledge is the
*correlation between consecutive stages*: a Gaussian RBF ``exp(-(v_i - v'_j)^2 / 8)`` between every
entry of one stage's vectors and the previous stage's, and the student's correlations are fitted to the
teacher's with a squared error summed over every element and divided by the batch size.

The numbers are those of RepDistiller (HobbitLong/RepDistiller ``distiller_zoo/KDSVD.py``, ``KDSVD(k=1)``):
the teacher keeps k = 1 singular vector, the student k + 3 = 4, and each student vector is matched to the
teacher vector it is most (absolutely) cosine-aligned with, with that cosine's sign (``align_rsv``), so the
student's vectors follow the teacher's sign; singular vectors and values are L2-normalised
(``F.normalize``, eps 1e-12), non-finite SVD outputs and loss elements are replaced by 0 (``removenan``,
``torch.where(isfinite)``), the teacher's RBF is detached; the stages are ``feat[1:-1]`` (teachkit's
``stages``, post-activation), and student and teacher stages must have equal channel counts (the alignment
multiplies their C-vectors). Weight 1 (RepDistiller's and mdistiller's ``FEAT_WEIGHT`` 1 with CE 1).
mdistiller's copy reshapes each map to (C H) x W instead of (H W) x C before the SVD; we follow
RepDistiller, which is the paper's per-position reading.

SVD signs: a singular vector is defined up to its sign, and which sign a backend returns is arbitrary
(LAPACK, cuSOLVER and MAGMA differ). The reference aligns the student to the teacher but leaves the
teacher's own sign to the backend, and the RBF between two stages depends on it. ``canonical_signs``
(default on, a deliberate deviation) flips each teacher vector so that its largest-magnitude entry is
positive, making the loss a function of the features alone; with ``canonical_signs: false`` the numbers
are the reference's on the same backend.

Rank-deficient features (fewer positions than singular vectors asked for, all-zero channels, a stage of
identical rows): the SVD returns min(H W, C) vectors, so the student keeps at most that many; a zero
map's vectors are whatever the backend returns (normalised; the value stays finite). The SVD's gradient
divides by differences of squared singular values, so equal (e.g. zero) singular values give
non-finite gradients: those entries of the gradient reaching the student's stage map are set to 0
(a backward hook), the gradient counterpart of the reference's ``removenan``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def _finite(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _finite_grad(x: Tensor) -> Tensor:
    """``x`` itself, with non-finite entries of the gradient flowing back into it set to 0."""
    if x.requires_grad:
        x.register_hook(_finite)
    return x


def right_singular(feat: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(V, s): the ``n`` leading right singular vectors of each sample's (H W) x C matrix, (B, C, n'), and the
    singular values, (B, n'), with n' = min(n, H W, C); both L2-normalised (vectors over C, values over n')."""
    x = feat.flatten(2).transpose(1, 2)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    v = _finite(vh.transpose(-2, -1))[:, :, :n]
    s = _finite(s)[:, :n]
    return F.normalize(v, dim=1), F.normalize(s, dim=1)


def canonical_signs(v: Tensor) -> Tensor:
    """Each column of (B, C, n) flipped so that its largest-magnitude entry is positive (ties: the first)."""
    top = v.abs().argmax(dim=1, keepdim=True)
    sign = torch.sign(v.gather(1, top))
    return v * torch.where(sign == 0, torch.ones_like(sign), sign)


def align_to(student: Tensor, teacher: Tensor) -> Tensor:
    """RepDistiller's ``align_rsv``: for each teacher vector, the student vector with the largest |cosine|
    (every tie kept, as the reference's equality mask), times that cosine's sign: (B, C, n_t)."""
    cosine = student.transpose(-2, -1) @ teacher
    best = cosine.abs().amax(dim=1, keepdim=True)
    mask = torch.where(best == cosine.abs(), torch.sign(cosine), torch.zeros_like(cosine))
    return student @ mask


def kdsvd_terms(student_maps: list[Tensor], teacher_maps: list[Tensor], k: int = 1,
                canonical: bool = True) -> list[Tensor]:
    """One term per consecutive stage pair: ``sum (RBF_s - RBF_t)^2 / B`` (module docstring)."""
    terms: list[Tensor] = []
    previous: tuple[Tensor, Tensor] | None = None
    for f_s, f_t in zip(student_maps, teacher_maps, strict=True):
        v_t, s_t = right_singular(upcast(f_t), k)
        if canonical:
            v_t = canonical_signs(v_t)
        v_s, _ = right_singular(_finite_grad(upcast(f_s)), k + 3)
        v_s = align_to(v_s, v_t)
        scale = s_t.unsqueeze(1)
        v_t, v_s = v_t * scale, v_s * scale
        if previous is not None:
            v_sb, v_tb = previous
            s_rbf = torch.exp(-(v_s.unsqueeze(2) - v_sb.unsqueeze(1)).pow(2) / 8)
            t_rbf = torch.exp(-(v_t.unsqueeze(2) - v_tb.unsqueeze(1)).pow(2) / 8)
            terms.append(_finite((s_rbf - t_rbf.detach()).pow(2)).sum() / f_s.shape[0])
        previous = (v_s, v_t)
    return terms


@dataclass
class KDSVDOptions(Options):
    """``k``: the teacher's singular vectors per stage (the student keeps k + 3; 1, RepDistiller's);
    ``canonical_signs``: fix the teacher vectors' signs (see the module docstring; off = the reference)."""

    k: int = option(1, ge=1)
    canonical_signs: bool = True


@LOSSES.register("kdsvd", "KD-SVD: RBF correlations of sign-aligned leading singular vectors of consecutive stages "
                          "(Lee et al. 2018)", options=KDSVDOptions)
class KDSVD(DistillLoss):
    """KDSVD (Lee et al. 2018) as RepDistiller computes it (module docstring): term ``kdsvd`` = the sum of
    :func:`kdsvd_terms` over the paired stages."""

    student_needs = teacher_needs = ("stages",)
    term_names = ("kdsvd",)
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, options: KDSVDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or KDSVDOptions()
        require_taps("kdsvd", student, teacher, "stages")
        pairs = paired_stages(student.stages, teacher.stages)
        if len(pairs) < 2:
            raise ConfigError(f"'kdsvd' correlates consecutive stages, so it needs at least 2 stage maps on each "
                              f"side; the probed models pair {len(pairs)} (name more in model.taps.stages)")
        n_s = len(student.stages)
        for i, (f_s, f_t) in enumerate(pairs):
            if f_s.dim() != 4 or f_t.dim() != 4:
                raise ConfigError(f"'kdsvd' needs spatial stage maps (B, C, H, W); stage pair {i} has shapes "
                                  f"{tuple(f_s.shape)} and {tuple(f_t.shape)}")
            if f_s.shape[1] != f_t.shape[1]:
                raise ConfigError(f"'kdsvd' aligns student and teacher singular vectors over the channels, so "
                                  f"paired stages need equal channel counts: student stage {n_s - len(pairs) + i} "
                                  f"has {f_s.shape[1]}, the paired teacher stage {f_t.shape[1]}")

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        pairs = paired_stages(student.stages, teacher.stages)
        terms = kdsvd_terms([s for s, _ in pairs], [t.detach() for _, t in pairs], self.options.k,
                            self.options.canonical_signs)
        return {"kdsvd": sum(terms)}
