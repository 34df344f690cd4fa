"""Peng et al. 2019, "Correlation Congruence for Knowledge Distillation" (ICCV 2019), as the CRD benchmark
(RepDistiller's ``Correlation``, code from the paper's authors) computes it."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from teachkit.losses.base import DistillLoss
from teachkit.losses.features import require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def correlation_loss(e_s: Tensor, e_t: Tensor) -> Tensor:
    """delta = |e_s - e_t|; mean over i = 0..B-2 of sum_j delta[i, j] * delta[i+1, j].

    RepDistiller's ``Correlation.forward`` verbatim in effect: a congruence of *consecutive* samples'
    embedding differences, not the paper's Gaussian-RBF correlation matrices (Eq. 7-8). A batch of one
    has no pair: the loss is 0 (RepDistiller would return NaN).
    """
    delta = (upcast(e_s) - upcast(e_t)).abs()
    if delta.shape[0] < 2:
        return delta.sum() * 0.0
    return (delta[:-1] * delta[1:]).sum(dim=1).mean()


@dataclass
class CCOptions(Options):
    """``feat_dim``: the width of the two linear embeddings (128, RepDistiller's)."""

    feat_dim: int = option(128, ge=1)


@LOSSES.register("cc", "correlation congruence on 128-d linear embeddings, RepDistiller form (Peng et al. 2019)",
                 options=CCOptions)
class CorrelationCongruence(DistillLoss):
    """Correlation congruence (Peng et al. 2019) as in the CRD benchmark (Tian et al. 2020):

    e_s = W_s z_s + b_s, e_t = W_t z_t + b_t, linear maps (RepDistiller's ``LinearEmbed``, no
    normalisation) from the pooled embeddings to ``feat_dim`` (128) dims, *both trained with the
    student* (the teacher's features are fixed; its embedding layer is not). Then, exactly as
    RepDistiller's ``Correlation``: delta = |e_s - e_t| and

        loss = mean_{i=0..B-2} sum_j delta[i, j] * delta[i+1, j],

    a product of consecutive samples' absolute embedding differences. This is what the benchmark's
    gamma 0.02 is tuned for; it is not the paper's kernel correlation matrix (Peng et al. 2019, Eq. 7-8):
    we follow the reference code the benchmark numbers come from.
    """

    student_needs = teacher_needs = ("embedding",)
    term_names = ("cc",)
    default_weight = 0.02

    def __init__(self, student: Taps, teacher: Taps, options: CCOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or CCOptions()
        require_taps("cc", student, teacher, "embedding")
        feat_dim = self.options.feat_dim
        self.embed_s = nn.Linear(student.embedding.flatten(1).shape[1], feat_dim)
        self.embed_t = nn.Linear(teacher.embedding.flatten(1).shape[1], feat_dim)

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        e_s = self.embed_s(student.embedding.flatten(1))
        e_t = self.embed_t(teacher.embedding.detach().flatten(1))
        return {"cc": correlation_loss(e_s, e_t)}
