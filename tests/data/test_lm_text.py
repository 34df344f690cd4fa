"""Causal-LM rows (teachkit.data.lm): LMText's masks, packed targets, rows / trimming, prompts and responses, the
teacher tokenisation, the ragged storage, and LMBatchLoader's batches by token count."""

from __future__ import annotations

import pytest
import torch

from teachkit.data import lm_tokenizers as lmt
from teachkit.data.lm import (
    CAUSAL_LM,
    LMBatchLoader,
    LMInfo,
    LMText,
    check_rows,
    lm_dataset,
    lm_splits,
    pad_rows,
    padded,
    ragged,
)
from teachkit.data.raw import SEQUENCE_TASKS
from teachkit.data.text import tokenisation, tokenizer_of
from teachkit.errors import ConfigError
from teachkit.types import Batch

TOK = lmt.char_tokenizer(["abcdefgh"])  # <pad>=0 <s>=1 </s>=2 <unk>=3, a=4 .. h=11
A, B, C, D, E, F, G, H = range(4, 12)


def info(max_length: int = 8, teacher: bool = False, kind: str = "prompt_response") -> LMInfo:
    tokenizers = {"": lmt.tokenizer_entry("char", TOK)}
    if teacher:
        tokenizers["teacher."] = lmt.tokenizer_entry("byte", lmt.byte_tokenizer())
    return LMInfo(TOK, tokenizers, pad_id=0, eos_id=2, bos_id=1, kind=kind, max_length=max_length,
                  references=("r0", "r1", "r2"), teacher_tokenizer=lmt.byte_tokenizer() if teacher else None,
                  teacher_pad_id=0 if teacher else None)


def hand_rows(teacher: bool = False) -> LMText:
    """Three rows: [BOS a b | c EOS], [BOS d | e f g EOS], [BOS h | EOS] ('|' before the first target)."""
    rows = [[1, A, B, C, 2], [1, D, E, F, G, 2], [1, H, 2]]
    ids, lengths = pad_rows(rows, 0)
    extra = {}
    if teacher:  # a teacher tokenisation of other lengths: 2, 3, 4 targets
        t_ids, t_lengths = pad_rows([[1, 50, 60, 70, 2], [1, 80, 81, 82, 2], [1, 90, 91, 92, 93]], 0)
        extra = {"t_ids": t_ids, "t_lengths": t_lengths, "t_starts": torch.tensor([3, 2, 1])}
    return LMText(ids, lengths, torch.tensor([3, 2, 2]), torch.tensor([0, 1, 2]), info(teacher=teacher), **extra)


def random_rows(n: int = 50, width: int = 20, seed: int = 0, teacher: bool = False) -> LMText:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (n,), generator=g)
    starts = torch.stack([torch.randint(1, int(n_), (1,), generator=g)[0] for n_ in lengths])
    rows = [torch.randint(4, 12, (int(k),), generator=g).tolist() for k in lengths]
    ids, lengths = pad_rows(rows, 0)
    extra = {}
    if teacher:
        t_lengths = torch.randint(2, width + 6, (n,), generator=g)
        t_ids, t_lengths = pad_rows([[5] * int(k) for k in t_lengths], 0)
        extra = {"t_ids": t_ids, "t_lengths": t_lengths, "t_starts": torch.ones(n, dtype=torch.long)}
    return LMText(ids, lengths, starts, torch.arange(n), info(max_length=width, teacher=teacher), **extra)


# -- masks and packed targets ----------------------------------------------------------------------------------------
def test_masks_and_packed_targets_by_hand():
    x = hand_rows()
    x.validate()
    assert x.shape == (3, 6) and x.dim() == 2 and not x.is_floating_point() and x.dtype == torch.int32
    assert list(x) == ["input_ids", "attention_mask", "target_mask"] and len(x) == 3
    assert x["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    # positions whose NEXT token is a target: starts-1 <= p < lengths-1
    assert x["target_mask"].int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert x.token_targets().tolist() == [C, 2, E, F, G, 2, 2] and x.token_targets().dtype == torch.int64
    assert x.tgt_lengths().tolist() == [2, 4, 1] and int(x.tgt_lengths().sum()) == x.token_targets().numel()
    # a model's packed logits: row r comes from position p (row-major) and predicts ids[p + 1]
    nxt = torch.cat([x.ids[:, 1:], torch.zeros(3, 1, dtype=x.ids.dtype)], dim=1)
    assert torch.equal(nxt[x["target_mask"]].long(), x.token_targets())
    assert x.side["row_ids"].tolist() == [0, 1, 2] and set(x.inputs) == set(x.KEYS)
    with pytest.raises(KeyError):
        x["labels"]


def test_invariants_are_checked():
    ids, lengths = pad_rows([[1, A, 2], [1, B, 2]], 0)
    for starts in ([0, 1], [1, 3], [2, 3]):
        with pytest.raises(ValueError, match="starts"):
            LMText(ids, lengths, torch.tensor(starts), torch.arange(2), info()).validate()
    with pytest.raises(ValueError, match="width"):
        check_rows(ids[:, :2], lengths, torch.tensor([1, 1]))
    with pytest.raises(ValueError):
        LMText(ids, lengths[:1], torch.tensor([1, 1]), torch.arange(2), info())
    with pytest.raises(ValueError, match="together"):
        LMText(ids, lengths, torch.tensor([1, 1]), torch.arange(2), info(), t_ids=ids)


# -- rows ----------------------------------------------------------------------------------------------------------
def test_rows_are_trimmed_to_their_longest_and_index_like_a_tensor():
    x = hand_rows(teacher=True)
    sel = x.rows([2, 0])
    assert sel.shape == (2, 5) and sel.row_ids.tolist() == [2, 0] and sel.starts.tolist() == [2, 3]
    assert sel.t_ids.shape == (2, 5) and sel.t_lengths.tolist() == [5, 5]
    assert x[2].shape == (1, 3) and x[2].t_ids.shape == (1, 5) and x[-1].row_ids.tolist() == [2]
    assert x[0:2].shape == (2, 6) and x[torch.tensor([True, False, True])].row_ids.tolist() == [0, 2]
    assert torch.equal(x[1:].token_targets(), torch.tensor([E, F, G, 2, 2]))
    assert x["input_ids"] is x.ids and x.to("cpu").shape == x.shape
    empty = x.rows(torch.zeros(0, dtype=torch.long))
    assert empty.num_rows == 0 and empty.token_targets().numel() == 0


def test_teacher_tokenisation_keys():
    x = hand_rows(teacher=True)
    assert list(x) == ["input_ids", "attention_mask", "target_mask", "teacher.input_ids", "teacher.attention_mask",
                       "teacher.target_mask"]
    own = tokenisation(x, "teacher")
    assert set(own) == {"input_ids", "attention_mask", "target_mask"} and own["input_ids"] is x.t_ids
    assert own["target_mask"].int().tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 0], [1, 1, 1, 1, 0]]
    assert x.teacher_tgt_lengths().tolist() == [2, 3, 4]
    assert tokenisation(x, "student")["input_ids"] is x.ids
    assert tokenizer_of(x, "teacher")["name"] == "byte" and tokenizer_of(x, "student")["name"] == "char"
    assert x.vocabulary_digest == lmt.vocab_digest(TOK)
    with pytest.raises(ValueError, match="teacher"):
        hand_rows().teacher_tgt_lengths()


# -- prompts and responses -------------------------------------------------------------------------------------------
def test_prompts_are_padded_prefixes():
    ids, lengths = hand_rows().prompts()
    assert ids.dtype == torch.int64 and ids.tolist() == [[1, A, B], [1, D, 0], [1, H, 0]]
    assert lengths.tolist() == [3, 2, 2]


def test_with_responses_appends_eos_cuts_and_drops_the_teacher():
    x = hand_rows(teacher=True)
    y = x.with_responses([[D, 2, A, A], [E] * 10, torch.tensor([2, 0, 0])])
    assert not y.has_teacher and y.starts.tolist() == [3, 2, 2] and y.row_ids.tolist() == [0, 1, 2]
    rows = [y.ids[i, :y.lengths[i]].tolist() for i in range(3)]
    assert rows[0] == [1, A, B, D, 2]  # cut after its first EOS
    assert rows[1] == [1, D, *[E] * 6]  # max_length 8: cut, keeping the prompt
    assert rows[2] == [1, H, 2]  # an empty response: EOS alone
    y.validate()
    assert y.token_targets().tolist() == [D, 2, *[E] * 6, 2]
    short = LMText(x.ids, x.lengths, x.starts, x.row_ids, info(max_length=3))
    cut = short.with_responses([[A, B], [A], [A]])
    assert cut.lengths.tolist() == [4, 3, 3]  # at least one target even past max_length
    with pytest.raises(ValueError):
        x.with_responses([[A]])


def test_info_text_stops_at_eos_and_skips_specials():
    i = info()
    assert i.text([1, A, B, 2, C, 0]) == "ab" and i.text(torch.tensor([A, 3, C])) == "ac"


# -- storage and datasets ----------------------------------------------------------------------------------------------
def test_ragged_rows_round_trip_through_lm_splits():
    rows = [[1, A, 2], [1, B, C, 2], [1, 2], [1, D, E, F, 2]]
    flat, lengths = ragged(rows)
    assert flat.tolist() == [x for r in rows for x in r] and lengths.tolist() == [3, 4, 2, 5]
    assert padded(flat, lengths, 0)[1].tolist() == [1, B, C, 2, 0]
    columns = {"split": [0, 0, 1, 2], "ids": (flat, lengths), "starts": [1, 2, 1, 3], "row_id": [0, 1, 2, 3]}
    parts = lm_splits(columns, info())
    assert [parts[p].num_rows for p in ("train", "val", "test")] == [2, 1, 1]
    assert parts["train"].ids.tolist() == [[1, A, 2, 0], [1, B, C, 2]] and parts["test"].starts.tolist() == [3]
    raw = lm_dataset("demo", parts)
    raw.validate()
    assert raw.task == CAUSAL_LM in SEQUENCE_TASKS and raw.num_classes == len(TOK) == 12
    assert raw.train_y is parts["train"].ids


# -- batches --------------------------------------------------------------------------------------------------------
def test_batch_loader_is_reproducible_per_seed_and_epoch_and_keeps_the_budget():
    x = random_rows()
    loader = x.batch_source(batch_size=8, shuffle=True, seed=3)
    assert isinstance(loader, LMBatchLoader) and loader.max_tokens is None
    loader = LMBatchLoader(x, 8, shuffle=True, seed=3, max_tokens=60)
    first = list(loader.batches(0))
    again = list(LMBatchLoader(x, 8, shuffle=True, seed=3, max_tokens=60).batches(0))
    assert all(torch.equal(a.index, b.index) for a, b in zip(first, again, strict=True))
    assert [b.index.tolist() for b in loader.batches(1)] != [b.index.tolist() for b in first]
    seen = torch.cat([b.index for b in first]).sort().values
    assert torch.equal(seen, torch.arange(x.num_rows))
    for b in first:
        assert isinstance(b, Batch) and b.size <= 8 and b.x.shape[0] * b.x.shape[1] <= 60
        assert torch.equal(b.y, b.x.token_targets()) and b.items == b.y.numel()
        assert torch.equal(b.x.row_ids, x.row_ids[b.index])
    assert loader.tokens() == int(x.tgt_lengths().sum())
    assert LMBatchLoader(x, 8, shuffle=False).order(5) == list(range(len(LMBatchLoader(x, 8, shuffle=False))))
    with pytest.raises(ConfigError, match="max_tokens=10"):
        LMBatchLoader(x, 8, max_tokens=10)


def test_batch_budget_counts_the_longer_tokenisation():
    x = random_rows(teacher=True)
    loader = LMBatchLoader(x, 16, shuffle=True, seed=0, max_tokens=80)
    for b in loader.batches(0):
        assert b.x.shape[0] * max(b.x.shape[1], b.x.t_ids.shape[1]) <= 80
    chunk = next(iter(loader.batches(0))).rows(0, 1)  # micro-batching keeps the packed targets consistent
    assert torch.equal(chunk.y, chunk.x.token_targets())
