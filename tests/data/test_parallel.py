"""Parallel text (teachkit.data.parallel): the vocabulary, ParallelText's rows / targets / teacher-forcing input,
TokenBatchLoader's batches by token count, and micro-batching of a translation batch."""

from __future__ import annotations

import pytest
import torch

from teachkit.data.parallel import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    DecodeOptions,
    ParallelText,
    TokenBatchLoader,
    TranslationInfo,
    Vocab,
    length_buckets,
    merge_units,
    shift_right,
)
from teachkit.data.raw import RawDataset
from teachkit.errors import ConfigError, DataError
from teachkit.types import Batch


def make_text(n: int = 40, seed: int = 0, max_src: int = 12, max_tgt: int = 15, vocab: int = 30) -> ParallelText:
    """N random pairs: lengths 1..max (EOS last), ids in 4..vocab-1, padded right with PAD."""
    g = torch.Generator().manual_seed(seed)
    src_len = torch.randint(1, max_src + 1, (n,), generator=g)
    tgt_len = torch.randint(1, max_tgt + 1, (n,), generator=g)

    def side(lengths: torch.Tensor, width: int) -> torch.Tensor:
        ids = torch.randint(4, vocab, (n, width), generator=g, dtype=torch.int32)
        pos = torch.arange(width).expand(n, width)
        ids[pos == (lengths - 1)[:, None]] = EOS
        ids[pos >= lengths[:, None]] = PAD
        return ids

    info = TranslationInfo(Vocab((*SPECIALS, *(f"w{i}" for i in range(4, vocab)))),
                           target_texts=[f"line {i}" for i in range(n)])
    return ParallelText(side(src_len, max_src + 3), side(tgt_len, max_tgt + 2), torch.arange(n), info)


# -- vocabulary ----------------------------------------------------------------------------------------------------
def test_vocab_build_encode_decode_and_json_round_trip():
    vocab = Vocab.build({"b": 3, "a": 3, "c": 5, "rare": 1, "<pad>": 9}, min_freq=2)
    assert vocab.tokens == (*SPECIALS, "c", "a", "b")  # count desc, ties alphabetical, specials not counted twice
    assert len(vocab) == 7 and vocab.id("c") == 4 and vocab.id("rare") == UNK
    assert vocab.encode(["a", "zzz", "c"]) == [5, UNK, 4]
    assert vocab.decode([BOS, 5, 6, PAD, 4, EOS, 4]) == ["a", "b", "c"]  # stops at EOS, drops PAD and BOS
    assert vocab.decode(torch.tensor([4, 99])) == ["c", "<unk>"]
    again = Vocab.from_json(vocab.to_json())
    assert again.tokens == vocab.tokens and again.digest == vocab.digest
    assert Vocab.build({"x": 1, "y": 2, "z": 3}, max_size=5).tokens == (*SPECIALS, "z")
    assert Vocab.build({"x": 1}).digest != vocab.digest


@pytest.mark.parametrize("bad, match", [
    (lambda: Vocab(("a", "b")), "special tokens"),
    (lambda: Vocab((*SPECIALS, "a", "a")), "twice"),
    (lambda: Vocab.from_json("not json", "vocab.json"), "vocab.json is not a teachkit vocabulary"),
    (lambda: Vocab.from_json('{"tokens": [1, 2]}'), "not a teachkit vocabulary"),
])
def test_vocab_errors_are_one_line(bad, match):
    with pytest.raises(DataError, match=match) as e:
        bad()
    assert "\n" not in str(e.value)


def test_merge_units_and_info_text():
    assert merge_units(["lo@@", "w@@", "er", "case"]) == "lower case"
    assert merge_units(["end@@"]) == "end"
    assert merge_units([]) == ""
    info = TranslationInfo(Vocab((*SPECIALS, "lo@@", "w", "x")))
    assert info.text(torch.tensor([4, 5, 6, EOS, 6])) == "low x"


def test_decode_options_are_checked():
    assert DecodeOptions().describe() == "greedy"
    assert DecodeOptions("beam", beam=4, length_penalty=0.6).describe() == "beam 4, length penalty 0.6"
    for kwargs in ({"strategy": "sample"}, {"beam": 0}, {"beam": True}, {"max_len_a": -1}, {"max_len_b": 0}):
        with pytest.raises(ConfigError):
            DecodeOptions(**kwargs)


# -- ParallelText ----------------------------------------------------------------------------------------------------
def test_rows_are_trimmed_to_their_longest_sequences():
    x = make_text()
    idx = torch.tensor([3, 7, 11])
    part = x[idx]
    assert isinstance(part, ParallelText) and part.num_rows == 3 and part.info is x.info
    src_len, tgt_len = x.src_lengths()[idx], x.tgt_lengths()[idx]
    assert part.src.shape == (3, int(src_len.max())) and part.tgt.shape == (3, int(tgt_len.max()))
    assert torch.equal(part.src, x.src[idx, :part.src.shape[1]])
    assert torch.equal(part.row_ids, idx)
    assert not (x.src[idx, part.src.shape[1]:] != PAD).any()  # only padding was cut
    assert x[2:5].num_rows == 3 and x[[1, 2]].num_rows == 2 and x[4].num_rows == 1
    assert x.shape == (40, x.src.shape[1]) and x.dim() == 2 and not x.is_floating_point()


def test_token_targets_pack_the_non_pad_targets_row_major():
    x = make_text()
    packed = x.token_targets()
    expected = [int(t) for row in x.tgt for t in row if t != PAD]
    assert packed.dtype == torch.int64 and packed.tolist() == expected
    assert packed.shape[0] == int(x.tgt_lengths().sum())
    part = x[torch.tensor([5, 1])]
    assert part.token_targets().tolist() == [*x.tgt[5][x.tgt[5] != PAD].tolist(), *x.tgt[1][x.tgt[1] != PAD].tolist()]


def test_tgt_in_is_shifted_right_behind_bos_with_pad_where_the_target_is_pad():
    x = make_text()
    assert list(x) == ["src_ids", "tgt_in"] and len(x) == 2
    tgt_in = x["tgt_in"]
    assert torch.equal(x["src_ids"], x.src)
    assert (tgt_in[:, 0] == BOS).all()
    real = x.tgt != PAD
    assert torch.equal(tgt_in != PAD, real)  # the same positions are marked
    assert torch.equal(tgt_in[:, 1:][real[:, 1:]], x.tgt[:, :-1][real[:, 1:]])
    assert torch.equal(shift_right(torch.tensor([[7, 8, EOS, PAD]])), torch.tensor([[BOS, 7, 8, PAD]]))
    assert set(x.inputs) == {"src_ids", "tgt_in"} and torch.equal(x.side["row_ids"], x.row_ids)
    with pytest.raises(KeyError):
        x["input_ids"]


def test_with_targets_and_shape_checks():
    x = make_text(n=4)
    new = torch.full((4, 3), 9, dtype=torch.int64)
    y = x.with_targets(new)
    assert y.tgt.dtype == x.src.dtype and torch.equal(y.src, x.src) and y.token_targets().tolist() == [9] * 12
    with pytest.raises(ValueError):
        x.with_targets(new[:3])
    with pytest.raises(ValueError):
        ParallelText(x.src, x.tgt[:3], x.row_ids, x.info)


# -- batching --------------------------------------------------------------------------------------------------------
def _padded_tokens(b: Batch) -> int:
    return b.x.num_rows * max(b.x.src.shape[1], b.x.tgt.shape[1])


@pytest.mark.parametrize("batch_size, max_tokens", [(8, None), (100, 64), (5, 40), (1, None)])
def test_batches_cover_every_row_once_and_respect_the_limits(batch_size, max_tokens):
    x = make_text(n=57)
    loader = TokenBatchLoader(x, batch_size, shuffle=True, seed=3, max_tokens=max_tokens)
    for epoch in (0, 1):
        batches = list(loader.batches(epoch))
        assert len(batches) == len(loader)
        rows = torch.cat([b.index for b in batches])
        assert sorted(rows.tolist()) == list(range(57))
        for b in batches:
            assert b.size <= batch_size
            if max_tokens is not None:
                assert _padded_tokens(b) <= max_tokens
            assert torch.equal(b.y, b.x.token_targets())  # y: the packed targets of its rows
            assert torch.equal(b.x.row_ids, x.row_ids[b.index])
    assert loader.tokens() == int(x.tgt_lengths().sum())


def test_batches_group_similar_lengths():
    x = make_text(n=200, max_src=30, max_tgt=30)
    loader = TokenBatchLoader(x, 10, shuffle=True, seed=0)
    spread = [float(x.tgt_lengths()[b.index].max() - x.tgt_lengths()[b.index].min()) for b in loader.batches(0)]
    assert max(spread) <= 3  # sorted by target length: a batch spans few lengths


def test_batch_order_is_a_function_of_seed_and_epoch():
    x = make_text(n=120)

    def order(seed: int, epoch: int) -> list[list[int]]:
        return [b.index.tolist() for b in TokenBatchLoader(x, 8, True, seed, max_tokens=100).batches(epoch)]

    assert order(1, 0) == order(1, 0) and order(1, 5) == order(1, 5)
    assert order(1, 0) != order(1, 1)  # the order changes from epoch to epoch
    assert sorted(map(tuple, order(1, 0))) == sorted(map(tuple, order(1, 1)))  # the batches themselves do not
    assert order(1, 0) != order(2, 0)
    unshuffled = TokenBatchLoader(x, 8, False, 0)
    assert unshuffled.order(0) == unshuffled.order(7) == list(range(len(unshuffled)))


def test_max_tokens_below_the_longest_sequence_is_a_config_error():
    x = make_text(n=10, max_src=12)
    longest = int(torch.maximum(x.src_lengths(), x.tgt_lengths()).max())
    with pytest.raises(ConfigError, match=f"longest sequence of the split \\({longest} tokens\\)"):
        TokenBatchLoader(x, 4, max_tokens=longest - 1)
    x.info.max_tokens = 50
    assert x.batch_source(4, True, 0).max_tokens == 50


def test_length_buckets_cut_at_the_token_budget():
    src = torch.tensor([2, 2, 2, 9, 9, 3])
    tgt = torch.tensor([2, 2, 2, 9, 9, 3])
    batches = [b.tolist() for b in length_buckets(src, tgt, batch_size=10, max_tokens=9, generator=None)]
    assert batches == [[0, 1, 2], [5], [3], [4]]  # 3 x 2 fits 9, 4 x 3 would not; 9-token rows alone


def test_batch_rows_repack_the_targets_of_a_micro_batch():
    x = make_text(n=30)
    batch = max(TokenBatchLoader(x, 12, shuffle=True, seed=0).batches(0), key=lambda b: b.size)
    assert batch.items == int(batch.y.shape[0]) == int(batch.x.tgt_lengths().sum())
    chunks = batch.chunks(5)
    assert [c.size for c in chunks] == [5, 5, 2]
    for c in chunks:
        assert isinstance(c.x, ParallelText)
        assert torch.equal(c.y, c.x.token_targets())
        assert c.items == int(c.x.tgt_lengths().sum())
    assert torch.equal(torch.cat([c.y for c in chunks]), batch.y)
    assert sum(c.items for c in chunks) == batch.items


def test_raw_dataset_validates_translation_splits():
    x = make_text(n=6)
    raw = RawDataset(x, x.tgt, x, x.tgt, num_classes=30, task="translation", name="t")
    raw.validate()
    with pytest.raises(DataError, match="target ids must lie in 0..9"):
        RawDataset(x, x.tgt, None, None, num_classes=10, task="translation").validate()
    with pytest.raises(DataError, match="parallel text inputs"):
        RawDataset(torch.zeros(6, 3), x.tgt, None, None, num_classes=30, task="translation").validate()
    with pytest.raises(DataError, match="must be integer"):
        RawDataset(x, x.tgt[:, 0], None, None, num_classes=30, task="translation").validate()
