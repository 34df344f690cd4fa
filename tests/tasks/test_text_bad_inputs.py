"""Text bad inputs through the CLI, table-driven: each ends with exit status 2 and ONE stderr line
``teachkit: error: ...`` naming the bad value, never a traceback, and nothing already written is lost."""

from __future__ import annotations

import json

import pytest
import yaml

from teachkit.cli import main
from teachkit.data.text import cache_root, tokenize_texts

SST2 = "sentence\tlabel\ngood film\t1\nbad film\t0\nfine movie\t1\nawful plot\t0\nnice\t1\ngrim\t0\n"


def glue_config(tmp, **data_options) -> dict:
    return {"name": "r", "out_dir": f"{tmp}/runs",
            "data": {"name": "glue", "root": f"{tmp}/glue", "options": {"task": "sst2", "max_length": 16,
                                                                         **data_options}},
            "model": {"name": "hf_text", "options": {"preset": "bert-tiny"}}, "train": {"epochs": 1}}


def squad_json(question: str) -> str:
    ctx = "The cat sat on the mat."
    qa = {"id": "q", "question": question, "answers": [{"text": "the mat", "answer_start": 15}]}
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [qa]}]}]})


def squad_config(tmp, **data_options) -> dict:
    return {**glue_config(tmp), "data": {"name": "squad", "root": f"{tmp}/squad", "options": data_options},
            "model": {"name": "hf_text", "options": {"preset": "bert-tiny", "head": "qa"}}}


SQUAD_FILES = {"squad/train-v1.1.json": squad_json("Where is the cat?"),
               "squad/dev-v1.1.json": squad_json("Where is the cat?")}
LONG_Q = {"squad/train-v1.1.json": squad_json("Where " + "very " * 40 + "exactly is the cat?"),
          "squad/dev-v1.1.json": squad_json("Where is it?")}

# (id, config (dict or callable(tmp) -> dict), files {relative path: text}, fragment naming the bad value)
ROWS = [
    ("unknown-glue-task", lambda t: glue_config(t, task="sts"), {"glue/SST-2/train.tsv": SST2}, "'sts'"),
    ("missing-glue-files", lambda t: glue_config(t), {"glue/README": "x"}, "gluebenchmark.com"),
    ("label-outside-set", lambda t: glue_config(t), {"glue/SST-2/train.tsv": SST2.replace("\t0\n", "\t7\n", 1),
                                                     "glue/SST-2/dev.tsv": SST2}, "'7'"),
    ("tokenizer-not-offline", lambda t: glue_config(t, tokenizer="acme/bert-nowhere"),
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "'acme/bert-nowhere' not found offline"),
    ("teacher-tokenizer-not-offline", lambda t: glue_config(t, teacher_tokenizer="acme/other"),
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "'acme/other' not found offline"),
    ("max-length-too-small", lambda t: glue_config(t, max_length=2),
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "'max_length' must be an integer >= 8, got 2"),
    ("model-path-not-offline", lambda t: {**glue_config(t), "model": {"name": "hf_text", "options": {
        "path": "acme/large-model"}}}, {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2},
     "'acme/large-model' not found offline"),
    ("unknown-preset", lambda t: {**glue_config(t), "model": {"name": "hf_text", "options": {"preset": "bert-hug"}}},
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "bert-hug"),
    ("missing-squad-files", lambda t: squad_config(t), {"squad/x.json": "{}"}, "rajpurkar.github.io"),
    ("bad-squad-version", lambda t: squad_config(t, version="3.0"), SQUAD_FILES, "'3.0'"),
    ("squad-max-length-below-question", lambda t: squad_config(t, max_length=24, doc_stride=4), LONG_Q,
     "max_length=24"),
    ("malformed-squad-json", lambda t: squad_config(t), {"squad/train-v1.1.json": "{not json",
                                                         "squad/dev-v1.1.json": "{}"}, "train-v1.1.json"),
    ("group-by-length-on-images", lambda t: {**glue_config(t), "data": {"name": "digits", "group_by_length": True},
                                             "model": {"name": "mlp"}}, {},
     "data.group_by_length=true needs tokenised"),
    ("teacher-cache-unknown", lambda t: {**glue_config(t), "teacher": {"cache": "always"}},
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "teacher.cache"),
    ("micro-batch-zero", lambda t: {**glue_config(t), "train": {"micro_batch": 0}},
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "train.micro_batch"),
    ("tweets-bad-limit", lambda t: {**glue_config(t), "data": {"name": "tweets", "options": {"limit": 1}}}, {},
     "limit"),
]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("make, files, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_text_bad_input_is_one_line_exit_2(tmp_path, capsys, make, files, fragment):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "keep.txt").write_text("precious")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(make(tmp_path)))
    try:
        code = main(["train", str(tmp_path / "cfg.yaml")])
    except BaseException as e:  # noqa: BLE001 -- any escape is the traceback this contract forbids
        pytest.fail(f"Traceback: {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err
    assert (tmp_path / "keep.txt").read_text() == "precious" and not (tmp_path / "runs").exists()


def test_a_tokenisation_cache_entry_with_another_key_is_never_used(tmp_path):
    """An entry at the key's folder that records another key (or is unreadable) is rebuilt, not trusted."""
    feats = tokenize_texts(["good film", "bad film"], None, tokenizer="minilm-l6", max_length=16,
                           key_parts={"test": 1})
    entries = [p for p in cache_root(None).iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    import datasets

    fake = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 2, "attention_mask": [[1, 1]] * 2},
                                      info=datasets.DatasetInfo(description="another key"))
    import shutil

    shutil.rmtree(entries[0])
    fake.save_to_disk(str(entries[0]))
    again = tokenize_texts(["good film", "bad film"], None, tokenizer="minilm-l6", max_length=16,
                           key_parts={"test": 1})
    assert again["input_ids"].tolist() == feats["input_ids"].tolist() and again["input_ids"].shape[1] == 16
    (entries[0] / "state.json").write_text("{ corrupt")
    third = tokenize_texts(["good film", "bad film"], None, tokenizer="minilm-l6", max_length=16,
                           key_parts={"test": 1})
    assert third["input_ids"].tolist() == feats["input_ids"].tolist()
