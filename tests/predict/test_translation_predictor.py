"""The translation predictor on a tiny toy translation run with learned BPE: the raw test sources translate to
exactly what the run's evaluator decoded (greedy and beam) and give the recorded test BLEU; an export folder with
the copied vocabulary and merges translates the same; one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.data.parallel import DecodeOptions
from teachkit.data.toy_translation import generate
from teachkit.errors import CheckpointError, ConfigError, DataError
from teachkit.models.decoding import translate_split
from teachkit.predict import load_predictor
from teachkit.predict.translation import TranslationPredictor
from teachkit.recipes.common import load_data
from teachkit.tasks.translation import Detokenizer, corpus_bleu, references

pytest.importorskip("sacrebleu")
pytest.importorskip("sacremoses")

COUNTS = {"train": 150, "valid": 20, "test": 20}


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nmt")
    cfg = {"name": "lstm", "out_dir": str(folder / "runs"),
           "data": {"name": "toy_translation", "batch_size": 32, "eval_batch_size": 8,
                    "options": {**COUNTS, "seed": 5, "bpe_size": 60, "max_tokens": 600}},
           "model": {"name": "lstm_attn", "options": {"embed_dim": 32, "hidden": 32}},
           "optim": {"name": "adamw", "lr": 0.03, "weight_decay": 0.0, "schedule": "constant"},
           "train": {"epochs": 6, "progress": False}}
    (folder / "run.yaml").write_text(yaml.safe_dump(cfg))
    mp = pytest.MonkeyPatch()
    mp.setenv("TEACHKIT_CACHE", str(folder / "cache"))
    assert main(["train", str(folder / "run.yaml"), "--quiet"]) == 0
    # the raw test sentences, drawn as the source draws them: test first, then valid, then train
    sources = generate({"test": COUNTS["test"], "val": COUNTS["valid"], "train": COUNTS["train"]}, 5)["test"][0]
    yield folder / "runs" / "lstm", from_dict(cfg), sources
    mp.undo()


def evaluator_translations(model, cfg, options: DecodeOptions) -> tuple[list[str], list[str]]:
    """What the run's evaluator decodes on the test split, detokenised as BLEU sees it, and the references."""
    splits = load_data(cfg.data, "cpu")
    x = splits.test.x
    detok = Detokenizer("en")
    hyps = [detok(x.info.text(ids)) for ids in translate_split(model, x, options, cfg.data.eval_batch_size)]
    return hyps, [detok(r) for r in references(x)]


def test_translate_reproduces_the_evaluator_and_the_recorded_bleu(toy_run):
    run, cfg, sources = toy_run
    predictor = load_predictor(run, "last")
    assert isinstance(predictor, TranslationPredictor) and predictor.bpe is not None and len(predictor.bpe) > 0
    assert predictor.class_names is None and predictor.labels is None
    out = predictor.translate(sources)
    hyps, refs = evaluator_translations(predictor.model, cfg, DecodeOptions())
    assert out == hyps and len(out) == 20
    assert predictor.predict(sources) == out
    summary = json.loads((run / "summary.json").read_text())
    assert corpus_bleu(out, refs, tokenised=False) == pytest.approx(summary["test_bleu"], abs=1e-9)
    assert 0 < summary["test_bleu"] < 100  # not a degenerate score: the comparison can fail


def test_beam_search_and_length_limit(toy_run):
    run, cfg, sources = toy_run
    predictor = load_predictor(run, "last")
    assert predictor.translate(sources, beam=1) == predictor.translate(sources)
    beam, _ = evaluator_translations(predictor.model, cfg, DecodeOptions("beam", beam=3))
    assert predictor.translate(sources, beam=3) == beam
    short = predictor.translate(sources[:4], max_len=2)
    assert all(len(s.split()) <= 2 for s in short)  # at most 2 BPE units: at most 2 words
    with pytest.raises(ConfigError, match="beam must be an integer >= 1"):
        predictor.translate(sources, beam=0)
    with pytest.raises(DataError, match="input 2 is ''"):
        predictor.translate(["a", ""])
    with pytest.raises(CheckpointError, match="use translate"):
        predictor.predict_proba(sources)


def test_inputs_from_a_file_and_an_export_folder(toy_run, tmp_path):
    run, _, sources = toy_run
    predictor = load_predictor(run, "last")
    (tmp_path / "in.txt").write_text(sources[0] + "\n\n" + sources[1] + "\n")
    items, names = predictor.read_inputs(tmp_path / "in.txt")
    assert items == sources[:2] and names == ["1", "3"]
    assert predictor.translate(tmp_path / "in.txt") == predictor.translate(sources[:2])
    export = tmp_path / "export"
    export.mkdir()
    assert predictor.export_files(export) is None
    assert sorted(p.name for p in export.iterdir()) == ["bpe.json", "vocab.json"]
    copied = TranslationPredictor(predictor.model, predictor.state, export)
    assert copied.translate(sources) == predictor.translate(sources)
    (export / "vocab.json").write_text(json.dumps({"tokens": ["<pad>", "<s>", "</s>", "<unk>", "x"]}))
    with pytest.raises(CheckpointError, match="not the vocabulary the model was trained with"):
        TranslationPredictor(predictor.model, predictor.state, export)
    assert main(["export", str(run), str(tmp_path / "exported"), "--select", "last"]) == 0  # the CLI's export
    exported = load_predictor(tmp_path / "exported")
    assert isinstance(exported, TranslationPredictor) and exported.translate(sources) == predictor.translate(sources)
    shutil.rmtree(export)
    export.mkdir()
    with pytest.raises(CheckpointError, match="no vocab.json"):
        TranslationPredictor(predictor.model, predictor.state, Path(export))
