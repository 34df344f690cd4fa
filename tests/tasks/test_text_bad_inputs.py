"""Text bad inputs through the CLI, table-driven: each ends with exit status 2 and ONE stderr line
``teachkit: error: ...`` naming the bad value, never a traceback, and nothing already written is lost."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

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


WORDS = "good bad film movie fine awful plot nice grim where is the cat sat on mat it".split()


def tiny_tokenizer(tmp) -> str:
    """A WordPiece tokenizer of about 60 tokens, saved as a Hugging Face folder (once per test folder)."""
    folder = Path(tmp) / "tiny-tok"
    if not (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator([" ".join(WORDS)] * 4, trainers.WordPieceTrainer(vocab_size=60, special_tokens=[
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(folder))
    return str(folder)


def tiny_bert(tmp, positions: int = 32) -> str:
    """A pretrained-style folder: a 1-layer, 16-wide BERT with ``positions`` position embeddings and the tiny
    tokenizer (once per test folder)."""
    folder = Path(tmp) / f"tiny-bert-{positions}"
    if not (folder / "config.json").is_file():
        from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification
        from transformers.utils import logging

        logging.disable_progress_bar()  # stderr holds the error line only (teachkit disables it too)
        tok = AutoTokenizer.from_pretrained(tiny_tokenizer(tmp))
        config = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=positions, pad_token_id=tok.pad_token_id)
        BertForSequenceClassification(config).save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
    return str(folder)


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
    ("glue-tsv-not-utf8", lambda t: glue_config(t), {"glue/SST-2/train.tsv": SST2.encode().replace(b"grim", b"gr\xefm"),
                                                     "glue/SST-2/dev.tsv": SST2},
     "train.tsv' line 7 is not UTF-8 text: byte 0xef (byte 3 of the line"),
    ("glue-field-over-csv-limit", lambda t: glue_config(t), {"glue/SST-2/train.tsv": SST2 + "x" * 140_000 + "\t1\n",
                                                             "glue/SST-2/dev.tsv": SST2},
     "train.tsv' line 8 cannot be read as tab-separated text: a field is longer than 131,072 characters"),
    ("max-length-over-model-positions", lambda t: {**glue_config(t, max_length=64, tokenizer=tiny_bert(t)),
                                                   "model": {"name": "hf_text", "options": {"path": tiny_bert(t)}}},
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2},
     "data.options.max_length=64 is more than model 'hf_text' (path '"),
    ("student-vocabulary-below-data-ids", lambda t: {**glue_config(t), "model": {"name": "hf_text", "options": {
        "preset": "bert-tiny", "tokenizer": tiny_tokenizer(t)}}},
     {"glue/SST-2/train.tsv": SST2, "glue/SST-2/dev.tsv": SST2}, "has a vocabulary of"),
]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("make, files, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_text_bad_input_is_one_line_exit_2(tmp_path, capsys, make, files, fragment):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
        else:
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


# -- a teacher checkpoint against the student's data (tokenizer, positions, vocabulary) ------------------------
def sst2_rows(n: int = 24) -> str:
    rows = [f"{WORDS[i % 8]} {WORDS[(3 * i + 1) % len(WORDS)]} {WORDS[8 + i % 8]}\t{i % 2}" for i in range(n)]
    return "sentence\tlabel\n" + "\n".join(rows) + "\n"


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, str]:
    """A teacher trained on the tiny tokenizer's ids (a 32-position BERT), and a copy of it whose checkpoints lack
    the tokenizer digest (as written by an older teachkit)."""
    from teachkit.config import from_dict
    from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
    from teachkit.recipes import train_model

    tmp = tmp_path_factory.mktemp("teachers")
    for name in ("train.tsv", "dev.tsv"):
        (tmp / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (tmp / "glue" / "SST-2" / name).write_text(sst2_rows())
    cfg = {**glue_config(tmp, tokenizer=tiny_tokenizer(tmp), cache_dir=str(tmp / "cache")), "name": "teacher",
           "model": {"name": "hf_text", "options": {"path": tiny_bert(tmp)}}, "train": {"epochs": 1, "progress": False}}
    folder = train_model(from_dict(cfg)).run_dir
    old = tmp / "old-teacher"
    shutil.copytree(folder, old)
    for file in (old / "checkpoints").glob("*.safetensors"):
        tensors, state = load_checkpoint(file)
        assert state.pop("tokenizer")["name"] == tiny_tokenizer(tmp)
        save_checkpoint(file, tensors, state)
    return {"teacher": str(folder), "old": str(old), "tok": tiny_tokenizer(tmp), "root": str(tmp / "glue")}


def student(tmp, t: dict[str, str], teacher: str = "teacher", tokenizer: str = "minilm-l6",
            max_length: int = 16) -> dict:
    cfg = glue_config(tmp, tokenizer=tokenizer, max_length=max_length)
    cfg["data"]["root"] = t["root"]
    model = {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1, "tokenizer": tokenizer}}
    return {**cfg, "model": model,
            "teacher": {"checkpoint": t[teacher], "allow_overlap": True}, "train": {"epochs": 1, "progress": False}}


# (id, student config from (tmp, teachers), fragments of the one line)
TEACHER_ROWS = [
    ("teacher-trained-on-another-tokenizer", lambda tmp, t: student(tmp, t),
     ["teacher (checkpoint '", "was trained on the ids of tokenizer '", "(sha256 ", "gives it those of 'minilm-l6' "
      "(sha256 ", "set data.options.teacher_tokenizer='"]),
    ("max-length-over-teacher-positions", lambda tmp, t: student(tmp, t, tokenizer=t["tok"], max_length=64),
     ["data.options.max_length=64 is more than teacher (checkpoint '", "takes: at most 32 tokens",
      "set data.options.max_length to at most 32"]),
    ("old-teacher-vocabulary-below-data-ids", lambda tmp, t: student(tmp, t, teacher="old"),
     ["teacher (checkpoint '", "has a vocabulary of", "but dataset 'glue' gives it ids up to",
      "of tokenizer 'minilm-l6'", "set data.options.teacher_tokenizer"]),
]


@pytest.mark.parametrize("make, fragments", [r[1:] for r in TEACHER_ROWS], ids=[r[0] for r in TEACHER_ROWS])
def test_a_teacher_that_cannot_read_the_data_is_one_line(tmp_path, capsys, teachers, make, fragments):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(make(tmp_path, teachers)))
    capsys.readouterr()
    code = main(["distill", str(tmp_path / "s.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("teachkit: error: ") and err.count("\n") == 1, err
    assert all(f in err for f in fragments), err
    if "sha256" in err:  # both digests, 12 hex characters each
        assert len(re.findall(r"sha256 [0-9a-f]{12}\)", err)) == 2, err


def test_an_old_teacher_without_a_tokenizer_digest_is_accepted(tmp_path, capsys, teachers):
    """No digest: nothing to compare (no error, no warning); ids and lengths that fit still run."""
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(student(tmp_path, teachers, "old", teachers["tok"])))
    assert main(["distill", str(tmp_path / "s.yaml")]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["tokenizer"]["name"] == teachers["tok"] and len(summary["tokenizer"]["sha256"]) == 64
    assert not any("tokenizer" in w for w in summary.get("warnings", []))


# -- GLUE TSV bytes, read directly ------------------------------------------------------------------------------
# (id, bytes of an SST-2 train.tsv, fragment of the one-line DataError, or None: read fine as ["good", "bad"])
TSV_ROWS = [
    ("latin-1-byte", b"sentence\tlabel\ngood\t1\nbad caf\xe9\t0\n", "line 3 is not UTF-8 text: byte 0xe9 (byte 8"),
    ("bad-byte-in-header", b"sen\xfftence\tlabel\ngood\t1\n", "line 1 is not UTF-8 text: byte 0xff (byte 4"),
    ("field-over-csv-limit", b"sentence\tlabel\ngood\t1\n" + b"y" * 131_073 + b"\t0\n",
     "line 3 cannot be read as tab-separated text: a field is longer than 131,072 characters"),
    ("utf8-bom-and-crlf", b"\xef\xbb\xbfsentence\tlabel\r\ngood\t1\r\nbad\t0\r\n", None),
    ("lone-cr-line-ends", b"sentence\tlabel\rgood\t1\rbad\t0\r", None),
]


@pytest.mark.parametrize("data, fragment", [r[1:] for r in TSV_ROWS], ids=[r[0] for r in TSV_ROWS])
def test_glue_tsv_bytes(tmp_path, data, fragment):
    from teachkit.errors import DataError
    from teachkit.tasks.glue import TASKS, read_tsv

    path = tmp_path / "train.tsv"
    path.write_bytes(data)
    if fragment is None:
        assert read_tsv(path, TASKS["sst2"]).first == ["good", "bad"]
        return
    with pytest.raises(DataError) as e:
        read_tsv(path, TASKS["sst2"])
    assert fragment in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- SQuAD answers that do not train as given: counted, one warning line ---------------------------------------
CTX = "The cat sat on the mat near the old red door of the quiet small house by the long green river bank."


def squad_answers_file(answers: list[tuple[str, int]]) -> str:
    qas = [{"id": f"q{i}", "question": "Where?", "answers": [{"text": text, "answer_start": start}]}
           for i, (text, start) in enumerate(answers)]
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": CTX, "qas": qas}]}]})


LONG_ANSWER = CTX[CTX.index("near"):]
# (id, train answers (text, answer_start), expected counts {not_at_answer_start, in_no_window}, warning fragment)
SQUAD_ROWS = [
    ("all-fine", [("the mat", 15), ("red door", CTX.index("red door"))], None, None),
    ("start-off-by-some", [("the mat", 15), ("the mat", 11)], (1, 0), "1 not the context's text at their answer_start"),
    ("start-beyond-context", [("the mat", 15), ("the mat", 500)], (1, 0), "train-v1.1.json 1 of 2"),
    ("answer-in-no-window", [("the mat", 15), (LONG_ANSWER, CTX.index(LONG_ANSWER))], (0, 1),
     "1 in no window of max_length=24 tokens"),
]


@pytest.mark.parametrize("answers, counts, fragment", [r[1:] for r in SQUAD_ROWS], ids=[r[0] for r in SQUAD_ROWS])
def test_squad_answers_not_trained_as_given_are_counted_and_warned_once(tmp_path, answers, counts, fragment):
    from teachkit.tasks.squad import squad

    (tmp_path / "train-v1.1.json").write_text(squad_answers_file(answers))
    (tmp_path / "dev-v1.1.json").write_text(squad_answers_file([("the mat", 15)]))
    raw = squad(str(tmp_path), max_length=24, doc_stride=4)
    notes = raw.train_x.data_notes
    if counts is None:
        assert raw.warnings == [] and "squad_answers_not_trained" not in notes
        return
    assert len(raw.warnings) == 1 and "\n" not in raw.warnings[0] and fragment in raw.warnings[0], raw.warnings
    got = notes["squad_answers_not_trained"]["train-v1.1.json"]
    assert (got["not_at_answer_start"], got["in_no_window"], got["answers"]) == (*counts, 2)
    assert raw.test_x.data_notes == notes and "dev-v1.1.json" not in notes["squad_answers_not_trained"]


# -- text models: their limits, named before a run --------------------------------------------------------------
def test_a_batch_longer_than_the_positions_is_one_line(tmp_path):
    import torch

    from teachkit.errors import ConfigError
    from teachkit.models import build_model

    model = build_model("hf_text", (16,), 2, path=tiny_bert(tmp_path))
    assert model.max_tokens == 32 and model.label.startswith("model 'hf_text' (path ")
    assert model(torch.ones(2, 32, dtype=torch.long)).shape == (2, 2)
    with pytest.raises(ConfigError, match=r"takes at most 32 tokens .* got a batch of 40; set data.options.max_length"
                                          r" to at most 32") as e:
        model(torch.ones(2, 40, dtype=torch.long))
    assert "\n" not in str(e.value)


def test_roberta_positions_start_after_the_padding_id():
    from transformers import BertConfig, DebertaV2Config, RobertaConfig

    from teachkit.models.text import max_tokens

    assert max_tokens(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert max_tokens(BertConfig(max_position_embeddings=512)) == 512
    assert max_tokens(DebertaV2Config(position_biased_input=False)) is None  # relative positions only


def test_the_tokenizer_digest_is_of_its_vocabulary_not_its_files(tmp_path):
    from teachkit.data.text import load_tokenizer, tokenizer_digest, tokenizer_vocab_digest

    load_tokenizer(tiny_tokenizer(tmp_path)).save_pretrained(str(tmp_path / "again"))
    (tmp_path / "again" / "tokenizer_config.json").write_text(
        (tmp_path / "again" / "tokenizer_config.json").read_text().replace("{", '{"note": "saved again",', 1))
    assert tokenizer_digest(str(tmp_path / "again")) != tokenizer_digest(tiny_tokenizer(tmp_path))
    assert tokenizer_vocab_digest(str(tmp_path / "again")) == tokenizer_vocab_digest(tiny_tokenizer(tmp_path))
    assert tokenizer_vocab_digest("minilm-l6") != tokenizer_vocab_digest(tiny_tokenizer(tmp_path))


def test_squad_answers_not_trained_as_given_are_one_warning_in_the_run(tmp_path, capsys):
    """Through a run: printed once on one line and kept in the summary (``warnings`` and ``data_notes``)."""
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "train-v1.1.json").write_text(squad_answers_file([("the mat", 15), ("mat the", 15)] * 4))
    (tmp_path / "squad" / "dev-v1.1.json").write_text(squad_answers_file([("the mat", 15)]))
    cfg = squad_config(tmp_path, max_length=24, doc_stride=4)
    cfg["model"]["options"]["layers"] = 1
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "answers not trained as given" in line]
    assert len(said) == 1 and "train-v1.1.json 4 of 8: 4 not the context's text at their answer_start" in said[0]
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["data_notes"]["squad_answers_not_trained"]["train-v1.1.json"]["not_at_answer_start"] == 4
    assert [w for w in summary["warnings"] if "answers not trained as given" in w] == [said[0].split(": ", 2)[2]]
