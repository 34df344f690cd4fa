"""Encoder-decoder translation models: the interface every one implements, shared by training and decoding.

A :class:`Seq2Seq` model reads one joint vocabulary (``num_classes`` = its size; ids 0-3 are PAD, BOS, EOS, UNK,
see :mod:`teachkit.data.parallel`) and is called in two ways:

- **training** (teacher forcing): ``model(src_ids=(B, S), tgt_in=(B, T))`` returns the logits of every target
  position *packed*, (N, V) with one row per ``tgt_in != PAD`` position in row-major order -- the layout of the
  batch's targets (:meth:`~teachkit.data.parallel.ParallelText.token_targets`), so every per-sample loss is a
  per-token loss. Asked for fields by :meth:`request_outputs` (what :class:`~teachkit.models.Tapped` does for a
  loss that reads them), it returns a mapping instead: ``logits`` plus ``encoder_out`` (B, S, H),
  ``src_mask`` (B, S) bool (True at real tokens), ``decoder_hidden`` (N, H) packed like the logits (the output
  projection's input). The ``embedding`` tap names the output projection, so ``embedding`` is also the (N, H)
  decoder state each logit row is computed from.
- **incremental decoding** (:mod:`teachkit.models.decoding`): ``encode(src_ids) -> Encoded``, ``start(enc) ->
  state``, ``step(enc, state, tokens (B,)) -> (log-probabilities (B, V), state)`` for one position given the
  previous token (cached: the prefix is never recomputed), ``reorder(enc, state, index)`` selecting rows
  (beam search). Decoding runs in eval mode under ``torch.no_grad``.

Inputs may be int32 (how splits store them); models take ``.long()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data.parallel import BOS, EOS, PAD

#: the fields a translation model returns on request (besides ``logits``)
OUTPUT_FIELDS = ("encoder_out", "src_mask", "decoder_hidden")


@dataclass
class Encoded:
    """An encoded source batch: ``memory`` (B, S, H), ``src_mask`` (B, S) bool (True at real tokens) and any
    model-specific tensors (``extra``; the LSTM's final encoder states), all with the batch on dim 0."""

    memory: Tensor
    src_mask: Tensor
    extra: dict[str, Tensor] | None = None

    def select(self, index: Tensor) -> Encoded:
        extra = None if self.extra is None else {k: v.index_select(0, index) for k, v in self.extra.items()}
        return Encoded(self.memory.index_select(0, index), self.src_mask.index_select(0, index), extra)


def pack(t: Tensor, mask: Tensor) -> Tensor:
    """(B, T, ...) -> (N, ...): the positions where ``mask`` (B, T) is True, row-major."""
    return t[mask]


class Seq2Seq(nn.Module):
    """Base class of translation models (see the module docstring). Subclasses implement :meth:`encode`,
    :meth:`start`, :meth:`step`, :meth:`reorder` and :meth:`decode_train` (the teacher-forced decoder:
    (B, T, H) hidden states before the output projection ``self.output``)."""

    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self._fields: frozenset[str] = frozenset()

    # -- structured outputs on request ----------------------------------------------------------------------
    def request_outputs(self, names: Iterable[str]) -> None:
        """Return a mapping with these fields (and ``logits``) from the next calls; an empty set: logits only."""
        self._fields = frozenset(names)

    # -- training --------------------------------------------------------------------------------------------
    def forward(self, src_ids: Tensor | Mapping[str, Tensor], tgt_in: Tensor | None = None) -> Any:
        """Packed logits (or the requested fields) for ``src_ids`` and ``tgt_in``, given as tensors or as one
        mapping holding both (a batch's inputs: ``model(batch.x)`` and ``model(**batch.x)`` are the same)."""
        if isinstance(src_ids, Mapping):
            src_ids, tgt_in = src_ids["src_ids"], src_ids["tgt_in"]
        if tgt_in is None:
            raise TypeError(f"{type(self).__name__} needs the target input tgt_in (teacher forcing) besides src_ids")
        src_ids, tgt_in = src_ids.long(), tgt_in.long()
        enc = self.encode(src_ids)
        hidden = self.decode_train(enc, tgt_in)  # (B, T, H)
        mask = tgt_in != PAD
        packed = pack(hidden, mask)
        logits = self.output(packed)
        if not self._fields:
            return logits
        out: dict[str, Tensor] = {"logits": logits}
        if "encoder_out" in self._fields:
            out["encoder_out"] = enc.memory
        if "src_mask" in self._fields:
            out["src_mask"] = enc.src_mask
        if "decoder_hidden" in self._fields:
            out["decoder_hidden"] = packed
        return out

    # -- to implement ------------------------------------------------------------------------------------------
    output: nn.Module

    def encode(self, src_ids: Tensor) -> Encoded:
        raise NotImplementedError

    def decode_train(self, enc: Encoded, tgt_in: Tensor) -> Tensor:
        raise NotImplementedError

    def start(self, enc: Encoded) -> Any:
        raise NotImplementedError

    def step(self, enc: Encoded, state: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def reorder(self, enc: Encoded, state: Any, index: Tensor) -> tuple[Encoded, Any]:
        raise NotImplementedError


def source_mask(src_ids: Tensor) -> Tensor:
    """(B, S) bool, True at real (non-PAD) source tokens."""
    return src_ids != PAD


def is_seq2seq(model: nn.Module) -> bool:
    """True for translation models (they decode incrementally)."""
    return isinstance(model, Seq2Seq) or all(hasattr(model, n) for n in ("encode", "start", "step", "reorder"))


@torch.no_grad()
def check_incremental(model: Seq2Seq, src_ids: Tensor, tgt_in: Tensor, atol: float = 1e-5) -> float:
    """Largest difference between teacher-forced log-probabilities and step-by-step ones on the same prefix
    (a cache bug shows here); for tests and debugging."""
    was = model.training
    model.eval()
    try:
        full = torch.log_softmax(model(src_ids, tgt_in).float(), dim=-1)
        enc = model.encode(src_ids.long())
        state = model.start(enc)
        rows = []
        for t in range(tgt_in.shape[1]):
            logp, state = model.step(enc, state, tgt_in[:, t].long())
            rows.append(logp.float())
        steps = torch.stack(rows, dim=1)[tgt_in != PAD]
    finally:
        model.train(was)
    return float((full - steps).abs().max()) if full.numel() else 0.0
