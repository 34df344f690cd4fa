"""Causal-LM bad inputs through the CLI, table-driven: each ends with exit status 2 and ONE stderr line
``teachkit: error: ...`` naming the bad value, never a traceback: data files and options, model options, the
gkd and seqkd sections, and methods that cannot work on the data or the tokenizers given."""

from __future__ import annotations

import json

import pytest
import yaml

from teachkit.cli import main
from tests.lm_setup import ADDITION, TINY_LM

RECORDS = "\n".join(json.dumps({"prompt": f"say {w}", "response": w}) for w in ("yes", "no", "maybe", "sure")) + "\n"


def lm(tmp, data=None, **sections) -> dict:
    cfg = {"name": "r", "out_dir": f"{tmp}/runs", "data": data or ADDITION, "model": TINY_LM,
           "optim": {"name": "adamw", "lr": 0.003}, "train": {"epochs": 1, "progress": False},
           "teacher": {"model": TINY_LM, "epochs": 1}}
    cfg.update(sections)
    return cfg


def pr(tmp, **options) -> dict:
    """prompt_response over pr/train.jsonl (val and test carved), char tokenizer."""
    return {"name": "prompt_response", "root": f"{tmp}/pr", "batch_size": 4,
            "options": {"train": "train.jsonl", "tokenizer": "char", **options}}


def addition(**options) -> dict:
    return {**ADDITION, "options": {**ADDITION["options"], **options}}


TEXT = {"t.txt": "\n".join(f"line {i} of plain text" for i in range(40)) + "\n"}
PLAIN = {"name": "lm_text", "root": "{tmp}/t.txt", "options": {"tokenizer": "char"}}

# (id, command, config (callable(tmp) -> dict), files {relative path: text | bytes}, fragment naming the bad value)
ROWS = [
    ("missing-train-file", "train", lambda t: lm(t, pr(t)), {}, "train.jsonl"),
    ("empty-file", "train", lambda t: lm(t, pr(t)), {"pr/train.jsonl": ""}, "train.jsonl"),
    ("not-json", "train", lambda t: lm(t, pr(t)), {"pr/train.jsonl": RECORDS + "{oops\n"}, "line 5"),
    ("missing-response", "train", lambda t: lm(t, pr(t)), {"pr/train.jsonl": RECORDS + '{"prompt": "x"}\n'},
     "response"),
    ("not-utf8", "train", lambda t: lm(t, pr(t)), {"pr/train.jsonl": RECORDS.encode() + b'{"prompt": "\xff"}\n'},
     "UTF-8"),
    ("too-long-rejected", "train", lambda t: lm(t, pr(t, max_length=8, too_long="reject")),
     {"pr/train.jsonl": RECORDS}, "max_length"),
    ("unknown-tokenizer", "train", lambda t: lm(t, pr(t, tokenizer="no-such-tokenizer")),
     {"pr/train.jsonl": RECORDS}, "no-such-tokenizer"),
    ("bpe-too-small", "train", lambda t: lm(t, pr(t, tokenizer="bpe", vocab_size=100)),
     {"pr/train.jsonl": RECORDS}, "vocab_size"),
    ("addition-zero-digits", "train", lambda t: lm(t, addition(digits=0)), {}, "digits"),
    ("addition-too-many-problems", "train", lambda t: lm(t, addition(digits=1, train=200)), {}, "distinct problems"),
    ("unknown-preset", "train", lambda t: lm(t, model={"name": "hf_causal_lm", "options": {"preset": "llama-huge"}}),
     {}, "llama-huge"),
    ("bad-dtype", "train", lambda t: lm(t, model={"name": "hf_causal_lm", "options": {"preset": "llama-tiny",
                                                                                       "dtype": "int8"}}),
     {}, "int8"),
    ("lora-rank-zero", "train", lambda t: lm(t, model={"name": "hf_causal_lm",
                                                       "options": {"preset": "llama-tiny", "lora": {"r": 0}}}),
     {}, "lora"),
    ("longer-than-the-positions", "train",
     lambda t: lm(t, pr(t, max_length=600), model={"name": "hf_causal_lm",
                                                    "options": {"preset": "llama-tiny", "max_positions": 64}}),
     {"pr/train.jsonl": RECORDS.replace("say", "say " + "x" * 100)}, "max_length"),
    ("classifier-on-text", "train", lambda t: lm(t, model={"name": "mlp"}), {}, "not a causal language model"),
    ("causal-lm-on-images", "train", lambda t: lm(t, {"name": "digits"}), {}, "reads token ids"),
    ("gkd-lmbda-above-one", "run gkd", lambda t: lm(t, gkd={"lmbda": 2}), {}, "gkd.lmbda"),
    ("gkd-zero-temperature", "run gkd", lambda t: lm(t, gkd={"temperature": 0}), {}, "gkd.temperature"),
    ("gkd-top-p-zero", "run gkd", lambda t: lm(t, gkd={"top_p": 0}), {}, "gkd.top_p"),
    ("gkd-no-new-tokens", "run gkd", lambda t: lm(t, gkd={"max_new_tokens": 0}), {}, "gkd.max_new_tokens"),
    ("gkd-on-plain-text", "run gkd", lambda t: lm(t, {**PLAIN, "root": f"{t}/t.txt"}), TEXT, "without prompts"),
    ("gkd-on-images", "run gkd", lambda t: lm(t, {"name": "digits"}, model={"name": "mlp"},
                                              teacher={"model": {"name": "mlp"}, "epochs": 1}), {},
     "causal language model"),
    ("gkd-two-tokenizers", "run gkd", lambda t: lm(t, addition(teacher_tokenizer="byte")), {}, "one tokenizer"),
    ("kd-two-tokenizers", "distill", lambda t: lm(t, addition(teacher_tokenizer="byte")), {},
     "use kd.method=uld"),
    ("seqkd-inter-on-lm", "run seqkd", lambda t: lm(t, seqkd={"mode": "inter", "beam": 2}), {}, "seqkd.mode=inter"),
    ("seqkd-unknown-decode", "run seqkd", lambda t: lm(t, seqkd={"decode": "nucleus"}), {}, "seqkd.decode"),
    ("seqkd-on-plain-text", "run seqkd", lambda t: lm(t, {**PLAIN, "root": f"{t}/t.txt"}), TEXT, "plain text"),
    ("seqkd-sampling-translation", "run seqkd",
     lambda t: lm(t, {"name": "toy_translation", "options": {"train": 40, "valid": 8, "test": 8}},
                  model={"name": "lstm_attn", "options": {"embed_dim": 8, "hidden": 8}},
                  teacher={"model": {"name": "lstm_attn", "options": {"embed_dim": 8, "hidden": 8}}, "epochs": 1},
                  seqkd={"decode": "sample"}), {}, "seqkd.decode=sample"),
]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("command, make, given, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_causal_lm_bad_input_is_one_line_exit_2(tmp_path, capsys, command, make, given, fragment):
    for name, content in given.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    cfg = make(tmp_path)
    if isinstance(cfg["data"].get("root"), str):
        cfg["data"]["root"] = cfg["data"]["root"].replace("{tmp}", str(tmp_path))
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    code = main([*command.split(), str(tmp_path / "cfg.yaml")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and fragment in err, err
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists()  # refused before anything trained


def test_row_ids_are_unique():
    assert len({r[0] for r in ROWS}) == len(ROWS) == 28
