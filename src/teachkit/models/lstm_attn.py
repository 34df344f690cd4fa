"""LSTM encoder-decoder with attention for translation: the LSTM-1 / LSTM-2 students of the L2T-DLF seed
(Wu et al. 2018, "Learning to Teach with Dynamic Loss Functions"), ``layers=1`` / ``layers=2``.

- **Encoder**: embedding -> (bidirectional) LSTM over the packed source (``pack_padded_sequence``: padding never
  reaches the backward direction); each direction has ``hidden // 2`` units so the memory is (B, S, hidden).
- **Bridge** (the decoder's initial state): per layer, the encoder's final states of both directions concatenated
  ([h_fwd; h_bwd], the size ``hidden``) and mapped by one Linear shared by all layers:
  ``h0 = tanh(W_h h_enc + b_h)``, ``c0 = W_c c_enc + b_c``. Decoder and encoder have the same number of layers.
- **Attention** (``attention``), always masked (PAD source positions score -inf):

  * ``luong``: Luong et al. 2015, "general" score ``h_t^T W_a h_s`` from the *current* decoder state, attentional
    hidden state ``tanh(W_c [c_t; h_t])``; no input feeding, so teacher forcing runs the decoder LSTM over the
    whole target at once (one cuDNN-friendly ``nn.LSTM`` call).
  * ``bahdanau``: Bahdanau et al. 2015, additive score ``v^T tanh(W s_{t-1} + U h_s)`` from the *previous*
    decoder state (the top layer's), the context fed into the decoder LSTM with the previous token's embedding
    (``[E y_{t-1}; c_t]``). The recurrence makes training loop over time steps (one ``nn.LSTM`` call per step).
    The deep output is simplified to ``tanh(W_c [c_t; s_t])`` (no maxout).

- **Output**: ``self.output`` = Linear(hidden, V) applied to the dropped-out attentional hidden state (the
  ``embedding`` tap). ``tie_embeddings`` (default): one matrix for the encoder input, the decoder input and the
  output projection (the vocabulary is joint; Press & Wolf 2017); it needs ``embed_dim == hidden``.

Dropout (``dropout``): on the embeddings, between stacked LSTM layers, on the encoder outputs and before the
output projection. Embeddings are drawn from U(-0.1, 0.1) (fairseq's LSTM), the PAD row zero.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from teachkit.data.parallel import PAD
from teachkit.errors import ConfigError
from teachkit.models.seq2seq import Encoded, Seq2Seq, source_mask
from teachkit.models.taps import TapSpec
from teachkit.models.zoo import MODELS, fraction, input_shape_of, positive_int
from teachkit.options import short_repr
from teachkit.registry import closest

__all__ = ["ATTENTIONS", "BahdanauAttention", "LSTMAttention", "LuongAttention", "lstm_attn"]

ATTENTIONS = ("luong", "bahdanau")

State = dict[str, Tensor]  # "h", "c": (layers, B, hidden), nn.LSTM's layout


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dim (source positions) with PAD positions (``mask`` False) at -inf."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


class LuongAttention(nn.Module):
    """Luong et al. 2015 "general" attention: score(h_t, h_s) = h_t^T W_a h_s, output tanh(W_c [c_t; h_t])."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.w_a = nn.Linear(hidden, hidden, bias=False)
        self.w_c = nn.Linear(2 * hidden, hidden, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """W_a h_s for every source position (computed once per source)."""
        return self.w_a(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """query (B, T, H) decoder states -> attentional hidden states (B, T, H)."""
        scores = torch.bmm(query, keys.transpose(1, 2))  # (B, T, S)
        context = torch.bmm(_masked_softmax(scores, mask[:, None, :]), memory)
        return torch.tanh(self.w_c(torch.cat([context, query], dim=-1)))


class BahdanauAttention(nn.Module):
    """Bahdanau et al. 2015 additive attention: e_j = v^T tanh(W s + U h_j), context = sum_j softmax(e)_j h_j."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.w = nn.Linear(hidden, hidden, bias=False)
        self.u = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, 1, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """U h_j for every source position (computed once per source)."""
        return self.u(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """query (B, H) previous decoder state -> context (B, H)."""
        scores = self.v(torch.tanh(self.w(query)[:, None, :] + keys)).squeeze(-1)  # (B, S)
        return torch.bmm(_masked_softmax(scores, mask)[:, None, :], memory).squeeze(1)


class LSTMAttention(Seq2Seq):
    """LSTM encoder-decoder with Luong or Bahdanau attention (see the module docstring)."""

    def __init__(self, vocab_size: int, embed_dim: int = 256, hidden: int = 256, layers: int = 1,
                 attention: str = "luong", dropout: float = 0.1, bidirectional: bool = True,
                 tie_embeddings: bool = True) -> None:
        super().__init__(vocab_size)
        self.hidden, self.layers, self.attention_kind = hidden, layers, attention
        self.bidirectional, self.tie_embeddings = bidirectional, tie_embeddings
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)  # the source (and shared) embedding
        self.embed_tgt = None if tie_embeddings else nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.drop = nn.Dropout(dropout)
        inter = dropout if layers > 1 else 0.0
        directions = 2 if bidirectional else 1
        self.encoder = nn.LSTM(embed_dim, hidden // directions, layers, batch_first=True, dropout=inter,
                               bidirectional=bidirectional)
        self.bridge_h = nn.Linear(hidden, hidden)
        self.bridge_c = nn.Linear(hidden, hidden)
        if attention == "luong":
            self.attention: LuongAttention | BahdanauAttention = LuongAttention(hidden)
            dec_in = embed_dim
        else:
            self.attention = BahdanauAttention(hidden)
            self.combine = nn.Linear(2 * hidden, hidden, bias=False)
            dec_in = embed_dim + hidden
        self.decoder = nn.LSTM(dec_in, hidden, layers, batch_first=True, dropout=inter)
        self.output = nn.Linear(hidden, vocab_size)
        for emb in (self.embed, self.embed_tgt):
            if emb is not None:
                nn.init.uniform_(emb.weight, -0.1, 0.1)
                with torch.no_grad():
                    emb.weight[PAD].zero_()
        if tie_embeddings:
            self.output.weight = self.embed.weight
        self.tap_spec = TapSpec(embedding="output")

    # -- encoder -----------------------------------------------------------------------------------------------
    def _target_embedding(self) -> nn.Embedding:
        return self.embed if self.embed_tgt is None else self.embed_tgt

    def _final(self, state: Tensor) -> Tensor:
        """nn.LSTM's final states (layers * directions, B, H / directions) -> (B, layers, H), directions
        concatenated per layer."""
        directions = 2 if self.bidirectional else 1
        b = state.shape[1]
        return state.view(self.layers, directions, b, -1).permute(2, 0, 1, 3).reshape(b, self.layers, -1)

    def encode(self, src_ids: Tensor) -> Encoded:
        src_ids = src_ids.long()
        mask = source_mask(src_ids)
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        x = self.drop(self.embed(src_ids))
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src_ids.shape[1])
        memory = self.drop(memory)
        extra = {"h": self._final(h), "c": self._final(c), "keys": self.attention.keys(memory)}
        return Encoded(memory, mask, extra)

    def start(self, enc: Encoded) -> State:
        """The decoder's initial state through the bridge (see the module docstring)."""
        assert enc.extra is not None
        h0 = torch.tanh(self.bridge_h(enc.extra["h"]))
        c0 = self.bridge_c(enc.extra["c"])
        return {"h": h0.transpose(0, 1).contiguous(), "c": c0.transpose(0, 1).contiguous()}

    # -- decoder -----------------------------------------------------------------------------------------------
    def _bahdanau_step(self, enc: Encoded, state: State, embedded: Tensor) -> tuple[Tensor, State]:
        """One Bahdanau step: embedded (B, E) previous token -> (attentional hidden (B, H), new state)."""
        assert enc.extra is not None
        context = self.attention(state["h"][-1], enc.extra["keys"], enc.memory, enc.src_mask)
        out, (h, c) = self.decoder(torch.cat([embedded, context], dim=-1)[:, None, :], (state["h"], state["c"]))
        hidden = torch.tanh(self.combine(torch.cat([context, out[:, 0]], dim=-1)))
        return hidden, {"h": h, "c": c}

    def decode_train(self, enc: Encoded, tgt_in: Tensor) -> Tensor:
        assert enc.extra is not None
        embedded = self.drop(self._target_embedding()(tgt_in.long()))
        state = self.start(enc)
        if self.attention_kind == "luong":
            out, _ = self.decoder(embedded, (state["h"], state["c"]))
            hidden = self.attention(out, enc.extra["keys"], enc.memory, enc.src_mask)
        else:
            steps = []
            for t in range(embedded.shape[1]):
                h_t, state = self._bahdanau_step(enc, state, embedded[:, t])
                steps.append(h_t)
            hidden = torch.stack(steps, dim=1) if steps else embedded.new_zeros(*tgt_in.shape, self.hidden)
        return self.drop(hidden)

    def step(self, enc: Encoded, state: State, tokens: Tensor) -> tuple[Tensor, State]:
        assert enc.extra is not None
        embedded = self.drop(self._target_embedding()(tokens.long()))
        if self.attention_kind == "luong":
            out, (h, c) = self.decoder(embedded[:, None, :], (state["h"], state["c"]))
            hidden = self.attention(out, enc.extra["keys"], enc.memory, enc.src_mask)[:, 0]
            state = {"h": h, "c": c}
        else:
            hidden, state = self._bahdanau_step(enc, state, embedded)
        logits = self.output(self.drop(hidden))
        return torch.log_softmax(logits.float(), dim=-1), state

    def reorder(self, enc: Encoded, state: State, index: Tensor) -> tuple[Encoded, State]:
        return enc.select(index), {k: v.index_select(1, index) for k, v in state.items()}


def _flag(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"model 'lstm_attn' option {option!r} must be true or false; got {short_repr(value)}")
    return value


@MODELS.register("lstm_attn", "LSTM encoder-decoder with Luong/Bahdanau attention (L2T-DLF LSTM-1/LSTM-2)")
def lstm_attn(input_shape: tuple[int, ...], num_classes: int, layers: int = 1, embed_dim: int = 256,
              hidden: int = 256, attention: str = "luong", dropout: float = 0.1, bidirectional: bool = True,
              tie_embeddings: bool = True) -> nn.Module:
    """LSTM translation model over a joint vocabulary of ``num_classes`` ids; ``input_shape`` is (S,)."""
    input_shape_of(input_shape, "lstm_attn")
    layers = positive_int("lstm_attn", "layers", layers)
    embed_dim = positive_int("lstm_attn", "embed_dim", embed_dim)
    hidden = positive_int("lstm_attn", "hidden", hidden)
    dropout = fraction("lstm_attn", "dropout", dropout)
    bidirectional = _flag("bidirectional", bidirectional)
    tie_embeddings = _flag("tie_embeddings", tie_embeddings)
    if attention not in ATTENTIONS:
        shown = attention if isinstance(attention, str) else ""
        raise ConfigError(f"model 'lstm_attn' option 'attention' must be one of {', '.join(ATTENTIONS)}; got "
                          f"{short_repr(attention)}{closest(shown, list(ATTENTIONS))}")
    if bidirectional and hidden % 2:
        raise ConfigError(f"model 'lstm_attn' with bidirectional=true needs an even hidden size (hidden // 2 per "
                          f"direction); got hidden={hidden}")
    if tie_embeddings and embed_dim != hidden:
        raise ConfigError(f"model 'lstm_attn' with tie_embeddings=true needs embed_dim == hidden (the output "
                          f"projection shares the embedding); got embed_dim={embed_dim}, hidden={hidden}")
    return LSTMAttention(num_classes, embed_dim, hidden, layers, attention, dropout, bidirectional, tie_embeddings)
