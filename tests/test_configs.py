"""Every shipped config validates, names registered models/datasets/losses, and the generated grid is current."""

import subprocess
import sys
from pathlib import Path

import pytest

from teachkit.config import load_config
from teachkit.data import DATASETS
from teachkit.losses import LOSSES, OBJECTIVES
from teachkit.models import MODELS

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) > 300


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_validates_and_names_exist(path):
    cfg = load_config(path)
    assert cfg.data.name in DATASETS
    assert cfg.model.name in MODELS
    assert cfg.train.loss in OBJECTIVES
    if cfg.teacher.checkpoint is None:
        assert cfg.teacher.model.name in MODELS
    for method in cfg.kd.methods:  # kd.options are validated against each method's options when loading
        assert method in LOSSES and (LOSSES.options_of(method) is None or method in cfg.kd.options)


def test_mse_teacher_grid_is_up_to_date():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "generate_mse_teacher_configs.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
