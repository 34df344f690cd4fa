"""On-policy distillation (teachkit run gkd): the loss equals the generalised JSD written out by hand on the tiny
addition vocabulary, for reference and for self-sampled responses; the coin and the samples are a function of
(seed, epoch, step); lmbda 0 never samples and reads the teacher cache, lmbda 1 always samples, seq_kd answers with
the teacher's samples; a run extended by --resume equals one trained in one go; bad settings are one line."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.errors import ConfigError
from teachkit.models import Tapped, build_model
from teachkit.models.lm_generate import generate_rows
from teachkit.recipes import RECIPES
from teachkit.recipes.gkd import GKDOptions, GKDStep, step_generator
from teachkit.recipes.teacher_cache import TeacherOutputs
from teachkit.types import Batch, Progress
from tests.lm_setup import ADDITION, lm_config


@pytest.fixture(scope="module")
def splits():
    return load_splits(from_dict({"data": ADDITION}).data)


def tiny_model(splits, seed: int):
    torch.manual_seed(seed)
    return build_model("hf_causal_lm", splits.input_shape, splits.num_classes, preset="llama-tiny")


def jsd_by_hand(student, teacher, x, beta: float) -> float:
    """The generalised JSD of Agarwal et al. (Eq. 1, TRL's convention) from each model's full logits, row by row:
    m = beta p_t + (1 - beta) p_s; beta KL(p_t || m) + (1 - beta) KL(p_s || m) per target token (beta 0: forward KL,
    1: reverse KL, TRL's ends), mean over tokens."""
    values = []
    with torch.no_grad():
        for i in range(x.num_rows):
            n, start = int(x.lengths[i]), int(x.starts[i])
            ids = x.ids[i:i + 1, :n].long()
            ps = torch.softmax(student.hf(input_ids=ids).logits[0, start - 1:n - 1].double(), -1)
            pt = torch.softmax(teacher.hf(input_ids=ids).logits[0, start - 1:n - 1].double(), -1)
            for p, q in zip(pt, ps, strict=True):
                if beta in (0.0, 1.0):  # TRL's ends: forward KL(p_t || p_s), reverse KL(p_s || p_t)
                    a, b = (p, q) if beta == 0.0 else (q, p)
                    values.append(sum(float(u) * math.log(float(u) / float(v)) for u, v in zip(a, b, strict=True)))
                    continue
                m = beta * p + (1 - beta) * q
                kl_p = sum(float(a) * math.log(float(a) / float(c)) for a, c in zip(p, m, strict=True) if a > 0)
                kl_q = sum(float(b) * math.log(float(b) / float(c)) for b, c in zip(q, m, strict=True) if b > 0)
                values.append(beta * kl_p + (1 - beta) * kl_q)
    return sum(values) / len(values)


def step_of(splits, lmbda: float, beta: float = 0.5) -> GKDStep:
    student, teacher = tiny_model(splits, 0), tiny_model(splits, 1).eval()
    opts = GKDOptions(lmbda=lmbda, beta=beta, max_new_tokens=4)
    return GKDStep(student, teacher, Tapped(teacher), TeacherOutputs(Tapped(teacher)), opts, seed=3)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_off_policy_loss_is_the_generalised_jsd(splits, beta):
    step = step_of(splits, lmbda=0.0, beta=beta)
    batch = next(iter(splits.train.x.batch_source(6, True, 0).batches(0)))
    out = step(batch, Progress(0, 0, 1, 1))
    assert set(out.terms) == {"gkd"} and out.outputs is not None
    want = jsd_by_hand(step.student, step.teacher, batch.x, beta)
    assert float(out.terms["gkd"].detach()) == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_on_policy_loss_is_on_the_students_own_samples(splits):
    step = step_of(splits, lmbda=1.0)
    batch = next(iter(splits.train.x.batch_source(6, True, 0).batches(0)))
    progress = Progress(1, 4, 2, 5)
    out = step(batch, progress)
    assert out.outputs is None and float(out.metrics["on_policy"]) == batch.size
    # the same stream again: the coin first, then the samples
    g = step_generator(3, progress.epoch, progress.step)
    assert float(torch.rand((), generator=g)) < 1.0
    prompts, lengths = batch.x.prompts()
    responses, _ = generate_rows(step.student, prompts, lengths, step.opts.sampling(), eos_id=batch.x.info.eos_id,
                                 pad_id=batch.x.info.pad_id, batch_size=batch.size, generator=g)
    sampled = batch.x.with_responses(responses)
    assert float(out.terms["gkd"].detach()) == pytest.approx(jsd_by_hand(step.student, step.teacher, sampled, 0.5),
                                                             rel=1e-4, abs=1e-7)
    again = step(batch, progress)  # the same (seed, epoch, step): the same samples, the same loss
    assert torch.equal(again.terms["gkd"], out.terms["gkd"])
    other = step(batch, Progress(1, 5, 2, 5))
    assert not torch.equal(other.terms["gkd"], out.terms["gkd"])


def test_lmbda_zero_reads_the_cache_and_lmbda_one_always_samples(tmp_path, lm_teacher):
    base = lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)}, train={"epochs": 1, "progress": False})
    never = RECIPES.get("gkd")(from_dict({**base, "name": "never", "gkd": {"lmbda": 0.0}})).summary
    assert never["gkd"]["on_policy_batches"] == 0 and never["gkd"]["sampled_tokens"] == 0
    assert never["teacher_cache"]["status"] == "computed"
    always = RECIPES.get("gkd")(from_dict({**base, "name": "always", "gkd": {"lmbda": 1.0}})).summary
    assert always["gkd"]["on_policy_batches"] == always["gkd"]["batches"] > 0
    assert always["gkd"]["sampled_tokens"] > 0 and always["cost"]["teacher_forward_images"] >= 240
    teacher = RECIPES.get("gkd")(from_dict({**base, "name": "seq-kd", "gkd": {"lmbda": 0.0, "seq_kd": True}})).summary
    assert teacher["gkd"]["teacher_sampled_batches"] == teacher["gkd"]["batches"] > 0
    assert teacher["gkd"]["on_policy_batches"] == 0 and teacher["gkd"]["sampled_tokens"] > 0


def test_resumed_run_equals_one_trained_in_one_go(tmp_path, lm_teacher):
    base = lm_config(tmp_path, teacher={"checkpoint": str(lm_teacher)}, gkd={"lmbda": 0.5, "max_new_tokens": 4},
                     optim={"schedule": "constant"})  # an extended run keeps its learning rates
    gkd = RECIPES.get("gkd")
    whole = gkd(from_dict({**base, "name": "whole", "train": {"epochs": 2, "progress": False}}))
    part = {**base, "name": "part"}
    gkd(from_dict({**part, "train": {"epochs": 1, "progress": False}}))
    resumed = gkd(from_dict({**part, "train": {"epochs": 2, "progress": False}}), resume=True)
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_gkd_options_and_data_are_checked(tmp_path, lm_teacher):
    assert dataclasses.asdict(GKDOptions()) == {"lmbda": 0.5, "beta": 0.5, "temperature": 0.9, "top_k": 0,
                                                "top_p": 1.0, "max_new_tokens": 128, "loss_temperature": 1.0,
                                                "seq_kd": False}
    with pytest.raises(ConfigError, match="gkd.lmbda"):
        from_dict(lm_config(tmp_path, gkd={"lmbda": 1.5}))
    text = tmp_path / "t.txt"
    text.write_text("\n".join(f"line {i} of text" for i in range(40)) + "\n")
    plain = lm_config(tmp_path, data={"name": "lm_text", "root": str(text), "options": {"tokenizer": "char"}},
                      teacher={"checkpoint": str(lm_teacher)})
    with pytest.raises(ConfigError, match="without prompts"):
        RECIPES.get("gkd")(from_dict(plain))


def test_a_batch_is_never_changed_in_place(splits):
    step = step_of(splits, lmbda=1.0)
    batch = next(iter(splits.train.x.batch_source(6, True, 0).batches(0)))
    before = batch.x.ids.clone()
    step(Batch(batch.x, batch.y, batch.index), Progress(0, 0, 1, 1))
    assert torch.equal(batch.x.ids, before)
