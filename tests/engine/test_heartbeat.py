"""Outside a terminal a long epoch prints heartbeat lines (step k/N, running loss, throughput in the evaluator's
unit) at most every ``heartbeat_s`` seconds; the epoch line and summary.json name the same unit."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import EVALUATORS, OptimConfig, Trainer
from teachkit.engine.trainer import input_unit
from teachkit.recipes.common import load_data
from teachkit.types import StepOutput

BEAT = re.compile(r"^beat epoch (\d)/2  step (\d+)/(\d+)  loss ([0-9.]+)  \((\d+) (\w+)/s\)$")


def scripted_trainer(tiny, tmp_path, heartbeat_s: float, unit: str | None = None) -> tuple[Trainer, int]:
    """A Trainer whose step k (1-based) of every epoch has loss exactly k: the running mean after step k is
    (k + 1) / 2 (equal batches)."""
    cfg = tiny(data={"batch_size": 24}, train={"epochs": 2, "progress": True})
    splits = load_data(cfg.data, torch.device("cpu"))
    n = len(splits.train) - len(splits.train) % 24  # whole batches only
    train = TensorSplit(splits.train.x[:n], splits.train.y[:n])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": logits.sum() * 0 + (progress.step + 1)}, logits)

    evaluator = EVALUATORS.get("classification")(splits, 1000)
    if unit is not None:
        evaluator.sample_unit = unit
    trainer = Trainer(model, step, BatchLoader(train, 24, shuffle=True, seed=0), OptimConfig(lr=0.01), evaluator,
                      tmp_path / "beat", loop=cfg.train.loop(), desc="beat", heartbeat_s=heartbeat_s)
    return trainer, n // 24


def test_heartbeat_lines_in_a_log(tiny, tmp_path, capsys):
    trainer, steps = scripted_trainer(tiny, tmp_path, heartbeat_s=0)
    while not trainer.done:
        trainer.run_epoch()
    summary = trainer.finish().summary
    out = capsys.readouterr().out.splitlines()
    beats = [BEAT.match(line) for line in out if line.startswith("beat epoch") and "step" in line]
    assert all(beats) and len(beats) == 2 * (steps - 1)  # every step but the last (the epoch line follows)
    for i, m in enumerate(beats):
        epoch, k, total, loss, _rate, unit = m.groups()
        assert (int(epoch), int(k), int(total)) == (i // (steps - 1) + 1, i % (steps - 1) + 1, steps)
        assert float(loss) == pytest.approx((int(k) + 1) / 2, abs=1e-4)
        assert unit == "img"
    epoch_lines = [line for line in out if line.startswith("beat epoch") and "step" not in line]
    assert len(epoch_lines) == 2 and all(line.endswith("img/s)") for line in epoch_lines)
    assert summary["sample_unit"] == "img"
    assert json.loads((tmp_path / "beat" / "summary.json").read_text())["sample_unit"] == "img"


def test_no_heartbeat_within_the_interval_and_the_evaluators_unit(tiny, tmp_path, capsys):
    trainer, _ = scripted_trainer(tiny, tmp_path, heartbeat_s=3600, unit="sent")
    trainer.run_epoch()
    out = capsys.readouterr().out
    assert "step " not in out  # a one-hour interval: no heartbeat in a short epoch
    assert out.strip().endswith("sent/s)")


def test_progress_false_prints_no_heartbeat(tiny, tmp_path, capsys):
    trainer, _ = scripted_trainer(tiny, tmp_path, heartbeat_s=0)
    trainer.loop = dataclasses.replace(trainer.loop, progress=False)
    trainer.run_epoch()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("x, unit", [
    (torch.zeros(2, 3, 8, 8), "img"), (torch.zeros(2, 1, 40), "seq"), (torch.zeros(2, 30), "row"),
    ({"input_ids": torch.zeros(2, 5, dtype=torch.long)}, "seq"),
])
def test_input_unit(x, unit):
    assert input_unit(x) == unit
