"""Shared tiny causal-LM settings for tests: 2-digit addition, llama-tiny models, a teacher trained once per test
session (``lm_teacher`` fixture in conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import merged

ADDITION = {"name": "addition", "batch_size": 32, "eval_batch_size": 64,
            "options": {"digits": 2, "train": 240, "valid": 24, "test": 24}}
TINY_LM = {"name": "hf_causal_lm", "options": {"preset": "llama-tiny"}}
ADAMW = {"name": "adamw", "lr": 0.003, "weight_decay": 0.0}


def lm_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A config dict for a one-second causal-LM run (sections given replace or update the defaults)."""
    cfg: dict[str, Any] = {"name": "lm", "out_dir": str(tmp_path / "runs"), "data": dict(ADDITION),
                           "model": dict(TINY_LM), "optim": dict(ADAMW),
                           "train": {"epochs": 2, "progress": False, "precision": "fp32"},
                           "teacher": {"model": dict(TINY_LM), "optim": dict(ADAMW), "epochs": 2},
                           "kd": {"method": "kd", "alpha": 0.5, "temperature": 1.0}}
    return merged(cfg, sections)
