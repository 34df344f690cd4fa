"""The Pro-KD GLUE / SQuAD configs (scripts/generate_text_configs.py): current, valid, and the paper's numbers."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from teachkit.config import load_config, read_yaml, yaml_load
from teachkit.data import DATASETS
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, OBJECTIVES
from teachkit.models import MODELS
from teachkit.recipes import RECIPES
from teachkit.recipes.context import check_run_name
from teachkit.recipes.prokd import prokd_plan

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "generate_text_configs.py"
CONFIGS = sorted(p for sub in ("glue", "squad") for p in (REPO / "configs" / sub).rglob("*.yaml"))
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")


def _params(builder) -> set[str]:
    return set(inspect.signature(builder).parameters)


def test_generated_configs_are_up_to_date():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_grid_is_complete():
    # 8 classification tasks x 10 files + STS-B x 2 files, per pair; SQuAD: 2 versions x 5 files, per pair
    assert len(CONFIGS) == 2 * (8 * 10 + 2) + 2 * 2 * 5
    for pair in ("bert", "roberta"):
        for task in GLUE_TASKS:
            assert (REPO / "configs" / "glue" / pair / task / "teacher.yaml").is_file()
        for version in ("v1.1", "v2.0"):
            assert (REPO / "configs" / "squad" / pair / version / "prokd.yaml").is_file()
    assert not (REPO / "configs" / "glue" / "bert" / "stsb" / "kd.yaml").exists()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_validates_and_names_exist(path):
    cfg = load_config(path)
    assert cfg.data.name in DATASETS and cfg.model.name in MODELS and cfg.train.loss in OBJECTIVES
    for method in cfg.kd.methods:
        assert method in LOSSES
    check_run_name(cfg.name)  # a valid run name
    # every data and model option is a parameter of the registered builder
    assert set(cfg.data.options) <= _params(DATASETS.get(cfg.data.name)) - {"root"}
    assert set(cfg.model.options) <= _params(MODELS.get(cfg.model.name)) - {"input_shape", "num_classes"}
    # the first line is the command that runs this file, naming an existing recipe
    first = path.read_text().splitlines()[0]
    rel = str(path.relative_to(REPO))
    assert first.startswith("# teachkit ") and f" {rel} data.root=" in first
    words = first.split()
    recipe = words[3] if words[2] == "run" else {"train": "train", "distill": "kd"}[words[2]]
    assert recipe in RECIPES
    if "(after " in first:
        before = first.split("(after ", 1)[1].rstrip(")")
        teacher = load_config(REPO / before)
        written = read_yaml(path)["teacher"]["checkpoint"]  # as written: run folders are relative to the cwd
        assert written == f"{teacher.out_dir}/{teacher.name}"
        assert cfg.teacher.checkpoint.endswith(written)  # resolved (docs/configuration-paths-and-taps.md)
    else:
        assert cfg.teacher.checkpoint is None
    # GPU configs: AdamW, linear decay, clip 1; no CPU-only settings
    assert (cfg.optim.name, cfg.optim.schedule, cfg.optim.grad_clip) == ("adamw", "linear", 1.0)
    assert cfg.train.flush_denormal is False
    if cfg.data.name == "glue":
        assert cfg.data.batch_size == 32 and cfg.data.options["max_length"] == 128
        assert cfg.train.loss in (("l2",) if cfg.data.options["task"] == "stsb" else ("ce", "mse"))
    else:
        assert cfg.data.batch_size == 12 and cfg.model.options["head"] == "qa"
        assert (cfg.data.options["max_length"], cfg.data.options["doc_stride"]) == (384, 128)
    if "kd" in yaml_load(path.read_text()):  # every Hinton-KD config: the paper's alpha 0.5
        assert cfg.kd.methods == ["kd"] and cfg.kd.alpha == 0.5


def _phases(cfg, teacher_epochs):
    plan = prokd_plan(cfg, teacher_epochs)
    phase1 = [s for s in plan if s.kind == "prokd"]
    assert all(s.kind == "ce" for s in plan[len(phase1):])
    return phase1, len(plan) - len(phase1)


def test_bert_sst2_prokd_numbers():
    cfg = load_config(REPO / "configs/glue/bert/sst2/prokd.yaml")
    teacher = load_config(REPO / "configs/glue/bert/sst2/teacher.yaml")
    assert teacher.train.epochs == 7 and teacher.train.save_every == 1 and teacher.train.loss == "ce"
    assert cfg.prokd.tau_max == 7 and cfg.prokd.student_epochs == 1 and cfg.prokd.mode == "replay"
    assert cfg.optim.lr == 2e-5 and cfg.optim.grad_clip == 1.0
    assert cfg.data.batch_size == 32 and cfg.data.options["max_length"] == 128
    assert cfg.data.options["tokenizer"] == cfg.model.options["path"] == "google/bert_uncased_L-4_H-512_A-8"
    phase1, phase2 = _phases(cfg, teacher.train.epochs)
    assert [s.temperature for s in phase1] == [7, 6, 5, 4, 3, 2, 1]
    assert [s.teacher_epoch for s in phase1] == [1, 2, 3, 4, 5, 6, 7]
    assert phase2 == 10
    for method in ("nokd", "kd", "annealing", "rco", "takd", "eskd"):  # the same budget for every student
        assert load_config(REPO / f"configs/glue/bert/sst2/{method}.yaml").train.epochs == 17


def test_learning_rates_and_roberta_schedule():
    assert load_config(REPO / "configs/glue/bert/rte/prokd.yaml").optim.lr == 5e-5
    assert load_config(REPO / "configs/glue/bert/mrpc/kd.yaml").optim.lr == 5e-5
    cfg = load_config(REPO / "configs/glue/roberta/mnli/prokd.yaml")
    assert cfg.optim.lr == 2e-5 and cfg.prokd.tau_max == 5 and cfg.prokd.student_epochs == 2
    assert load_config(REPO / "configs/glue/roberta/mnli/teacher.yaml").train.epochs == 5
    phase1, phase2 = _phases(cfg, 5)
    assert [s.temperature for s in phase1] == [5, 5, 4, 4, 3, 3, 2, 2, 1, 1] and phase2 == 10
    takd = load_config(REPO / "configs/glue/roberta/mnli/takd.yaml")
    assert takd.takd.assistant.options["path"] == "roberta-base"
    assert load_config(REPO / "configs/glue/roberta/mnli/eskd.yaml").eskd.search is True
    assert load_config(REPO / "configs/glue/roberta/mnli/teacher_mse.yaml").train.loss == "mse"


def test_squad_numbers():
    for version in ("1.1", "2.0"):
        cfg = load_config(REPO / f"configs/squad/bert/v{version}/prokd.yaml")
        assert cfg.data.options["version"] == version
        assert cfg.optim.lr == 3e-5 and cfg.prokd.tau_max == 3 and cfg.prokd.student_epochs == 1
        assert _phases(cfg, 3)[1] == 5  # BERT-Small (appendix Table 15)
        teacher = load_config(REPO / f"configs/squad/bert/v{version}/teacher.yaml")
        assert teacher.train.epochs == 3 and teacher.optim.lr == 3e-5 and teacher.train.save_every == 1
        rob = load_config(REPO / f"configs/squad/roberta/v{version}/prokd.yaml")
        assert _phases(rob, 3)[1] == 6  # DistilRoBERTa (appendix Table 14)
        rob_teacher = load_config(REPO / f"configs/squad/roberta/v{version}/teacher.yaml")
        assert (rob_teacher.optim.lr, rob_teacher.optim.weight_decay) == (1.5e-5, 0.01)


def test_stsb_is_regression_without_distillation():
    for pair in ("bert", "roberta"):
        folder = REPO / "configs" / "glue" / pair / "stsb"
        assert sorted(p.name for p in folder.iterdir()) == ["nokd.yaml", "teacher.yaml"]
        assert all(load_config(p).train.loss == "l2" for p in folder.iterdir())


def test_prokd_budget_is_checked():
    # the plan refuses a phase I longer than the student's budget, so the shipped budgets are consistent
    cfg = load_config(REPO / "configs/glue/bert/sst2/prokd.yaml", ["train.epochs=6"])
    with pytest.raises(ConfigError):
        prokd_plan(cfg, 7)
