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

__all__ = ["as_map", "match_spatial", "paired_stages", "require_taps", "stage_index"]

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
