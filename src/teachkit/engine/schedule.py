"""Learning-rate schedules as pure functions of training time (no state to checkpoint)."""

from __future__ import annotations

import math

from teachkit.engine.optim import OptimConfig


def lr_factor(cfg: OptimConfig, epoch: int, step: int, steps_per_epoch: int, epochs: int) -> float:
    """Multiplier of ``cfg.lr`` at (epoch, step): linear warm-up per step, then the schedule.

    ``step`` and ``multistep`` decay at epoch boundaries (as the reference CIFAR recipes do);
    ``cosine`` anneals per step from 1 to 0 over the epochs after warm-up; ``linear`` decays per step from 1
    to 0 over them; ``inverse_sqrt`` is sqrt(warm-up / t) after the warm-up (t in epochs, per step).
    """
    t = epoch + step / max(1, steps_per_epoch)
    if cfg.warmup_epochs > 0 and t < cfg.warmup_epochs:
        return (t + 1.0 / max(1, steps_per_epoch)) / cfg.warmup_epochs
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "step":
        return cfg.gamma ** (epoch // cfg.step_size)
    if cfg.schedule == "multistep":
        return cfg.gamma ** sum(epoch >= m for m in cfg.milestones)
    if cfg.schedule == "inverse_sqrt":  # fairseq's inverse_sqrt: 1 at the end of the warm-up, then 1/sqrt(t)
        return math.sqrt(cfg.warmup_epochs / max(t, cfg.warmup_epochs))
    span = max(1e-8, epochs - cfg.warmup_epochs)
    if cfg.schedule == "linear":  # transformers' get_linear_schedule_with_warmup, per step
        return max(0.0, 1.0 - (t - cfg.warmup_epochs) / span)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (t - cfg.warmup_epochs) / span)))
