"""The teacher-output cache: exact, shared across runs, verified, and off where inputs change per epoch."""

import json

import torch

from teachkit.recipes import distill, train_model
from teachkit.recipes.teacher_cache import FOLDER


def _teacher(tiny):
    return train_model(tiny(name="teacher", model={"name": "mlp", "options": {"hidden": [32]}}))


def _summary(result):
    return json.loads((result.run_dir / "summary.json").read_text())


def test_cached_and_uncached_students_are_bit_identical(tiny):
    teacher = _teacher(tiny)
    runs = {}
    for mode in ("auto", "off"):
        runs[mode] = distill(tiny(name=f"kd-{mode}", kd={"method": "kd"}, train={"epochs": 3, "progress": False},
                                  teacher={"checkpoint": str(teacher.run_dir), "cache": mode}))
    for a, b in zip(runs["auto"].model.state_dict().values(), runs["off"].model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    cached, plain = _summary(runs["auto"]), _summary(runs["off"])
    assert cached["teacher_cache"]["status"] == "computed" and cached["teacher_cache"]["taps"] == ["logits"]
    assert plain["teacher_cache"] == {"status": "off", "why": "teacher.cache=off"}
    width = {"float32": 4, "bfloat16": 2}[cached["teacher_cache"]["dtype"]]  # the teacher's own output dtype
    assert cached["teacher_cache"]["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[cached["precision"]]
    n = cached["teacher_cache"]["bytes"] // (4 * width)  # logits of 4 classes
    assert cached["cost"]["teacher_forward_images"] == n == 216
    assert plain["cost"]["teacher_forward_images"] == 3 * n and plain["cost"]["teacher_forwards_saved"] == 0
    assert cached["cost"]["teacher_forwards_saved"] == 3 * n


def test_another_student_run_reads_the_cache_from_disk(tiny):
    teacher = _teacher(tiny)
    first = distill(tiny(name="a", teacher={"checkpoint": str(teacher.run_dir)}))
    second = distill(tiny(name="b", kd={"method": "dkd"}, train={"seed": 1, "epochs": 2, "progress": False},
                          teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(first)["teacher_cache"]["status"] == "computed"
    info = _summary(second)["teacher_cache"]
    assert info["status"] == "loaded" and second.run_dir.parent.joinpath(FOLDER).is_dir()
    assert _summary(second)["cost"]["teacher_forward_images"] == 0


def test_a_tampered_or_foreign_cache_file_is_never_trusted(tiny):
    teacher = _teacher(tiny)
    first = distill(tiny(name="a", teacher={"checkpoint": str(teacher.run_dir)}))
    path = _summary(first)["teacher_cache"]["file"]
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF  # flip a bit of the stored logits
    open(path, "wb").write(bytes(data))
    again = distill(tiny(name="b", teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(again)["teacher_cache"]["status"] == "computed"
    for a, b in zip(first.model.state_dict().values(), again.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # another teacher (other weights) gets its own entry, not this one
    other = train_model(tiny(name="teacher2", train={"seed": 5, "epochs": 2, "progress": False},
                             model={"name": "mlp", "options": {"hidden": [32]}}))
    third = distill(tiny(name="c", teacher={"checkpoint": str(other.run_dir)}))
    assert _summary(third)["teacher_cache"]["status"] == "computed"
    assert _summary(third)["teacher_cache"]["file"] != path


def test_augmented_inputs_get_views_and_feature_methods_run_the_teacher_per_batch(tiny):
    teacher = _teacher(tiny)
    aug = distill(tiny(name="aug", data={"augment": "flip"}, teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(aug)["teacher_cache"]["status"] == "views"  # per-epoch views: test_teacher_cache_views.py
    fit_aug = distill(tiny(name="fitnet-aug", data={"augment": "flip"}, kd={"method": "fitnet",
                           "options": {"fitnet": {"stage": 0}}}, teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(fit_aug)["teacher_cache"]["status"] == "off"
    crd = distill(tiny(name="crd", kd={"method": "crd"}, teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(crd)["teacher_cache"]["status"] == "computed"  # embedding taps are cached too
    fit = distill(tiny(name="fitnet", kd={"method": "fitnet", "options": {"fitnet": {"stage": 0}}},
                       teacher={"checkpoint": str(teacher.run_dir)}))
    assert _summary(fit)["teacher_cache"]["status"] == "off"
    assert "not cached (stages" in _summary(fit)["teacher_cache"]["why"]


def test_float16_storage_is_reported(tiny):
    teacher = _teacher(tiny)
    half = distill(tiny(name="half", teacher={"checkpoint": str(teacher.run_dir), "cache_dtype": "float16"}))
    info = _summary(half)["teacher_cache"]
    assert info["dtype"] == "float16" and info["bytes"] == 216 * 4 * 2
