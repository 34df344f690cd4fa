import pytest

from teachkit.config import OptimConfig
from teachkit.engine.schedule import lr_factor


def test_multistep_decays_at_epoch_boundaries():
    cfg = OptimConfig(schedule="multistep", milestones=[150, 180, 210], gamma=0.1)
    assert lr_factor(cfg, 149, 99, 100, 240) == 1.0
    assert lr_factor(cfg, 150, 0, 100, 240) == pytest.approx(0.1)
    assert lr_factor(cfg, 239, 0, 100, 240) == pytest.approx(1e-3)


def test_cosine_and_warmup():
    cfg = OptimConfig(schedule="cosine", warmup_epochs=1)
    assert lr_factor(cfg, 0, 0, 10, 11) == pytest.approx(0.1)  # first warm-up step
    assert lr_factor(cfg, 0, 9, 10, 11) == pytest.approx(1.0)
    assert lr_factor(cfg, 1, 0, 10, 11) == pytest.approx(1.0)
    assert lr_factor(cfg, 6, 0, 10, 11) == pytest.approx(0.5)  # half way through the 10 cosine epochs


def test_step_and_constant():
    assert lr_factor(OptimConfig(schedule="step", step_size=2, gamma=0.5), 5, 0, 10, 10) == 0.25  # decays at 2, 4
    assert lr_factor(OptimConfig(schedule="constant"), 5, 3, 10, 10) == 1.0
