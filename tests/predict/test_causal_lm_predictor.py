"""The causal-LM predictor: prompts typed by hand give exactly the responses the run's evaluator generated for the
same rows, perplexity equals the teacher-forced loss by hand, ``teachkit predict`` writes them, an export folder
answers the same and carries a Hugging Face folder that transformers loads; a LoRA student trains only its
adapters, resumes and exports them; one-line errors."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch

import teachkit
from teachkit.cli import main
from teachkit.config import from_dict
from teachkit.data import load_splits
from teachkit.errors import DataError
from teachkit.models.lm_generate import GenerateOptions, generate_rows
from teachkit.predict import load_predictor
from teachkit.predict.causal_lm import CausalLMPredictor
from teachkit.recipes import train_model
from tests.lm_setup import ADDITION, lm_config


def test_prompts_by_hand_give_the_evaluators_responses(lm_teacher):
    predictor = load_predictor(lm_teacher, "last")
    assert isinstance(predictor, CausalLMPredictor) and predictor.labels is None
    x = load_splits(from_dict({"data": ADDITION}).data).test.x
    tok = x.info.tokenizer
    prompts = [tok.decode(x.ids[i, :x.starts[i]], skip_special_tokens=True) for i in range(x.num_rows)]
    assert all(p.endswith("=") and "+" in p for p in prompts)
    ids, lengths = x.prompts()
    want, _ = generate_rows(predictor.model, ids, lengths, GenerateOptions("greedy", x.info.max_new_tokens),
                            eos_id=x.info.eos_id, pad_id=x.info.pad_id, batch_size=8)
    assert predictor.generate(prompts) == [x.info.text(r) for r in want]
    assert predictor.predict(prompts[0]) == predictor.generate([prompts[0]])
    sampled = predictor.generate(prompts[:4], decode="sample", temperature=3.0, seed=1)
    assert sampled == predictor.generate(prompts[:4], decode="sample", temperature=3.0, seed=1)


def test_perplexity_is_the_teacher_forced_loss(lm_teacher):
    predictor = load_predictor(lm_teacher, "last")
    text = "12+34=46"
    ids = torch.tensor([[1, *predictor.tokenizer(text, add_special_tokens=False)["input_ids"]]])
    with torch.no_grad():
        logits = predictor.model.hf(input_ids=ids).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    assert predictor.perplexity([text])[0] == pytest.approx(math.exp(float(nll)), rel=1e-5)


def test_predict_command_and_export(tmp_path, lm_teacher):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("12+34=\n\n7+8=\n")
    out = tmp_path / "answers.csv"
    assert main(["predict", str(lm_teacher), str(prompts), "--out", str(out), "--select", "last"]) == 0
    rows = list(csv.reader(io.StringIO(out.read_text())))
    predictor = load_predictor(lm_teacher, "last")
    assert rows[0][0] == "prompt" and [r[0] for r in rows[1:]] == ["1", "3"]
    assert [r[1] for r in rows[1:]] == predictor.generate(["12+34=", "7+8="])
    exported = tmp_path / "export"
    assert main(["export", str(lm_teacher), str(exported), "--select", "last"]) == 0
    again = load_predictor(exported)
    assert again.generate(["12+34=", "7+8="]) == predictor.generate(["12+34=", "7+8="])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(exported / "hf", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(exported / "hf", local_files_only=True)
    ids = torch.tensor([[tok.bos_token_id, *tok("12+34=", add_special_tokens=False)["input_ids"]]])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, predictor.model.hf(input_ids=ids).logits)
    with pytest.raises(DataError, match="a non-empty prompt string or a list of messages"):
        predictor.generate([""])


def test_a_lora_student_trains_its_adapters_resumes_and_exports_them(tmp_path):
    pytest.importorskip("peft")
    model = {"name": "hf_causal_lm", "options": {"preset": "llama-tiny", "lora": {"r": 2, "alpha": 4}}}
    cfg = lm_config(tmp_path, model=model, optim={"schedule": "constant"}, train={"epochs": 1, "progress": False})
    first = train_model(from_dict(cfg))
    trainable = {n for n, p in first.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    longer = {**cfg["train"], "epochs": 2}
    resumed = train_model(from_dict({**cfg, "train": longer}), resume=True)
    whole = train_model(from_dict({**cfg, "name": "whole", "train": longer}))
    for a, b in zip(resumed.model.state_dict().values(), whole.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    exported = tmp_path / "export"
    assert main(["export", str(resumed.run_dir), str(exported), "--select", "last"]) == 0
    assert (exported / "adapter" / "adapter_config.json").is_file()
    assert (exported / "adapter" / "adapter_model.safetensors").is_file()
    assert teachkit.load(exported).generate(["1+2="]) == teachkit.load(resumed.run_dir, "last").generate(["1+2="])
