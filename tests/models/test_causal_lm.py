"""hf_causal_lm: packed logits, structured outputs, taps, options, gradient checkpointing, dtypes, LoRA, saving."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from teachkit.errors import ConfigError  # noqa: E402
from teachkit.models import MODELS, FrozenTeacher, Tapped, build_model  # noqa: E402
from teachkit.models.causal_lm import (  # noqa: E402
    PRESETS,
    HFCausalLM,
    causal_lm_of,
    is_causal_lm,
    positions_from_mask,
    save_adapter,
    save_pretrained,
)
from teachkit.models.zoo import describe_builder  # noqa: E402

V = 20
SHAPE = (12,)
TINY = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 48}


def tiny(family: str = "llama", seed: int = 0, num_classes: int = V, **options) -> HFCausalLM:
    torch.manual_seed(seed)
    return build_model("hf_causal_lm", SHAPE, num_classes, family=family, **{**TINY, **options}).eval()


def batch(seed: int = 1, lengths=(7, 4, 6), starts=(3, 1, 2), vocab: int = V, prefix: str = "") -> dict:
    """Right-padded rows (pad 0) with the LM data's masks: target_mask True at starts-1 <= p < lengths-1."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.int32)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    target = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, (n, s) in enumerate(zip(lengths, starts, strict=True)):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=g, dtype=torch.int32)
        mask[i, :n] = 1
        target[i, s - 1:n - 1] = True
    return {f"{prefix}input_ids": ids, f"{prefix}attention_mask": mask, f"{prefix}target_mask": target}


def hf_logits(model: HFCausalLM, x: dict) -> torch.Tensor:
    with torch.no_grad():
        return model.hf(input_ids=x["input_ids"].long(), attention_mask=x["attention_mask"]).logits


# --- outputs ------------------------------------------------------------------------------------------------

def test_registered_and_described() -> None:
    assert "hf_causal_lm" in MODELS.names()
    assert "\n" not in MODELS.entry("hf_causal_lm").description
    desc = describe_builder(MODELS.get("hf_causal_lm"))
    assert "path=None" in desc and "lora=None" in desc and "dtype='float32'" in desc


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_packed_logits_are_the_full_models_logits_at_the_targets(family: str) -> None:
    model, x = tiny(family), batch()
    with torch.no_grad():
        packed = model(x)
        same = model(**x)
    full = hf_logits(model, x)
    assert packed.shape == (int(x["target_mask"].sum()), V) == (4 + 3 + 4, V)
    torch.testing.assert_close(packed, full[x["target_mask"]], rtol=1e-5, atol=1e-5)
    assert torch.equal(packed, same)
    # row r is row-major: the first row's targets come first
    torch.testing.assert_close(packed[:4], full[0, 2:6], rtol=1e-5, atol=1e-5)
    # no target_mask: every position, (B, L, V), equal at the real tokens
    with torch.no_grad():
        every = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"])
    real = x["attention_mask"].bool()
    assert every.shape == (3, 7, V)
    torch.testing.assert_close(every[real], full[real], rtol=1e-5, atol=1e-5)
    # a bare tensor is input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(x["input_ids"][:1, :7]), model.hf(x["input_ids"][:1].long()).logits)


def test_positions_count_real_tokens_only() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def test_left_padded_rows_give_the_same_logits_as_unpadded_ones() -> None:
    model = tiny()
    ids = torch.tensor([[5, 6, 7, 8]])
    left = {"input_ids": torch.tensor([[0, 0, 5, 6, 7, 8]]), "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1]])}
    with torch.no_grad():
        torch.testing.assert_close(model(left)[0, 2:], model(ids)[0], rtol=1e-5, atol=1e-5)


def test_request_outputs_fields_and_shapes() -> None:
    model, x = tiny(), batch()
    model.request_outputs({"hidden_states", "attentions"})
    assert model.hf.config._attn_implementation == "eager"
    with torch.no_grad():
        out = model(x)
    assert set(out) == {"logits", "hidden_states", "attentions"}
    assert out["logits"].shape == (11, V)
    assert len(out["hidden_states"]) == 3 and all(h.shape == (3, 7, 32) for h in out["hidden_states"])
    assert len(out["attentions"]) == 2 and all(a.shape == (3, 2, 7, 7) for a in out["attentions"])
    rows = out["attentions"][0][0, :, :7].sum(-1)  # probabilities over the real, earlier tokens
    torch.testing.assert_close(rows, torch.ones_like(rows))
    assert float(out["attentions"][0][0, 0, 2, 3:].abs().sum()) == 0.0  # causal
    model.request_outputs(set())
    assert model.hf.config._attn_implementation == "sdpa"
    with torch.no_grad():
        torch.testing.assert_close(model(x), out["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_embedding_tap_is_the_heads_packed_input(family: str) -> None:
    model, x = tiny(family), batch()
    assert model.tap_spec.embedding == "head"
    with Tapped(model, want=("logits", "embedding", "hidden_states")) as tap, torch.no_grad():
        taps = tap(x)
    assert taps.embedding.shape == (11, 32)
    torch.testing.assert_close(model.hf.get_output_embeddings()(taps.embedding), taps.logits)
    torch.testing.assert_close(taps.embedding, taps.extra["hidden_states"][-1][x["target_mask"]])
    assert model.requested_outputs == frozenset()


def test_a_wider_head_is_cut_to_the_datas_vocabulary(tmp_path) -> None:
    wide = tiny(num_classes=24)
    save_pretrained(wide, tmp_path / "wide")
    model = build_model("hf_causal_lm", SHAPE, V, path=str(tmp_path / "wide")).eval()
    assert model.tokenizer_name == str(tmp_path / "wide") and model.num_logits == V
    x = batch()
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, hf_logits(wide, x)[x["target_mask"]][:, :V], rtol=1e-5, atol=1e-5)
    with Tapped(model, want=("logits", "embedding")) as tap, torch.no_grad():
        taps = tap(x)
    torch.testing.assert_close(model.head(taps.embedding), taps.logits)
    with pytest.raises(ConfigError, match="vocabulary of 24 token ids but the data's tokenizer has 30"):
        build_model("hf_causal_lm", SHAPE, 30, path=str(tmp_path / "wide"))


def test_final_logit_softcapping_is_applied() -> None:
    if not hasattr(transformers, "Gemma2Config"):
        pytest.skip("Gemma-2 needs transformers >= 4.42")
    config = transformers.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       final_logit_softcapping=0.5, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model, x = HFCausalLM(hf, attention="eager"), batch()
    with torch.no_grad():
        out = model(x)
        raw = hf.lm_head(hf.model(input_ids=x["input_ids"].long(), attention_mask=x["attention_mask"])[0])
    torch.testing.assert_close(out, hf_logits(model, x)[x["target_mask"]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, 0.5 * torch.tanh(raw[x["target_mask"]] / 0.5), rtol=1e-5, atol=1e-5)
    assert float(out.abs().max()) <= 0.5


def test_teacher_side_inputs() -> None:
    student_x, teacher_x = batch(seed=1), batch(seed=2, lengths=(5, 6, 3), starts=(2, 2, 1), prefix="teacher.")
    both = {**student_x, **teacher_x}
    teacher = tiny(inputs="teacher")
    student = tiny()  # the same weights
    with torch.no_grad():
        t_out, s_out = teacher(both), student(both)
        plain = student({k.removeprefix("teacher."): v for k, v in teacher_x.items()})
    assert t_out.shape == (int(teacher_x["teacher.target_mask"].sum()), V)
    assert s_out.shape == (11, V)
    torch.testing.assert_close(t_out, plain)
    # without a teacher tokenisation the teacher reads the unprefixed keys; FrozenTeacher strips the prefix
    with torch.no_grad():
        torch.testing.assert_close(teacher(student_x), s_out)
        torch.testing.assert_close(FrozenTeacher(student)(both), t_out)


def test_too_long_input_is_one_line() -> None:
    model = build_model("hf_causal_lm", (8,), V, max_positions=8, **TINY)
    with pytest.raises(ConfigError) as err:
        model(torch.zeros(1, 9, dtype=torch.long))
    msg = str(err.value)
    assert "\n" not in msg and "at most 8 tokens" in msg and "data.options.max_length to at most 8" in msg
    with pytest.raises(ConfigError, match="data has 12: set data.options.max_length to at most 10"):
        tiny(max_positions=10)
    assert tiny().max_tokens == 512 and tiny(max_positions=12).max_tokens == 12
    assert build_model("hf_causal_lm", (600,), V, **TINY).max_tokens == 600  # at least the data's length


# --- options ------------------------------------------------------------------------------------------------

def test_presets_sizes() -> None:
    assert {"llama-tiny", "llama-mini", "llama-small", "gpt2-tiny", "gpt2-mini", "gpt2-small"} <= set(PRESETS)
    with torch.device("meta"):
        models = {name: build_model("hf_causal_lm", SHAPE, V, preset=name) for name in PRESETS}
    for name, (family, layers, hidden, heads, inter) in PRESETS.items():
        c = models[name].hf.config
        assert c.model_type == family and c.num_hidden_layers == layers and c.hidden_size == hidden
        assert c.num_attention_heads == heads
        assert (c.intermediate_size if family == "llama" else c.n_inner) == inter
        assert c.vocab_size == V and c.tie_word_embeddings
    small = models["llama-small"]
    # 12 x (4 x 256^2 attention + 3 x 256 x 688 SwiGLU + 2 x 256 norms) + 256 final norm + 20 x 256 embeddings
    assert sum(p.numel() for p in small.parameters()) == 12 * (4 * 256 ** 2 + 3 * 256 * 688 + 512) + 256 + 20 * 256
    assert 9.4e6 < sum(p.numel() for p in small.parameters()) < 9.6e6
    llama = build_model("hf_causal_lm", SHAPE, V, layers=1, hidden=64)
    assert llama.hf.config.intermediate_size == 172 and llama.hf.config.num_attention_heads == 1
    gqa = build_model("hf_causal_lm", SHAPE, V, preset="llama-tiny", heads=4, kv_heads=2, tie_embeddings=False)
    assert gqa.hf.config.num_key_value_heads == 2 and not gqa.hf.config.tie_word_embeddings
    assert gqa.label == "model 'hf_causal_lm' (preset 'llama-tiny')"


@pytest.mark.parametrize(("options", "match"), [
    ({}, "needs one of option 'path'"),
    ({"layers": 2}, "needs one of option 'path'"),
    ({"preset": "llama-huge"}, "option 'preset'='llama-huge' is not allowed.*allowed: llama-tiny"),
    ({"preset": "llama-tiny", "family": "gpt2"}, "'family'='gpt2' contradicts preset 'llama-tiny'"),
    ({"family": "mistral", **TINY}, "option 'family'='mistral' is not allowed; allowed: llama, gpt2"),
    ({**TINY, "heads": 3}, "'heads'=3 must divide 'hidden'=32"),
    ({**TINY, "hidden": 36, "heads": 4}, "with an even quotient"),
    ({**TINY, "kv_heads": 3, "heads": 2}, "'kv_heads'=3 must divide 'heads'=2"),
    ({**TINY, "family": "gpt2", "kv_heads": 1}, "'kv_heads' applies to family 'llama' only"),
    ({**TINY, "layers": 0}, "'layers' must be a positive int"),
    ({**TINY, "dropout": 1.0}, "'dropout' must be a number in \\[0, 1\\)"),
    ({**TINY, "dtype": "float64"}, "'dtype'='float64' is not allowed.*allowed: float32, bfloat16, float16"),
    ({**TINY, "attention": "flash"}, "'attention'='flash' is not allowed"),
    ({**TINY, "inputs": "both"}, "'inputs'='both' is not allowed"),
    ({**TINY, "gradient_checkpointing": "yes"}, "'gradient_checkpointing' must be true or false"),
    ({**TINY, "tie_embeddings": 1}, "'tie_embeddings' must be true or false"),
    ({**TINY, "max_positions": 0}, "'max_positions' must be a positive int"),
    ({"path": "x", "layers": 2}, "options 'path' and 'layers' exclude each other"),
    ({"path": 3}, "'path' must be a folder or model name"),
    ({"path": "/no/such/folder-xyz"}, "not found offline"),
    ({**TINY, "lora": 8}, "'lora' must be null or a mapping"),
    ({**TINY, "lora": {"rank": 8}}, "'lora' has no key 'rank'"),
    ({**TINY, "lora": {"r": 0}}, "'lora.r' must be a positive int"),
    ({**TINY, "lora": {"alpha": -1}}, "'lora.alpha' must be a number > 0"),
    ({**TINY, "lora": {"dropout": 2}}, "'lora.dropout' must be a number in"),
    ({**TINY, "lora": {"target_modules": []}}, "'lora.target_modules' must be a list of module names"),
    ({**TINY, "lora": {"target_modules": ["nope"]}}, "option 'lora': "),
    ({**TINY, "speed": 1}, "has no option 'speed'"),
])
def test_bad_options_are_one_line(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err, torch.device("meta"):
        build_model("hf_causal_lm", SHAPE, V, **options)
    assert "\n" not in str(err.value)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    plain, checked = tiny(), tiny(gradient_checkpointing=True)
    checked.load_state_dict(plain.state_dict())
    x = batch()
    grads, calls = [], []
    for model in (plain, checked):
        model.train()
        seen: list[int] = []
        handle = model.hf.model.layers[0].input_layernorm.register_forward_pre_hook(
            lambda *_, seen=seen: seen.append(1))
        model(x).logsumexp(-1).sum().backward()
        handle.remove()
        calls.append(len(seen))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert calls == [1, 2]  # checkpointing runs the layer again in backward
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_weights_run(dtype: str) -> None:
    model, x = tiny(dtype=dtype), batch()
    assert all(p.dtype == getattr(torch, dtype) for p in model.parameters())
    with torch.no_grad():
        out = model(x)
    assert out.dtype == getattr(torch, dtype) and out.shape == (11, V) and bool(torch.isfinite(out).all())
    ref = tiny()
    with torch.no_grad():
        torch.testing.assert_close(out.float(), ref(x), rtol=0.1, atol=0.1)


# --- LoRA ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_lora_trains_only_the_adapters(family: str) -> None:
    pytest.importorskip("peft")
    model = tiny(family, lora={"r": 4, "alpha": 8})
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj") if family == "llama" else ("c_attn", "c_proj")
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == set(targets)
    assert model.peft_model is not None and model.peft_model not in list(model.modules())
    assert all(k.startswith("hf.") for k in model.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(batch()).logsumexp(-1).sum().backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(trainable)


def test_lora_state_dict_round_trip_and_saving(tmp_path) -> None:
    pytest.importorskip("peft")
    model = tiny(lora={"r": 4})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at zero: make the adapter matter
    x = batch()
    with torch.no_grad():
        out = model(x)
        assert not torch.allclose(out, tiny()(x), atol=1e-3)
    fresh = tiny(seed=5, lora={"r": 4})
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(x), out)
    assert save_adapter(model, tmp_path / "adapter") == tmp_path / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    save_pretrained(model, tmp_path / "merged")  # merged: a plain Hugging Face folder
    merged = build_model("hf_causal_lm", SHAPE, V, path=str(tmp_path / "merged")).eval()
    assert merged.peft_model is None and not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(x), out, rtol=1e-4, atol=1e-4)
    assert any("lora" in k for k in model.state_dict())  # saving did not merge the model itself
    with pytest.raises(ConfigError, match="has no LoRA adapter"):
        save_adapter(tiny(), tmp_path / "none")


def test_lora_needs_peft(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"needs peft: pip install 'teachkit\[lm\]'"):
        tiny(lora={"r": 2})


# --- building -------------------------------------------------------------------------------------------------

def test_meta_device_build(tmp_path) -> None:
    save_pretrained(tiny("gpt2"), tmp_path / "gpt2")
    with torch.device("meta"):
        built = [build_model("hf_causal_lm", SHAPE, V, preset="llama-tiny"),
                 build_model("hf_causal_lm", SHAPE, V, path=str(tmp_path / "gpt2"))]
        if __import__("importlib").util.find_spec("peft"):
            built.append(build_model("hf_causal_lm", SHAPE, V, preset="gpt2-tiny", lora={"r": 2}))
    for model in built:
        assert all(p.device.type == "meta" for p in model.parameters())
    assert built[1].hf.config.model_type == "gpt2" and built[1].max_tokens == 512


def test_attributes_and_wrappers() -> None:
    model = tiny()
    assert model.vocab_size == V and model.num_logits == V and model.input_kind == "tokens"
    assert model.tokenizer_name is None and model.label == "model 'hf_causal_lm' (llama, 2 layers x 32)"
    frozen = FrozenTeacher(model)
    assert is_causal_lm(model) and is_causal_lm(frozen) and not is_causal_lm(torch.nn.Linear(2, 2))
    assert causal_lm_of(frozen) is model and causal_lm_of(torch.compile(model)) is model
    with pytest.raises(ConfigError, match="not a causal language model"):
        causal_lm_of(torch.nn.Linear(2, 2))
