"""Feature-map helpers the feature-based distillation losses share: tap checks, stage pairing and
indexing, and spatial matching by adaptive average pooling.

Every check here depends on the probed models (which taps exist, how many stages, their shapes), so it
runs when a loss is built from the probes and fails as one :class:`~teachkit.errors.ConfigError` line.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.types import Taps

__all__ = ["as_map", "equal_width_stage_pairs", "match_spatial", "paired_stages", "require_taps", "stage_index"]

#: Where each side's taps are named in the run configuration.
_CONFIG_KEY = {"student": "model.taps", "teacher": "teacher.model.taps"}


def require_taps(method: str, student: Taps, teacher: Taps, tap: str) -> None:
    """ConfigError naming ``tap`` when the probed student or teacher lacks it (None or no stages)."""
    for side, taps in (("student", student), ("teacher", teacher)):
        value = taps.get(tap)
        if value is None or (isinstance(value, list) and not value):
            raise ConfigError(f"{method!r} needs the {side}'s {tap!r} tap but the probed {side} has none; "
                              f"name its module path(s) in {_CONFIG_KEY[side]}.{tap}")


def as_map(f: Tensor) -> Tensor:
    """A stage output as a (B, C, H, W) map: (B, C) -> (B, C, 1, 1), (B, C, L) -> (B, C, L, 1)."""
    if f.dim() == 2:
        return f[:, :, None, None]
    if f.dim() == 3:
        return f[..., None]
    if f.dim() == 4:
        return f
    raise ConfigError(f"stage maps must be (B, C), (B, C, L) or (B, C, H, W); got shape {tuple(f.shape)}")


def match_spatial(f_s: Tensor, f_t: Tensor) -> tuple[Tensor, Tensor]:
    """Adaptive-average-pool whichever (B, C, H, W) map is larger to the smaller's (H, W).

    (Per dimension: the target is (min(H_s, H_t), min(W_s, W_t)); RepDistiller pools to a square
    of the smaller height, which is the same for the square maps of its zoo.)
    """
    size = (min(f_s.shape[2], f_t.shape[2]), min(f_s.shape[3], f_t.shape[3]))
    if tuple(f_s.shape[2:]) != size:
        f_s = F.adaptive_avg_pool2d(f_s, size)
    if tuple(f_t.shape[2:]) != size:
        f_t = F.adaptive_avg_pool2d(f_t, size)
    return f_s, f_t


def paired_stages(student: Sequence[Tensor], teacher: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Pair the last ``min(n_s, n_t)`` stages of each side, in order (deepest with deepest)."""
    n = min(len(student), len(teacher))
    return list(zip(student[len(student) - n:], teacher[len(teacher) - n:], strict=True))


def stage_index(key: str, side: str, index: int, count: int) -> int:
    """``index`` into ``count`` stages (negative counts from the end), or a ConfigError naming the option
    ``key`` (``kd.options.fitnet.stage``) and the range the probed ``side`` allows."""
    if not -count <= index < count:
        raise ConfigError(f"{key}={index!r} is out of range: {side} has {count} stage(s), so it must be in "
                          f"{-count}..{count - 1}")
    return index % count


def equal_width_stage_pairs(method: str, student: Taps, teacher: Taps, why: str) -> None:
    """The checks of a method comparing consecutive stages of equal widths (FSP's flow matrices, KDSVD's
    singular vectors): the ``stages`` tap on both sides, at least two paired stages, each a (B, C, H, W)
    map, and equal channel counts per pair; ``why`` says why the widths must agree. One ConfigError line."""
    require_taps(method, student, teacher, "stages")
    pairs = paired_stages(student.stages, teacher.stages)
    if len(pairs) < 2:
        raise ConfigError(f"{method!r} compares consecutive stages, so it needs at least 2 stage maps on each side; "
                          f"the probed models pair {len(pairs)} (name more in model.taps.stages)")
    first_s, first_t = len(student.stages) - len(pairs), len(teacher.stages) - len(pairs)
    for i, (f_s, f_t) in enumerate(pairs):
        name = f"student stage {first_s + i} / teacher stage {first_t + i}"
        if f_s.dim() != 4 or f_t.dim() != 4:
            raise ConfigError(f"{method!r} needs spatial stage maps (B, C, H, W); {name} have shapes "
                              f"{tuple(f_s.shape)} and {tuple(f_t.shape)}")
        if f_s.shape[1] != f_t.shape[1]:
            raise ConfigError(f"{method!r} {why}, so paired stages need equal channel counts: {name} have "
                              f"{f_s.shape[1]} and {f_t.shape[1]} channels (pair stages of equal widths in "
                              "model.taps.stages, or use at / nst)")
