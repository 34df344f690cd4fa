"""Lee, Kim, Kwak & Cho 2018, "Self-supervised Knowledge Distillation Using Singular Value Decomposition"
(KDSVD, ECCV 2018), Sec. 3.

Each stage map, read as a (H W) x C matrix per sample, is compressed to its leading right singular
vectors (one C-vector each, the "compressed feature map"), scaled by the teacher's normalised singular
values. The knowledge is the *correlation between consecutive stages*: a Gaussian RBF
``exp(-(v_i - v'_j)^2 / 8)`` between every entry of one stage's vectors and the previous stage's, and the
student's correlations are fitted to the teacher's with a squared error summed over every element and
divided by the batch size; the terms of the consecutive stage pairs are summed.

The numbers are those of RepDistiller (HobbitLong/RepDistiller ``distiller_zoo/KDSVD.py``, ``KDSVD(k=1)``,
fed ``feat[1:-1]`` by ``helper/loops.py``: the stage outputs, teachkit's post-activation ``stages``):

- the teacher keeps k singular vectors, the student k + 3; each teacher vector takes the student vector
  with the largest |cosine| to it, times that cosine's sign (``align_rsv``; every tie is kept, as the
  reference's equality mask does), so the student's vectors follow the teacher's signs;
- singular vectors and values are L2-normalised (``F.normalize``, eps 1e-12; vectors over C, values over
  the kept ones, so with k = 1 the scale is exactly 1), non-finite SVD outputs and loss elements are
  replaced by 0 (``removenan``, ``torch.where(isfinite)``), the teacher's RBF is detached (the teacher's
  maps too: no gradient reaches it);
- student and teacher stages must have equal channel counts (the alignment multiplies their C-vectors).

Default weight 1: RepDistiller's ``scripts/run_cifar_distill.sh`` has no KDSVD line (``-b`` defaults to
None) and its README tables have no KDSVD row; mdistiller's ``CFG.KDSVD.LOSS.FEAT_WEIGHT`` is 1 (CE 1, K 1).

Layout (option ``layout``). ``repdistiller`` (default) reads each map as the (H W) x C matrix above, the
paper's per-position reading (the authors' TensorFlow code, sseung0703/SSKD_SVD ``nets/Distillation.py``,
reshapes its NHWC maps to (H W) x C as well). mdistiller's copy (megvii-research/mdistiller
``mdistiller/distillers/KDSVD.py``, stages ``feats[1:]``, the same three maps) instead views each (B, C, H, W)
map as ``feat.view(B, C * H, W).float()``: a (C H) x W matrix whose right singular vectors run over the
map's *width* W, not its channels. ``layout: mdistiller`` reproduces that: the vectors are W-vectors, the
student's are aligned to the teacher's over W (so paired stages need equal widths W, and may differ in
channels), and the RBF compares the W entries of consecutive stages. Everything else in mdistiller's file is
RepDistiller's: ``torch.svd``, ``removenan``, ``F.normalize`` (eps 1e-12) of the first k (teacher) / k + 3
(student) vectors and values, ``align_rsv`` (largest |cosine|, its sign, every tie kept), values times the
teacher's normalised singular values, ``exp(-d^2 / 8)``, the finite-masked squared error summed and divided by
the batch size, K = 1. Its ``.float()`` casts every input to float32; here the computation runs in at least
float32 as everywhere in teachkit (float32 and half inputs as mdistiller, float64 stays float64).
``canonical_signs`` applies to both layouts (off: the reference's numbers on the same backend).

SVD signs. A singular vector is defined up to its sign and which sign a backend returns is arbitrary
(LAPACK, cuSOLVER and MAGMA differ). The reference aligns the student to the teacher but leaves the
teacher's own sign to the backend, and the RBF between two stages depends on it (the authors' TF
``Align_rsv`` flips the teacher to the student instead: backend-dependent as well). Deviation:
``canonical_signs`` (default on) flips each teacher vector so that its largest-magnitude entry is
positive (ties: the first), making the loss a function of the features alone (for post-ReLU maps the
leading vector is the nonnegative Perron vector, so this is robust); ``canonical_signs: false`` gives the
reference's numbers on the same backend.

Rank-deficient features. Deviation, gradient only: the reference differentiates ``torch.svd``, whose
backward divides by ``s_j^2 - s_i^2`` for *every* pair of singular values, so repeated ones (two dead
channels, a zero map) give NaN in the whole sample's gradient when they come out exactly equal (exactly
zero columns in float64 do; in float32 LAPACK usually returns distinct round-off values and the
reference's gradient is then finite and, up to round-off, ours), although the kept vectors are smooth
functions of the map whenever their singular values are simple. :class:`TopRightSingular` computes the
same forward (``torch.linalg.svd``, equal to ``torch.svd`` in float64) and the same backward restricted
to the kept vectors, with every reciprocal of a singular value or of a gap ``|s_i - s_j|`` at or below
``max(H W, C) * eps(dtype) * s_max`` (numerically zero) taken as 0. So:

- dead channels / repeated singular values among the dropped ones: the exact gradient (the reference: NaN);
- a kept singular value equal to another (its vector is not unique): that pair's rotation is left out of
  the gradient (a finite sub-gradient);
- an all-zero map: value finite (its vectors are the backend's basis vectors, or 0), gradient 0;
- fewer singular vectors than asked (H W or C below k, or below k + 3 for the student): the SVD has
  min(H W, C) of them; the missing ones are zero vectors with singular value 0 (deviation: the reference
  broadcasts mismatched counts between consecutive stages or fails), identical to the reference otherwise.

Non-square maps are flattened over H W (RepDistiller's ``view(-1, C, H * H)`` assumes H = W; mdistiller's
view is exact for any H, W).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import equal_width_stage_pairs, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def _finite(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _safe_reciprocal(x: Tensor, keep: Tensor) -> Tensor:
    """``1 / x`` where ``keep``, else 0 (no inf or NaN is formed, so none reaches a gradient)."""
    return torch.where(keep, 1 / torch.where(keep, x, torch.ones_like(x)), torch.zeros_like(x))


class TopRightSingular(torch.autograd.Function):
    """(V, s) = the ``n`` leading right singular vectors, (B, C, n'), and values, (B, n'), of the thin SVD of
    a (B, M, C) batch, n' = min(n, M, C); the backward is torch's SVD backward (gU = 0) on the kept vectors
    with numerically zero singular values and gaps given reciprocal 0 (module docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, n: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        ctx.save_for_backward(u, s, vh)
        ctx.kept = min(n, s.shape[-1])
        return vh[:, :ctx.kept].transpose(-2, -1), s[:, :ctx.kept]

    @staticmethod
    def backward(ctx, g_v: Tensor | None, g_s: Tensor | None) -> tuple[Tensor, None]:  # type: ignore[override]
        u, s, vh = ctx.saved_tensors
        kept, m, c, r = ctx.kept, u.shape[-2], vh.shape[-1], s.shape[-1]
        g_vh = torch.zeros_like(vh)
        if g_v is not None:
            g_vh[:, :kept] = g_v.transpose(-2, -1)
        inner = torch.zeros_like(s).diag_embed()
        if g_s is not None:
            inner = torch.cat([g_s, torch.zeros_like(s[:, kept:])], dim=1).diag_embed()
        tol = (max(m, c) * torch.finfo(s.dtype).eps * s.amax(dim=-1, keepdim=True)).unsqueeze(-1)  # (B, 1, 1)
        # gA = U [S (skew(V^T gV) / E) + diag(gS)] V^T + U S^-1 gV^T (I - V V^T), E[a, b] = s_b^2 - s_a^2
        x = vh @ g_vh.transpose(-2, -1)
        e = s.unsqueeze(-2).pow(2) - s.unsqueeze(-1).pow(2)
        distinct = (s.unsqueeze(-2) - s.unsqueeze(-1)).abs() > tol
        inner = inner + s.unsqueeze(-1) * (x - x.transpose(-2, -1)) * _safe_reciprocal(e, distinct)
        g_a = u @ inner @ vh
        if c > r:  # the part of gV outside the row space (M < C)
            inv_s = _safe_reciprocal(s, s > tol.squeeze(-1))
            g_a = g_a + u @ (inv_s.unsqueeze(-1) * (g_vh - (g_vh @ vh.transpose(-2, -1)) @ vh))
        return g_a, None


#: the matrix each stage map is read as before the SVD (module docstring)
Layout = Literal["repdistiller", "mdistiller"]


def stage_matrix(feat: Tensor, layout: str = "repdistiller") -> Tensor:
    """Each sample's (B, C, H, W) map as the matrix whose right singular vectors KDSVD keeps: (B, H W, C) for
    ``repdistiller`` (vectors over the channels), (B, C H, W) for ``mdistiller`` (over the width W)."""
    if layout == "mdistiller":
        b, c, h, w = feat.shape
        return feat.reshape(b, c * h, w)
    return feat.flatten(2).transpose(1, 2)


def right_singular(feat: Tensor, n: int, layout: str = "repdistiller") -> tuple[Tensor, Tensor]:
    """(V, s): the ``n`` leading right singular vectors of each sample's :func:`stage_matrix` (M x D), (B, D, n)
    (D = C, or W with ``layout="mdistiller"``), and the singular values, (B, n), both L2-normalised (vectors
    over D, values over the n); when the matrix has fewer than n (min(M, D) < n) the rest are zero columns /
    zero values."""
    v, s = TopRightSingular.apply(stage_matrix(feat, layout), n)
    v, s = _finite(v), _finite(s)
    if v.shape[-1] < n:
        v, s = F.pad(v, (0, n - v.shape[-1])), F.pad(s, (0, n - s.shape[-1]))
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
                canonical: bool = True, layout: str = "repdistiller") -> list[Tensor]:
    """One term per consecutive stage pair: ``sum (RBF_s - RBF_t)^2 / B`` (module docstring)."""
    terms: list[Tensor] = []
    previous: tuple[Tensor, Tensor] | None = None
    for f_s, f_t in zip(student_maps, teacher_maps, strict=True):
        v_t, s_t = right_singular(upcast(f_t), k, layout)
        if canonical:
            v_t = canonical_signs(v_t)
        v_s, _ = right_singular(upcast(f_s), k + 3, layout)
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


def check_stage_pairs(student: Taps, teacher: Taps, layout: str) -> None:
    """The models' checks: two or more paired (B, C, H, W) stages of equal channel counts (``repdistiller``)
    or of equal widths W (``mdistiller``, whose singular vectors run over W); one ConfigError line."""
    if layout != "mdistiller":
        equal_width_stage_pairs("kdsvd", student, teacher,
                                "aligns student and teacher singular vectors over the channels")
        return
    require_taps("kdsvd", student, teacher, "stages")
    pairs = paired_stages(student.stages, teacher.stages)
    if len(pairs) < 2 or any(f.dim() != 4 for pair in pairs for f in pair):
        shapes = [(tuple(f_s.shape), tuple(f_t.shape)) for f_s, f_t in pairs]
        raise ConfigError(f"'kdsvd' compares consecutive stages, so it needs at least 2 paired spatial stage maps "
                          f"(B, C, H, W) on each side; the probed models pair {shapes}")
    first_s, first_t = len(student.stages) - len(pairs), len(teacher.stages) - len(pairs)
    for i, (f_s, f_t) in enumerate(pairs):
        if f_s.shape[3] != f_t.shape[3]:
            raise ConfigError(f"'kdsvd' with kd.options.kdsvd.layout=mdistiller aligns singular vectors over the map "
                              f"width W, so paired stages need equal widths: student stage {first_s + i} / teacher "
                              f"stage {first_t + i} have W = {f_s.shape[3]} and {f_t.shape[3]} (use layout "
                              "repdistiller, or pair stages of equal widths in model.taps.stages)")


@dataclass
class KDSVDOptions(Options):
    """``k``: the teacher's singular vectors per stage (the student keeps k + 3; 1, RepDistiller's);
    ``canonical_signs``: fix the teacher vectors' signs (see the module docstring; off = the reference);
    ``layout``: ``repdistiller`` ((H W) x C matrices, vectors over the channels) or ``mdistiller``
    ((C H) x W, vectors over the width W, as mdistiller's copy)."""

    k: int = option(1, ge=1)
    canonical_signs: bool = True
    layout: Layout = "repdistiller"


@LOSSES.register("kdsvd", "KD-SVD: RBF correlations of sign-aligned leading singular vectors of consecutive stages "
                          "(Lee et al. 2018)", options=KDSVDOptions)
class KDSVD(DistillLoss):
    """KDSVD (Lee et al. 2018) as RepDistiller computes it, or mdistiller with ``layout: mdistiller`` (module
    docstring): term ``kdsvd`` = the sum of :func:`kdsvd_terms` over the paired stages."""

    student_needs = teacher_needs = ("stages",)
    term_names = ("kdsvd",)
    default_weight = 1.0

    def __init__(self, student: Taps, teacher: Taps, options: KDSVDOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or KDSVDOptions()
        check_stage_pairs(student, teacher, self.options.layout)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        opts = self.options
        pairs = paired_stages(student.stages, teacher.stages)
        terms = kdsvd_terms([s for s, _ in pairs], [t.detach() for _, t in pairs], opts.k, opts.canonical_signs,
                            opts.layout)
        return {"kdsvd": sum(terms)}

    def extra_repr(self) -> str:
        opts = self.options
        return f"k={opts.k}, canonical_signs={opts.canonical_signs}, layout={opts.layout}"
