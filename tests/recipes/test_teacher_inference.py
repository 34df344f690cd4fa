"""``teacher.inference``: a KD run with the teacher folded and run in inference mode trains, records the mode, and
keeps the teacher cache's guarantee (cached and uncached students bit-identical); OFD keeps the BatchNorms it
reads, HSAKD's teacher heads train on the inference-mode teacher's stages."""

from __future__ import annotations

import json
import math

import pytest
import torch

from teachkit.config import from_dict
from teachkit.recipes import distill, train_model
from teachkit.recipes.teacher import resolve_teacher_inference
from tests.conftest import tiny_config

EPOCHS = 2
#: a small CIFAR ResNet-8 (7 BatchNorms, each right after a conv) on the tiny 1x8x8 images
RESNET = {"name": "resnet8", "options": {"width": 0.5}}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("inference-teacher")
    cfg = from_dict(tiny_config(root, name="teacher", model=RESNET, train={"epochs": 1, "progress": False}))
    return str(train_model(cfg).run_dir)


def _run(tmp_path, teacher_dir: str, name: str, *, inference: str = "fold", cache: str = "off",
         method: str = "kd", **sections):
    train = {"epochs": EPOCHS, "progress": False, **sections.pop("train", {})}
    teacher = {"checkpoint": teacher_dir, "cache": cache, "inference": inference}
    cfg = from_dict(tiny_config(tmp_path, name=name, kd={"method": method, **sections.pop("kd", {})}, train=train,
                                teacher=teacher, **sections))
    return distill(cfg)


def _summary(result) -> dict:
    return json.loads((result.run_dir / "summary.json").read_text())


def test_a_folded_teacher_trains_a_student_close_to_the_plain_one(tmp_path, teacher_dir) -> None:
    plain = _run(tmp_path, teacher_dir, "plain", inference="plain")
    fold = _run(tmp_path, teacher_dir, "fold")
    auto = _summary(_run(tmp_path, teacher_dir, "auto", inference="auto"))
    assert _summary(plain)["teacher"]["inference"] == {"mode": "plain"}
    info = _summary(fold)["teacher"]["inference"]
    assert auto["teacher"]["inference"] == info  # auto folds
    assert info == {"mode": "fold", "bn_folded": 7, "dtype": "float32"}  # fp32 here: folded, nothing cast
    assert all(math.isfinite(row["train"]["loss"]) for row in fold.history)
    # fp32: the folded teacher's logits differ at float rounding only, so the students barely do
    for (key, a), b in zip(plain.model.state_dict().items(), fold.model.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-3), key


def test_cached_and_uncached_students_stay_bit_identical_under_fold(tmp_path, teacher_dir) -> None:
    augment = {"data": {"augment": "crop_flip"}}
    uncached = _run(tmp_path, teacher_dir, "uncached", **augment)
    writes = _run(tmp_path, teacher_dir, "writes", cache="auto", method="dkd", **augment)
    reads = _run(tmp_path, teacher_dir, "reads", cache="auto", **augment)
    plain = _summary(_run(tmp_path, teacher_dir, "plain", inference="plain", cache="auto", **augment))
    for key, value in uncached.model.state_dict().items():
        assert torch.equal(value, reads.model.state_dict()[key]), key
    wrote, read = _summary(writes)["teacher_cache"], _summary(reads)["teacher_cache"]
    assert read["key"] == wrote["key"] != plain["teacher_cache"]["key"]  # a folded teacher has its own views
    assert read["epochs_loaded"] == EPOCHS and wrote["epochs_computed"] == EPOCHS


def test_ofd_keeps_the_batchnorms_it_reads(tmp_path, teacher_dir) -> None:
    result = _run(tmp_path, teacher_dir, "ofd", method="ofd", model=RESNET)
    assert _summary(result)["teacher"]["inference"]["bn_folded"] == 7 - 3  # the three stages_bn stay
    assert all(math.isfinite(row["train"]["loss"]) for row in result.history)


def test_hsakd_heads_train_on_the_inference_mode_teacher(tmp_path, teacher_dir) -> None:
    # bf16: the heads' evaluator calls the bf16 teacher outside autocast and feeds its stages to float32 heads
    result = _run(tmp_path, teacher_dir, "hsakd", method="hsakd", model=RESNET,
                  kd={"options": {"hsakd": {"teacher_head_epochs": 1}}}, train={"epochs": 1, "precision": "bf16"})
    assert _summary(result)["teacher"]["inference"]["dtype"] == "bfloat16"
    heads = json.loads((result.run_dir / "hsakd_teacher_heads" / "summary.json").read_text())
    assert heads["last_epoch"] == 1 and math.isfinite(heads["val_joint_acc"])
    assert all(math.isfinite(row["train"]["loss"]) for row in result.history)


def test_a_bf16_run_folds_and_casts_the_teacher(tmp_path, teacher_dir) -> None:
    result = _run(tmp_path, teacher_dir, "bf16", train={"precision": "bf16", "epochs": 1})
    summary = _summary(result)
    assert summary["precision"] == "bf16"
    assert summary["teacher"]["inference"] == {"mode": "fold", "bn_folded": 7, "dtype": "bfloat16"}
    assert all(math.isfinite(row["train"]["loss"]) for row in result.history)


def test_auto_resolves_to_fold() -> None:
    assert resolve_teacher_inference("auto", ["kd"], torch.device("cpu"), "bf16") == "fold"
    assert resolve_teacher_inference("plain", ["kd"], torch.device("cpu"), "bf16") == "plain"
    assert resolve_teacher_inference("fold", ["kd"], torch.device("cpu"), "fp32") == "fold"
