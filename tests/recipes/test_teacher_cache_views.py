"""The view cache: teacher outputs for augmented views, computed once per (seed, epoch) and reused.

A student reading the files of another run (another KD method, same seed) is bit-identical to one that runs the
teacher on every batch; a different seed or batch size gets its own files; a tampered file is recomputed; a
resumed run ends with the same weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from teachkit.config import from_dict
from teachkit.data.augment import Augment
from teachkit.data.base import TensorSplit
from teachkit.engine import ClassificationEvaluator
from teachkit.engine.checkpoint import load_checkpoint
from teachkit.models import Tapped
from teachkit.recipes import distill, train_model
from teachkit.recipes.teacher_cache import VIEWS_FOLDER, ViewTeacherOutputs, view_outputs
from teachkit.types import Batch
from tests.conftest import tiny_config, untimed

EPOCHS = 3
N = 216  # training samples of the tiny synthetic set (240 minus the validation carve-out)
#: a small CNN teacher (4-D weights: channels_last and bf16 autocast apply where the run resolves them)
TEACHER = {"name": "lenet", "options": {"channels": [4, 8], "fc": 32}}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("views-teacher")
    cfg = from_dict(tiny_config(root, name="teacher", model=TEACHER, train={"epochs": 1, "progress": False}))
    return str(train_model(cfg).run_dir)


def _run(tmp_path: Path, teacher_dir: str, name: str, *, method: str = "kd", cache: str = "auto",
         resume: bool = False, **sections):
    train = {"epochs": EPOCHS, "progress": False, **sections.pop("train", {})}
    teacher = {"checkpoint": teacher_dir, "cache": cache, **sections.pop("teacher", {})}
    data = {"augment": "crop_flip", **sections.pop("data", {})}
    cfg = from_dict(tiny_config(tmp_path, name=name, kd={"method": method}, train=train, teacher=teacher,
                                data=data, **sections))
    return distill(cfg, resume=resume)


def _summary(result) -> dict:
    return json.loads((result.run_dir / "summary.json").read_text())


def _same_weights(a, b) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb)
    for key, value in sa.items():
        assert torch.equal(value, sb[key]), key


def _metrics(result) -> list[dict]:
    return untimed(result.history)


def test_a_run_reading_another_methods_views_is_bit_identical_to_an_uncached_run(tmp_path, teacher_dir):
    plain = _run(tmp_path, teacher_dir, "plain", cache="off")
    first = _run(tmp_path, teacher_dir, "first", method="dkd")  # writes every epoch's views
    second = _run(tmp_path, teacher_dir, "second")  # kd, same seed: reads dkd's files
    _same_weights(plain, second)
    assert _metrics(plain) == _metrics(second)
    off, wrote, read = _summary(plain), _summary(first), _summary(second)
    assert off["teacher_cache"] == {"status": "off", "why": "teacher.cache=off"}
    assert off["cost"]["teacher_forward_images"] == EPOCHS * N and off["cost"]["teacher_forwards_saved"] == 0
    assert wrote["cost"]["teacher_forward_images"] == EPOCHS * N and wrote["cost"]["teacher_forwards_saved"] == 0
    assert read["cost"]["teacher_forward_images"] == 0 and read["cost"]["teacher_forwards_saved"] == EPOCHS * N
    info = read["teacher_cache"]
    assert info["status"] == "views" and info["exact"] and info["taps"] == ["logits"]
    assert info["key"] == wrote["teacher_cache"]["key"]
    assert (info["epochs_loaded"], info["epochs_computed"], info["files_written"]) == (EPOCHS, 0, 0)
    assert (wrote["teacher_cache"]["epochs_computed"], wrote["teacher_cache"]["files_written"]) == (EPOCHS, EPOCHS)
    # the teacher's own dtype is stored: bf16 logits under bf16 autocast, float32 in fp32
    assert info["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[read["precision"]]
    width = 2 if info["dtype"] == "bfloat16" else 4
    assert info["bytes_in_memory"] == N * 4 * width + 2 * N  # one epoch's logits (4 classes) and two masks
    folder = Path(info["folder"])
    assert folder == tmp_path / "runs" / VIEWS_FOLDER / info["key"]
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert files == [f"epoch-{e}.safetensors" for e in range(EPOCHS)] and info["files"] == EPOCHS
    assert info["bytes_on_disk"] == sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def test_another_seed_or_batch_size_does_not_reuse_the_views(tmp_path, teacher_dir):
    base = _summary(_run(tmp_path, teacher_dir, "base", train={"epochs": 1}))["teacher_cache"]
    seed = _summary(_run(tmp_path, teacher_dir, "seed", train={"epochs": 1, "seed": 1}))
    size = _summary(_run(tmp_path, teacher_dir, "size", train={"epochs": 1}, data={"batch_size": 16}))
    flip = _summary(_run(tmp_path, teacher_dir, "flip", train={"epochs": 1}, data={"augment": "flip"}))
    keys = {base["key"], seed["teacher_cache"]["key"], size["teacher_cache"]["key"], flip["teacher_cache"]["key"]}
    assert len(keys) == 4
    for other in (seed, size, flip):
        assert other["teacher_cache"]["epochs_loaded"] == 0 and other["teacher_cache"]["epochs_computed"] == 1
        assert other["cost"]["teacher_forward_images"] == N and other["cost"]["teacher_forwards_saved"] == 0
    again = _summary(_run(tmp_path, teacher_dir, "again", train={"epochs": 1}))
    assert again["teacher_cache"]["key"] == base["key"] and again["teacher_cache"]["epochs_loaded"] == 1


def test_a_tampered_or_misplaced_epoch_file_is_recomputed_not_trusted(tmp_path, teacher_dir):
    first = _run(tmp_path, teacher_dir, "first")
    folder = Path(_summary(first)["teacher_cache"]["folder"])
    path = folder / "epoch-1.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip bits of the stored logits
    path.write_bytes(bytes(data))
    shutil.copy(folder / "epoch-0.safetensors", folder / "epoch-2.safetensors")  # another epoch's (valid) views
    shutil.copy(folder / "epoch-0.json", folder / "epoch-2.json")
    again = _run(tmp_path, teacher_dir, "again")
    _same_weights(first, again)
    info = _summary(again)["teacher_cache"]
    assert (info["epochs_loaded"], info["epochs_computed"], info["rejected"], info["files_written"]) == (1, 2, 2, 2)
    assert _summary(again)["cost"]["teacher_forward_images"] == 2 * N
    for e in range(EPOCHS):  # rewritten: every file verifies and holds its own epoch
        _, state = load_checkpoint(folder / f"epoch-{e}.safetensors")
        assert state["epoch"] == e and state["key"] == info["key"]


class Interrupt(Exception):
    pass


def test_a_resumed_run_ends_with_the_same_weights(tmp_path, teacher_dir, monkeypatch):
    straight = _run(tmp_path, teacher_dir, "straight", cache="off")
    real, calls = ClassificationEvaluator.evaluate, {"n": 0}

    def crash_in_epoch_two(self, model):
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 1 written (and its views); epoch 2 trained, its views not written
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", crash_in_epoch_two)
    with pytest.raises(Interrupt):
        _run(tmp_path, teacher_dir, "resumed")
    monkeypatch.setattr(ClassificationEvaluator, "evaluate", real)
    resumed = _run(tmp_path, teacher_dir, "resumed", resume=True)
    _same_weights(straight, resumed)
    assert straight.history[-1]["train"] == resumed.history[-1]["train"]
    info = _summary(resumed)["teacher_cache"]
    assert (info["epochs_loaded"], info["epochs_computed"], info["files"]) == (0, 2, EPOCHS)
    # a later run of the same seed reads all of them, and agrees too
    _same_weights(straight, _run(tmp_path, teacher_dir, "later"))


def test_approximate_storage_is_reported_and_read_back_as_computed(tmp_path, teacher_dir):
    for name, teacher in (("half", {"cache_dtype": "float16"}), ("top2", {"cache_topk": 2})):
        first = _run(tmp_path, teacher_dir, f"{name}-a", train={"epochs": 2}, teacher=teacher)
        second = _run(tmp_path, teacher_dir, f"{name}-b", train={"epochs": 2}, teacher=teacher)
        _same_weights(first, second)  # the rounded / top-k outputs, whether computed or read
        info = _summary(second)["teacher_cache"]
        assert not info["exact"] and info["epochs_loaded"] == 2 and "approximation" in info
        assert _summary(second)["cost"]["teacher_forward_images"] == 0
    assert info["topk"] == 2 and "biased" in info["approximation"]


def test_an_epoch_reentered_starts_its_table_afresh(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(10, 1, 4, 4)
    split = TensorSplit(x, torch.zeros(10, dtype=torch.long))
    teacher = Tapped(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).eval())
    make = lambda: view_outputs(teacher, split, names=("logits",), augment=Augment(flip=True), seed=0,  # noqa: E731
                                batch_size=4, out_dir=tmp_path)

    def batch(rows):
        index = torch.tensor(rows)
        return Batch(x[index], None, index)

    outputs: ViewTeacherOutputs = make()
    outputs.start_epoch(0)
    outputs(batch([0, 1, 2, 3]))  # interrupted here
    outputs.start_epoch(0)  # re-entered (a resumed run)
    assert outputs.table == {} and not bool(outputs.filled.any())
    expected = [outputs(batch(rows)).logits for rows in ([4, 5, 6, 7], [8, 9], [0, 1, 2, 3])]
    outputs.end_epoch(0)
    assert outputs.files_written == 1 and outputs.table == {}
    reader = make()
    reader.start_epoch(0)
    assert reader.complete
    got = [reader(batch(rows)).logits for rows in ([4, 5, 6, 7], [8, 9], [0, 1, 2, 3])]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert reader.forwards == 0 and reader.reads == 10


def test_micro_batches_and_embedding_taps_are_cached_exactly(tmp_path, teacher_dir):
    chunked = {"epochs": 2, "micro_batch": 8}  # the teacher sees chunks of 8: its own key
    plain = _run(tmp_path, teacher_dir, "plain", cache="off", train=chunked)
    _run(tmp_path, teacher_dir, "first", method="dkd", train=chunked)
    second = _run(tmp_path, teacher_dir, "second", train=chunked)
    _same_weights(plain, second)
    assert _summary(second)["cost"]["teacher_forwards_saved"] == 2 * N
    crd = [_run(tmp_path, teacher_dir, f"crd-{i}", method="crd", train={"epochs": 2}) for i in range(2)]
    _same_weights(*crd)
    info = [_summary(r)["teacher_cache"] for r in crd]
    assert info[0]["taps"] == ["logits", "embedding"]
    assert (info[0]["epochs_computed"], info[1]["epochs_loaded"]) == (2, 2)
    assert len({info[0]["key"], _summary(second)["teacher_cache"]["key"]}) == 2
