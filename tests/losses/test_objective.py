"""The distillation objective: CE plus gamma x ramp x term weight x each method's unweighted terms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teachkit.losses import DistillLoss, DistillObjective, KDConfig, needs_of
from teachkit.types import Batch, Progress, Taps, TrainingStage


class Toy(DistillLoss):
    """Returns fixed unweighted terms; ramps linearly over 2 epochs; weights its second term by 3."""

    student_needs = ("logits", "stages")
    teacher_needs = ("logits", "embedding")
    term_names = ("a", "b")

    def __init__(self, terms: dict[str, float], replaces_ce: bool = False, stage: bool = False) -> None:
        super().__init__()
        self.values = terms
        self.replaces_ce_flag, self.stage = replaces_ce, stage
        self.term_weights = {"b": 3.0}

    @property
    def replaces_ce(self) -> bool:  # type: ignore[override]
        return self.replaces_ce_flag

    def ramp(self, progress: Progress) -> float:
        return min(1.0, progress.epoch_float / 2)

    def transform_batch(self, batch: Batch) -> Batch:
        return batch.map_x(lambda x: x + 1)

    def training_stage(self, teacher, student=None):
        return TrainingStage("toy", {}, lambda b, p: None, lambda s, n: None, {}, 1) if self.stage else None

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, torch.Tensor]:
        return {k: torch.tensor(v) for k, v in self.values.items()}


def batch() -> tuple[Taps, Batch]:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    return Taps(logits), Batch(torch.zeros(2, 1), torch.tensor([0, 0]), torch.arange(2))


def test_weights_ramp_and_term_weights_multiply_unweighted_terms():
    obj = DistillObjective({"toy": Toy({"a": 2.0, "b": 5.0})}, {"toy": 0.5}, ce_weight=0.25)
    taps, b = batch()
    terms = obj(taps, taps, b, Progress(1, 0, 10, 4))  # ramp = 1 / 2
    ce = F.cross_entropy(taps.logits, b.y)
    assert terms["ce"].item() == pytest.approx(0.25 * ce.item())
    assert terms["toy.a"].item() == pytest.approx(0.5 * 0.5 * 2.0) and terms["toy.b"].item() == pytest.approx(
        0.5 * 0.5 * 3.0 * 5.0)
    full = obj(taps, taps, b, Progress(3, 0, 10, 4))  # ramp = 1
    assert full["toy.b"].item() == pytest.approx(0.5 * 3.0 * 5.0)


def test_single_term_named_after_the_method_and_zero_weight_skipped():
    obj = DistillObjective({"one": Toy({"a": 2.0}), "off": Toy({"a": 9.0})}, {"one": 1.0, "off": 0.0}, ce_weight=0)
    taps, b = batch()
    assert set(obj(taps, taps, b, Progress(4, 0, 10, 4))) == {"one"}  # no ce (weight 0), "off" skipped


def test_replaces_ce_needs_transform_and_stages():
    obj = DistillObjective({"x": Toy({"a": 1.0}, replaces_ce=True, stage=True), "y": Toy({"a": 1.0})},
                           {"x": 1.0, "y": 1.0}, ce_weight=1.0)
    taps, b = batch()
    assert "ce" not in obj(taps, taps, b, Progress(4, 0, 10, 4))
    assert obj.student_needs == {"logits", "stages"} and obj.teacher_needs == {"logits", "embedding"}
    assert torch.equal(obj.transform_batch(b).x, b.x + 2)  # every method's transform, in order
    assert [s.name for s in obj.training_stages(None)] == ["toy"]


def test_needs_of_registered_methods_per_side():
    assert needs_of(["kd"]) == ({"logits"}, {"logits"})
    assert needs_of(["reviewkd", "crd"]) == ({"logits", "stages", "embedding"},
                                              {"logits", "stages_pre", "embedding"})


def test_kd_config_weights():
    assert KDConfig().weights() == ({"kd": 0.9}, pytest.approx(0.1))
    assert KDConfig(method=["crd", "kd"], gamma={"crd": 2}).weights() == ({"crd": 2.0, "kd": 0.9}, 1.0)
    assert KDConfig(method="at", ce_weight=0.5).weights() == ({"at": 1000.0}, 0.5)
