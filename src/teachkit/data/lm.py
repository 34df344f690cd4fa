"""Token rows for causal language models: :class:`LMText` (the ``x`` of every split), :class:`LMInfo` (what its
splits share) and :class:`LMBatchLoader` (batches by token count).

A row is one token sequence, ``ids[i, :lengths[i]]`` (right-padded with ``info.pad_id``), whose tokens from
``starts[i]`` on are TARGETS (``1 <= starts[i] < lengths[i] <= L``): for plain text every token after the first
of its block; for a prompt and its response the response tokens and EOS (``starts`` = the prompt's length), so
the loss counts response tokens only (Ouyang et al. 2022's supervised fine-tuning; Kim & Rush 2016's
sequence-level KD trains on ``with_responses`` of a teacher). ``row_ids`` index ``info.references`` (the
reference responses, for exact match; for plain text the documents the blocks were cut from).

As a mapping ``x`` is a causal LM's input, ``model(**x)``: ``input_ids``, ``attention_mask`` and ``target_mask``
(True at the positions whose NEXT token is a target: ``starts - 1 <= p < lengths - 1``). The model returns one
logit row per True position, row-major, so its row r predicts ``x.token_targets()[r]`` and every per-sample loss
of teachkit is a per-token loss, as for translation (:mod:`teachkit.data.parallel`). A teacher with another
tokenizer reads its own tokenisation of the same rows (``t_ids``, ``t_lengths``, ``t_starts``), exposed under
the ``teacher.`` prefix (:func:`teachkit.data.text.tokenisation`), as Universal Logit Distillation needs
(Boizard et al. 2024).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from teachkit.data.parallel import TokenBatchLoader
from teachkit.data.raw import RawDataset
from teachkit.data.text import TEACHER_PREFIX

#: the task of causal language modelling (its evaluator: perplexity, token accuracy, exact match)
CAUSAL_LM = "causal_lm"
#: ``LMInfo.kind`` of plain text (blocks of documents) and of prompt / response rows
KINDS = ("text", "prompt_response")


@dataclass(eq=False)
class LMInfo:
    """What every split of one causal-LM dataset shares (see the module docstring)."""

    #: the student's tokenizer (a Hugging Face fast tokenizer)
    tokenizer: Any
    #: per prefix group (``""``, ``teacher.``) the tokenizer's ``{"name", "sha256"}`` (as ``TextInfo.tokenizers``)
    tokenizers: dict[str, dict[str, str]]
    pad_id: int
    eos_id: int
    bos_id: int | None
    #: ``text`` (blocks of documents) or ``prompt_response``
    kind: str
    #: the longest row, in tokens (prompt and response together)
    max_length: int
    #: training batches: at most this many padded tokens (None: ``data.batch_size`` rows per batch)
    max_tokens: int | None = None
    #: how many tokens a model may generate for a prompt when evaluated
    max_new_tokens: int = 64
    #: the reference response of each row id (plain text: the document each block was cut from)
    references: tuple[str, ...] = ()
    #: counts and facts for the run summary (rows per split, lines skipped, responses cut, tokenizer)
    notes: dict[str, Any] = field(default_factory=dict)
    #: files a run keeps in its folder (name -> text): ``tokenizer.json`` and ``tokenizer_config.json``
    artifacts: dict[str, str] = field(default_factory=dict)
    #: the teacher's own tokenizer when the rows carry a teacher tokenisation
    teacher_tokenizer: Any = None
    teacher_pad_id: int | None = None

    def text(self, ids: Sequence[int] | Tensor) -> str:
        """The text of token ids up to the first EOS, special tokens skipped."""
        seq = [int(t) for t in (ids.tolist() if isinstance(ids, Tensor) else ids)]
        if self.eos_id in seq:
            seq = seq[:seq.index(self.eos_id)]
        return self.tokenizer.decode(seq, skip_special_tokens=True)


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, dtype: torch.dtype = torch.int32) -> tuple[Tensor, Tensor]:
    """Token lists as an (N, longest) tensor right-padded with ``pad_id``, and their lengths (N,) int64."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    width = int(lengths.max()) if len(rows) else 1
    out = torch.full((len(rows), width), pad_id, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out, lengths


def ragged(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token lists as (their ids one after the other, int32; their lengths, int64)."""
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
    return flat, lengths


def padded(flat: np.ndarray, lengths: np.ndarray, pad_id: int) -> Tensor:
    """The (N, longest) int32 tensor of ragged rows (:func:`ragged`), right-padded with ``pad_id``."""
    width = max(1, int(lengths.max())) if lengths.size else 1
    out = np.full((lengths.shape[0], width), pad_id, dtype=np.int32)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat
    return torch.from_numpy(out)


def _take(columns: Mapping[str, Any], name: str, a: int, b: int, pad: int) -> tuple[Tensor, Tensor]:
    """Rows ``a:b`` of the ragged column ``name``: padded ids and lengths."""
    flat, lengths = columns[name]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    part = np.asarray(lengths[a:b], dtype=np.int64)
    return padded(flat[offsets[a]:offsets[b]], part, pad), torch.from_numpy(part.copy())


def _vector(columns: Mapping[str, Any], name: str, a: int, b: int) -> Tensor:
    return torch.from_numpy(np.array(columns[name][a:b], dtype=np.int64))


def lm_splits(columns: Mapping[str, Any], info: LMInfo) -> dict[str, LMText]:
    """``train`` / ``val`` / ``test`` :class:`LMText` s of rows stored split after split: ``split`` (N,) codes
    0/1/2 (ascending), ``ids`` ragged (:func:`ragged`), ``starts`` and ``row_id`` (N,); optionally ``t_ids``
    (ragged) and ``t_starts``."""
    bounds = np.searchsorted(np.asarray(columns["split"]), np.arange(4), side="left")
    out = {}
    for code, part in enumerate(("train", "val", "test")):
        a, b = int(bounds[code]), int(bounds[code + 1])
        ids, lengths = _take(columns, "ids", a, b, info.pad_id)
        teacher = {}
        if "t_ids" in columns:
            t_pad = info.teacher_pad_id if info.teacher_pad_id is not None else 0
            t_ids, t_lengths = _take(columns, "t_ids", a, b, t_pad)
            teacher = {"t_ids": t_ids, "t_lengths": t_lengths, "t_starts": _vector(columns, "t_starts", a, b)}
        out[part] = LMText(ids, lengths, _vector(columns, "starts", a, b), _vector(columns, "row_id", a, b), info,
                           **teacher)
    return out


def _positions(ids: Tensor) -> Tensor:
    return torch.arange(ids.shape[1], device=ids.device)[None, :]


def _trim(ids: Tensor, lengths: Tensor) -> Tensor:
    """``ids`` cut to the longest of ``lengths`` (at least one column)."""
    width = int(lengths.max()) if lengths.numel() else 1
    return ids[:, :max(1, width)]


def check_rows(ids: Tensor, lengths: Tensor, starts: Tensor, what: str = "rows") -> None:
    """ValueError unless ``1 <= starts < lengths <= ids.shape[1]`` on every row (a bug of the code building
    them, never a user's mistake: sources check their input first)."""
    if ids.dim() != 2 or lengths.shape != (ids.shape[0],) or starts.shape != (ids.shape[0],):
        raise ValueError(f"{what}: ids (N, L), lengths (N,) and starts (N,) needed; got {tuple(ids.shape)}, "
                         f"{tuple(lengths.shape)}, {tuple(starts.shape)}")
    bad = (starts < 1) | (starts >= lengths) | (lengths > ids.shape[1])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{what}: row {i} has starts {int(starts[i])}, length {int(lengths[i])}, width "
                         f"{ids.shape[1]}; needed 1 <= starts < length <= width")


class LMText(Mapping[str, Tensor]):
    """Token rows of a causal-LM split (see the module docstring). ``x[key]`` is an input column, ``x[rows]``
    (int, slice, list, tensor) the rows trimmed to their longest (each tokenisation to its own)."""

    def __init__(self, ids: Tensor, lengths: Tensor, starts: Tensor, row_ids: Tensor, info: LMInfo, *,
                 t_ids: Tensor | None = None, t_lengths: Tensor | None = None,
                 t_starts: Tensor | None = None) -> None:
        n = ids.shape[0] if ids.dim() == 2 else -1
        if ids.dim() != 2 or lengths.shape != (n,) or starts.shape != (n,) or row_ids.shape != (n,):
            raise ValueError(f"LMText needs ids (N, L), lengths, starts and row_ids (N,); got {tuple(ids.shape)}, "
                             f"{tuple(lengths.shape)}, {tuple(starts.shape)}, {tuple(row_ids.shape)}")
        teacher = (t_ids, t_lengths, t_starts)
        if any(t is None for t in teacher) and any(t is not None for t in teacher):
            raise ValueError("LMText: t_ids, t_lengths and t_starts are given together or not at all")
        if t_ids is not None and (t_ids.dim() != 2 or t_ids.shape[0] != n):
            raise ValueError(f"LMText: t_ids must be ({n}, T), got {tuple(t_ids.shape)}")
        self.ids, self.lengths, self.starts, self.row_ids, self.info = ids, lengths, starts, row_ids, info
        self.t_ids, self.t_lengths, self.t_starts = t_ids, t_lengths, t_starts
        self.num_rows = int(n)

    @property
    def has_teacher(self) -> bool:
        """True when the rows carry a teacher's own tokenisation."""
        return self.t_ids is not None

    def validate(self) -> None:
        """ValueError unless both tokenisations keep ``1 <= starts < lengths <= L`` on every row."""
        check_rows(self.ids, self.lengths, self.starts, "LMText")
        if self.t_ids is not None:
            check_rows(self.t_ids, self.t_lengths, self.t_starts, "LMText teacher tokenisation")  # type: ignore

    # -- the mapping of model inputs -------------------------------------------------------------------------
    KEYS = ("input_ids", "attention_mask", "target_mask")

    def __iter__(self) -> Iterator[str]:
        yield from self.KEYS
        if self.has_teacher:
            yield from (TEACHER_PREFIX + k for k in self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS) * (2 if self.has_teacher else 1)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, str):
            return self.rows(key)
        side = (self.ids, self.lengths, self.starts)
        name = key
        if key.startswith(TEACHER_PREFIX) and self.has_teacher:
            side, name = (self.t_ids, self.t_lengths, self.t_starts), key[len(TEACHER_PREFIX):]  # type: ignore
        ids, lengths, starts = side
        if name == "input_ids":
            return ids
        if name == "attention_mask":
            return (_positions(ids) < lengths[:, None]).long()
        if name == "target_mask":
            pos = _positions(ids)
            return (pos >= starts[:, None] - 1) & (pos < lengths[:, None] - 1)
        raise KeyError(key)

    @property
    def inputs(self) -> dict[str, Tensor]:
        """The model inputs as a dict (the mapping's keys)."""
        return {k: self[k] for k in self}

    @property
    def side(self) -> dict[str, Tensor]:
        return {"row_ids": self.row_ids}

    @property
    def vocabulary_digest(self) -> str:
        """sha256 of the student tokenizer's vocabulary (checkpoints record it)."""
        return self.info.tokenizers[""]["sha256"]

    @property
    def data_notes(self) -> dict[str, Any]:
        """What reading the data did (rows, lines skipped, responses cut, tokenizer): kept in checkpoints."""
        return dict(self.info.notes)

    @property
    def artifacts(self) -> dict[str, str]:
        """Files a run on this data keeps in its folder (the tokenizer built here)."""
        return dict(self.info.artifacts)

    # -- tensor-like -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """(rows, padded length)."""
        return self.num_rows, int(self.ids.shape[1])

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def dtype(self) -> torch.dtype:
        return self.ids.dtype

    def is_floating_point(self) -> bool:
        return False

    def dim(self) -> int:
        return 2

    def _map(self, fn: Any) -> LMText:
        teacher = {} if not self.has_teacher else {"t_ids": fn(self.t_ids), "t_lengths": fn(self.t_lengths),
                                                   "t_starts": fn(self.t_starts)}
        return LMText(fn(self.ids), fn(self.lengths), fn(self.starts), fn(self.row_ids), self.info, **teacher)

    def to(self, device: torch.device | str) -> LMText:
        return self._map(lambda t: t.to(device))

    def rows(self, index: Any) -> LMText:
        """The selected rows, each tokenisation trimmed to its longest selected row."""
        if isinstance(index, int):
            index = index + self.num_rows if index < 0 else index
            index = slice(index, index + 1)
        if isinstance(index, list):
            index = torch.as_tensor(index, dtype=torch.long)
        if isinstance(index, Tensor):
            index = index.to(self.ids.device)
        out = self._map(lambda t: t[index])
        out.ids = _trim(out.ids, out.lengths)
        if out.has_teacher:
            out.t_ids = _trim(out.t_ids, out.t_lengths)  # type: ignore[arg-type]
        return out

    # -- targets ---------------------------------------------------------------------------------------------
    def token_targets(self) -> Tensor:
        """The targets packed: (N_tokens,) int64, ``ids[i, starts[i]:lengths[i]]`` row after row."""
        pos = _positions(self.ids)
        return self.ids[(pos >= self.starts[:, None]) & (pos < self.lengths[:, None])].long()

    def tgt_lengths(self) -> Tensor:
        """Targets per row (N,): ``lengths - starts``."""
        return self.lengths - self.starts

    def teacher_tgt_lengths(self) -> Tensor:
        """Targets per row of the teacher tokenisation (N,)."""
        if not self.has_teacher:
            raise ValueError("these rows carry no teacher tokenisation (dataset option teacher_tokenizer)")
        return self.t_lengths - self.t_starts  # type: ignore[operator]

    def prompts(self) -> tuple[Tensor, Tensor]:
        """(prompt ids (N, P) int64 right-padded with ``pad_id``, prompt lengths (N,) = ``starts``): what a model
        generates a response to."""
        width = int(self.starts.max()) if self.num_rows else 1
        ids = self.ids[:, :width].long()
        return ids.masked_fill(_positions(ids) >= self.starts[:, None], self.info.pad_id), self.starts.clone()

    def with_responses(self, responses: Sequence[Sequence[int]] | Tensor) -> LMText:
        """Each row's prompt followed by ``responses[i]`` (cut after its first EOS, EOS appended when missing; cut
        to ``info.max_length`` tokens keeping at least one target), without the teacher tokenisation: a
        teacher's responses for sequence-level KD, the student's own for on-policy distillation."""
        if len(responses) != self.num_rows:
            raise ValueError(f"{len(responses)} responses for {self.num_rows} rows")
        eos, limit = self.info.eos_id, self.info.max_length
        ids, starts = self.ids.cpu(), self.starts.cpu().tolist()
        rows = []
        for i, response in enumerate(responses):
            tokens = [int(t) for t in (response.tolist() if isinstance(response, Tensor) else response)]
            tokens = tokens[:tokens.index(eos) + 1] if eos in tokens else [*tokens, eos]
            rows.append(ids[i, :starts[i]].tolist() + tokens[:max(1, limit - starts[i])])
        new, lengths = pad_rows(rows, self.info.pad_id, self.ids.dtype)
        device = self.ids.device
        return LMText(new.to(device), lengths.to(device), self.starts.clone(), self.row_ids, self.info)

    def bucket_lengths(self) -> tuple[Tensor, Tensor]:
        """(the teacher tokenisation's lengths when the rows carry one, else the lengths; the lengths): what batches
        sort rows by and pad to (the longer of the two)."""
        other = self.t_lengths if self.t_lengths is not None else self.lengths
        return other, self.lengths

    def batch_source(self, batch_size: int, shuffle: bool, seed: int) -> LMBatchLoader:
        """The batches of a split holding these rows: :class:`LMBatchLoader` with ``info.max_tokens``."""
        return LMBatchLoader(self, batch_size, shuffle, seed, self.info.max_tokens)

    def __repr__(self) -> str:
        teacher = f", teacher {tuple(self.t_ids.shape)}" if self.t_ids is not None else ""
        return (f"LMText({self.num_rows} rows, ids {tuple(self.ids.shape)}{teacher}, {self.info.kind}, "
                f"vocab {len(self.info.tokenizer)})")


#: Training batches of an :class:`LMText` split (:class:`~teachkit.data.parallel.TokenBatchLoader`): rows sorted by
#: length (ties by a seeded draw), cut into batches of at most ``batch_size`` rows and ``max_tokens`` padded tokens
#: (rows x the longest row, the longer tokenisation when a teacher's is carried), visited in a seeded order per
#: epoch; ``Batch(rows, rows.token_targets(), index)``. The batches are fixed, their order a function of (seed,
#: epoch).
LMBatchLoader = TokenBatchLoader


def lm_dataset(name: str, parts: Mapping[str, LMText], warnings: Sequence[str] = ()) -> RawDataset:
    """The RawDataset of ``train`` / ``val`` / ``test`` :class:`LMText` splits sharing one :class:`LMInfo`: each
    ``y`` is its rows' ids (the vocabulary check of sequence tasks), ``num_classes`` the vocabulary size."""
    for part, x in parts.items():
        x.validate()
        if x.num_rows == 0:
            raise ValueError(f"dataset {name!r}: the {part} split holds no rows")
    train = parts["train"]
    val, test = parts.get("val"), parts.get("test")
    return RawDataset(train, train.ids, test, None if test is None else test.ids,
                      num_classes=len(train.info.tokenizer), default_augment="none", task=CAUSAL_LM, name=name,
                      val_x=val, val_y=None if val is None else val.ids, warnings=list(warnings))
