import json

import pytest
import torch

from teachkit.data import BatchLoader
from teachkit.data.base import TensorSplit
from teachkit.engine import EVALUATORS, Callback, ClassificationEvaluator, EpochHooks, LoopConfig, OptimConfig, fit
from teachkit.engine.checkpoint import load_checkpoint
from teachkit.engine.syncs import HostSyncCounter
from teachkit.errors import CheckpointError, ConfigError, NonFiniteLossError
from teachkit.recipes import train_model
from teachkit.recipes.common import load_data
from teachkit.types import Batch, Evaluator, StepOutput


class Interrupt(Exception):
    pass


def test_run_folder_contents(tiny):
    result = train_model(tiny(train={"epochs": 3, "save_every": 1, "progress": False}))
    d = result.run_dir
    assert (d / "config.yaml").is_file()
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2, 3]
    summary = json.loads((d / "summary.json").read_text())
    for key in ("val_acc", "test_acc", "best_epoch", "best_val_acc", "test_acc_at_best", "wall_time_s",
                "images_per_s"):
        assert key in summary
    manifest = json.loads((d / "trajectory" / "trajectory.json").read_text())["checkpoints"]
    assert [e["epoch"] for e in manifest] == [1, 2, 3] and all(len(e["sha256"]) == 64 for e in manifest)
    assert summary["val_acc"] > 40  # 4 separable classes: learns well above chance (25%)


def test_resume_is_bit_identical(tiny, tmp_path):
    """4 epochs straight == 2 epochs, crash, resume for 2 more (CPU)."""
    dropout = {"name": "mlp", "options": {"hidden": [16], "dropout": 0.3}}  # the torch RNG matters too
    straight = train_model(tiny(name="straight", model=dropout, train={"epochs": 4, "progress": False}))
    cfg = tiny(name="resumed", model=dropout, train={"epochs": 4, "progress": False})

    real_evaluate = ClassificationEvaluator.evaluate
    calls = {"n": 0}

    def crash_after_two_epochs(self, model):
        calls["n"] += 1
        if calls["n"] == 3:  # epochs 1-2 evaluated, checkpoint of epoch 2 written
            raise Interrupt
        return real_evaluate(self, model)

    ClassificationEvaluator.evaluate = crash_after_two_epochs
    try:
        with pytest.raises(Interrupt):
            train_model(cfg)
    finally:
        ClassificationEvaluator.evaluate = real_evaluate
    _, state = load_checkpoint(tmp_path / "runs" / "resumed" / "checkpoints" / "last.safetensors")
    assert state["epoch"] == 2
    resumed = train_model(cfg, resume=True)
    for (k, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), k
    lines = (resumed.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2, 3, 4]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny, tmp_path):
    cfg = tiny(train={"epochs": 4, "progress": False})
    splits = load_data(cfg.data, torch.device("cpu"))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))

    def step(batch, progress):
        logits = model(batch.x)
        loss = torch.nn.functional.cross_entropy(logits, batch.y)
        if progress.epoch == 2 and progress.step == 3:
            loss = loss * float("nan")
        return StepOutput({"ce": loss}, logits)

    run_dir = tmp_path / "nan-run"
    batches = BatchLoader(splits.train, cfg.data.batch_size, shuffle=True, seed=0)
    with pytest.raises(NonFiniteLossError, match=r"loss became nan at epoch 3, step 4; training stopped, "
                                                 r"last good checkpoint .*last.safetensors' \(epoch 2\)"):
        fit(model, step, batches, cfg.optim, EVALUATORS.get("classification")(splits, 1000), run_dir,
            loop=cfg.train.loop())
    tensors, state = load_checkpoint(run_dir / "checkpoints" / "last.safetensors")
    assert state["epoch"] == 2
    assert all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_tensorboard_events_or_clear_error(tiny):
    from teachkit.errors import ConfigError

    cfg = tiny(name="tb", train={"epochs": 1, "progress": False, "tensorboard": True})
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"pip install 'teachkit\[tensorboard\]'"):
            train_model(cfg)
    else:
        result = train_model(cfg)
        assert list((result.run_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_progress_bar_and_epoch_lines(tiny, capsys):
    train_model(tiny(name="bar", train={"epochs": 2, "progress": True}))
    err_out = capsys.readouterr()
    text = err_out.out + err_out.err
    assert "bar epoch 2/2" in text and "val" in text and "img/s" in text


def test_channels_last_and_bf16_train_and_keep_layout(tiny):
    images = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 120, "n_test": 40}
    cfg = tiny(name="cl", data={"options": images}, model={"name": "resnet8", "options": {}},
               train={"epochs": 2, "progress": False, "channels_last": True, "precision": "bf16"})
    result = train_model(cfg)
    conv = result.model.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert result.summary["val_acc"] > 25  # learns above chance with both speed options on


class Scripted(Evaluator):
    """An evaluator whose val metrics per epoch are given in advance (test: their negatives), to test selection."""

    primary = "acc"

    def __init__(self, val: list[dict[str, float]]) -> None:
        self.val, self.calls = val, 0

    def metric_names(self) -> tuple[str, ...]:
        return tuple(self.val[0])

    def evaluate(self, model):
        self.calls += 1
        val = self.val[min(self.calls, len(self.val)) - 1]  # the last one repeats for longer runs
        return {"val": val, "test": {k: -v for k, v in val.items()}}


def tiny_fit(tmp_path, name, evaluator, loop, step_fn=None, model=None, batches=None):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(3, 2)
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    batches = batches or BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0)

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": torch.nn.functional.cross_entropy(logits, batch.y)}, logits)

    return fit(model, step_fn or step, batches, OptimConfig(lr=0.1), evaluator, tmp_path / name, loop=loop), model


@pytest.mark.parametrize("metric, mode, best", [("acc", "auto", 3), ("loss", "auto", 2), ("loss", "max", 1),
                                                ("acc", "min", 1)])
def test_select_metric_maximised_or_minimised(tmp_path, metric, mode, best):
    val = [{"acc": 10.0, "loss": 3.0}, {"acc": 20.0, "loss": 1.0}, {"acc": 30.0, "loss": 2.0}]
    result, _ = tiny_fit(tmp_path, f"{metric}-{mode}", Scripted(val),
                         LoopConfig(epochs=3, progress=False, select_metric=metric, select_mode=mode))
    s = result.summary
    assert s["select_metric"] == metric and s["best_epoch"] == best
    assert s[f"best_val_{metric}"] == val[best - 1][metric] and s[f"test_{metric}_at_best"] == -val[best - 1][metric]
    _, state = load_checkpoint(tmp_path / f"{metric}-{mode}" / "checkpoints" / "best.safetensors")
    assert state["epoch"] == best


def test_unknown_select_metric_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match=r"train.select_metric='f1' is not a metric of this task; choose one of: "
                                          r"acc, loss"):
        tiny_fit(tmp_path, "bad", Scripted([{"acc": 1.0, "loss": 1.0}]),
                 LoopConfig(epochs=1, progress=False, select_metric="f1"))


class TwoInputs(torch.nn.Module):
    """A model called with named inputs (as a tokenised batch is): model(a=..., b=...)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(5, 2)

    def forward(self, a, b):
        return self.a(a) + self.b(b)


class MappingBatches:
    """A batch source of mapping inputs, reproducible per (seed, epoch)."""

    def __len__(self) -> int:
        return 4

    def batches(self, epoch: int):
        g = torch.Generator().manual_seed(epoch)
        for i in range(4):
            a, b = torch.randn(6, 3, generator=g), torch.randn(6, 5, generator=g)
            yield Batch({"a": a, "b": b}, (a[:, 0] > 0).long(), torch.arange(6) + 6 * i)


def test_mapping_inputs_and_several_modules_train_checkpoint_and_resume(tmp_path):
    """Inputs may be a mapping of tensors; every module is optimised and saved under its own prefix."""
    def run(name, epochs, resume=False, crash_after=None):
        torch.manual_seed(0)
        model, head = TwoInputs(), torch.nn.Linear(2, 2)

        def step(batch, progress):
            logits = model(**batch.x)
            return StepOutput({"ce": torch.nn.functional.cross_entropy(logits, batch.y),
                               "aux": head(logits).pow(2).mean()}, logits)

        def crash(record):
            if record["epoch"] == crash_after:
                raise Interrupt

        ev = Scripted([{"acc": float(e), "loss": 0.0} for e in range(1, 5)])
        return fit({"model": model, "head": head}, step, MappingBatches(), OptimConfig(lr=0.1), ev, tmp_path / name,
                   loop=LoopConfig(epochs=epochs, progress=False), resume=resume,
                   callbacks=[EpochHooks(end=crash)]), model, head

    straight, m1, h1 = run("straight", 3)
    with pytest.raises(Interrupt):
        run("resumed", 3, crash_after=1)
    resumed, m2, h2 = run("resumed", 3, resume=True)
    tensors, _ = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.safetensors")
    assert {k.split("/")[0] for k in tensors} >= {"model", "head", "optim", "rng"}
    for a, b in ((m1, m2), (h1, h2)):
        for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(v, w), k
    record = straight.history[-1]
    assert set(record["train"]) == {"loss", "ce", "aux"} and "train_acc" not in record  # no train metrics asked


def test_one_host_sync_per_step(tmp_path):
    """The NaN guard is the step's only read of a tensor; metrics stay on the device until the epoch ends."""
    totals = {}
    for steps in (3, 6):
        x, y = torch.randn(8 * steps, 3), torch.randint(0, 2, (8 * steps,))
        batches = BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0)
        ev = Scripted([{"acc": 1.0, "loss": 1.0}])
        with HostSyncCounter() as counter:
            tiny_fit(tmp_path, f"s{steps}", ev, LoopConfig(epochs=1, progress=False), batches=batches)
        totals[steps] = counter.total
    assert (totals[6] - totals[3]) / 3 == 1


def test_callbacks_run_around_each_epoch_in_order(tmp_path):
    calls = []
    ev = Scripted([{"acc": 1.0, "loss": 1.0}] * 2)
    hooks = EpochHooks(start=lambda e: calls.append(("start", e)), end=lambda r: calls.append(("end", r["epoch"])))

    class Checker(Callback):
        def on_epoch_end(self, trainer, record):
            assert trainer.last_path.is_file() and trainer.epoch == record["epoch"]  # checkpoint already written
            calls.append(("checked", record["epoch"]))

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))

    def step(batch, progress):
        logits = model(batch.x)
        return StepOutput({"ce": torch.nn.functional.cross_entropy(logits, batch.y)}, logits)

    fit(model, step, BatchLoader(TensorSplit(x, y), 8, shuffle=True, seed=0), OptimConfig(), ev, tmp_path / "cb",
        loop=LoopConfig(epochs=2, progress=False), callbacks=[hooks, Checker()])
    assert calls == [("start", 0), ("end", 1), ("checked", 1), ("start", 1), ("end", 2), ("checked", 2)]


def test_resume_from_a_checkpoint_of_other_modules_is_a_one_line_error(tmp_path):
    tiny_fit(tmp_path, "run", Scripted([{"acc": 1.0, "loss": 1.0}]), LoopConfig(epochs=1, progress=False))
    other = torch.nn.Linear(3, 5)  # not the Linear(3, 2) the run folder was made with
    batches = BatchLoader(TensorSplit(torch.zeros(8, 3), torch.zeros(8).long()), 8, shuffle=False, seed=0)
    with pytest.raises(CheckpointError) as e:
        fit(other, lambda b, p: None, batches, OptimConfig(), Scripted([{"acc": 1.0, "loss": 1.0}]), tmp_path / "run",
            loop=LoopConfig(epochs=2, progress=False), resume=True)
    assert "cannot resume from" in str(e.value) and "does not fit this run's model" in str(e.value)
    assert "\n" not in str(e.value)
