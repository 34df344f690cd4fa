"""L2T-DLF on a causal language model: the dynamic loss per target token (diagonal Phi) and its exact hypergradient
through a tiny Hugging Face GPT-2 student's momentum-SGD steps against central finite differences; the recipe
picks the diagonal Phi and checkpointed memory for task causal_lm."""

import json
import math

import torch

from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.models import build_model
from teachkit.recipes import RECIPES
from teachkit.recipes.l2t.hypergrad import FunctionalStudent, InnerOptimizer, hypergradient
from teachkit.recipes.l2t.loss import dev_cross_entropy
from teachkit.recipes.l2t.recipe import diagonal_phi
from tests.lm_setup import ADDITION, lm_config
from tests.recipes.l2t.test_l2t_translation import central_differences, dev_value, loss_fn

F64 = torch.float64


def problem(T: int, seed: int = 0):
    splits = load_splits(from_dict({"data": {**ADDITION, "options": {**ADDITION["options"], "train": 40}}}).data)
    torch.manual_seed(seed)
    # GPT-2: its LayerNorm and attention compute in the weights' dtype (Llama's RMSNorm and rotary positions run in
    # float32 whatever the dtype, too coarse for central differences)
    model = build_model("hf_causal_lm", splits.input_shape, splits.num_classes, family="gpt2", layers=1, hidden=8,
                        heads=2, intermediate=12, attention="eager").to(F64)
    batches = list(splits.train.x.batch_source(4, True, seed).batches(0))[:T]
    dev = next(iter(splits.val.x.batch_source(6, False, 0).batches(0)))
    states = torch.rand(T, 5, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return FunctionalStudent(model), batches, dev, states, splits.num_classes


def test_per_token_hypergradient_matches_finite_differences_on_a_tiny_gpt2():
    from teachkit.recipes.l2t.teachers import build_teacher

    student, batches, dev, states, vocab = problem(T=3)
    torch.manual_seed(1)
    teacher = build_teacher("static", vocab, 5, hidden=3, rank=2, diagonal=True).to(F64)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    start = student.initial_state()
    opt = InnerOptimizer(lr=0.5, momentum=0.9, weight_decay=1e-3)
    res = hypergradient(student, start, teacher, states, batches, loss_fn, opt, dev, dev_cross_entropy, "full")
    fd_t = central_differences(teacher, lambda: dev_value(student, start, batches, teacher, states, opt, dev,
                                                          dev_cross_entropy))
    got = torch.cat([g.flatten() for g in res.grads])
    assert fd_t.norm() > 1e-5
    assert float((got - fd_t).norm() / fd_t.norm()) < 1e-4
    assert all(b.y.shape[0] == int(b.x.tgt_lengths().sum()) for b in batches)  # one loss row per target token


def test_the_recipe_runs_per_token_on_a_causal_lm(tmp_path):
    cfg = lm_config(tmp_path, optim={"name": "sgd", "lr": 0.1, "momentum": 0.9},
                    model={"name": "hf_causal_lm", "options": {"preset": "llama-tiny", "attention": "eager"}},
                    train={"epochs": 1, "progress": False},
                    l2t={"teacher_steps": 2, "inner_steps": 2, "dev_batch_size": 8})
    config = from_dict(cfg)
    result = RECIPES.get("l2t")(config)
    s = result.summary
    assert s["l2t"]["memory"] == "checkpoint" and s["l2t"]["teacher_steps_done"] == 2 and s["task"] == "causal_lm"
    assert diagonal_phi(config, load_splits(config.data)) and math.isfinite(s["test_loss"])
    logged = [json.loads(line) for line in (result.run_dir / "teacher_log.jsonl").read_text().splitlines()]
    assert logged and all(r["phi"]["W_offdiag_mean"] == 0 for r in logged if "phi" in r)
