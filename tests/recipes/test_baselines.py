import json

import pytest

from teachkit.errors import ConfigError
from teachkit.recipes import RECIPES, train_model


def test_takd_trains_assistant_then_student(tiny, capsys):
    cfg = tiny(name="takd", train={"epochs": 2, "progress": False},
               teacher={"model": {"name": "mlp", "options": {"hidden": [16]}}, "epochs": 1},
               takd={"assistant": {"name": "mlp", "options": {"hidden": [64]}}, "assistant_epochs": 1})
    result = RECIPES.get("takd")(cfg)
    assert "warning: the assistant mlp" in capsys.readouterr().err  # larger than its teacher
    assert (result.run_dir / "assistant" / "summary.json").is_file()
    student_teacher = json.loads((result.run_dir / "student" / "teacher.json").read_text())
    assistant = json.loads((result.run_dir / "assistant" / "summary.json").read_text())
    assert student_teacher["val_acc"] == pytest.approx(assistant["val_acc"])  # the student learnt from the TA
    assert result.summary["cost"]["student_epochs"] == 3


def test_checkpoint_search_picks_best_on_validation(tiny):
    teacher = train_model(tiny(name="traj", train={"epochs": 3, "save_every": 1, "progress": False}))
    result = RECIPES.get("eskd")(tiny(name="search", eskd={"search": True},
                                      teacher={"checkpoint": str(teacher.run_dir)}))
    table = result.summary["search"]
    assert [row["teacher_epoch"] for row in table] == [1, 2, 3]
    best = max(table, key=lambda r: (r["best_val_acc"], -r["teacher_epoch"]))
    assert result.summary["teacher_epoch"] == best["teacher_epoch"]
    assert result.summary["cost"]["student_epochs"] == 3 * 2


def test_eskd_single_epoch_and_errors(tiny):
    teacher = train_model(tiny(name="traj2", train={"epochs": 2, "save_every": 1, "progress": False}))
    one = RECIPES.get("eskd")(tiny(name="es1", eskd={"epoch": 1}, teacher={"checkpoint": str(teacher.run_dir)}))
    assert one.summary["teacher_epoch"] == 1
    with pytest.raises(ConfigError, match="eskd.epoch=5 has no teacher checkpoint"):
        RECIPES.get("eskd")(tiny(name="es2", eskd={"epoch": 5}, teacher={"checkpoint": str(teacher.run_dir)}))
    with pytest.raises(ConfigError, match="eskd needs eskd.epoch"):
        RECIPES.get("eskd")(tiny(name="es3", teacher={"checkpoint": str(teacher.run_dir)}))
