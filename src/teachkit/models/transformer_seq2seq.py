"""Transformer encoder-decoder for translation (Vaswani et al. 2017, "Attention Is All You Need"), with
fairseq's conventions: post-norm by default (``pre_norm=True``: LayerNorm before each sublayer and a final
LayerNorm on both stacks), sinusoidal positions, embeddings scaled by sqrt(d_model) and drawn from
N(0, d_model^-0.5) with a zero PAD row, ReLU feed-forward layers, ``dropout`` on embeddings and sublayer outputs,
``attention_dropout`` on attention weights, ``activation_dropout`` after the ReLU, and with ``share_embeddings``
one matrix for the encoder input, the decoder input and the output projection (no bias; joint vocabulary).

Attention is this module's own (q/k/v/out projections). With gradients enabled it is computed explicitly
(matmul, masked softmax, matmul), so that it can be differentiated twice (the L2T-DLF recipe differentiates
through training steps; the fused kernels cannot); under ``torch.no_grad`` (decoding, evaluation) it calls
``scaled_dot_product_attention``. Decoding caches keys and values per decoder layer: the encoder-decoder ones
are computed once in :meth:`TransformerSeq2Seq.start`, the self-attention ones grow by one position per step.

Registered: ``transformer_seq2seq`` (the base sizes of Vaswani et al. 2017), ``transformer_small`` (the
L2T-DLF seed's "transformer_small", Wu et al. 2018: the widths of tensor2tensor's transformer_small -- d_model
256, 4 heads, ffn 1024 -- with the seed's 6 + 6 layers) and ``transformer_iwslt`` (fairseq's
transformer_iwslt_de_en: 6 + 6 layers, d_model 512, ffn 1024, 4 heads, dropout 0.3, shared embeddings).
Presets take every option of ``transformer_seq2seq`` as an override.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from teachkit.data.parallel import PAD
from teachkit.errors import ConfigError
from teachkit.models.seq2seq import Encoded, Seq2Seq, source_mask
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, fraction, input_shape_of, positive_int
from teachkit.options import short_repr

__all__ = ["MultiheadAttention", "TransformerSeq2Seq", "sinusoids", "transformer_iwslt", "transformer_seq2seq",
           "transformer_small"]

#: per decoder layer: "k", "v" self-attention cache (B, heads, t, d_head); "ck", "cv" encoder-decoder (B, heads, S, d)
LayerCache = dict[str, Tensor]


def sinusoids(length: int, dim: int) -> Tensor:
    """(length, dim) sinusoidal positions of Vaswani et al. 2017: PE(p, 2i) = sin(p / 10000^(2i/dim)),
    PE(p, 2i+1) = cos(p / 10000^(2i/dim))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe.float()


class MultiheadAttention(nn.Module):
    """Scaled dot-product attention over ``heads`` heads with q/k/v/out projections (Vaswani et al. 2017)."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.d_head, self.dropout = heads, d_model // heads, dropout
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        for lin in (self.q, self.k, self.v, self.out):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def _split(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, heads, L, d_head)."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.d_head).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x`` (B, L, D), each (B, heads, L, d_head)."""
        return self._split(self.k(x)), self._split(self.v(x))

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Queries from ``x`` (B, T, D) attend to ``k``/``v`` (B, heads, L, d_head); ``mask`` broadcastable to
        (B, heads, T, L), True where attending is allowed. Returns (B, T, D)."""
        q = self._split(self.q(x))
        p = self.dropout if self.training else 0.0
        if torch.is_grad_enabled():  # explicit: twice differentiable
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.d_head ** -0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = F.dropout(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), p, self.training)
            out = torch.matmul(weights, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class _Block(nn.Module):
    """Shared by encoder and decoder layers: residual sublayers, post-norm or pre-norm, and the FFN."""

    def __init__(self, d_model: int, ffn: int, dropout: float, activation_dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.drop = nn.Dropout(dropout)
        self.act_drop = nn.Dropout(activation_dropout)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def residual(self, x: Tensor, norm: nn.LayerNorm, fn: Any) -> Tensor:
        """x + dropout(fn(x)), with the LayerNorm before fn (pre-norm) or after the sum (post-norm)."""
        y = self.drop(fn(norm(x) if self.pre_norm else x))
        return x + y if self.pre_norm else norm(x + y)

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.residual(x, self.ffn_norm, lambda h: self.fc2(self.act_drop(F.relu(self.fc1(h)))))


class EncoderLayer(_Block):
    def __init__(self, d_model: int, heads: int, ffn: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool) -> None:
        super().__init__(d_model, ffn, dropout, activation_dropout, pre_norm)
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.residual(x, self.self_attn_norm, lambda h: self.self_attn(h, *self.self_attn.project_kv(h), mask))
        return self.feed_forward(x)


class DecoderLayer(_Block):
    def __init__(self, d_model: int, heads: int, ffn: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool) -> None:
        super().__init__(d_model, ffn, dropout, activation_dropout, pre_norm)
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d_model)
        self.cross_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.cross_attn_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], src_mask: Tensor, self_mask: Tensor | None,
                cache: LayerCache | None = None) -> Tensor:
        """x (B, T, D). Training: ``cache`` None and ``self_mask`` causal. Decoding: T = 1, the new position's
        keys/values are appended to ``cache`` (in place), ``self_mask`` None."""

        def self_attention(h: Tensor) -> Tensor:
            k, v = self.self_attn.project_kv(h)
            if cache is not None:
                k = cache["k"] = torch.cat([cache["k"], k], dim=2)
                v = cache["v"] = torch.cat([cache["v"], v], dim=2)
            return self.self_attn(h, k, v, self_mask)

        x = self.residual(x, self.self_attn_norm, self_attention)
        x = self.residual(x, self.cross_attn_norm, lambda h: self.cross_attn(h, *cross_kv, src_mask))
        return self.feed_forward(x)


class TransformerSeq2Seq(Seq2Seq):
    """Transformer encoder-decoder (see the module docstring)."""

    def __init__(self, vocab_size: int, encoder_layers: int = 6, decoder_layers: int = 6, d_model: int = 512,
                 heads: int = 8, ffn: int = 2048, dropout: float = 0.1, attention_dropout: float = 0.0,
                 activation_dropout: float = 0.0, share_embeddings: bool = True, max_positions: int = 1024,
                 pre_norm: bool = False) -> None:
        super().__init__(vocab_size)
        self.d_model, self.max_positions, self.pre_norm = d_model, max_positions, pre_norm
        self.scale = math.sqrt(d_model)
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)  # the source (and shared) embedding
        self.embed_tgt = None if share_embeddings else nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.register_buffer("positions", sinusoids(max_positions, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        layer_args = (d_model, heads, ffn, dropout, attention_dropout, activation_dropout, pre_norm)
        self.encoder = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(decoder_layers))
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        for weight in (self.embed.weight, None if self.embed_tgt is None else self.embed_tgt.weight,
                       self.output.weight):
            if weight is not None:
                nn.init.normal_(weight, 0.0, d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
            if self.embed_tgt is not None:
                self.embed_tgt.weight[PAD].zero_()
        if share_embeddings:
            self.output.weight = self.embed.weight
        self.tap_spec = TapSpec(embedding="output")

    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        length = ids.shape[1]
        if offset + length > self.max_positions:
            raise ConfigError(f"a sequence of {offset + length} tokens is longer than the transformer's "
                              f"max_positions={self.max_positions}; raise model.options.max_positions")
        return self.drop(emb(ids) * self.scale + self.positions[offset:offset + length])

    # -- encoder -----------------------------------------------------------------------------------------------
    def encode(self, src_ids: Tensor) -> Encoded:
        src_ids = src_ids.long()
        mask = source_mask(src_ids)
        x = self._embed(self.embed, src_ids)
        attn_mask = mask[:, None, None, :]
        for layer in self.encoder:
            x = layer(x, attn_mask)
        return Encoded(self.encoder_norm(x), mask)

    # -- decoder -----------------------------------------------------------------------------------------------
    def _target_embedding(self) -> nn.Embedding:
        return self.embed if self.embed_tgt is None else self.embed_tgt

    def decode_train(self, enc: Encoded, tgt_in: Tensor) -> Tensor:
        tgt_in = tgt_in.long()
        x = self._embed(self._target_embedding(), tgt_in)
        t = tgt_in.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        src_mask = enc.src_mask[:, None, None, :]
        for layer in self.decoder:
            x = layer(x, layer.cross_attn.project_kv(enc.memory), src_mask, causal)
        return self.decoder_norm(x)

    def start(self, enc: Encoded) -> dict[str, Any]:
        """The decoding cache: the encoder-decoder keys/values of every layer (computed once), empty
        self-attention caches, and the number of positions decoded so far."""
        b = enc.memory.shape[0]
        layers = []
        for layer in self.decoder:
            ck, cv = layer.cross_attn.project_kv(enc.memory)
            empty = ck.new_zeros(b, ck.shape[1], 0, ck.shape[3])
            layers.append({"k": empty, "v": empty, "ck": ck, "cv": cv})
        return {"step": 0, "layers": layers}

    def step(self, enc: Encoded, state: dict[str, Any], tokens: Tensor) -> tuple[Tensor, dict[str, Any]]:
        step = state["step"]
        x = self._embed(self._target_embedding(), tokens.long()[:, None], offset=step)
        src_mask = enc.src_mask[:, None, None, :]
        layers = [dict(c) for c in state["layers"]]  # the caller's state is left as it was
        for layer, cache in zip(self.decoder, layers, strict=True):
            x = layer(x, (cache["ck"], cache["cv"]), src_mask, None, cache)
        logits = self.output(self.decoder_norm(x)[:, 0])
        return torch.log_softmax(logits.float(), dim=-1), {"step": step + 1, "layers": layers}

    def reorder(self, enc: Encoded, state: dict[str, Any], index: Tensor) -> tuple[Encoded, dict[str, Any]]:
        layers = [{k: v.index_select(0, index) for k, v in cache.items()} for cache in state["layers"]]
        return enc.select(index), {"step": state["step"], "layers": layers}


# -- builders ------------------------------------------------------------------------------------------------

def _build(name: str, input_shape: Any, num_classes: int, encoder_layers: int, decoder_layers: int, d_model: int,
           heads: int, ffn: int, dropout: float, attention_dropout: float, activation_dropout: float,
           share_embeddings: bool, max_positions: int, pre_norm: bool) -> TransformerSeq2Seq:
    dims = input_shape_of(input_shape, name)
    ints = {"encoder_layers": encoder_layers, "decoder_layers": decoder_layers, "d_model": d_model, "heads": heads,
            "ffn": ffn, "max_positions": max_positions}
    for option, value in ints.items():
        positive_int(name, option, value)
    for option, value in (("dropout", dropout), ("attention_dropout", attention_dropout),
                          ("activation_dropout", activation_dropout)):
        fraction(name, option, value)
    for option, value in (("share_embeddings", share_embeddings), ("pre_norm", pre_norm)):
        if not isinstance(value, bool):
            raise ConfigError(f"model {name!r} option {option!r} must be true or false; got {short_repr(value)}")
    if d_model % heads or d_model % 2:
        raise ConfigError(f"model {name!r} needs an even d_model divisible by heads; got d_model={d_model}, "
                          f"heads={heads}")
    if dims[0] > max_positions:
        raise ConfigError(f"model {name!r}: the source length {dims[0]} is longer than max_positions="
                          f"{max_positions}; raise max_positions or shorten the data")
    return TransformerSeq2Seq(num_classes, encoder_layers, decoder_layers, d_model, heads, ffn, float(dropout),
                              float(attention_dropout), float(activation_dropout), share_embeddings, max_positions,
                              pre_norm)


@MODELS.register("transformer_seq2seq", "Transformer encoder-decoder for translation (Vaswani et al. 2017)")
def transformer_seq2seq(input_shape: tuple[int, ...], num_classes: int, encoder_layers: int = 6,
                        decoder_layers: int = 6, d_model: int = 512, heads: int = 8, ffn: int = 2048,
                        dropout: float = 0.1, attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                        share_embeddings: bool = True, max_positions: int = 1024, pre_norm: bool = False) -> nn.Module:
    """Transformer over a joint vocabulary of ``num_classes`` ids; ``input_shape`` is (S,)."""
    return _build("transformer_seq2seq", input_shape, num_classes, encoder_layers, decoder_layers, d_model, heads,
                  ffn, dropout, attention_dropout, activation_dropout, share_embeddings, max_positions, pre_norm)


@MODELS.register("transformer_small", "Transformer 6+6, d_model 256, 4 heads, ffn 1024 (L2T-DLF transformer_small)")
def transformer_small(input_shape: tuple[int, ...], num_classes: int, encoder_layers: int = 6,
                      decoder_layers: int = 6, d_model: int = 256, heads: int = 4, ffn: int = 1024,
                      dropout: float = 0.1, attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                      share_embeddings: bool = True, max_positions: int = 1024, pre_norm: bool = False) -> nn.Module:
    """The L2T-DLF seed's transformer_small: tensor2tensor's transformer_small widths with 6 + 6 layers."""
    return _build("transformer_small", input_shape, num_classes, encoder_layers, decoder_layers, d_model, heads,
                  ffn, dropout, attention_dropout, activation_dropout, share_embeddings, max_positions, pre_norm)


@MODELS.register("transformer_iwslt", "Transformer 6+6, d_model 512, 4 heads, ffn 1024, dropout 0.3 (fairseq "
                                      "transformer_iwslt_de_en)")
def transformer_iwslt(input_shape: tuple[int, ...], num_classes: int, encoder_layers: int = 6,
                      decoder_layers: int = 6, d_model: int = 512, heads: int = 4, ffn: int = 1024,
                      dropout: float = 0.3, attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                      share_embeddings: bool = True, max_positions: int = 1024, pre_norm: bool = False) -> nn.Module:
    """fairseq's transformer_iwslt_de_en (dropout 0.3, shared embeddings)."""
    return _build("transformer_iwslt", input_shape, num_classes, encoder_layers, decoder_layers, d_model, heads,
                  ffn, dropout, attention_dropout, activation_dropout, share_embeddings, max_positions, pre_norm)
