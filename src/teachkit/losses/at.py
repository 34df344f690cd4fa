"""Zagoruyko & Komodakis 2017, "Paying More Attention to Attention" (ICLR 2017), Eq. 2 -- attention transfer."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses.base import DistillLoss
from teachkit.losses.features import match_spatial, paired_stages, require_taps
from teachkit.losses.registry import LOSSES
from teachkit.options import Options, option
from teachkit.types import Batch, Progress, Taps, upcast


def attention_map(f: Tensor, p: int = 2) -> Tensor:
    """Spatial attention Q = normalize(mean_c |f|^p, flattened) of a (B, C, H, W) map: the paper's
    F^p_sum up to the factor C, which the normalisation removes; RepDistiller's ``f.pow(p).mean(1)``
    for p = 2. Returns (B, H*W)."""
    return F.normalize(upcast(f).abs().pow(p).mean(1).flatten(1), dim=1)


def at_term(f_s: Tensor, f_t: Tensor, p: int = 2) -> Tensor:
    """mean((Q_s - Q_t)^2) over batch and positions for one stage pair, after spatial matching."""
    if f_s.dim() == 3:
        f_s, f_t = f_s[..., None], f_t[..., None]
    f_s, f_t = match_spatial(f_s, f_t)
    return (attention_map(f_s, p) - attention_map(f_t, p)).pow(2).mean()


@dataclass
class ATOptions(Options):
    """``p``: the power of the activation map (2, the paper's and RepDistiller's)."""

    p: int = option(2, ge=1)


@LOSSES.register("at", "attention transfer: sum over stages of mean((Q_s - Q_t)^2) (Zagoruyko & Komodakis 2017)",
                 options=ATOptions)
class AttentionTransfer(DistillLoss):
    """Attention transfer (Zagoruyko & Komodakis 2017, Eq. 2), as RepDistiller's ``Attention``:
    per stage ``Q = normalize(mean_c(f^2).flatten())`` and ``mean((Q_s - Q_t)^2)`` (mean over batch
    and positions, which is the paper's ||Q_s/||Q_s|| - Q_t/||Q_t|| ||_2 squared, divided by B*HW;
    the square makes gamma 1000 the right scale), summed over stages. Post-activation stage maps;
    where sizes differ the larger map is adaptive-average-pooled to the smaller.

    Stage pairing: RepDistiller uses every stage of two equally deep networks; here, when the
    student and teacher have different stage counts, the last ``min(n_s, n_t)`` of each are paired
    in order (deepest with deepest). Stage maps must be spatial ((B, C, H, W) or (B, C, L)).
    Options: :class:`ATOptions` (``p``, the power of the activation map).
    """

    student_needs = teacher_needs = ("stages",)
    term_names = ("at",)
    default_weight = 1000.0

    def __init__(self, student: Taps, teacher: Taps, options: ATOptions | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__(student, teacher, num_classes=num_classes, num_samples=num_samples)
        self.options = options or ATOptions()
        require_taps("at", student, teacher, "stages")
        for side, taps in (("student", student), ("teacher", teacher)):
            for i, f in enumerate(taps.stages):
                if f.dim() not in (3, 4):
                    raise ConfigError(f"'at' needs spatial stage maps (B, C, H, W) or (B, C, L); {side} stage {i} "
                                      f"has shape {tuple(f.shape)} (use an embedding method such as pkt or rkd)")
        self.p = self.options.p
        self.pairs = min(len(student.stages), len(teacher.stages))

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        pairs = paired_stages(student.stages, teacher.stages)
        return {"at": sum(at_term(f_s, f_t.detach(), self.p) for f_s, f_t in pairs)}
