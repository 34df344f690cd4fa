"""Translation: BLEU conventions, word-level KD on packed token logits, the evaluator, and end-to-end runs."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.data.parallel import merge_units
from teachkit.losses import build_objective
from teachkit.losses.kd import HintonKD
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.recipes.common import load_data
from teachkit.tasks.translation import Detokenizer, corpus_bleu
from teachkit.types import Batch, Progress, Taps

REFS = ["the cat sat on the mat .", "a dog , however , didn 't .", "we 're going to the zoo tomorrow !"]


def test_bleu_of_references_against_themselves_is_100_both_ways():
    detok = Detokenizer("en")
    assert corpus_bleu(REFS, REFS, tokenised=True) == pytest.approx(100.0)
    assert corpus_bleu([detok(r) for r in REFS], [detok(r) for r in REFS], tokenised=False) == pytest.approx(100.0)


def test_tokenised_bleu_is_case_insensitive_and_detokenised_bleu_sees_moses_detokenisation():
    detok = Detokenizer("en")
    assert detok("a dog , however , didn 't .") == "a dog, however, didn't."
    assert corpus_bleu([r.upper() for r in REFS], REFS, tokenised=True) == pytest.approx(100.0)
    worse = corpus_bleu(["the cat sat on a hat .", *REFS[1:]], REFS, tokenised=True)
    assert 0 < worse < 100


def test_bpe_units_merge_back_to_tokenised_text():
    assert merge_units(["the", "c@@", "at", "s@@", "a@@", "t", "."]) == "the cat sat ."
    assert merge_units(["tail@@"]) == "tail"


def test_word_level_kd_equals_ce_when_the_teacher_is_one_hot():
    """Kim & Rush's word-level KD with a one-hot teacher is the NLL of the gold token: the ``kd`` loss on packed
    per-token logits (T = 1) and the mixed objective (1 - alpha) CE + alpha KD both equal CE exactly."""
    g = torch.Generator().manual_seed(0)
    tokens, vocab = 37, 50
    student = torch.randn(tokens, vocab, generator=g, dtype=torch.float64)
    gold = torch.randint(0, vocab, (tokens,), generator=g)
    teacher = F.one_hot(gold, vocab).double() * 1e4  # softmax is exactly one-hot in float64
    ce = F.cross_entropy(student, gold)
    batch = Batch({"src_ids": torch.zeros(4, 3)}, gold, torch.arange(4))
    progress = Progress(0, 0, 1, 1)
    kd = HintonKD(options=None)
    kd.temperature = 1.0
    torch.testing.assert_close(kd(Taps(student), Taps(teacher), batch, progress)["kl"], ce, rtol=1e-12, atol=1e-12)
    objective = build_objective("kd", Taps(student), Taps(teacher), num_classes=vocab, num_samples=4, alpha=0.5,
                                temperature=1.0)
    terms = objective(Taps(student), Taps(teacher), batch, progress)
    torch.testing.assert_close(sum(terms.values()), ce, rtol=1e-12, atol=1e-12)
    # a softer teacher is not CE: the test above can fail
    soft = kd(Taps(student), Taps(torch.randn(tokens, vocab, generator=g, dtype=torch.float64)), batch, progress)
    assert not torch.allclose(soft["kl"], ce)


# ------------------------------------------------------------------------------------------------ end to end

TINY_TRANSFORMER = {"name": "transformer_seq2seq", "options": {"encoder_layers": 1, "decoder_layers": 1,
                                                                "d_model": 16, "heads": 2, "ffn": 32}}
TINY_LSTM = {"name": "lstm_attn", "options": {"embed_dim": 16, "hidden": 16}}


def nmt_config(tmp_path, **sections) -> dict:
    cfg = {"name": "student", "out_dir": str(tmp_path / "runs"),
           "data": {"name": "toy_translation", "batch_size": 32, "eval_batch_size": 64,
                    "options": {"train": 120, "valid": 20, "test": 20, "max_tokens": 400}},
           "model": TINY_LSTM, "optim": {"name": "adamw", "lr": 0.01, "weight_decay": 0.0, "schedule": "constant"},
           "train": {"epochs": 2, "progress": False},
           "teacher": {"model": TINY_TRANSFORMER, "optim": {"name": "adamw", "lr": 0.01, "weight_decay": 0.0},
                       "epochs": 2},
           "kd": {"method": "kd", "alpha": 0.5, "temperature": 1.0}, "seqkd": {"beam": 2}}
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


@pytest.fixture
def teacher_dir(tmp_path):
    cfg = nmt_config(tmp_path, name="teacher", model=TINY_TRANSFORMER)
    return train_model(from_dict(cfg)).run_dir


def state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_lowers_the_loss_and_writes_bleu_and_the_vocabulary(tmp_path):
    result = train_model(from_dict(nmt_config(tmp_path, train={"epochs": 3})))
    losses = [r["train"]["loss"] for r in result.history]
    assert losses[-1] < losses[0]
    s = result.summary
    for split in ("val", "test"):
        assert {f"{split}_{m}" for m in ("bleu", "bleu_tok", "loss", "ppl", "acc")} <= set(s)
        assert s[f"{split}_ppl"] == pytest.approx(math.exp(s[f"{split}_loss"]))
    assert s["select_metric"] == "bleu" and s["best_epoch"] >= 1
    assert (result.run_dir / "vocab.json").is_file()
    assert json.loads((result.run_dir / "vocab.json").read_text())["tokens"][:4] == ["<pad>", "<s>", "</s>", "<unk>"]


def test_word_kd_cached_equals_online_teacher_and_topk_is_reported(tmp_path, teacher_dir):
    """The ragged per-token cache gives the student the same teacher logits as running the teacher per batch
    (to float tolerance: batches pad to other lengths), and top-k is a stated approximation."""
    base = nmt_config(tmp_path, teacher={"checkpoint": str(teacher_dir)})
    base["train"] = {**base["train"], "precision": "fp32"}  # bf16 rounding would swamp the padding differences
    online = distill(from_dict({**base, "name": "online", "teacher": {**base["teacher"], "cache": "off"}}))
    cached = distill(from_dict({**base, "name": "cached"}))
    assert cached.summary["teacher_cache"]["status"] == "computed"
    assert online.summary["teacher_cache"]["status"] == "off"
    for a, b in zip(state(online.model).values(), state(cached.model).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    again = distill(from_dict({**base, "name": "again"}))
    assert again.summary["teacher_cache"]["status"] == "loaded" and again.summary["cost"]["teacher_forward_images"] == 0
    topk = distill(from_dict({**base, "name": "topk", "teacher": {**base["teacher"], "cache_topk": 3}}))
    report = topk.summary["teacher_cache"]
    assert report["topk"] == 3 and "biased" in report["approximation"]
    assert report["bytes"] < cached.summary["teacher_cache"]["bytes"]


def test_topk_cache_gives_the_renormalised_topk_distribution(tmp_path, teacher_dir):
    from teachkit.models import Tapped
    from teachkit.recipes.common import load_model
    from teachkit.recipes.teacher_cache import teacher_outputs

    cfg = from_dict(nmt_config(tmp_path))
    splits = load_data(cfg.data, "cpu")
    model, _ = load_model(teacher_dir)
    tapped = Tapped(model.eval())
    cache = teacher_outputs(tapped, splits.train, needs={"logits"}, mode="auto", augmented=False, transforms=False,
                            out_dir=tmp_path / "c", batch_size=16, topk=4, vocab_size=splits.num_classes)
    from teachkit.data.parallel import TokenBatchLoader

    batch = next(iter(TokenBatchLoader(splits.train.x, 8, seed=3).batches(1)))
    with torch.no_grad():
        full = tapped(batch.x).logits
    got = cache(batch).logits
    values, ids = full.topk(4, dim=1)
    expected = torch.softmax(values, dim=1)
    torch.testing.assert_close(torch.softmax(got, dim=1).gather(1, ids), expected, rtol=1e-4, atol=1e-6)
    assert float(torch.softmax(got, dim=1).sum(1).sub(1).abs().max()) < 1e-5


def test_seqkd_trains_on_the_teachers_translations_and_reuses_them(tmp_path, teacher_dir):
    base = nmt_config(tmp_path, teacher={"checkpoint": str(teacher_dir)})
    first = RECIPES.get("seqkd")(from_dict({**base, "name": "seq"}))
    report = first.summary["seqkd"]
    assert report["status"] == "computed" and report["sentences"] == 120 and report["decoding"].startswith("beam 2")
    assert first.summary["cost"]["teacher_sentences_decoded"] == 120
    second = RECIPES.get("seqkd")(from_dict({**base, "name": "seq2", "train": {**base["train"], "seed": 1}}))
    assert second.summary["seqkd"]["status"] == "loaded" and second.summary["cost"]["teacher_sentences_decoded"] == 0
    inter = RECIPES.get("seqkd")(from_dict({**base, "name": "inter", "seqkd": {"beam": 2, "mode": "inter"}}))
    assert inter.summary["seqkd"]["mode"] == "inter" and inter.summary["seqkd"]["status"] == "computed"


def test_seqkd_targets_are_the_teachers_beam_outputs(tmp_path, teacher_dir):
    from teachkit.models.decoding import beam_search
    from teachkit.recipes.common import load_model
    from teachkit.recipes.seqkd import SeqKDOptions, teacher_translations

    splits = load_data(from_dict(nmt_config(tmp_path)).data, "cpu")
    model, _ = load_model(teacher_dir)
    x = splits.train.x.rows(torch.arange(9))
    got = teacher_translations(model, x, SeqKDOptions(beam=2, batch_size=4))
    for i in range(9):
        best = beam_search(model, x.rows([i]).src, beam=2)[0][0]
        assert got[i] == best.tokens.tolist()


@pytest.mark.parametrize("recipe", ["train", "kd", "seqkd"])
def test_resume_after_two_epochs_is_bit_identical(tmp_path, teacher_dir, recipe):
    base = nmt_config(tmp_path, teacher={"checkpoint": str(teacher_dir)}, train={"epochs": 4, "progress": False})
    straight = RECIPES.get(recipe)(from_dict({**base, "name": f"{recipe}-straight"}))
    RECIPES.get(recipe)(from_dict({**base, "name": f"{recipe}-split", "train": {**base["train"], "epochs": 2}}))
    resumed = RECIPES.get(recipe)(from_dict({**base, "name": f"{recipe}-split"}), resume=True)
    for a, b in zip(state(straight.model).values(), state(resumed.model).values(), strict=True):
        assert torch.equal(a, b)


def test_prokd_and_l2t_run_on_translation(tmp_path):
    cfg = nmt_config(tmp_path, name="prokd", train={"epochs": 3}, prokd={"tau_max": 2.0, "loss": "kl"})
    result = RECIPES.get("prokd")(from_dict(cfg))
    assert [s[0] for s in result.summary["plan"]["stages"]] == ["prokd", "prokd", "ce"]
    l2t = nmt_config(tmp_path, name="l2t", optim={"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
                     model={"name": "lstm_attn", "options": {"embed_dim": 16, "hidden": 16, "dropout": 0.0}},
                     l2t={"teacher_steps": 2, "inner_steps": 2, "warm_start_epochs": 1, "dev_batch_size": 10})
    result = RECIPES.get("l2t")(from_dict(l2t))
    info = result.summary["l2t"]
    assert info["teacher_steps_done"] == 2 and info["warm_start_epochs"] == 1
    assert info["memory"] == "checkpoint"  # l2t.memory=auto on translation
    assert (result.run_dir / "warm_start" / "summary.json").is_file()
    from teachkit.recipes.l2t import load_teacher

    teacher, _ = load_teacher(result.run_dir / "teacher.safetensors")
    assert teacher.diagonal and teacher.W.shape == (load_data(from_dict(l2t).data, "cpu").num_classes,)


def test_cli_train_distill_seqkd_eval_with_beam(tmp_path, capsys):
    cfg = nmt_config(tmp_path)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({**cfg, "name": "teacher", "model": TINY_TRANSFORMER}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "t.yaml"), "--quiet"]) == 0
    teacher = f"teacher.checkpoint={tmp_path}/runs/teacher"
    assert main(["distill", str(tmp_path / "s.yaml"), teacher, "name=word", "--quiet"]) == 0
    assert main(["run", "seqkd", str(tmp_path / "s.yaml"), teacher, "name=seq", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "run finished" in out and "bleu" in out
    assert main(["eval", str(tmp_path / "runs" / "word"), "data.options.decode=beam", "data.options.beam=3",
                 "--quiet"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"bleu", "bleu_tok", "acc", "loss", "ppl"} <= set(line) and line["split"] == "test"
    assert main(["eval", str(tmp_path / "runs" / "word"), "optim.lr=3"]) == 2
    assert "only data.options" in capsys.readouterr().err


def test_quick_nmt_demo(tmp_path, capsys):
    assert main(["demo", "--task", "nmt", "--quick", "--seeds", "1", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| sequence-level KD (teacher beam outputs) |" in out and "intervals cover" in out
    (folder,) = list((tmp_path / "demo").iterdir())
    saved = json.loads((folder / "results.json").read_text())
    assert set(saved["students"]) == {"no-kd", "word-kd", "seq-kd"}
    assert saved["sizes"]["train"] < saved["sizes"]["teacher_train"]
    student = json.loads((folder / "seed0" / "word-kd" / "summary.json").read_text())
    assert student["data"]["train_subset"] == saved["sizes"]["train"] and "teacher_overlap_allowed" not in student


@pytest.mark.parametrize("recipe, section", [
    ("takd", {"takd": {"assistant": {"name": "lstm_attn", "options": {"embed_dim": 8, "hidden": 8}},
                       "assistant_epochs": 1}}),
    ("eskd", {"eskd": {"search": True}}),
    ("rco", {"rco": {"anchors": 2}, "prokd": {"mode": "replay"}}),
    ("annealing", {"prokd": {"mode": "replay", "tau_max": 2.0}}),
    ("ban", {"ban": {"generations": 2}}),
])
def test_every_trajectory_recipe_runs_on_translation(tmp_path, recipe, section):
    teacher = train_model(from_dict(nmt_config(tmp_path, name="teacher", model=TINY_TRANSFORMER,
                                               train={"epochs": 2, "progress": False, "save_every": 1})))
    cfg = nmt_config(tmp_path, name=recipe, teacher={"checkpoint": str(teacher.run_dir)},
                     train={"epochs": 3 if recipe == "annealing" else 2, "progress": False}, **section)
    s = RECIPES.get(recipe)(from_dict(cfg)).summary
    assert math.isfinite(s["val_bleu"]) and 0 <= s["test_bleu"] <= 100 and math.isfinite(s["test_loss"])
