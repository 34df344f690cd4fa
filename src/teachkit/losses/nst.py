"""Huang & Wang 2017, "Like What You Like: Knowledge Distill via Neuron Selectivity Transfer" (NST,
arXiv:1707.01219), Sec. 3.3: the NST loss with the polynomial kernel.

Each channel of a stage map is one neuron's *selectivity pattern* over the spatial positions. NST
matches the distribution of the student's patterns to the teacher's with the squared maximum mean
discrepancy (MMD), each pattern L2-normalised over the positions first, under the polynomial kernel
``k(a, b) = (a . b + c)^d`` with d = 2, c = 0 (the paper's best kernel):

    MMD^2 = 1/C_t^2 sum_{i,i'} k(t_i, t_i') + 1/C_s^2 sum_{j,j'} k(s_j, s_j') - 2/(C_s C_t) sum_{i,j} k(s_j, t_i)

per sample, averaged over the batch, summed over the stages. The paper's total is ``CE + lambda/2 MMD^2``;
here (as in the reference) the weight multiplies MMD^2 itself.

The numbers are those of RepDistiller (HobbitLong/RepDistiller ``distiller_zoo/NST.py``, ``NSTLoss`` with
``full_loss=True``, fed ``feat[1:-1]`` by ``helper/loops.py``): the stage outputs without the stem and the
pooled embedding, teachkit's post-activation ``stages``; where spatial sizes differ the larger map is
average-pooled to the smaller one's size (``F.adaptive_avg_pool2d``, via :func:`match_spatial`) before
normalising; ``F.normalize`` over the flattened positions (eps 1e-12: an all-zero channel stays 0);
``mean`` over the batch and every channel pair; the teacher-teacher term is computed and detached (it
only shifts the value), and the teacher's maps are detached. Default weight 50: RepDistiller's
``scripts/run_cifar_distill.sh`` runs ``--distill nst -a 0 -b 50`` (CE weight 1). mdistiller
(``mdistiller/distillers/NST.py``, ``CFG.NST.LOSS.FEAT_WEIGHT`` 50, stages ``feats[1:]`` = the same three
maps) computes the identical loss; no difference.

Deviation (shapes only): when the two networks have different stage counts the last ``min(n_s, n_t)``
stages are paired (RepDistiller zips equally deep lists); non-square maps are pooled per dimension to
(min H, min W) (RepDistiller pools to a square of the smaller height: the same for square maps);
(B, C, L) maps of 1-D networks are read as (B, C, L, 1).
"""

from __future__ import annotations

from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import as_map, match_spatial, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.types import Batch, Progress, Taps, upcast


def selectivity(f: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, C, H*W): each channel's map flattened and L2-normalised over the positions
    (``F.normalize``: divided by max(norm, 1e-12))."""
    flat = f.flatten(2)
    return flat / flat.norm(dim=2, keepdim=True).clamp_min(1e-12)


def poly_kernel_mean(a: Tensor, b: Tensor) -> Tensor:
    """``mean_{n,i,j} (a[n, i] . b[n, j])^2`` for (B, Ca, L) and (B, Cb, L): the d = 2, c = 0 kernel."""
    return (a @ b.transpose(1, 2)).pow(2).mean()


def nst_term(f_s: Tensor, f_t: Tensor) -> Tensor:
    """Squared polynomial-kernel MMD between the channel patterns of one stage pair (teacher term detached)."""
    f_s, f_t = match_spatial(as_map(upcast(f_s)), as_map(upcast(f_t)))
    s, t = selectivity(f_s), selectivity(f_t)
    return poly_kernel_mean(t, t).detach() + poly_kernel_mean(s, s) - 2 * poly_kernel_mean(s, t)


@LOSSES.register("nst", "neuron selectivity transfer: polynomial-kernel MMD of normalised channel maps per stage "
                        "(Huang & Wang 2017)")
class NST(DistillLoss):
    """NST (Huang & Wang 2017, Sec. 3.3), as RepDistiller's ``NSTLoss``: the sum over stage pairs of
    :func:`nst_term`. Reads post-activation ``stages``; channel counts may differ between the networks."""

    student_needs = teacher_needs = ("stages",)
    term_names = ("nst",)
    default_weight = 50.0

    def __init__(self, student: Taps, teacher: Taps, *, num_classes: int = 0, num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        require_taps("nst", student, teacher, "stages")
        for side, taps in (("student", student), ("teacher", teacher)):
            for i, f in enumerate(taps.stages):
                if f.dim() not in (3, 4):
                    raise ConfigError(f"'nst' needs spatial stage maps (B, C, H, W) or (B, C, L); {side} stage {i} "
                                      f"has shape {tuple(f.shape)} (use an embedding method such as pkt or rkd)")
        self.pairs = min(len(student.stages), len(teacher.stages))

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        pairs = paired_stages(student.stages, teacher.stages)
        return {"nst": sum(nst_term(f_s, f_t.detach()) for f_s, f_t in pairs)}
