"""Text distillation losses: TinyBERT hidden-state / embedding MSE, pooled MSE, TinyBERT / MiniLM attention.

Taps are built by hand (random or constant tensors of Hugging Face's shapes), plus one tiny fake encoder
returning a structured output, so no ``transformers`` is needed.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective, needs_of
from teachkit.losses.attention import AttentionKD, AttentionKDOptions
from teachkit.losses.hidden import HiddenMSE, HiddenMSEOptions, PooledMSE, PooledMSEOptions, uniform_layer_map
from teachkit.models import Tapped
from teachkit.types import Batch, Taps

P = Progress(0, 0, 1, 1)


def taps(hidden=None, attn=None, pooled=None, rows=None):
    extra = {k: v for k, v in (("hidden_states", hidden), ("attentions", attn), ("pooled", pooled)) if v is not None}
    if rows is None:
        first = next(iter(extra.values()))
        rows = (first[0] if isinstance(first, (list, tuple)) else first).shape[0]
    return Taps(torch.zeros(rows, 2), extra=extra)


def batch(mask=None, rows=2, length=3):
    """A text batch; ``mask`` None -> a plain tensor input (no attention mask)."""
    if mask is None:
        return Batch(torch.zeros(rows, length), torch.zeros(rows, dtype=torch.long), torch.arange(rows))
    mask = torch.as_tensor(mask)
    x = {"input_ids": torch.zeros(mask.shape, dtype=torch.long), "attention_mask": mask}
    return Batch(x, torch.zeros(mask.shape[0], dtype=torch.long), torch.arange(mask.shape[0]))


def states(layers, b=2, length=3, h=4, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, length, h, generator=g).requires_grad_(requires_grad) for _ in range(layers + 1))


def probs(layers, b=2, heads=2, length=3, mask=None, requires_grad=False, seed=0):
    """Softmax attention maps; padded keys get probability exactly 0 (as with a finfo.min additive mask)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        scores = torch.randn(b, heads, length, length, generator=g)
        if mask is not None:
            scores = scores.masked_fill(torch.as_tensor(mask)[:, None, None, :] == 0, float("-inf"))
        out.append(scores.softmax(-1).requires_grad_(requires_grad))
    return tuple(out)


def one_line(info):
    text = str(info.value)
    assert "\n" not in text, text
    return text


# -- hidden_mse -------------------------------------------------------------------------------------------------

def test_uniform_layer_map():
    assert uniform_layer_map("x", 4, 12) == [(1, 3), (2, 6), (3, 9), (4, 12)]  # TinyBERT 4-layer from BERT-base
    assert uniform_layer_map("x", 3, 3) == [(1, 1), (2, 2), (3, 3)]
    assert uniform_layer_map("x", 4, 6) == [(1, 1), (2, 3), (3, 4), (4, 6)]  # floor(m * 6 / 4)


def test_hidden_zero_when_equal_positive_otherwise_and_gradients():
    s = states(2, requires_grad=True)
    t = tuple(x.detach().clone().requires_grad_(True) for x in s)
    loss = HiddenMSE(taps(s), taps(t))
    assert isinstance(loss.proj_hidden, nn.Identity) and not list(loss.parameters())  # same size: no projection
    out = loss(taps(s), taps(t), batch([[1, 1, 1], [1, 1, 0]]), P)
    assert set(out) == {"hidden", "embedding"} and out["hidden"].item() == out["embedding"].item() == 0.0
    t2 = states(2, seed=1)
    t2 = tuple(x.requires_grad_(True) for x in t2)
    out = loss(taps(s), taps(t2), batch([[1, 1, 1], [1, 1, 0]]), P)
    assert out["hidden"].item() > 0 and out["embedding"].item() > 0
    (out["hidden"] + out["embedding"]).backward()
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in s)  # layers 1, 2 and the embeddings
    assert all(x.grad is None for x in t2)


def test_hidden_projection_identity_is_zero_and_trains():
    s = states(2, h=4, requires_grad=True)
    loss = HiddenMSE(taps(s), taps(s), HiddenMSEOptions(project=True))
    assert isinstance(loss.proj_hidden, nn.Linear) and isinstance(loss.proj_embedding, nn.Linear)
    with torch.no_grad():
        for lin in (loss.proj_hidden, loss.proj_embedding):
            lin.weight.copy_(torch.eye(4))
            lin.bias.zero_()
    out = loss(taps(s), taps(tuple(x.detach() for x in s)), batch(), P)
    assert out["hidden"].item() == pytest.approx(0.0, abs=1e-12) and out["embedding"].item() == pytest.approx(0.0)
    with torch.no_grad():
        loss.proj_hidden.bias.fill_(0.5)  # every projected entry off by 0.5: MSE 0.25 per layer, 2 layers
    out = loss(taps(s), taps(tuple(x.detach() for x in s)), batch(), P)
    assert out["hidden"].item() == pytest.approx(0.5, rel=1e-6)
    out["hidden"].backward()
    assert loss.proj_hidden.weight.grad.abs().sum() > 0 and loss.proj_hidden.bias.grad.abs().sum() > 0
    assert loss.proj_embedding.weight.grad is None  # the embedding term was not backpropagated


def test_hidden_sizes_differ_builds_projections_from_probes():
    s, t = states(2, h=4, requires_grad=True), tuple(x.requires_grad_(True) for x in states(4, h=6, seed=1))
    loss = HiddenMSE(taps(s), taps(t))
    assert (loss.proj_hidden.in_features, loss.proj_hidden.out_features) == (4, 6)
    assert (loss.proj_embedding.in_features, loss.proj_embedding.out_features) == (4, 6)
    out = loss(taps(s), taps(t), batch([[1, 1, 0], [1, 1, 1]]), P)
    (out["hidden"] + out["embedding"]).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.parameters())
    assert all(x.grad is not None for x in s) and all(x.grad is None for x in t)
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(s), taps(t), HiddenMSEOptions(project=False))
    assert one_line(info).startswith("project=False but the student's hidden size (4) differs from the teacher's (6)")


def test_hidden_layer_mapping_picks_the_right_teacher_layers():
    # teacher state k is the constant sqrt(2^k): against a zero student its MSE is 2^k, so the loss, a sum of
    # distinct powers of two, says exactly which teacher states entered
    def teacher(n):
        return tuple(torch.full((2, 3, 4), math.sqrt(2.0**k), dtype=torch.float64) for k in range(n + 1))

    def zeros(m):
        return tuple(torch.zeros(2, 3, 4, dtype=torch.float64) for _ in range(m + 1))

    def value(m, n, **opts):
        loss = HiddenMSE(taps(zeros(m)), taps(teacher(n)), HiddenMSEOptions(**opts))
        return {k: v.item() for k, v in loss(taps(zeros(m)), taps(teacher(n)), batch([[1, 1, 0], [1, 0, 0]]),
                                                    P).items()}

    assert value(3, 6, embeddings=False) == {"hidden": 2**2 + 2**4 + 2**6}
    assert value(4, 6) == {"hidden": 2**1 + 2**3 + 2**4 + 2**6, "embedding": 2**0}
    assert value(3, 6, layers="last") == {"hidden": 2**6, "embedding": 1.0}
    assert value(2, 2, layers="last", embeddings=False) == {"hidden": 2**2}
    assert value(8, 6, layers="last") == {"hidden": 2**6, "embedding": 1.0}  # last: depth may differ


def test_hidden_hand_computed_masked_and_unmasked():
    # one layer, B=2, L=3, H=2; student zeros; teacher layer-1 states below. Real tokens: 2 + 1 = 3.
    t1 = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]], [[0.0, 3.0], [7.0, 7.0], [5.0, 5.0]]])
    t = (torch.zeros(2, 3, 2), t1)
    s = (torch.zeros(2, 3, 2), torch.zeros(2, 3, 2))
    loss = HiddenMSE(taps(s), taps(t))
    masked = loss(taps(s), taps(t), batch([[1, 1, 0], [1, 0, 0]]), P)["hidden"].item()
    assert masked == pytest.approx((1 + 1 + 4 + 0 + 0 + 9) / 6)
    everything = (t1**2).mean().item()
    assert loss(taps(s), taps(t), batch(), P)["hidden"].item() == pytest.approx(everything)  # no mask in batch
    unmasked = HiddenMSE(taps(s), taps(t), HiddenMSEOptions(mask_padding=False))
    assert unmasked(taps(s), taps(t), batch([[1, 1, 0], [1, 0, 0]]), P)["hidden"].item() == pytest.approx(everything)


def test_hidden_ignores_padded_positions():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    s, t = states(2, length=4), states(3, length=4, seed=1)
    loss = HiddenMSE(taps(s), taps(t))
    base = loss(taps(s), taps(t), batch(mask), P)
    pad = (mask == 0)[..., None]
    s2 = tuple(x.masked_fill(pad, 100.0) for x in s)
    t2 = tuple(x.masked_fill(pad, -50.0) for x in t)
    moved = loss(taps(s2), taps(t2), batch(mask), P)
    for k in base:
        torch.testing.assert_close(moved[k], base[k])
    real = tuple(x.clone() for x in s)
    real[1][0, 0] += 1.0  # a real token of a mapped layer does count
    assert loss(taps(real), taps(t), batch(mask), P)["hidden"].item() != pytest.approx(base["hidden"].item())


def test_hidden_dtypes():
    s = tuple(x.to(torch.bfloat16) for x in states(2))
    t = tuple(x.to(torch.bfloat16) for x in states(2, seed=1))
    out = HiddenMSE(taps(s), taps(t))(taps(s), taps(t), batch(), P)
    assert all(v.dtype == torch.float32 for v in out.values())
    s64, t64 = tuple(x.double() for x in s), tuple(x.double() for x in t)
    loss = HiddenMSE(taps(s64), taps(t64), HiddenMSEOptions(project=True)).double()
    assert all(v.dtype == torch.float64 for v in loss(taps(s64), taps(t64), batch([[1, 1, 0]] * 2), P).values())


def test_hidden_bad_probes_are_one_line_config_errors():
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(states(4)), taps(states(3)))
    assert "student has more layers (4) than the teacher (3)" in one_line(info)
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(pooled=torch.zeros(2, 4)), taps(states(3)))
    assert one_line(info).startswith("'hidden_mse' needs the student's 'hidden_states' tap")
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(states(2)), Taps(torch.zeros(2, 2), extra={"hidden_states": torch.zeros(2, 3, 4)}))
    assert "teacher's 'hidden_states' tap as a tuple of (B, L, H) tensors" in one_line(info)
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(states(0)), taps(states(3)), HiddenMSEOptions(layers="last"))
    assert "at least one transformer layer" in one_line(info)
    with pytest.raises(ConfigError) as info:
        HiddenMSE(taps(states(2, length=3)), taps(states(3, length=5)))
    assert "same tokenizer" in one_line(info)


# -- pooled_mse -------------------------------------------------------------------------------------------------

def test_pooled_mse_hand_computed_projection_and_gradients():
    p_s = torch.tensor([[1.0, 2.0], [0.0, 0.0]], requires_grad=True)
    p_t = torch.tensor([[1.0, 0.0], [3.0, 0.0]], requires_grad=True)
    loss = PooledMSE(taps(pooled=p_s), taps(pooled=p_t))
    assert not list(loss.parameters())
    out = loss(taps(pooled=p_s), taps(pooled=p_t), batch(), P)
    assert set(out) == {"pooled"} and out["pooled"].item() == pytest.approx((0 + 4 + 9 + 0) / 4)
    out["pooled"].backward()
    assert p_s.grad.abs().sum() > 0 and p_t.grad is None
    assert loss(taps(pooled=p_s), taps(pooled=p_s), batch(), P)["pooled"].item() == 0.0
    wide = torch.randn(2, 5, requires_grad=True)
    proj = PooledMSE(taps(pooled=p_s), taps(pooled=wide))
    assert (proj.proj.in_features, proj.proj.out_features) == (2, 5)
    proj(taps(pooled=p_s), taps(pooled=wide), batch(), P)["pooled"].backward()
    assert proj.proj.weight.grad.abs().sum() > 0 and wide.grad is None
    with pytest.raises(ConfigError) as info:
        PooledMSE(taps(pooled=p_s), taps(pooled=wide), PooledMSEOptions(project=False))
    assert "pooled size (2) differs from the teacher's (5)" in one_line(info)
    with pytest.raises(ConfigError) as info:
        PooledMSE(taps(states(1)), taps(pooled=wide))
    assert one_line(info) == ("'pooled_mse' needs the student's 'pooled' tap, a (B, H) tensor; the probed student "
                              "gives none")
    assert HiddenMSE.token_level and AttentionKD.token_level and not PooledMSE.token_level


# -- attention_kd -----------------------------------------------------------------------------------------------

def test_attention_tinybert_zero_positive_and_gradients():
    mask = [[1, 1, 1], [1, 1, 0]]
    s = probs(2, mask=mask, requires_grad=True)
    loss = AttentionKD(taps(attn=s), taps(attn=s))
    t_same = tuple(a.detach().clone().requires_grad_(True) for a in s)
    assert loss(taps(attn=s), taps(attn=t_same), batch(mask), P)["attention"].item() == 0.0
    t = tuple(a.requires_grad_(True) for a in probs(2, mask=mask, seed=1))
    out = loss(taps(attn=s), taps(attn=t), batch(mask), P)
    assert set(out) == {"attention"} and out["attention"].item() > 0
    out["attention"].backward()
    assert all(a.grad is not None and a.grad.abs().sum() > 0 for a in s) and all(a.grad is None for a in t)


def test_attention_tinybert_hand_computed():
    # B=1, one layer, L=2. Head 0: student rows (1, 0), (.5, .5) vs teacher (.5, .5) twice -> squares .25, .25,
    # 0, 0; head 1 equal. Mean over 2 heads x 2 x 2 entries -> .5 / 8.
    a_s = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]], [[0.3, 0.7], [0.6, 0.4]]]])
    a_t = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]], [[0.3, 0.7], [0.6, 0.4]]]])
    loss = AttentionKD(taps(attn=(a_s,)), taps(attn=(a_t,)))
    assert loss(taps(attn=(a_s,)), taps(attn=(a_t,)), batch([[1, 1]]), P)["attention"].item() == \
        pytest.approx(0.5 / 8)
    # L=3 with the last token padded: its query row and key column drop out; entries kept 2 heads x 2 x 2
    pad_s = torch.zeros(1, 2, 3, 3)
    pad_t = torch.zeros(1, 2, 3, 3)
    pad_s[..., :2, :2], pad_t[..., :2, :2] = a_s, a_t
    pad_s[..., 2, :] = 0.9  # the padded query row differs: ignored
    masked = loss(taps(attn=(pad_s,)), taps(attn=(pad_t,)), batch([[1, 1, 0]]), P)["attention"].item()
    assert masked == pytest.approx(0.5 / 8)
    unmasked = AttentionKD(taps(attn=(pad_s,)), taps(attn=(pad_t,)), AttentionKDOptions(mask_padding=False))
    everything = unmasked(taps(attn=(pad_s,)), taps(attn=(pad_t,)), batch([[1, 1, 0]]), P)["attention"].item()
    assert everything == pytest.approx((0.5 + 2 * 3 * 0.81) / 18)


def test_attention_tinybert_layer_mapping():
    # teacher layer k (1-based) holds the constant sqrt(2^k); student zeros: the loss names the mapped layers
    def teacher(n):
        return tuple(torch.full((2, 1, 3, 3), math.sqrt(2.0**k), dtype=torch.float64) for k in range(1, n + 1))

    zeros = tuple(torch.zeros(2, 1, 3, 3, dtype=torch.float64) for _ in range(2))
    loss = AttentionKD(taps(attn=zeros), taps(attn=teacher(4)))
    assert loss.pairs == [(0, 1), (1, 3)]
    assert loss(taps(attn=zeros), taps(attn=teacher(4)), batch([[1, 1, 0], [1, 1, 1]]), P)["attention"].item() \
        == 2**2 + 2**4
    three = tuple(torch.zeros(2, 1, 3, 3, dtype=torch.float64) for _ in range(3))
    assert AttentionKD(taps(attn=three), taps(attn=teacher(6)))(
        taps(attn=three), taps(attn=teacher(6)), batch(), P)["attention"].item() == 2**2 + 2**4 + 2**6


def test_attention_minilm_hand_computed_last_layer_only():
    # last layers, B=1, 1 head, L=2: teacher rows (.5, .5), (.9, .1); student (.25, .75), (.9, .1)
    a_t = torch.tensor([[[[0.5, 0.5], [0.9, 0.1]]]])
    a_s = torch.tensor([[[[0.25, 0.75], [0.9, 0.1]]]], requires_grad=True)
    first_s, first_t = torch.rand(1, 1, 2, 2), torch.rand(1, 1, 2, 2)  # earlier layers never enter
    s, t = (torch.rand(1, 1, 2, 2), first_s, a_s), (first_t, a_t)  # a student deeper than the teacher is fine
    loss = AttentionKD(taps(attn=s), taps(attn=t), AttentionKDOptions(mode="minilm"))
    out = loss(taps(attn=s), taps(attn=t), batch([[1, 1]]), P)["attention"]
    expected = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75) + 0.0) / 2
    assert out.item() == pytest.approx(expected, rel=1e-6)
    out.backward()
    assert a_s.grad.abs().sum() > 0 and first_s.grad is None
    same = loss(taps(attn=(s[0], s[1], a_t)), taps(attn=t), batch([[1, 1]]), P)["attention"].item()
    assert same == pytest.approx(0.0, abs=1e-7)


def test_attention_minilm_averages_heads_when_counts_differ():
    # teacher heads rows (.5, .5) and (1, 0) average to (.75, .25): the student's one head matches exactly
    a_t = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [1.0, 0.0]]]])
    a_s = torch.tensor([[[[0.75, 0.25], [0.75, 0.25]]]])
    loss = AttentionKD(taps(attn=(a_s,)), taps(attn=(a_t,)), AttentionKDOptions(mode="minilm"))
    assert loss.average_heads
    assert loss(taps(attn=(a_s,)), taps(attn=(a_t,)), batch(), P)["attention"].item() == pytest.approx(0, abs=1e-7)
    other = torch.tensor([[[[0.5, 0.5], [0.75, 0.25]]]])
    expected = (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)) / 2
    assert loss(taps(attn=(other,)), taps(attn=(a_t,)), batch(), P)["attention"].item() == \
        pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("mode", ["tinybert", "minilm"])
def test_attention_ignores_padding_and_stays_finite(mode):
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    s = probs(2, length=4, mask=mask, requires_grad=True)  # padded keys: exact zeros on both sides
    t = probs(2, length=4, mask=mask, seed=1)
    loss = AttentionKD(taps(attn=s), taps(attn=t), AttentionKDOptions(mode=mode))
    base = loss(taps(attn=s), taps(attn=t), batch(mask), P)["attention"]
    base.backward()
    assert base.item() > 0 and torch.isfinite(s[1].grad).all() and s[1].grad.abs().sum() > 0
    assert (s[0].grad is None) == (mode == "minilm")  # minilm reads the last layer only
    rows = (mask == 0)[:, None, :, None]
    cols = (mask == 0)[:, None, None, :]
    s2 = tuple(a.detach().masked_fill(rows, 0.3).masked_fill(cols, 0.2) for a in s)
    t2 = tuple(a.masked_fill(rows, 0.7) for a in t)
    moved = loss(taps(attn=s2), taps(attn=t2), batch(mask), P)["attention"]
    torch.testing.assert_close(moved, base.detach())
    unmasked = AttentionKD(taps(attn=s), taps(attn=t), AttentionKDOptions(mode=mode, mask_padding=False))
    assert unmasked(taps(attn=s2), taps(attn=t2), batch(mask), P)["attention"].item() != pytest.approx(base.item())


def test_attention_bad_probes_are_one_line_config_errors():
    with pytest.raises(ConfigError) as info:
        AttentionKD(taps(attn=probs(2, heads=4)), taps(attn=probs(4, heads=2)))
    assert one_line(info) == ("mode='tinybert' compares attention maps head by head but student layer 1 has 4 heads "
                              "and teacher layer 2 has 2; use mode 'minilm' (averages heads when they differ)")
    with pytest.raises(ConfigError) as info:
        AttentionKD(taps(attn=probs(3)), taps(attn=probs(2)))
    assert "student has more layers (3) than the teacher (2)" in one_line(info)
    with pytest.raises(ConfigError) as info:
        AttentionKD(taps(attn=probs(2)), taps(states(2)), AttentionKDOptions(mode="minilm"))
    assert one_line(info).startswith("'attention_kd' needs the teacher's 'attentions' tap")
    with pytest.raises(ConfigError) as info:
        AttentionKD(taps(attn=probs(2, length=3)), taps(attn=probs(2, length=4)))
    assert "same tokenizer" in one_line(info)
    with pytest.raises(ConfigError) as info:
        AttentionKD(taps(attn=(torch.zeros(2, 2, 3, 4),)), taps(attn=probs(1)))
    assert "gives shape(s) [(2, 2, 3, 4)]" in one_line(info)


# -- end to end: a tiny encoder with a structured output, through Tapped and build_objective ---------------------

class TinyEncoder(nn.Module):
    """A BERT-shaped toy: embeddings, ``layers`` self-attention blocks (padded keys masked), a tanh pooler on
    token 0; returns logits, hidden_states (embeddings first), attentions and pooled like Hugging Face."""

    def __init__(self, layers: int, hidden: int, heads: int, vocab: int = 13, classes: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, hidden)
        self.qkv = nn.ModuleList(nn.Linear(hidden, 3 * hidden) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.pool = nn.Linear(hidden, hidden)
        self.cls = nn.Linear(hidden, classes)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids)
        b, length, width = h.shape
        hidden, attentions = [h], []
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = (z.view(b, length, self.heads, -1).transpose(1, 2) for z in qkv(h).chunk(3, dim=-1))
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
            a = scores.softmax(-1)
            h = h + torch.tanh(out((a @ v).transpose(1, 2).reshape(b, length, width)))
            hidden.append(h)
            attentions.append(a)
        pooled = torch.tanh(self.pool(h[:, 0]))
        return {"logits": self.cls(pooled), "hidden_states": tuple(hidden), "attentions": tuple(attentions),
                "pooled": pooled}


def test_end_to_end_objective_trains_student_and_projections_and_ignores_padding():
    torch.manual_seed(0)
    methods = ["hidden_mse", "attention_kd", "pooled_mse"]
    student, teacher = TinyEncoder(2, 8, 2), TinyEncoder(4, 12, 2)
    teacher.eval().requires_grad_(False)
    s_needs, t_needs = needs_of(methods)
    assert s_needs == t_needs == {"logits", "hidden_states", "attentions", "pooled"}
    s_tap, t_tap = Tapped(student, want=s_needs), Tapped(teacher, want=t_needs)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    ids = torch.randint(1, 13, mask.shape).masked_fill(mask == 0, 0)
    x = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        student.eval()
        probe = {"input_ids": ids[:2], "attention_mask": mask[:2]}
        s_probe, t_probe = s_tap(probe), t_tap(probe)
        student.train()
    objective = build_objective(methods, s_probe, t_probe, num_classes=2, num_samples=4,
                                options={"attention_kd": {"mode": "tinybert"}})
    assert objective.weights == {"hidden_mse": 1.0, "attention_kd": 1.0, "pooled_mse": 1.0}
    b = Batch(x, torch.tensor([0, 1, 0, 1]), torch.arange(4))
    with torch.no_grad():
        t_out = t_tap(x)
    terms = objective(s_tap(x), t_out, b, P)
    assert set(terms) == {"ce", "hidden_mse.hidden", "hidden_mse.embedding", "attention_kd", "pooled_mse"}
    assert all(torch.isfinite(v) and v.item() > 0 for v in terms.values())
    sum(v for k, v in terms.items() if k != "ce").backward()
    aux = list(objective.parameters())
    assert len(aux) == 6  # W_h, W_e, pooled W: weight + bias each (8 -> 12)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in aux)
    assert all(p.grad is not None for p in student.parameters() if p is not student.cls.weight
               and p is not student.cls.bias)  # the classifier only enters through CE
    assert all(p.grad is None for p in teacher.parameters())
    # other token ids at padded positions change the padded states only: no term moves
    with torch.no_grad():
        other = {"input_ids": ids.masked_fill(mask == 0, 7), "attention_mask": mask}
        again = objective(s_tap(other), t_tap(other), Batch(other, b.y, b.index), P)
    for k in terms:
        torch.testing.assert_close(again[k], terms[k].detach(), rtol=1e-5, atol=1e-6)
