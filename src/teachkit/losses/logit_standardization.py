"""Sun, Ren, Li, Wang & Cao 2024, "Logit Standardization in Knowledge Distillation" (CVPR 2024).

The paper replaces the temperature shared by teacher and student with a per-sample Z-score of each
model's logits before the softmax (its Algorithm 1): ``Z(z) = (z - mean(z)) / std(z)``, then
``softmax(Z(z) / tau)`` with a *base* temperature tau (2 in the authors' CIFAR-100 runs, with the KD
weight raised to 9). The student then only has to match the teacher's logit *relations*, not their
range or scale.

The numbers are those of the authors' code (sunshangquan/logit-standardization-KD,
``mdistiller/distillers/KD.py`` ``normalize``): the mean and the *unbiased* standard deviation (Bessel's
correction, ``Tensor.std``'s default) over the class dimension, with 1e-7 added to the standard
deviation: ``(z - mean) / (1e-7 + std)``.

The switch is ``logit_standardize`` on the logit methods that take it (``kd``, ``dkd``, ``mlkd``) and on
the trajectory recipes (``prokd.logit_standardize`` for prokd, annealing and rco).
"""

from __future__ import annotations

from torch import Tensor

#: Added to the standard deviation (the authors' value).
EPS = 1e-7

#: The authors' CIFAR-100 setting with standardisation: base temperature 2, KD weight 9.
BASE_TEMPERATURE = 2.0
KD_WEIGHT = 9.0


def standardize_logits(logits: Tensor, eps: float = EPS) -> Tensor:
    """Z-score each row over the last (class) dimension: ``(z - mean) / (eps + std)``, std unbiased
    (Sun et al. 2024, Algorithm 1; the authors' ``normalize``). Invariant to ``z -> a z + b`` for a > 0
    (up to eps). A single class (std undefined) is refused by the caller, not here."""
    mean = logits.mean(dim=-1, keepdim=True)
    std = logits.std(dim=-1, keepdim=True)
    return (logits - mean) / (eps + std)


def maybe_standardize(student: Tensor, teacher: Tensor, on: bool) -> tuple[Tensor, Tensor]:
    """``(Z(student), Z(teacher))`` when ``on``, else the logits unchanged."""
    return (standardize_logits(student), standardize_logits(teacher)) if on else (student, teacher)
