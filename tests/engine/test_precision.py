"""Fast defaults: precision resolved per device with one-line fallbacks, channels_last auto, fp16 with a
gradient scaler and exact resume, torch.compile with an eager fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from teachkit.engine import precision as precision_module
from teachkit.engine.checkpoint import load_checkpoint
from teachkit.engine.precision import Precision, resolve_channels_last, resolve_precision
from teachkit.recipes import train_model

CPU = torch.device("cpu")


@pytest.mark.parametrize(("requested", "fast", "name", "warns"), [
    ("auto", True, "bf16", False),
    ("auto", False, "fp32", False),
    ("fp32", True, "fp32", False),
    ("bf16", False, "bf16", False),  # asked for explicitly: runs (slowly) where it is not fast
    ("fp16", True, "bf16", True),  # fp16 is a GPU mode: the CPU falls back, saying so
    ("fp16", False, "fp32", True),
])
def test_precision_is_resolved_for_the_device(monkeypatch, requested, fast, name, warns):
    monkeypatch.setattr(precision_module, "fast_bf16", lambda device: fast)
    resolved = resolve_precision(requested, CPU)
    assert resolved.name == name and resolved.requested == requested
    assert bool(resolved.warning) == warns
    if warns:
        assert "train.precision=fp16 needs a CUDA GPU" in resolved.warning and f"running {name}" in resolved.warning


@pytest.mark.parametrize(("device", "fast", "name"), [("cpu", True, "fp32"), ("cpu", False, "fp32")])
def test_auto_keeps_recurrent_students_in_fp32_on_a_cpu(monkeypatch, device, fast, name):
    monkeypatch.setattr(precision_module, "fast_bf16", lambda d: fast)
    assert resolve_precision("auto", torch.device(device), recurrent=True).name == name
    assert resolve_precision("bf16", torch.device(device), recurrent=True).name == "bf16"  # asked for: honoured


def test_recurrent_models_are_recognised():
    assert precision_module.has_recurrent(nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 2)))
    assert not precision_module.has_recurrent(nn.Sequential(nn.Linear(2, 2), nn.Conv2d(1, 1, 1)))


def test_unknown_precision_names_the_allowed_ones():
    with pytest.raises(ValueError, match="choose one of: auto, fp32, bf16, fp16"):
        resolve_precision("fp8", CPU)


def test_fast_bf16_reads_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert precision_module.fast_bf16(CPU)
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not precision_module.fast_bf16(CPU)


@pytest.mark.parametrize(("setting", "name", "expected"), [
    ("auto", "bf16", True), ("auto", "fp16", True), ("auto", "fp32", False), (True, "fp32", True),
    (False, "bf16", False)])
def test_channels_last_auto_follows_half_precision(setting, name, expected):
    assert resolve_channels_last(setting, Precision(name, name)) is expected


def test_default_precision_and_layout_are_recorded(tiny):
    result = train_model(tiny(name="defaults"))
    expected = resolve_precision("auto", CPU)
    assert result.summary["precision"] == expected.name
    assert result.summary["channels_last"] is (expected.name != "fp32")
    assert result.summary["compiled"] == []


def test_fp16_on_a_cpu_falls_back_with_one_warning(tiny):
    result = train_model(tiny(name="fp16", train={"epochs": 1, "progress": False, "precision": "fp16"}))
    assert result.summary["precision"] in ("bf16", "fp32")
    assert any("train.precision=fp16 needs a CUDA GPU" in w for w in result.summary["warnings"])


class Stop(Exception):
    pass


def test_fp16_trains_with_a_gradient_scaler_and_resumes_exactly(tiny, monkeypatch):
    """The fp16 path (a GPU's) run on the CPU's fp16 autocast: the scaler's state is checkpointed and a resumed
    run equals an uninterrupted one."""
    from teachkit.engine import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "resolve_precision", lambda name, device, **_: Precision("fp16", name))
    straight = train_model(tiny(name="straight", train={"epochs": 3, "progress": False}))
    _, state = load_checkpoint(straight.run_dir / "checkpoints" / "last.safetensors")
    assert state["scaler"]["scale"] > 0 and straight.summary["precision"] == "fp16"

    cfg = tiny(name="resumed", train={"epochs": 3, "progress": False})
    real = trainer_module.Trainer._write_epoch
    calls = {"n": 0}

    def stop_after_two(self, *args, **kwargs):
        real(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            raise Stop

    monkeypatch.setattr(trainer_module.Trainer, "_write_epoch", stop_after_two)
    with pytest.raises(Stop):
        train_model(cfg)
    monkeypatch.setattr(trainer_module.Trainer, "_write_epoch", real)
    resumed = train_model(cfg, resume=True)
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_compile_runs_the_student_compiled(tiny):
    eager = train_model(tiny(name="eager", train={"epochs": 1, "progress": False, "precision": "fp32"}))
    compiled = train_model(tiny(name="compiled", train={"epochs": 1, "progress": False, "precision": "fp32",
                                                        "compile": True}))
    assert compiled.summary["compiled"] == ["model"]
    for a, b in zip(eager.model.state_dict().values(), compiled.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # fused kernels round differently
    assert "forward" not in vars(compiled.model) or callable(compiled.model.forward)


def test_a_model_that_fails_to_compile_runs_eagerly_with_a_warning(tiny, monkeypatch):
    from torch._dynamo.exc import TorchDynamoException

    def broken_compile(fn):
        def call(*args, **kwargs):
            raise TorchDynamoException("simulated backend failure")
        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    eager = train_model(tiny(name="eager", train={"epochs": 2, "progress": False}))
    fallen = train_model(tiny(name="fallen", train={"epochs": 2, "progress": False, "compile": True}))
    assert fallen.summary["compiled"] == []
    assert any(w.startswith("torch.compile failed for model (simulated backend failure); running eagerly")
               for w in fallen.summary["warnings"])
    for a, b in zip(eager.model.state_dict().values(), fallen.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the failed first step left nothing behind


CONV = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
MLP = nn.Sequential(nn.Linear(4, 4))
RECURRENT_CONV = nn.ModuleList([nn.Conv2d(3, 4, 3), nn.LSTM(4, 4)])
MIN = precision_module.COMPILE_AUTO_MIN_STEPS


@pytest.mark.parametrize(("setting", "device", "model", "steps", "expected"), [
    (True, "cpu", MLP, 1, True),  # true / false are taken as given
    (False, "cpu", CONV, 10**6, False),
    ("auto", "cpu", CONV, MIN, True),  # a CPU conv net over a run long enough to pay back the compile time
    ("auto", "cpu", CONV, MIN - 1, False),  # a short run does not
    ("auto", "cpu", MLP, 10**6, False),  # not measured: not a conv net
    ("auto", "cpu", RECURRENT_CONV, 10**6, False),
    ("auto", "cuda", CONV, 10**6, False),  # not measured on a GPU
])
def test_compile_auto_is_on_where_it_was_measured_to_pay_back(setting, device, model, steps, expected):
    assert precision_module.resolve_compile(setting, torch.device(device), model, steps) is expected


def test_the_trainer_resolves_compile_auto_over_the_runs_planned_steps(tiny, monkeypatch):
    """``train.compile=auto`` reaches the rule with the run's device, student and epochs x batches per epoch; a
    run it resolves off for trains exactly as ``false`` (bit-identical weights, nothing compiled)."""
    from teachkit.engine import trainer as trainer_module

    calls = []

    def recording(setting, device, model, steps_planned):
        calls.append((setting, device.type, type(model).__name__, steps_planned))
        return precision_module.resolve_compile(setting, device, model, steps_planned)

    monkeypatch.setattr(trainer_module, "resolve_compile", recording)
    auto = train_model(tiny(name="auto", train={"epochs": 3, "progress": False, "compile": "auto"}))
    off = train_model(tiny(name="off", train={"epochs": 3, "progress": False, "compile": False}))
    default = train_model(tiny(name="default", train={"epochs": 1, "progress": False}))
    assert calls[2][0] == "auto" and default.summary["compiled"] == []  # the default is auto
    assert calls[0] == ("auto", "cpu", "MLP", 3 * 7)  # 240 samples - 10% val = 216 = 6 x 32 + 24: 7 batches
    assert auto.summary["compiled"] == [] and calls[1][0] is False
    for a, b in zip(auto.model.state_dict().values(), off.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
