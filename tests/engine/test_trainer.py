import json

import pytest
import torch

from teachkit.data import BatchLoader
from teachkit.engine import EVALUATORS, ClassificationEvaluator, fit
from teachkit.engine.checkpoint import load_checkpoint
from teachkit.errors import NonFiniteLossError
from teachkit.recipes import train_model
from teachkit.recipes.common import load_data
from teachkit.types import StepOutput


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
