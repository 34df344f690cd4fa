"""lstm_attn and transformer_seq2seq: packed logits, incremental decoding, padding, taps, double backward."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from teachkit.data.parallel import EOS, PAD, shift_right
from teachkit.errors import ConfigError
from teachkit.models import MODELS, Tapped, build_model
from teachkit.models.lstm_attn import LSTMAttention
from teachkit.models.seq2seq import OUTPUT_FIELDS, Seq2Seq, check_incremental
from teachkit.models.transformer_seq2seq import TransformerSeq2Seq

V = 20
LSTM = {"hidden": 16, "embed_dim": 16}
TRANSFORMER = {"d_model": 16, "heads": 2, "ffn": 32, "encoder_layers": 2, "decoder_layers": 2}
CONFIGS = {
    "luong-1": ("lstm_attn", {**LSTM, "layers": 1}),
    "luong-2": ("lstm_attn", {**LSTM, "layers": 2}),
    "bahdanau-1": ("lstm_attn", {**LSTM, "attention": "bahdanau"}),
    "bahdanau-2": ("lstm_attn", {**LSTM, "attention": "bahdanau", "layers": 2}),
    "lstm-untied-unidirectional": ("lstm_attn", {"hidden": 16, "embed_dim": 8, "tie_embeddings": False,
                                                 "bidirectional": False}),
    "transformer": ("transformer_seq2seq", TRANSFORMER),
    "transformer-prenorm-unshared": ("transformer_seq2seq", {**TRANSFORMER, "pre_norm": True,
                                                             "share_embeddings": False}),
}
KINDS = ["luong-1", "bahdanau-1", "transformer"]


def make(key: str, seed: int = 0, **over) -> Seq2Seq:
    name, options = CONFIGS[key]
    torch.manual_seed(seed)
    return build_model(name, (12,), V, **{**options, **over})


def reverse_batch(n: int, seed: int, min_len: int = 2, max_len: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """A reverse task: (src (n, S), tgt (n, T)) int32, right-padded, each sequence ending with EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    src = torch.full((n, max(lengths) + 1), PAD, dtype=torch.int32)
    tgt = torch.full_like(src, PAD)
    for i, length in enumerate(lengths):
        words = torch.randint(4, V, (length,), generator=g, dtype=torch.int32)
        src[i, :length], tgt[i, :length] = words, words.flip(0)
        src[i, length] = tgt[i, length] = EOS
    return src, tgt


def inputs(n: int = 5, seed: int = 1) -> dict[str, torch.Tensor]:
    src, tgt = reverse_batch(n, seed)
    return {"src_ids": src, "tgt_in": shift_right(tgt)}


# --- building -----------------------------------------------------------------------------------------------

def test_registered_with_descriptions() -> None:
    for name in ("lstm_attn", "transformer_seq2seq", "transformer_small", "transformer_iwslt"):
        assert name in MODELS.names() and MODELS.entry(name).description


def test_presets_defaults_and_overrides() -> None:
    def defaults(name: str) -> dict:
        return {k: p.default for k, p in inspect.signature(MODELS.get(name)).parameters.items()
                if p.default is not inspect.Parameter.empty}

    small, iwslt = defaults("transformer_small"), defaults("transformer_iwslt")
    assert (small["encoder_layers"], small["decoder_layers"], small["d_model"], small["heads"], small["ffn"],
            small["dropout"]) == (6, 6, 256, 4, 1024, 0.1)
    assert (iwslt["encoder_layers"], iwslt["decoder_layers"], iwslt["d_model"], iwslt["heads"], iwslt["ffn"],
            iwslt["dropout"], iwslt["share_embeddings"]) == (6, 6, 512, 4, 1024, 0.3, True)
    assert set(small) == set(iwslt) == set(defaults("transformer_seq2seq"))
    m = build_model("transformer_iwslt", (12,), V, encoder_layers=1, decoder_layers=2)
    assert isinstance(m, TransformerSeq2Seq) and len(m.encoder) == 1 and len(m.decoder) == 2
    assert m.d_model == 512 and m.decoder[0].fc1.out_features == 1024 and m.decoder[0].self_attn.heads == 4
    assert m.drop.p == 0.3 and m.output.weight is m.embed.weight


def test_tying() -> None:
    m = make("luong-1")
    assert isinstance(m, LSTMAttention) and m.output.weight is m.embed.weight and m.embed_tgt is None
    u = make("lstm-untied-unidirectional")
    assert u.output.weight is not u.embed.weight and u.embed_tgt is not None
    t = make("transformer-prenorm-unshared")
    assert t.output.weight is not t.embed.weight and t.embed_tgt is not None


def test_deterministic_given_seed() -> None:
    x = inputs()
    for key in KINDS:
        a, b = make(key, seed=3).eval(), make(key, seed=3).eval()
        assert torch.equal(a(**x), b(**x))


# --- teacher forcing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", list(CONFIGS))
def test_forward_packs_logits(key: str) -> None:
    model, x = make(key), inputs()
    assert x["src_ids"].dtype == torch.int32
    logits = model(**x)
    assert logits.shape == (int((x["tgt_in"] != PAD).sum()), V)
    assert model.tap_spec.embedding == "output"


@pytest.mark.parametrize("key", list(CONFIGS))
def test_incremental_matches_teacher_forcing(key: str) -> None:
    model, x = make(key), inputs(6, seed=2)
    model.train()
    assert check_incremental(model, x["src_ids"], x["tgt_in"]) < 1e-5
    assert model.training  # restored


@pytest.mark.parametrize("key", list(CONFIGS))
def test_padding_invariance(key: str) -> None:
    model, x = make(key).eval(), inputs(6, seed=4)
    src, tgt_in = x["src_ids"], x["tgt_in"]
    with torch.no_grad():
        batch = model(src, tgt_in)
        counts = (tgt_in != PAD).sum(dim=1).tolist()
        start = 0
        for i, n in enumerate(counts):
            s, t = int((src[i] != PAD).sum()), n
            alone = model(src[i:i + 1, :s], tgt_in[i:i + 1, :t])
            assert torch.allclose(alone, batch[start:start + n], atol=1e-5), (key, i)
            start += n


def test_transformer_attention_paths_agree() -> None:
    """With gradients the attention is explicit (twice differentiable), without them fused: same logits."""
    model, x = make("transformer-prenorm-unshared").eval(), inputs(6, seed=7)
    explicit = model(**x)
    with torch.no_grad():
        fused = model(**x)
    assert explicit.requires_grad and torch.allclose(explicit, fused, atol=1e-5)


@pytest.mark.parametrize("key", KINDS)
def test_training_lowers_loss(key: str) -> None:
    model = make(key, dropout=0.0)
    src, tgt = reverse_batch(32, seed=5)
    y = tgt[tgt != PAD].long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2 if key == "transformer" else 3e-2)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(src, shift_right(tgt)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0], losses


# --- outputs for losses ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", KINDS)
def test_request_outputs(key: str) -> None:
    model, x = make(key), inputs()
    b, s = x["src_ids"].shape
    n = int((x["tgt_in"] != PAD).sum())
    model.request_outputs(set(OUTPUT_FIELDS))
    out = model(**x)
    assert out["logits"].shape == (n, V)
    assert out["encoder_out"].shape == (b, s, 16)
    assert torch.equal(out["src_mask"], x["src_ids"] != PAD)
    assert out["decoder_hidden"].shape == (n, 16)
    assert torch.allclose(model.output(out["decoder_hidden"]), out["logits"])
    model.request_outputs(set())
    assert isinstance(model(**x), torch.Tensor)


@pytest.mark.parametrize("key", KINDS)
def test_tapped_embedding(key: str) -> None:
    model, x = make(key).eval(), inputs()
    n = int((x["tgt_in"] != PAD).sum())
    with Tapped(model, want=("logits", "embedding")) as tapped, torch.no_grad():
        taps = tapped(x)
    assert taps.logits.shape == (n, V) and taps.embedding.shape == (n, 16)
    assert torch.allclose(model.output(taps.embedding), taps.logits, atol=1e-6)


@pytest.mark.parametrize("key", ["luong-2", "bahdanau-1", "transformer", "transformer-prenorm-unshared"])
def test_double_backward(key: str) -> None:
    model = make(key).train()
    src, tgt = reverse_batch(4, seed=6)
    x, targets = {"src_ids": src, "tgt_in": shift_right(tgt)}, tgt[tgt != PAD].long()
    params = [p for p in model.parameters() if p.requires_grad]
    loss = F.cross_entropy(model(**x), targets)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    penalty = sum((g ** 2).sum() for g in grads)
    second = torch.autograd.grad(penalty, params, allow_unused=True)
    assert all(torch.isfinite(g).all() for g in second if g is not None)
    assert sum(float(g.abs().sum()) for g in second if g is not None) > 0


# --- bad options ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, options, words", [
    ("lstm_attn", {"attention": "luonng"}, "did you mean 'luong'"),
    ("lstm_attn", {"embed_dim": 8, "hidden": 16}, "embed_dim == hidden"),
    ("lstm_attn", {"hidden": 15, "embed_dim": 15}, "even hidden"),
    ("lstm_attn", {"dropout": 1.5}, "'dropout'"),
    ("lstm_attn", {"layers": 0}, "'layers'"),
    ("lstm_attn", {"bidirectional": "yes"}, "'bidirectional'"),
    ("lstm_attn", {"heads": 2}, "no option 'heads'"),
    ("transformer_seq2seq", {"d_model": 16, "heads": 3}, "divisible by heads"),
    ("transformer_seq2seq", {"pre_norm": 1}, "'pre_norm'"),
    ("transformer_seq2seq", {"max_positions": 8}, "12 is longer than max_positions=8"),
    ("transformer_small", {"attention_dropout": -0.1}, "'attention_dropout'"),
])
def test_bad_options_are_one_line(name: str, options: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        build_model(name, (12,), V, **options)
    assert "\n" not in str(info.value)


def test_source_longer_than_max_positions() -> None:
    model = build_model("transformer_seq2seq", (4,), V, **{**TRANSFORMER, "max_positions": 6})
    src = torch.full((1, 8), 5, dtype=torch.int32)
    with pytest.raises(ConfigError, match="8 tokens is longer than the transformer's max_positions=6") as info:
        model(src, torch.ones(1, 2, dtype=torch.int32))
    assert "\n" not in str(info.value)
