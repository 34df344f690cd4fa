"""Batched augmentation: each output must be a valid reflect-padded crop (maybe flipped) of its input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from teachkit.data import Augment, make_augment
from teachkit.data.base import Splits, TensorSplit
from teachkit.errors import ConfigError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def matching_offsets(out: torch.Tensor, src: torch.Tensor, pad: int) -> list[tuple[int, ...]]:
    """All offsets at which ``out`` (C, *S) equals a slice of ``src`` (C, *S) reflect-padded by ``pad``."""
    spatial = src.shape[1:]
    padded = F.pad(src[None], (pad, pad) * len(spatial), mode="reflect")[0]
    hits = []
    if len(spatial) == 1:
        for dx in range(2 * pad + 1):
            if torch.equal(padded[:, dx:dx + spatial[0]], out):
                hits.append((dx,))
        return hits
    for dy in range(2 * pad + 1):
        for dx in range(2 * pad + 1):
            if torch.equal(padded[:, dy:dy + spatial[0], dx:dx + spatial[1]], out):
                hits.append((dy, dx))
    return hits


def test_no_pad_no_flip_is_identity() -> None:
    x = torch.randn(5, 3, 4, 4)
    assert torch.equal(Augment()(x, gen()), x)
    seq = torch.randn(2, 1, 7)
    assert torch.equal(Augment(crop_pad=0, flip=False)(seq, gen()), seq)


def test_crop_is_a_reflect_padded_crop_with_per_sample_offsets() -> None:
    x = torch.randn(400, 2, 5, 6)  # distinct values: a crop matches at one offset only
    out = Augment(crop_pad=2)(x, gen(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    seen = set()
    for i in range(len(x)):
        hits = matching_offsets(out[i], x[i], 2)
        assert len(hits) == 1, f"sample {i} is not a reflect-padded crop of its input"
        seen.add(hits[0])
    assert seen == {(dy, dx) for dy in range(5) for dx in range(5)}  # every offset drawn, each sample its own


def test_reflect_not_zero_or_replicate_padding() -> None:
    x = torch.arange(1.0, 10.0).view(1, 1, 3, 3).expand(64, 1, 3, 3).contiguous()
    out = Augment(crop_pad=1)(x, gen(2))
    # reflect-padding [[1,2,3],[4,5,6],[7,8,9]] by 1, the crop at offset (0, 0) is [[5,4,5],[2,1,2],[5,4,5]]
    corner = torch.tensor([[5.0, 4, 5], [2, 1, 2], [5, 4, 5]])
    assert any(torch.equal(o[0], corner) for o in out)
    assert not (out == 0).any()


def test_flip_reverses_last_dim_for_about_half() -> None:
    x = torch.randn(400, 3, 4, 5)
    out = Augment(flip=True)(x, gen(3))
    flipped = [torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x, strict=True)]
    kept = [torch.equal(o, xi) for o, xi in zip(out, x, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 140 <= sum(flipped) <= 260


def test_crop_and_flip_together() -> None:
    x = torch.randn(300, 1, 6, 6)
    out = Augment(crop_pad=1, flip=True)(x, gen(4))
    n_flipped = 0
    for i in range(len(x)):
        plain = matching_offsets(out[i], x[i], 1)
        mirrored = matching_offsets(out[i].flip(-1), x[i], 1)
        assert len(plain) + len(mirrored) == 1
        n_flipped += len(mirrored)
    assert 90 <= n_flipped <= 210


def test_sequences_crop_and_flip_along_length() -> None:
    x = torch.randn(200, 2, 9)
    out = Augment(crop_pad=3, flip=True)(x, gen(5))
    assert out.shape == x.shape
    offsets = set()
    for i in range(len(x)):
        plain, mirrored = matching_offsets(out[i], x[i], 3), matching_offsets(out[i].flip(-1), x[i], 3)
        assert len(plain) + len(mirrored) == 1
        offsets.update(plain)
    assert len(offsets) >= 5


def test_same_generator_seed_same_result() -> None:
    x = torch.randn(32, 3, 8, 8)
    aug = Augment(crop_pad=2, flip=True)
    assert torch.equal(aug(x, gen(7)), aug(x, gen(7)))
    assert not torch.equal(aug(x, gen(7)), aug(x, gen(8)))


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        Augment(crop_pad=-1)
    with pytest.raises(ValueError, match="smaller than"):
        Augment(crop_pad=4)(torch.randn(2, 1, 4, 4), gen())
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        Augment(flip=True)(torch.randn(2, 4), gen())


def splits_of(shape: tuple[int, ...], default: str = "none") -> Splits:
    s = TensorSplit(torch.zeros(2, *shape), torch.zeros(2, dtype=torch.long))
    return Splits("t", s, s, s, num_classes=2, default_augment=default)


def test_make_augment() -> None:
    cifar = splits_of((3, 32, 32), "crop_flip")
    a = make_augment("auto", cifar)
    assert isinstance(a, Augment) and (a.crop_pad, a.flip) == (4, True)
    assert make_augment("none", cifar) is None
    assert make_augment("auto", splits_of((1, 8, 8))) is None
    c = make_augment("crop", splits_of((1, 8, 8)))
    assert c is not None and (c.crop_pad, c.flip) == (1, False)
    f = make_augment("flip", splits_of((1, 28, 28)))
    assert f is not None and (f.crop_pad, f.flip) == (0, True)
    s = make_augment("crop_flip", splits_of((1, 40)))
    assert s is not None and (s.crop_pad, s.flip) == (5, True)
    with pytest.raises(ConfigError, match=r"unknown augment 'crops'.*crop_flip"):
        make_augment("crops", cifar)
    with pytest.raises(ConfigError, match=r"\(C, H, W\) or \(C, L\)"):
        make_augment("crop", splits_of((10,)))
