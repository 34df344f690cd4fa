"""Distilling causal language models through the shared recipes: token-level KD cached vs per batch (students
agree), the top-k cache with the rest's probability, sequence-level KD on the teacher's greedy or sampled
responses (cached and verified), Pro-KD online equals replay, Universal Logit Distillation across tokenizers (and
the token-aligned methods refused there), and the Python API."""

from __future__ import annotations

import math

import pytest
import torch

import teachkit
from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.errors import ConfigError
from teachkit.losses.divergences import TopKLogits
from teachkit.models import Tapped
from teachkit.models.lm_generate import GenerateOptions, generate_rows
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.recipes.common import load_model
from teachkit.recipes.teacher_cache import teacher_outputs
from tests.lm_setup import ADDITION, TINY_LM, lm_config


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_cached_and_uncached_students_agree(tmp_path, lm_teacher):
    base = lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)})
    online = distill(from_dict({**base, "name": "online", "teacher": {**base["teacher"], "cache": "off"}}))
    cached = distill(from_dict({**base, "name": "cached"}))
    assert online.summary["teacher_cache"]["status"] == "off"
    report = cached.summary["teacher_cache"]
    tokens = int(load_splits(from_dict(base).data).train.x.tgt_lengths().sum())  # every answer digit and EOS
    assert report["status"] == "computed" and report["tokens"] == tokens
    for a, b in zip(weights(online.model).values(), weights(cached.model).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    again = distill(from_dict({**base, "name": "again"}))
    assert again.summary["teacher_cache"]["status"] == "loaded"
    assert again.summary["cost"]["teacher_forward_images"] == 0


def test_topk_cache_keeps_the_rest_of_the_probability(tmp_path, lm_teacher):
    cfg = from_dict(lm_config(tmp_path))
    splits = load_splits(cfg.data)
    model, _ = load_model(lm_teacher)
    tapped = Tapped(model.eval())
    cache = teacher_outputs(tapped, splits.train, needs={"logits"}, mode="auto", augmented=False, transforms=False,
                            out_dir=tmp_path / "c", batch_size=16, topk=3, vocab_size=splits.num_classes)
    batch = next(iter(splits.train.x.batch_source(8, True, 3).batches(1)))
    with torch.no_grad():
        full = tapped(batch.x).logits.double()
    top = cache(batch).extra["topk"]
    assert isinstance(top, TopKLogits) and top.vocab_size == splits.num_classes
    p = torch.softmax(full, dim=1)
    kept = p.gather(1, top.ids)
    torch.testing.assert_close(top.ids, full.topk(3, dim=1).indices)
    torch.testing.assert_close(top.log_rest.double().exp(), 1 - kept.sum(1), rtol=1e-4, atol=1e-6)
    report = cache.report()
    assert report["topk"] == 3 and "bucket" in report["approximation"]
    assert report["bytes_per_million_tokens"] == 3 * (4 + 4) * 1_000_000 + 4 * 1_000_000
    student = distill(from_dict({**lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher), "cache_topk": 3}),
                                 "name": "topk"}))
    assert student.summary["teacher_cache"]["topk"] == 3 and math.isfinite(student.summary["test_loss"])


def test_sequence_level_kd_trains_on_the_teachers_greedy_responses(tmp_path, lm_teacher):
    cfg = lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)}, seqkd={"beam": 1})
    first = RECIPES.get("seqkd")(from_dict({**cfg, "name": "first"}))
    block = first.summary["seqkd"]
    assert block["status"] == "computed" and block["decoding"].startswith("greedy")
    assert 0 <= block["teacher_exact_train"] <= 100 and block["sentences"] == 240
    splits = load_splits(from_dict(cfg).data)
    teacher, _ = load_model(lm_teacher)
    prompts, lengths = splits.train.x.prompts()
    info = splits.train.x.info
    want, _ = generate_rows(teacher, prompts, lengths, GenerateOptions("greedy", max_new_tokens=info.max_new_tokens),
                            eos_id=info.eos_id, pad_id=info.pad_id, batch_size=64)
    exact = sum(info.text(r) == info.references[int(i)] for r, i in zip(want, splits.train.x.row_ids, strict=True))
    assert block["teacher_exact_train"] == pytest.approx(100 * exact / 240)
    second = RECIPES.get("seqkd")(from_dict({**cfg, "name": "second"}))
    assert second.summary["seqkd"]["status"] == "loaded" and second.summary["cost"]["teacher_forward_images"] == 0
    for a, b in zip(weights(first.model).values(), weights(second.model).values(), strict=True):
        assert torch.equal(a, b)


def test_sampled_responses_are_seeded_and_inter_is_refused(tmp_path, lm_teacher):
    cfg = lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)}, seqkd={"decode": "sample", "temperature": 2.0})
    a = RECIPES.get("seqkd")(from_dict({**cfg, "name": "a"})).summary["seqkd"]
    other = RECIPES.get("seqkd")(from_dict({**cfg, "name": "b", "train": {**cfg["train"], "seed": 1}})).summary
    assert a["decoding"].startswith("sampling") and other["seqkd"]["status"] == "computed"  # another seed: new file
    again = RECIPES.get("seqkd")(from_dict({**cfg, "name": "c"})).summary["seqkd"]
    assert again["status"] == "loaded" and again["file"] == a["file"]
    with pytest.raises(ConfigError, match="seqkd.mode=inter"):
        RECIPES.get("seqkd")(from_dict({**cfg, "name": "d", "seqkd": {"mode": "inter", "beam": 2}}))


def test_prokd_online_equals_replay_on_a_causal_lm(tmp_path, lm_teacher):
    """The student following the teacher's fine-tuning checkpoints with the annealed temperature: trained alongside
    the teacher (online) or replaying the recorded run (the session fixture: the same teacher config and seed)."""
    common = {"prokd": {"tau_max": 3, "loss": "kl"}, "train": {"epochs": 4, "progress": False, "precision": "fp32"}}
    replay = RECIPES.get("prokd")(from_dict({**lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)}, **common),
                                             "name": "replay"}))
    online = RECIPES.get("prokd")(from_dict({**lm_config(tmp_path, teacher={"epochs": 3}, **common),
                                             "name": "online"}))
    assert replay.summary["plan"]["mode"] == "replay" and online.summary["plan"]["mode"] == "online"
    assert [s[2] for s in online.summary["plan"]["stages"]] == [3.0, 2.0, 1.0, 1.0]
    for a, b in zip(weights(online.model).values(), weights(replay.model).values(), strict=True):
        assert torch.equal(a, b)


def test_universal_logit_distillation_across_tokenizers(tmp_path):
    byte_data = {**ADDITION, "options": {**ADDITION["options"], "tokenizer": "byte"}}
    teacher = train_model(from_dict(lm_config(tmp_path, name="byte-teacher", data=byte_data)))
    mixed = {**ADDITION, "options": {**ADDITION["options"], "teacher_tokenizer": "byte"}}
    cfg = lm_config(tmp_path, data=mixed, teacher={"checkpoint": str(teacher.run_dir)})
    with pytest.raises(ConfigError, match="kd.method=kd compares per-token distributions over one vocabulary"):
        distill(from_dict({**cfg, "name": "kd"}))
    uld = distill(from_dict({**cfg, "name": "uld", "kd": {"method": "uld"}}))
    assert uld.summary["teacher_cache"]["status"] == "computed" and math.isfinite(uld.summary["test_loss"])
    assert uld.summary["num_classes"] != teacher.summary["num_classes"]  # 16 characters vs 260 bytes
    with pytest.raises(ConfigError, match="needs one tokenizer|both need one tokenizer"):
        RECIPES.get("gkd")(from_dict({**cfg, "name": "gkd"}))


def test_the_python_api_distils_a_causal_lm(tmp_path, lm_teacher):
    data = dict(ADDITION)
    student = teachkit.distill("hf_causal_lm", str(lm_teacher), data, method="kd", epochs=1, out_dir=tmp_path,
                               overrides={"model.options": TINY_LM["options"], "train.progress": False,
                                          "optim.name": "adamw", "optim.lr": 0.003})
    assert student.summary["task"] == "causal_lm" and "test_exact" in student.summary
    answers = teachkit.load(student).generate(["12+34=", "3+4="])
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    on_policy = teachkit.run("gkd", student="hf_causal_lm", teacher=str(lm_teacher), data=data, epochs=1,
                             out_dir=tmp_path, options={"lmbda": 1.0, "max_new_tokens": 4},
                             overrides={"model.options": TINY_LM["options"], "train.progress": False,
                                        "optim.name": "adamw", "optim.lr": 0.003})
    assert on_policy.summary["gkd"]["on_policy_batches"] == on_policy.summary["gkd"]["batches"] > 0
