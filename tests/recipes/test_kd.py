import dataclasses
import json
import math

import pytest
import torch

from teachkit.errors import CheckpointError, ConfigError
from teachkit.losses import LOSSES
from teachkit.recipes import distill, load_model, train_model


def test_distill_trains_teacher_in_command_and_keeps_it_frozen(tiny):
    cfg = tiny(name="kd", data={"train_subset": 60}, train={"epochs": 2, "progress": False})
    result = distill(cfg)
    teacher_dir = result.run_dir / "teacher"
    assert (teacher_dir / "summary.json").is_file()
    teacher_summary = json.loads((teacher_dir / "summary.json").read_text())
    # the teacher saw the full train split (240 - 10% val = 216), the student only its 60-image subset
    teacher_metrics = json.loads((teacher_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert teacher_metrics["images_per_s"] > 0 and teacher_summary["epochs"] == 2
    before, _ = load_model(teacher_dir)
    # distilling again from the saved teacher does not change its weights on disk
    again = distill(tiny(name="kd2", data={"train_subset": 60}, teacher={"checkpoint": str(teacher_dir)}))
    after, _ = load_model(teacher_dir)
    for a, b in zip(before.state_dict().values(), after.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    terms = json.loads((again.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"ce", "kd", "loss"}


def test_teacher_gets_no_gradient_and_stays_in_eval(tiny, monkeypatch):
    import teachkit.recipes.teacher as teacher

    seen = {}
    real = teacher.FrozenTeacher

    class Spy(real):
        def forward(self, x):
            seen["training"] = self.module.training
            out = super().forward(x)
            seen["requires_grad"] = out.requires_grad
            return out

    monkeypatch.setattr(teacher, "FrozenTeacher", Spy)
    distill(tiny(name="spy", model={"name": "mlp", "options": {"hidden": [8], "dropout": 0.5}},
                 teacher={"model": {"name": "mlp", "options": {"hidden": [8], "dropout": 0.5}}, "epochs": 1}))
    assert seen == {"training": False, "requires_grad": False}


def test_class_count_mismatch_is_refused(tiny):
    teacher = train_model(tiny(name="t4"))
    cfg = tiny(name="s3", data={"options": {"shape": [1, 8, 8], "num_classes": 3, "n_train": 240, "n_test": 60}},
               teacher={"checkpoint": str(teacher.run_dir)})
    with pytest.raises(ConfigError, match="teacher has 4 classes but dataset 'synthetic'.* has 3"):
        distill(cfg)


def test_missing_teacher_checkpoint(tiny, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        distill(tiny(teacher={"checkpoint": str(tmp_path / "nowhere")}))


def test_run_folder_is_never_overwritten(tiny):
    cfg = tiny(name="once")
    train_model(cfg)
    with pytest.raises(ConfigError, match="already exists; pass --resume"):
        train_model(cfg)


def test_resume_with_different_config_is_refused(tiny):
    train_model(tiny(name="r"))
    with pytest.raises(ConfigError, match=r"cannot resume .*optim.lr=0.05, not 0.1"):
        train_model(tiny(name="r", optim={"lr": 0.1}), resume=True)


def test_zero_shot_student_reports_omitted_and_kept_accuracy(tiny):
    result = distill(tiny(name="zs", data={"omit_classes": [2]}, train={"epochs": 2, "progress": False}))
    s = result.summary
    assert 0 <= s["test_acc_omitted"] <= 100 and 0 <= s["test_acc_kept"] <= 100
    # the teacher trained in-command saw every class, the student did not
    teacher_cfg = (result.run_dir / "teacher" / "config.yaml").read_text()
    assert "omit_classes: []" in teacher_cfg
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "acc_omitted" in record["val"] and "acc_kept" in record["test"]


#: every registered method, a new one included, but those reading text-encoder taps (tests/tasks/test_text_kd.py)
METHODS = [m for m in LOSSES.names() if not {"hidden_states", "attentions", "pooled"}
           & (set(LOSSES.get(m).student_needs) | set(LOSSES.get(m).teacher_needs))]
IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 120, "n_test": 40}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_distils_through_the_recipe(tiny, method):
    """Probe, build, train one epoch, checkpoint: a resnet8 student from a resnet14 teacher on 8x8 images.
    Pre-training stages (FSP, AB, FT, HSAKD's heads) run one epoch; a method whose main-stage weight is 0 by
    default (FSP, AB) is weighted 1 so that its term shows."""
    options_cls = LOSSES.options_of(method)
    fields = {f.name for f in dataclasses.fields(options_cls)} if options_cls else set()
    options = {key: 1 for key in ("init_epochs", "teacher_head_epochs") if key in fields}
    gamma = {method: 1.0} if LOSSES.get(method).default_weight == 0 else {}
    cfg = tiny(name=f"m-{method}", data={"options": IMAGES, "batch_size": 16},
               model={"name": "resnet8", "options": {}}, train={"epochs": 1, "progress": False},
               teacher={"model": {"name": "resnet14", "options": {}}, "epochs": 1},
               kd={"method": method, "options": {method: options} if options else {}, "gamma": gamma})
    result = distill(cfg)
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert all(math.isfinite(v) for v in record["train"].values())
    assert any(k == method or k.startswith(f"{method}.") for k in record["train"]), record["train"]


def test_combined_methods_and_resume_of_auxiliary_state(tiny):
    cfg = tiny(name="crd-kd", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 2, "progress": False}, teacher={"model": {"name": "resnet8", "options": {}}},
               kd={"method": ["crd", "kd"]})
    result = distill(cfg)
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"ce", "kd", "crd.student", "crd.teacher"} <= set(record["train"])
    from teachkit.engine.checkpoint import load_checkpoint

    tensors, _ = load_checkpoint(result.run_dir / "checkpoints" / "last.safetensors")
    assert any(k.startswith("objective/methods.crd.memory") for k in tensors)  # CRD memory bank is checkpointed


def test_feature_method_on_model_without_taps_is_one_line_error(tiny):
    cfg = tiny(name="no-taps", kd={"method": "at"})  # mlp student: flat stages, no spatial maps
    with pytest.raises(ConfigError) as e:
        distill(cfg)
    assert "\n" not in str(e.value)


class Interrupt(Exception):
    pass


def test_crd_resume_is_bit_identical(tiny, monkeypatch):
    """3 epochs straight == 1 epoch, crash, resume (memory banks, Z and the RNG come back)."""
    from teachkit.engine import ClassificationEvaluator

    def cfg(name: str, teacher: dict):
        return tiny(name=name, kd={"method": "crd"}, train={"epochs": 3, "progress": False}, teacher=teacher)

    first = distill(cfg("first", {}))
    teacher = {"checkpoint": str(first.run_dir / "teacher")}
    straight = distill(cfg("straight", teacher))
    real, calls = ClassificationEvaluator.evaluate, {"n": 0}

    def crash_in_epoch_two(self, model):
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 1 evaluated and checkpointed
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(ClassificationEvaluator, "evaluate", crash_in_epoch_two)
    with pytest.raises(Interrupt):
        distill(cfg("resumed", teacher))
    monkeypatch.setattr(ClassificationEvaluator, "evaluate", real)
    resumed = distill(cfg("resumed", teacher), resume=True)
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert straight.history[-1]["train"] == resumed.history[-1]["train"]
    assert {"crd.student", "crd.teacher"} <= set(straight.history[-1]["train"])


def test_hsakd_teacher_head_stage_resumes_exactly_and_is_reused(tiny, monkeypatch):
    """The heads train through the engine in their own folder: a crash in the stage resumes bit for bit, and a
    finished stage is loaded, not retrained."""
    from teachkit.engine import load_checkpoint as load
    from teachkit.losses.hsakd import HEADS_STAGE, TeacherHeadsEvaluator

    def cfg(name):
        return tiny(name=name, data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
                    train={"epochs": 1, "progress": False}, teacher={"model": {"name": "resnet8", "options": {}},
                                                                      "epochs": 1},
                    kd={"method": "hsakd", "options": {"hsakd": {"teacher_head_epochs": 3}}})

    straight = distill(cfg("straight"))
    real, calls = TeacherHeadsEvaluator.evaluate, {"n": 0}

    def crash_in_second_epoch(self, model):
        calls["n"] += 1
        if calls["n"] == 2:  # stage epoch 1 evaluated and checkpointed
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(TeacherHeadsEvaluator, "evaluate", crash_in_second_epoch)
    with pytest.raises(Interrupt):
        distill(cfg("resumed"))
    monkeypatch.setattr(TeacherHeadsEvaluator, "evaluate", real)
    _, state = load(straight.run_dir.parent / "resumed" / HEADS_STAGE / "checkpoints" / "last.safetensors")
    assert state["epoch"] == 1
    resumed = distill(cfg("resumed"), resume=True)
    heads = [load(r.run_dir / HEADS_STAGE / "checkpoints" / "last.safetensors")[0] for r in (straight, resumed)]
    assert heads[0].keys() == heads[1].keys() and all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    monkeypatch.setattr(TeacherHeadsEvaluator, "evaluate", lambda *a: pytest.fail("a finished stage retrained"))
    distill(cfg("resumed"), resume=True)  # everything finished: loads the heads, trains nothing new


def test_cost_wall_time_counts_the_in_command_teacher(tiny) -> None:
    """``cost.wall_time_s`` is the total: the student's own time plus the teacher trained in its folder."""
    import json

    result = distill(tiny(name="cost"))
    teacher = json.loads((result.run_dir / "teacher" / "summary.json").read_text())
    cost = result.summary["cost"]["wall_time_s"]
    both = result.summary["wall_time_s"] + teacher["wall_time_s"]  # the student's read at finish, a moment later
    assert both - 0.05 <= cost <= both and cost >= result.summary["wall_time_s"]
