"""Translation bad inputs through the CLI, table-driven: each ends with exit status 2 and ONE stderr line
``teachkit: error: ...`` naming the bad value, never a traceback, and nothing already written is lost."""

from __future__ import annotations

import pytest
import yaml

from teachkit.cli import main

PAIRS_DE = "ein haus .\nder hund läuft .\ndie katze schläft .\nich sehe ein haus .\n"
PAIRS_EN = "a house .\nthe dog runs .\nthe cat sleeps .\ni see a house .\n"
TINY_SEQ2SEQ = {"name": "lstm_attn", "options": {"embed_dim": 8, "hidden": 8}}


def iwslt(tmp, **options) -> dict:
    return {"name": "r", "out_dir": f"{tmp}/runs",
            "data": {"name": "iwslt14", "root": f"{tmp}/iwslt", "batch_size": 4,
                     "options": {"bpe_size": 0, **options}},
            "model": TINY_SEQ2SEQ, "train": {"epochs": 1, "progress": False}}


def files(de: str = PAIRS_DE, en: str = PAIRS_EN, **more: str) -> dict[str, str]:
    out = {}
    for part in ("train", "valid", "test"):
        out[f"iwslt/{part}.de"], out[f"iwslt/{part}.en"] = de, en
    return {**out, **more}


def toy(tmp, **options) -> dict:
    return {"name": "r", "out_dir": f"{tmp}/runs",
            "data": {"name": "toy_translation", "batch_size": 16,
                     "options": {"train": 40, "valid": 8, "test": 8, **options}},
            "model": TINY_SEQ2SEQ, "train": {"epochs": 1, "progress": False}}


# (id, command, config (callable(tmp) -> dict), files {relative path: text}, fragment naming the bad value)
ROWS = [
    ("line-counts-differ", "train", iwslt, files(en=PAIRS_EN + "one more .\n"),
     "line 5 of train.en has no counterpart"),
    ("empty-line-rejected", "train", lambda t: iwslt(t, empty_lines="reject"),
     files(de=PAIRS_DE.replace("der hund läuft .", "")), "empty"),
    ("too-long-rejected", "train", lambda t: iwslt(t, too_long="reject", max_length=4), files(), "max_length"),
    ("missing-file", "train", iwslt, {"iwslt/train.de": PAIRS_DE}, "train.en"),
    ("missing-vocab-file", "train", lambda t: iwslt(t, vocab_file=f"{t}/nowhere/vocab.json"), files(),
     "nowhere"),
    ("beam-below-one", "train", lambda t: iwslt(t, decode="beam", beam=0), files(), "beam"),
    ("unknown-decoding", "train", lambda t: iwslt(t, decode="sample"), files(), "sample"),
    ("max-tokens-too-small", "train", lambda t: iwslt(t, max_tokens=2), files(), "max_tokens"),
    ("not-a-translation-model", "train", lambda t: {**toy(t), "model": {"name": "mlp"}}, {},
     "cannot translate"),
    ("seqkd-beam-zero", "run seqkd", lambda t: {**toy(t), "seqkd": {"beam": 0}}, {}, "seqkd.beam"),
    ("seqkd-inter-needs-a-beam", "run seqkd", lambda t: {**toy(t), "seqkd": {"mode": "inter", "beam": 1}}, {},
     "seqkd.mode=inter"),
    ("seqkd-on-images", "run seqkd", lambda t: {**toy(t), "data": {"name": "digits"}, "model": {"name": "mlp"},
                                               "teacher": {"model": {"name": "mlp"}, "epochs": 1}}, {},
     "seqkd distils translations"),
    ("cache-topk-negative", "distill", lambda t: {**toy(t), "teacher": {"cache_topk": -1}}, {}, "cache_topk"),
    ("l2t-phi-unknown", "run l2t", lambda t: {**toy(t), "l2t": {"phi": "lowrank"}}, {}, "l2t.phi"),
]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("command, make, given, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_translation_bad_input_is_one_line_exit_2(tmp_path, capsys, command, make, given, fragment):
    for name, text in given.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "keep.txt").write_text("precious")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(make(tmp_path)))
    try:
        code = main([*command.split(), str(tmp_path / "cfg.yaml")])
    except BaseException as e:  # noqa: BLE001 -- any escape is the traceback this contract forbids
        pytest.fail(f"Traceback: {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err
    assert (tmp_path / "keep.txt").read_text() == "precious"
    # refused before any epoch: no checkpoint was written (a folder that finished no epoch is reused as new)
    assert not list((tmp_path / "runs").rglob("*.safetensors")) if (tmp_path / "runs").exists() else True


def test_a_teacher_with_another_vocabulary_is_refused_for_word_level_kd(tmp_path, capsys):
    """Word-level KD compares per-token distributions over one vocabulary: a teacher trained on another
    vocabulary (here another corpus size, so other word types) is one line naming both vocabularies."""
    teacher = {**toy(tmp_path, train=60), "name": "teacher"}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(teacher))
    assert main(["train", str(tmp_path / "t.yaml")]) == 0
    student = {**toy(tmp_path, train=30), "name": "student", "teacher": {"checkpoint": f"{tmp_path}/runs/teacher",
                                                                         "allow_overlap": True}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(student))
    capsys.readouterr()
    assert main(["distill", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another vocabulary" in err and "vocab_file" in err, err
    # with the teacher's vocabulary file it runs
    student["data"]["options"]["vocab_file"] = f"{tmp_path}/runs/teacher"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(student))
    assert main(["distill", str(tmp_path / "s.yaml")]) == 0, capsys.readouterr().err


def test_skipped_and_truncated_lines_are_counted_in_the_run_summary(tmp_path):
    de = PAIRS_DE.replace("der hund läuft .", "") + "ein sehr sehr sehr langer satz ist hier .\n"
    en = PAIRS_EN + "a very very very long sentence is here .\n"
    for name, text in files(de=de, en=en).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(iwslt(tmp_path, max_length=6)))
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 0  # the warnings: one line each, kept in the summary
    import json

    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    notes = summary["data_notes"]
    assert any("truncated" in w for w in summary["warnings"]) and set(notes["warnings"]) <= set(summary["warnings"])
    assert notes["truncated"]["train"] == 2  # the long pair: its source and its target sequence
    assert sum(notes["skipped_empty"].values()) == 3  # the empty line, in each split
