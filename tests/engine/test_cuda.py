"""Device-side facts on a CUDA GPU (``pytest -m cuda``; skipped without CUDA; the GPU kit, scripts/gpu_check.sh,
runs them): precision resolution, one host sync per step, fp16's scaler across a resume, channels_last batches,
the CUDA random stream in checkpoints and the teacher-output cache on the device."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import ClassificationEvaluator, LoopConfig, OptimConfig, fit, load_checkpoint
from teachkit.engine.precision import resolve_channels_last, resolve_precision
from teachkit.engine.syncs import HostSyncCounter
from teachkit.models import build_model
from teachkit.recipes import distill, train_model
from teachkit.types import StepOutput

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
ON_CUDA = {"device": "cuda", "progress": False}


class Interrupt(Exception):
    pass


def mlp_fit(tmp_path, name: str, steps: int, loop: LoopConfig):
    """A small MLP trained for one epoch of ``steps`` batches of 8, data and model on the GPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(CUDA)
    x, y = torch.randn(8 * steps, 3, device=CUDA), torch.randint(0, 2, (8 * steps,), device=CUDA)

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": F.cross_entropy(logits, batch.y)}, logits)

    evaluator = ClassificationEvaluator({"val": TensorSplit(x[:16], y[:16])}, 2)
    return fit(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0), OptimConfig(lr=0.1), evaluator,
               tmp_path / name, loop=loop)


def test_auto_precision_is_bf16_with_channels_last_from_capability_8():
    major = torch.cuda.get_device_capability(CUDA)[0]
    auto = resolve_precision("auto", CUDA)
    assert auto.name == ("bf16" if major >= 8 else "fp32") and not auto.warning
    assert resolve_channels_last("auto", auto) is (major >= 8)
    fp16 = resolve_precision("fp16", CUDA)
    assert fp16.name == "fp16" and not fp16.warning
    assert isinstance(fp16.scaler(CUDA), torch.amp.GradScaler) and auto.scaler(CUDA) is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_host_sync_per_step_on_the_gpu(tmp_path, precision):
    """The NaN guard is the step's only read of a device tensor (per-epoch reads cancel out of 6 - 3 steps)."""
    totals = {}
    for steps in (3, 6):
        with HostSyncCounter() as counter:
            mlp_fit(tmp_path, f"{precision}{steps}", steps, LoopConfig(epochs=1, progress=False, precision=precision))
        totals[steps] = counter.total
    assert (totals[6] - totals[3]) / 3 == 1


def test_fp16_scaler_state_is_checkpointed_and_an_interrupted_run_resumes_bit_identically(tiny, tmp_path, monkeypatch):
    train = {**ON_CUDA, "epochs": 4, "precision": "fp16"}
    straight = train_model(tiny(name="straight", train=train))
    real_evaluate, calls = ClassificationEvaluator.evaluate, {"n": 0}

    def crash_after_two_epochs(self, model):
        calls["n"] += 1
        if calls["n"] == 3:  # epochs 1-2 evaluated, the checkpoint of epoch 2 written
            raise Interrupt
        return real_evaluate(self, model)

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", crash_after_two_epochs)
    with pytest.raises(Interrupt):
        train_model(tiny(name="resumed", train=train))
    monkeypatch.setattr(ClassificationEvaluator, "evaluate", real_evaluate)
    tensors, state = load_checkpoint(tmp_path / "runs" / "resumed" / "checkpoints" / "last.safetensors")
    assert state["epoch"] == 2 and state["scaler"]["scale"] > 0 and "rng/cuda" in tensors
    resumed = train_model(tiny(name="resumed", train=train), resume=True)
    assert resumed.summary["precision"] == "fp16"
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert a.device.type == "cuda" and torch.equal(a, b), k


def test_channels_last_batches_and_weights_stay_on_the_gpu(tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet8", (3, 8, 8), 4).to(CUDA)
    x, y = torch.randn(32, 3, 8, 8, device=CUDA), torch.randint(0, 4, (32,), device=CUDA)
    seen = []

    def step(batch, progress):
        seen.append((batch.x.device.type, batch.x.is_contiguous(memory_format=torch.channels_last)))
        logits = model(batch.x)
        return StepOutput({"ce": F.cross_entropy(logits.float(), batch.y)}, logits)

    result = fit(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0), OptimConfig(lr=0.05),
                 ClassificationEvaluator({"val": TensorSplit(x, y)}, 4), tmp_path / "cl",
                 loop=LoopConfig(epochs=1, progress=False, precision="bf16", channels_last=True))
    assert seen == [("cuda", True)] * 4
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert result.summary["precision"] == "bf16" and result.summary["channels_last"] is True
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_teacher_cache_on_the_gpu_gives_the_uncached_student(tiny):
    teacher = train_model(tiny(name="teacher", train=ON_CUDA, model={"name": "mlp", "options": {"hidden": [32]}}))
    runs = {mode: distill(tiny(name=f"kd-{mode}", kd={"method": "kd"}, train={**ON_CUDA, "epochs": 3,
                                                                              "precision": "fp32"},
                               teacher={"checkpoint": str(teacher.run_dir), "cache": mode}))
            for mode in ("auto", "off")}
    info = json.loads((runs["auto"].run_dir / "summary.json").read_text())["teacher_cache"]
    assert info["status"] == "computed"
    for a, b in zip(runs["auto"].model.state_dict().values(), runs["off"].model.state_dict().values(), strict=True):
        assert a.device.type == "cuda"
        # batch-invariant kernels are not guaranteed on a GPU (the cache runs the teacher on larger batches)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
