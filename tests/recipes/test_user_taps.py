"""Feature KD between the user's own models: the embedding tap inferred for plain MLPs, and ``teacher.taps`` given
to a teacher trained without taps, which is distilled from without being retrained (its folder is untouched)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.recipes import distill, load_model, train_model

HERE = __name__


def plain_mlp(input_shape, num_classes, hidden: int = 16) -> nn.Module:
    """A plain user MLP: no tap spec; its last nn.Linear is the classifier."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


class HeadFirst(nn.Module):
    """A user model whose classifier ``head`` is declared before ``body``: nothing to infer its embedding from."""

    def __init__(self, input_shape, num_classes) -> None:
        super().__init__()
        self.head = nn.Linear(24, num_classes)
        self.body = nn.Linear(math.prod(input_shape), 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x.flatten(1))))


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (and its mtime), by relative path."""
    return {str(p.relative_to(folder)): f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mtime_ns}"
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_crd_between_plain_mlps_infers_both_embeddings(tiny, capsys):
    cfg = tiny(name="crd-plain", model={"name": f"{HERE}:plain_mlp", "options": {}}, kd={"method": "crd"},
               teacher={"model": {"name": f"{HERE}:plain_mlp", "options": {"hidden": 32}}, "epochs": 1},
               train={"epochs": 1, "progress": True})
    result = distill(cfg)
    lines = ["student: embedding tap inferred as the input of '3' (the last nn.Linear)",
             "teacher: embedding tap inferred as the input of '3' (the last nn.Linear)"]
    assert result.summary["notes"] == lines
    err = capsys.readouterr().err
    assert all(f"teachkit: {line}" in err for line in lines)
    assert math.isfinite(result.history[-1]["train"]["crd.student"])


def test_teacher_taps_on_a_teacher_trained_without_them(tiny):
    teacher = train_model(tiny(name="headfirst", model={"name": f"{HERE}:HeadFirst", "options": {}}))
    before, weights = digests(teacher.run_dir), load_model(teacher.run_dir)[0].state_dict()
    student = {"name": f"{HERE}:plain_mlp", "options": {}}
    with pytest.raises(ConfigError, match=r"^teacher model HeadFirst has no 'embedding' tap and it cannot be "
                                          r"inferred: .* in teacher.taps.embedding \(nn.Linear modules: 'head', "
                                          r"'body'\)$"):
        distill(tiny(name="s-no-taps", model=student, kd={"method": "crd"},
                     teacher={"checkpoint": str(teacher.run_dir)}))
    result = distill(tiny(name="s-taps", model=student, kd={"method": "crd"},
                          teacher={"checkpoint": str(teacher.run_dir), "taps": {"embedding": "head"}}))
    assert result.summary["notes"] == ["student: embedding tap inferred as the input of '3' (the last nn.Linear)"]
    assert math.isfinite(result.history[-1]["train"]["crd.student"])
    assert digests(teacher.run_dir) == before  # not retrained: every file of the teacher's folder as it was
    after = load_model(teacher.run_dir)[0].state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights) and weights.keys() == after.keys()
