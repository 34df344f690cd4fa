"""Shared fixtures: small configs on synthetic data so engine and CLI tests run in seconds."""

from __future__ import annotations

import pytest
import torch

from teachkit.config import from_dict

torch.set_num_threads(1)


def untimed(obj):
    """``obj`` without timing fields (``*time_s``, ``images_per_s``), which differ between any two runs."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if not (k.endswith("time_s") or k == "images_per_s")}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def tiny_config(tmp_path, **sections) -> dict:
    """A config dict for a 2-second run: 8x8 synthetic images, small MLP, few epochs."""
    cfg = {
        "name": "tiny",
        "out_dir": str(tmp_path / "runs"),
        "data": {"name": "synthetic", "batch_size": 32,
                 "options": {"shape": [1, 8, 8], "num_classes": 4, "n_train": 240, "n_test": 80}},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "optim": {"name": "sgd", "lr": 0.05, "schedule": "cosine"},
        "train": {"epochs": 2, "progress": False},
        "teacher": {"model": {"name": "mlp", "options": {"hidden": [32]}}, "epochs": 2},
    }
    return merged(cfg, sections)


def merged(cfg: dict, sections: dict) -> dict:
    """``cfg`` with each of ``sections``: a mapping updates that section's keys, anything else replaces it."""
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def tiny(tmp_path):
    def make(**sections):
        return from_dict(tiny_config(tmp_path, **sections))

    return make


@pytest.fixture(scope="session")
def lm_teacher(tmp_path_factory):
    """A tiny causal-LM teacher (llama-tiny on 2-digit addition, 3 epochs, every epoch recorded) trained once per
    test session: its run folder."""
    from teachkit.recipes import train_model
    from tests.lm_setup import lm_config

    folder = tmp_path_factory.mktemp("lm-teacher")
    cfg = lm_config(folder, name="teacher", train={"epochs": 3, "save_every": 1, "progress": False,
                                                   "precision": "fp32"})
    return train_model(from_dict(cfg)).run_dir
