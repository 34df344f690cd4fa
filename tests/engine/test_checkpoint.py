import json

import pytest
import torch

from teachkit.engine.checkpoint import (
    Trajectory,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)
from teachkit.errors import CheckpointError


def test_roundtrip_with_state_and_sidecar(tmp_path):
    path = tmp_path / "c.safetensors"
    digest = save_checkpoint(path, {"w": torch.arange(6.0).reshape(2, 3)}, {"epoch": 3, "note": "x"})
    tensors, state = load_checkpoint(path)
    assert torch.equal(tensors["w"], torch.arange(6.0).reshape(2, 3))
    assert state == {"epoch": 3, "note": "x"}
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["sha256"] == digest and side["epoch"] == 3
    assert not list(tmp_path.glob("*.tmp"))  # temp files renamed away


def test_truncated_and_modified_files_are_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": torch.ones(100)}, {"epoch": 1})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)
    path.with_suffix(".json").unlink()  # without the sidecar: the format itself is checked
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": torch.ones(3)}, {"epoch": 1})
    import teachkit.engine.checkpoint as ck

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_file", boom)
    with pytest.raises(ck.WriteError, match=r"cannot write '.*c.safetensors': disk full$"):
        save_checkpoint(path, {"w": torch.zeros(3)}, {"epoch": 2})
    monkeypatch.undo()
    tensors, state = load_checkpoint(path)
    assert state["epoch"] == 1 and torch.equal(tensors["w"], torch.ones(3))
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda p: torch.optim.AdamW(p, lr=1e-3),
])
def test_optimizer_state_roundtrip_without_pickle(tmp_path, make):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = make(model.parameters())
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    tensors, struct = optimizer_to_flat(opt)
    save_checkpoint(tmp_path / "o.safetensors", tensors, {"optimizer": struct})
    loaded, state = load_checkpoint(tmp_path / "o.safetensors")
    opt2 = make(model.parameters())
    optimizer_from_flat(opt2, loaded, state["optimizer"])
    for k, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt2.state_dict()["state"][k][key]))


def test_trajectory_manifest_and_hash(tmp_path):
    traj = Trajectory(tmp_path / "t")
    for epoch in (1, 2, 3):
        traj.add(epoch, {"acc": 50.0 + epoch}, {"w": torch.full((2,), float(epoch))}, {"epoch": epoch})
    again = Trajectory(tmp_path / "t")
    assert [e["epoch"] for e in again.entries] == [1, 2, 3]
    assert again.entries[1]["val_acc"] == 52.0
    tensors, _ = again.load(2)
    assert torch.equal(tensors["w"], torch.full((2,), 2.0))
    (tmp_path / "t" / "epoch_0003.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="sha256"):
        again.load(3)
    with pytest.raises(CheckpointError, match="no checkpoint for epoch 7"):
        again.load(7)


def test_a_stale_sidecar_left_by_a_kill_is_recognised_and_rewritten(tmp_path):
    """A kill between the checkpoint's rename and its sidecar's: the file is complete (its own content digest
    matches), the sidecar names the previous file's sha256."""
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, {"w": torch.ones(3)}, {"epoch": 1})
    stale = path.with_suffix(".json").read_text()
    save_checkpoint(path, {"w": torch.full((3,), 2.0)}, {"epoch": 2})
    path.with_suffix(".json").write_text(stale)
    tensors, state = load_checkpoint(path)
    assert state["epoch"] == 2 and torch.equal(tensors["w"], torch.full((3,), 2.0))
    assert json.loads(path.with_suffix(".json").read_text())["epoch"] == 2  # rewritten
    # a file modified after writing fails its content digest, sidecar or not
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 check"):
        load_checkpoint(path)
    path.with_suffix(".json").unlink()
    with pytest.raises(CheckpointError, match="sha256 check"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/epoch_0001.safetensors"])
def test_trajectory_files_stay_inside_their_folder(tmp_path, name) -> None:
    folder = tmp_path / "trajectory"
    folder.mkdir()
    (folder / "trajectory.json").write_text(json.dumps({"checkpoints": [{"epoch": 1, "file": name,
                                                                         "sha256": "0" * 64}]}))
    trajectory = Trajectory(folder)
    for read in (trajectory.path, trajectory.load):
        with pytest.raises(CheckpointError, match="not a file of its folder"):
            read(1)
