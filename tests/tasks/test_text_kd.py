"""Text through the same engine and recipes as images: train, KD methods, the teacher cache, Pro-KD, exact resume,
STS-B regression, SQuAD, a teacher with its own tokenizer, and the text demo (tiny GLUE / SQuAD files, a
2-layer 128-wide BERT on the bundled MiniLM tokenizer)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.errors import ConfigError
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.tasks.glue import GlueEvaluator

POSITIVE = "good great lovely fine happy superb nice".split()
NEGATIVE = "bad awful poor sad terrible ugly grim".split()
FILLER = "the movie was a film plot actor scene story it really quite".split()
TINY = {"name": "hf_text", "options": {"preset": "bert-tiny"}}


class Interrupt(Exception):
    pass


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


def review(i: int, label: int) -> str:
    words = POSITIVE if label else NEGATIVE
    filler = " ".join(FILLER[(i * k) % len(FILLER)] for k in range(1, 2 + i % 6))
    return f"{filler} {words[i % len(words)]} {FILLER[i % len(FILLER)]}"


def write_sst2(root, n_train: int = 96, n_dev: int = 32) -> str:
    folder = root / "SST-2"
    folder.mkdir(parents=True)
    for name, n, salt in (("train.tsv", n_train, 0), ("dev.tsv", n_dev, 1000)):
        rows = [f"{review(i + salt, i % 2)}\t{i % 2}" for i in range(n)]
        (folder / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return str(root)


def write_stsb(root, n_train: int = 60, n_dev: int = 20) -> str:
    folder = root / "STS-B"
    folder.mkdir(parents=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = [f"{i}\tg\tf\t2012\t{i}\ts\ts\t{review(i, 1)}\t{review(i + 3, i % 2)}\t{(i % 6) * 0.9:.1f}"
                for i in range(n)]
        (folder / name).write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(root)


def write_squad(root) -> str:
    contexts = [f"The {w} lives in the {v} near the old bridge and sings every morning." for w, v in
                zip(POSITIVE, NEGATIVE, strict=True)]
    data = []
    for i, ctx in enumerate(contexts):
        where = ctx.index("the ")
        qas = [{"id": f"q{i}", "question": "Where does it live?",
                "answers": [{"text": ctx[where:where + 4 + len(NEGATIVE[i])], "answer_start": where}]}]
        data.append({"title": f"t{i}", "paragraphs": [{"context": ctx, "qas": qas}]})
    for name, part in (("train-v1.1.json", data[:5] * 4), ("dev-v1.1.json", data[5:])):
        (root / name).write_text(json.dumps({"version": "1.1", "data": part}))
    return str(root)


def config(tmp_path, root, name, task="sst2", **sections):
    cfg = {"name": name, "out_dir": str(tmp_path / "runs"),
           "data": {"name": "glue", "root": root, "batch_size": 16, "eval_batch_size": 64,
                    "options": {"task": task, "max_length": 32}},
           "model": TINY, "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01, "schedule": "linear",
                                    "grad_clip": 1.0},
           "train": {"epochs": 2, "progress": False}}
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(cfg.get(key), dict) and isinstance(value, dict) else value
    return from_dict(cfg)


def summary(result) -> dict:
    return json.loads((result.run_dir / "summary.json").read_text())


@pytest.fixture
def sst2(tmp_path):
    root = write_sst2(tmp_path / "glue")
    teacher = train_model(config(tmp_path, root, "teacher", model={"name": "hf_text", "options": {
        "preset": "bert-tiny", "layers": 2}}, train={"epochs": 3, "save_every": 1, "progress": False}))
    return root, teacher


def test_text_student_distils_with_the_cache_and_without(tmp_path, sst2):
    root, teacher = sst2
    assert summary(teacher)["test_acc"] > 60  # the teacher learned the sentiment words (chance: 50)
    runs = {mode: distill(config(tmp_path, root, f"kd-{mode}", kd={"method": "kd", "alpha": 0.5},
                                 teacher={"checkpoint": str(teacher.run_dir), "cache": mode},
                                 train={"epochs": 2, "progress": False, "precision": "fp32"}))
            for mode in ("auto", "off")}
    on, off = summary(runs["auto"]), summary(runs["off"])
    assert on["teacher_cache"]["status"] == "computed" and off["teacher_cache"]["status"] == "off"
    n = on["teacher_cache"]["bytes"] // (4 * 2)  # float32 logits of 2 classes
    assert n == 86  # 96 training sentences - a 10% val slice
    assert on["cost"]["teacher_forward_images"] == n and off["cost"]["teacher_forward_images"] == 2 * n
    # padded lengths differ between the cached pass and the training batches: equal to float rounding, not bits
    for a, b in zip(runs["auto"].model.state_dict().values(), runs["off"].model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert off["val_acc"] == pytest.approx(on["val_acc"])


@pytest.mark.parametrize("method", ["dkd", "hidden_mse", "attention_kd", "pooled_mse", "logit_l2", "dist"])
def test_logit_hidden_and_attention_methods_run_on_text(tmp_path, sst2, method):
    root, teacher = sst2
    result = distill(config(tmp_path, root, method, kd={"method": method},
                            teacher={"checkpoint": str(teacher.run_dir)}, train={"epochs": 1, "progress": False}))
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert all(math.isfinite(v) for v in record["train"].values()) and len(record["train"]) >= 3
    token_level = method in ("hidden_mse", "attention_kd")
    assert summary(result)["teacher_cache"]["status"] == ("off" if token_level or method == "pooled_mse"
                                                          else "computed")


def test_prokd_on_text_resumes_exactly(tmp_path, sst2, monkeypatch):
    root, teacher = sst2
    cfg = dict(prokd={"mode": "replay", "tau_max": 3.0}, teacher={"checkpoint": str(teacher.run_dir)},
               train={"epochs": 4, "progress": False}, model={"name": "hf_text", "options": {
                   "preset": "bert-tiny", "layers": 1, "dropout": 0.2}})
    straight = RECIPES.get("prokd")(config(tmp_path, root, "straight", **cfg))
    plan = summary(straight)["plan"]
    assert plan["phase1_epochs"] == 3 and plan["phase2_epochs"] == 1
    real = GlueEvaluator.evaluate
    calls = {"n": 0}

    def crash(self, model):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Interrupt
        return real(self, model)

    monkeypatch.setattr(GlueEvaluator, "evaluate", crash)
    with pytest.raises(Interrupt):
        RECIPES.get("prokd")(config(tmp_path, root, "resumed", **cfg))
    monkeypatch.setattr(GlueEvaluator, "evaluate", real)
    resumed = RECIPES.get("prokd")(config(tmp_path, root, "resumed", **cfg), resume=True)
    for (k, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_micro_batches_match_whole_batches_on_text(tmp_path, sst2):
    root, _ = sst2
    runs = [train_model(config(tmp_path, root, f"mb{m}", model={"name": "hf_text", "options": {
        "preset": "bert-tiny", "layers": 1, "dropout": 0.0}}, train={"epochs": 1, "progress": False,
                                                                      "micro_batch": m, "precision": "fp32"}))
            for m in (None, 5)]
    for a, b in zip(runs[0].model.state_dict().values(), runs[1].model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=2e-5)


def test_stsb_regression_trains_and_distils_by_output_regression(tmp_path):
    root = write_stsb(tmp_path / "glue")
    reg = {"train": {"epochs": 1, "loss": "l2", "progress": False}}
    teacher = train_model(config(tmp_path, root, "t", task="stsb",
                                 train={"epochs": 1, "loss": "l2", "progress": False, "save_every": 1}))
    assert {"test_pearson", "test_spearman", "test_score", "val_score"} <= set(summary(teacher))
    student = distill(config(tmp_path, root, "s", task="stsb", kd={"method": "logit_l2"},
                             teacher={"checkpoint": str(teacher.run_dir)}, **reg))
    terms = json.loads((student.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["train"]
    assert set(terms) == {"loss", "l2", "logit_l2"}
    pro = RECIPES.get("prokd")(config(tmp_path, root, "p", task="stsb", prokd={"tau_max": 1.0, "mode": "replay"},
                                      teacher={"checkpoint": str(teacher.run_dir)},
                                      train={"epochs": 2, "loss": "l2", "progress": False}))
    assert [r["train"].keys() - {"loss"} for r in pro.history] == [{"prokd"}, {"l2"}]
    with pytest.raises(ConfigError, match=r"needs class scores.*kd.method=logit_l2") as e:
        distill(config(tmp_path, root, "x", task="stsb", kd={"method": "kd"},
                       teacher={"checkpoint": str(teacher.run_dir)}, **reg))
    assert "\n" not in str(e.value)


def test_squad_student_trains_and_distils_span_logits(tmp_path):
    (tmp_path / "squad").mkdir()
    root = write_squad(tmp_path / "squad")
    data = {"name": "squad", "root": root, "batch_size": 8, "eval_batch_size": 32,
            "options": {"max_length": 32, "doc_stride": 8}}
    qa = {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1, "head": "qa"}}
    teacher = train_model(config(tmp_path, root, "qa-t", data=data, model=qa,
                                 train={"epochs": 2, "progress": False}))
    s = summary(teacher)
    assert {"test_exact", "test_f1", "val_f1"} <= set(s) and 0 <= s["test_f1"] <= 100
    student = distill(config(tmp_path, root, "qa-s", data=data, model=qa, kd={"method": "kd"},
                             teacher={"checkpoint": str(teacher.run_dir)}, train={"epochs": 1, "progress": False}))
    record = json.loads((student.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["train"]) == {"loss", "ce", "kd"} and all(math.isfinite(v) for v in record["train"].values())
    assert summary(student)["teacher_cache"]["status"] == "computed"  # (N, L, 2) start/end logits, padded


def make_tokenizer(folder, texts) -> str:
    """A tiny WordPiece tokenizer, saved as a Hugging Face folder: a teacher with another vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=120, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(str(folder))
    return str(folder)


def test_a_teacher_with_its_own_tokenizer(tmp_path):
    root = write_sst2(tmp_path / "glue")
    other = make_tokenizer(tmp_path / "tok", [review(i, i % 2) for i in range(200)])
    data = {"options": {"task": "sst2", "max_length": 32, "teacher_tokenizer": other}}
    teacher_model = {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1, "tokenizer": other}}
    result = distill(config(tmp_path, root, "two-tok", data=data, kd={"method": "kd"},
                            teacher={"model": teacher_model, "epochs": 1, "optim": {"name": "adamw", "lr": 3e-3}},
                            train={"epochs": 1, "progress": False}))
    assert summary(result)["teacher_cache"]["status"] == "computed"
    teacher_cfg = (result.run_dir / "teacher" / "config.yaml").read_text()
    assert f"tokenizer: {other}" in teacher_cfg  # the in-command teacher trained on its own tokenisation
    with pytest.raises(ConfigError, match=r"kd.method=hidden_mse compares token-level tensors") as e:
        distill(config(tmp_path, root, "bad", data=data, kd={"method": "hidden_mse"},
                       teacher={"model": teacher_model, "epochs": 1}))
    assert "\n" not in str(e.value)


def test_text_demo_runs_offline(tmp_path, capsys):
    assert main(["demo", "--task", "text", "--quick", "--seeds", "1", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| Pro-KD (replayed trajectory) |" in out and "intervals cover: student seeds only" in out
    assert list((tmp_path / "demo").glob("*/results.png")) and list((tmp_path / "demo").glob("*/results.json"))


@pytest.mark.parametrize("recipe, section", [
    ("takd", {"takd": {"assistant": {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1}},
                       "assistant_epochs": 1}}),
    ("eskd", {"eskd": {"search": True}}),
    ("rco", {"rco": {"anchors": 2}, "prokd": {"mode": "replay"}}),
    ("annealing", {"prokd": {"mode": "replay", "tau_max": 2.0}}),
    ("ban", {"ban": {"generations": 2}}),
])
def test_every_trajectory_recipe_runs_on_text(tmp_path, sst2, recipe, section):
    root, teacher = sst2
    epochs = 4 if recipe == "annealing" else 2  # phase I follows the 3 teacher epochs
    result = RECIPES.get(recipe)(config(tmp_path, root, recipe, teacher={"checkpoint": str(teacher.run_dir)},
                                        train={"epochs": epochs, "progress": False}, **section))
    s = summary(result)
    assert math.isfinite(s["val_acc"]) and 0 <= s["test_acc"] <= 100


def test_length_grouped_batches_cut_padding_and_stay_reproducible(tmp_path):
    from teachkit.data import BatchLoader, TensorSplit

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 40, (300,), generator=g)
    mask = (torch.arange(40)[None, :] < lengths[:, None]).long()
    from teachkit.data.text import TokenFeatures

    split = TensorSplit(TokenFeatures({"input_ids": mask * 5, "attention_mask": mask}), torch.zeros(300).long())
    plain = BatchLoader(split, 10, shuffle=True, seed=3)
    grouped = BatchLoader(split, 10, shuffle=True, seed=3, lengths=lengths)
    for epoch in (0, 1):
        order = grouped.order(epoch)
        assert sorted(order.tolist()) == list(range(300)) and torch.equal(order, grouped.order(epoch))
    assert not torch.equal(grouped.order(0), grouped.order(1))
    width = {name: sum(int(b.x["input_ids"].shape[1]) for b in loader.batches(0))
             for name, loader in (("plain", plain), ("grouped", grouped))}
    assert width["grouped"] < 0.8 * width["plain"]  # padded tokens per epoch


def test_prokd_online_trains_the_text_teacher_alongside(tmp_path):
    root = write_sst2(tmp_path / "glue")
    tiny_teacher = {"name": "hf_text", "options": {"preset": "bert-tiny", "layers": 1}}
    result = RECIPES.get("prokd")(config(tmp_path, root, "online", prokd={"mode": "online", "tau_max": 2.0},
                                         teacher={"model": tiny_teacher, "epochs": 2,
                                                  "optim": {"name": "adamw", "lr": 3e-3}},
                                         train={"epochs": 3, "progress": False}))
    s = summary(result)
    assert s["plan"]["mode"] == "online" and s["cost"]["teacher_epochs_trained"] == 2
    assert s["teacher_cache"] == {"computed": 2}  # each teacher epoch's logits, computed once
