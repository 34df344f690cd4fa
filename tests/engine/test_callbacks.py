"""Engine callbacks: the run/epoch/step hooks and their order, StepInfo against the run's own metrics.jsonl, stopping
a run (after a step, at an epoch's end, early stopping) with a valid checkpoint and summary, no extra host sync,
named callbacks from ``train.callbacks`` (a plugin's, through the CLI) and callback objects from the Python API."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import yaml

import teachkit
from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import Callback, LoopConfig, OptimConfig, Trainer, fit, load_checkpoint
from teachkit.engine.callbacks import CALLBACKS, EarlyStop, EarlyStopOptions, callback_specs
from teachkit.engine.syncs import HostSyncCounter
from teachkit.errors import ConfigError
from teachkit.types import StepOutput
from tests.engine.test_trainer import Scripted


class Recorder(Callback):
    """Every hook, in order; the step infos with their tensors read on the host (the test's own syncs)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.steps: list[dict] = []

    def on_train_start(self, trainer):
        self.calls.append(("train_start", trainer.epoch))

    def on_epoch_start(self, trainer, epoch):
        self.calls.append(("epoch_start", epoch))

    def on_step_end(self, trainer, info):
        self.calls.append(("step", info.epoch, info.step))
        self.steps.append({"epoch": info.epoch, "step": info.step, "global": info.global_step,
                           "per_epoch": info.steps_per_epoch, "loss": float(info.loss), "samples": info.samples,
                           "lr": info.lr, "terms": {k: float(v) for k, v in info.terms.items()},
                           "on_host": info.loss.device.type})

    def on_epoch_end(self, trainer, record):
        self.calls.append(("epoch_end", record["epoch"]))

    def on_train_end(self, trainer, summary):
        self.calls.append(("train_end", summary["last_epoch"]))


class NoOp(Callback):
    """Every hook overridden, doing nothing."""

    def on_train_start(self, trainer):
        pass

    def on_epoch_start(self, trainer, epoch):
        pass

    def on_step_end(self, trainer, info):
        pass

    def on_epoch_end(self, trainer, record):
        pass

    def on_train_end(self, trainer, summary):
        pass


def data(n=44, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


def make_trainer(tmp_path, name, callbacks=(), epochs=3, micro_batch=None, val=None, resume=False, n=44):
    """A linear model with two loss terms (CE and a small weight penalty) on 44 rows in batches of 8 (the last 4)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = data(n)

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": torch.nn.functional.cross_entropy(logits, batch.y),
                           "l2": 0.01 * model.weight.pow(2).sum()}, logits)

    ev = Scripted(val or [{"acc": 1.0, "loss": 1.0}])
    loop = LoopConfig(epochs=epochs, progress=False, micro_batch=micro_batch)
    trainer = Trainer(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0),
                      OptimConfig(lr=0.1, schedule="cosine"), ev, tmp_path / name, loop=loop, callbacks=callbacks,
                      resume=resume)
    return trainer, model


def run(trainer):
    while not trainer.done:
        trainer.run_epoch()
    return trainer.finish()


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weighted_mean(steps, epoch, key=lambda s: s["loss"]):
    rows = [s for s in steps if s["epoch"] == epoch]
    return sum(key(s) * s["samples"] for s in rows) / sum(s["samples"] for s in rows)


def test_hooks_run_in_order_around_the_run_epochs_and_steps(tmp_path):
    rec = Recorder()
    trainer, _ = make_trainer(tmp_path, "order", [rec], epochs=2)
    run(trainer)
    per_epoch = lambda e: [("epoch_start", e), *[("step", e, s) for s in range(6)], ("epoch_end", e + 1)]  # noqa: E731
    assert rec.calls == [("train_start", 0), *per_epoch(0), *per_epoch(1), ("train_end", 2)]
    assert [s["global"] for s in rec.steps] == list(range(1, 13)) and {s["per_epoch"] for s in rec.steps} == {6}
    assert [s["samples"] for s in rec.steps[:6]] == [8, 8, 8, 8, 8, 4]


@pytest.mark.parametrize("micro_batch", [None, 3])
def test_step_losses_average_to_the_epochs_train_loss(tmp_path, micro_batch):
    """The per-step loss and terms, weighted by the step's samples, are the epoch's train means in metrics.jsonl
    (with micro-batches too: chunks of 3, 3 and 2 rows); loss = ce + l2; lr is the step's scheduled one."""
    rec = Recorder()
    trainer, _ = make_trainer(tmp_path, f"avg{micro_batch}", [rec], epochs=2, micro_batch=micro_batch)
    run(trainer)
    for epoch, record in enumerate(records(trainer.run_dir)):
        assert weighted_mean(rec.steps, epoch) == pytest.approx(record["train"]["loss"], rel=1e-12)
        for term in ("ce", "l2"):
            assert weighted_mean(rec.steps, epoch, lambda s, t=term: s["terms"][t]) == pytest.approx(
                record["train"][term], rel=1e-12)
        assert [s for s in rec.steps if s["epoch"] == epoch][-1]["lr"] == record["lr"]
    for s in rec.steps:
        assert s["loss"] == pytest.approx(s["terms"]["ce"] + s["terms"]["l2"], rel=1e-6)  # summed in float32
    # cosine schedule by hand: lr_t = 0.05 (1 + cos(pi t / T)) at step t of T = 12
    assert [s["lr"] for s in rec.steps] == pytest.approx([0.05 * (1 + math.cos(math.pi * t / 12)) for t in range(12)])


def test_a_callback_doing_nothing_adds_no_host_sync(tmp_path):
    totals = {}
    for name, callbacks in (("none", []), ("noop", [NoOp()])):
        trainer, _ = make_trainer(tmp_path, name, callbacks, epochs=2)
        with HostSyncCounter() as counter:
            run(trainer)
        totals[name] = counter.total
    assert totals["noop"] == totals["none"] > 0


def test_step_info_holds_device_tensors_and_reading_them_is_the_callbacks_own_sync(tmp_path):
    rec = Recorder()
    trainer, _ = make_trainer(tmp_path, "dev", [rec], epochs=1)
    with HostSyncCounter() as counter:
        run(trainer)
    plain, _ = make_trainer(tmp_path, "plain", [NoOp()], epochs=1)
    with HostSyncCounter() as base:
        run(plain)
    reads_per_step = 1 + 2  # the recorder reads the loss and both terms
    assert counter.total - base.total == reads_per_step * 6 and {s["on_host"] for s in rec.steps} == {"cpu"}


class StopAt(Callback):
    def __init__(self, global_step=None, epoch=None):
        self.global_step, self.epoch = global_step, epoch

    def on_step_end(self, trainer, info):
        if info.global_step == self.global_step:
            trainer.request_stop(f"reached step {info.global_step}")

    def on_epoch_end(self, trainer, record):
        if record["epoch"] == self.epoch:
            trainer.request_stop("enough epochs")


def test_a_stop_after_a_step_ends_the_epoch_there_with_a_valid_checkpoint_and_summary(tmp_path):
    rec = Recorder()
    trainer, model = make_trainer(tmp_path, "stop", [StopAt(global_step=9), rec], epochs=4)
    result = run(trainer)
    stopped = {"reason": "reached step 9", "epoch": 2, "step": 3}
    assert result.summary["stopped"] == stopped and result.summary["last_epoch"] == 2
    assert json.loads((trainer.run_dir / "summary.json").read_text())["stopped"] == stopped
    assert [s["global"] for s in rec.steps] == list(range(1, 10)) and rec.calls[-1] == ("train_end", 2)
    lines = records(trainer.run_dir)
    assert [r["epoch"] for r in lines] == [1, 2]
    assert weighted_mean(rec.steps, 1) == pytest.approx(lines[1]["train"]["loss"], rel=1e-12)  # its 3 steps only
    tensors, state = load_checkpoint(trainer.last_path)
    assert state["epoch"] == 2 and state["stopped"] == stopped
    assert torch.equal(tensors["model/weight"], model.weight.detach())
    # resuming the stopped run trains nothing more and keeps the stop
    again, model2 = make_trainer(tmp_path, "stop", [rec2 := Recorder()], epochs=4, resume=True)
    assert again.done and again.epoch == 2
    summary = run(again).summary
    assert summary["stopped"] == stopped and torch.equal(model2.weight, model.weight)
    assert rec2.calls == [("train_start", 2), ("train_end", 2)]
    with pytest.raises(ConfigError, match="stopped after epoch 2 .reached step 9."):
        again.run_epoch()


def test_a_stop_at_an_epochs_end_is_noted_in_its_checkpoint(tmp_path):
    trainer, _ = make_trainer(tmp_path, "epochstop", [StopAt(epoch=2)], epochs=5)
    result = run(trainer)
    stopped = {"reason": "enough epochs", "epoch": 2, "step": 6}
    assert result.summary["stopped"] == stopped and len(records(trainer.run_dir)) == 2
    _, state = load_checkpoint(trainer.last_path)
    assert state["epoch"] == 2 and state["stopped"] == stopped
    again, _ = make_trainer(tmp_path, "epochstop", epochs=5, resume=True)
    assert again.done


def test_early_stop_stops_after_patience_epochs_and_a_resumed_run_stops_at_the_same_epoch(tmp_path):
    val = [{"acc": a} for a in (10.0, 20.0, 20.0, 15.0, 30.0, 40.0)]  # best at epoch 2; 3 and 4 do not improve
    trainer, _ = make_trainer(tmp_path, "early", [EarlyStop(EarlyStopOptions(patience=2))], epochs=6, val=val)
    result = run(trainer)
    assert result.summary["last_epoch"] == 4 and result.summary["best_epoch"] == 2
    assert result.summary["stopped"]["epoch"] == 4 and "did not improve for 2 epochs" in result.summary["stopped"][
        "reason"]

    class Kill(Exception):
        pass

    class KillAt3(Callback):
        def on_epoch_end(self, trainer, record):
            if record["epoch"] == 3:
                raise Kill

    first, _ = make_trainer(tmp_path, "early2", [EarlyStop(EarlyStopOptions(patience=2)), KillAt3()], epochs=6,
                            val=val)
    with pytest.raises(Kill):
        run(first)
    resumed, _ = make_trainer(tmp_path, "early2", [EarlyStop(EarlyStopOptions(patience=2))], epochs=6,
                              val=val[3:], resume=True)  # the evaluator's epochs 4, 5, 6
    assert run(resumed).summary["stopped"]["epoch"] == 4


def test_fit_runs_the_callbacks_too(tmp_path):
    rec = Recorder()
    model = torch.nn.Linear(3, 2)
    x, y = data(16)

    def step(batch, progress):
        return StepOutput({"ce": torch.nn.functional.cross_entropy(model(batch.x), batch.y)})

    result = fit(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0), OptimConfig(),
                 Scripted([{"acc": 1.0}]), tmp_path / "fit", loop=LoopConfig(epochs=1, progress=False), callbacks=[rec])
    assert rec.calls[0] == ("train_start", 0) and rec.calls[-1] == ("train_end", 1) and "stopped" not in result.summary


# ----------------------------------------------------------------------------- named callbacks and the API


def test_train_callbacks_are_names_or_mappings_with_typed_options():
    specs = callback_specs(["early_stop", {"name": "early_stop", "options": {"patience": 3}}])
    built = [s.build() for s in specs]
    assert [type(b) for b in built] == [EarlyStop, EarlyStop] and built[1].options.patience == 3
    assert built[0].options.patience == EarlyStopOptions().patience
    with pytest.raises(ConfigError, match=r"^train.callbacks\[0\]: unknown callback 'early_sto' \(did you mean "
                                          r"'early_stop'\?\); choose one of: .*early_stop"):
        from_dict({"train": {"callbacks": ["early_sto"]}})
    with pytest.raises(ConfigError, match=r"train.callbacks\[0\].options.patience=0 is out of range"):
        from_dict({"train": {"callbacks": [{"name": "early_stop", "options": {"patience": 0}}]}})
    assert "early_stop" in CALLBACKS


PLUGIN = '''"""A plugin registering a callback that writes each step's loss and samples to a JSON lines file."""
import json
from dataclasses import dataclass

from teachkit.engine import Callback, register_callback
from teachkit.options import Options


@dataclass
class StepLogOptions(Options):
    path: str = "steps.jsonl"


@register_callback("{name}", "writes each step's loss", options=StepLogOptions)
class StepLog(Callback):
    def __init__(self, options):
        self.path = options.path

    def on_step_end(self, trainer, info):
        with open(self.path, "a") as f:
            f.write(json.dumps({{"epoch": info.epoch, "loss": float(info.loss), "samples": info.samples}}) + "\\n")
'''


def test_a_plugins_callback_named_in_the_config_runs_through_the_cli(tmp_path, monkeypatch, capsys):
    """``teachkit train`` with ``train.callbacks`` naming a plugin's callback: its per-step losses average (by
    samples) to each epoch's train loss in metrics.jsonl."""
    module = "tk_steplog_plugin"
    (tmp_path / f"{module}.py").write_text(PLUGIN.format(name="steplog"))
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "steps.jsonl"
    cfg = {"name": "cb", "out_dir": str(tmp_path / "runs"), "plugins": [module],
           "data": {"name": "synthetic", "batch_size": 32,
                    "options": {"shape": [1, 8, 8], "num_classes": 4, "n_train": 200, "n_test": 60}},
           "model": {"name": "mlp", "options": {"hidden": [16]}}, "optim": {"lr": 0.05},
           "train": {"epochs": 2, "progress": False,
                     "callbacks": [{"name": "steplog", "options": {"path": str(log)}}]}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    try:
        assert main(["train", str(path), "--quiet"]) == 0
    finally:
        sys.modules.pop(module, None)
        CALLBACKS._entries.pop("steplog", None)  # the registration goes with the plugin (re-runnable in one process)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    lines = records(tmp_path / "runs" / "cb")
    assert len(lines) == 2
    for epoch, record in enumerate(lines):
        assert weighted_mean(steps, epoch) == pytest.approx(record["train"]["loss"], rel=1e-9)
    per_epoch = [[s["samples"] for s in steps if s["epoch"] == e] for e in (0, 1)]
    assert per_epoch[0] == per_epoch[1] and len(per_epoch[0]) >= 2


def test_the_python_api_takes_callback_objects(tmp_path):
    x, y = data(120, seed=2)
    rec = Recorder()
    teachkit.train(lambda: torch.nn.Linear(3, 2), (x.numpy(), y.numpy()), epochs=2, out_dir=tmp_path, quiet=True,
                   callbacks=[rec])
    assert rec.calls[0] == ("train_start", 0) and rec.calls[-1] == ("train_end", 2)
    assert {s["epoch"] for s in rec.steps} == {0, 1}
    teacher = tmp_path / "train-model"
    student = Recorder()
    teachkit.distill(lambda: torch.nn.Linear(3, 2), teacher, (x.numpy(), y.numpy()), epochs=1, out_dir=tmp_path,
                     quiet=True, callbacks=[student])
    assert student.calls[0] == ("train_start", 0) and student.calls[-1] == ("train_end", 1) and student.steps
    with pytest.raises(ConfigError, match=r"callbacks\[0\] is a str, not a teachkit.engine.Callback"):
        teachkit.train(lambda: torch.nn.Linear(3, 2), (x.numpy(), y.numpy()), epochs=1, out_dir=tmp_path,
                       quiet=True, callbacks=["early_stop"])
