"""Batched augmentation: each output must be a valid padded crop (maybe flipped) of its input: reflect-padded, or
zero-padded in raw pixels as torchvision's ``RandomCrop(32, padding=4)`` before ``ToTensor`` + ``Normalize``."""

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
    out = Augment(crop_pad=2, pad_mode="reflect")(x, gen(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    seen = set()
    for i in range(len(x)):
        hits = matching_offsets(out[i], x[i], 2)
        assert len(hits) == 1, f"sample {i} is not a reflect-padded crop of its input"
        seen.add(hits[0])
    assert seen == {(dy, dx) for dy in range(5) for dx in range(5)}  # every offset drawn, each sample its own


def test_reflect_not_zero_or_replicate_padding() -> None:
    x = torch.arange(1.0, 10.0).view(1, 1, 3, 3).expand(64, 1, 3, 3).contiguous()
    out = Augment(crop_pad=1, pad_mode="reflect")(x, gen(2))
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
    out = Augment(crop_pad=1, flip=True, pad_mode="reflect")(x, gen(4))
    n_flipped = 0
    for i in range(len(x)):
        plain = matching_offsets(out[i], x[i], 1)
        mirrored = matching_offsets(out[i].flip(-1), x[i], 1)
        assert len(plain) + len(mirrored) == 1
        n_flipped += len(mirrored)
    assert 90 <= n_flipped <= 210


def test_sequences_crop_and_flip_along_length() -> None:
    x = torch.randn(200, 2, 9)
    out = Augment(crop_pad=3, flip=True, pad_mode="reflect")(x, gen(5))
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
        Augment(crop_pad=4, pad_mode="reflect")(torch.randn(2, 1, 4, 4), gen())
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


def normalised_splits(raw: torch.Tensor, default: str = "crop_flip") -> Splits:
    """Splits of ``raw`` (N, C, ...) normalised per channel by hand, as teachkit's loader does before augmenting."""
    dims = [0, *range(2, raw.dim())]
    mean, std = raw.mean(dim=dims), raw.std(dim=dims)
    view = (1, -1) + (1,) * (raw.dim() - 2)
    s = TensorSplit((raw - mean.view(view)) / std.view(view), torch.zeros(len(raw), dtype=torch.long))
    return Splits("t", s, s, s, num_classes=2, default_augment=default, mean=mean, std=std)


def test_zero_padding_is_torchvision_random_crop_on_the_raw_image_then_normalise() -> None:
    """torchvision (RepDistiller): RandomCrop(32, padding=4) pads the raw image with 0, crops, flips, then
    ToTensor + Normalize; so a padded pixel is -mean/std after normalisation. Recomputed here per sample from the
    raw image with F.pad(constant 0) and slicing, with the offsets and coins drawn in the documented order."""
    raw = torch.rand(64, 3, 32, 32)
    splits = normalised_splits(raw)
    aug = make_augment("auto", splits)
    assert aug is not None and (aug.crop_pad, aug.flip, aug.pad_mode) == (4, True, "zeros")
    out = aug(splits.train.x, gen(11))
    g = gen(11)
    offsets = torch.randint(0, 9, (64, 2), generator=g)
    flips = torch.rand(64, generator=g) < 0.5
    mean, std = splits.mean.view(3, 1, 1), splits.std.view(3, 1, 1)
    for i in range(64):
        oy, ox = offsets[i].tolist()
        crop = F.pad(raw[i], (4, 4, 4, 4), mode="constant", value=0.0)[:, oy:oy + 32, ox:ox + 32]
        crop = crop.flip(-1) if flips[i] else crop
        assert torch.equal(out[i], (crop - mean) / std), f"sample {i}"
    corner = out[offsets.sum(1).argmin()]  # the smallest offsets: most padding at the top left
    assert torch.equal(corner[:, 0, 0], (0 - splits.mean) / splits.std) and bool((splits.mean > 0).all())


def test_zero_padding_of_unnormalised_sequences_is_zero() -> None:
    x = torch.rand(50, 2, 9) + 1.0  # no zeros inside
    out = Augment(crop_pad=3, flip=False)(x, gen(12))  # pad_mode="zeros" is the default
    offsets = torch.randint(0, 7, (50, 1), generator=gen(12))
    for i in range(50):
        o = int(offsets[i])
        assert torch.equal(out[i], F.pad(x[i], (3, 3))[:, o:o + 9])
    assert bool((out == 0).any()) and bool(((out == 0) | (out >= 1)).all())


def test_reflect_and_zeros_share_offsets_and_differ_only_in_the_border() -> None:
    x = torch.rand(40, 1, 6, 6) + 1.0
    zeros, reflect = (Augment(crop_pad=2, flip=True, pad_mode=m)(x, gen(13)) for m in ("zeros", "reflect"))
    padded = zeros == 0
    assert bool(padded.any()) and torch.equal(zeros[~padded], reflect[~padded])
    assert not bool((reflect == 0).any())


def test_pad_mode_option_reaches_the_augmentation_and_its_cache_key() -> None:
    from teachkit.data import DataConfig
    from teachkit.options import from_mapping

    splits = normalised_splits(torch.rand(4, 3, 8, 8))
    default = from_mapping(DataConfig, {"name": "synthetic"}, "data")
    chosen = from_mapping(DataConfig, {"name": "synthetic", "augment_options": {"pad_mode": "reflect"}}, "data")
    zeros = make_augment("crop", splits, default.augment_options)
    reflect = make_augment("crop", splits, chosen.augment_options)
    assert zeros is not None and reflect is not None
    assert (zeros.pad_mode, reflect.pad_mode) == ("zeros", "reflect") and reflect.fill is None
    assert zeros.fill is not None and torch.equal(zeros.fill, (0 - splits.mean) / splits.std)
    assert repr(zeros) != repr(reflect) and "pad_mode='zeros', fill=[" in repr(zeros)
    assert repr(make_augment("flip", splits, chosen.augment_options)) == "Augment(crop_pad=0, flip=True)"
    with pytest.raises(ConfigError, match=r"^data\.augment_options\.pad_mode='mirror' is not allowed; choose one "
                                          r"of: zeros, reflect$"):
        from_mapping(DataConfig, {"name": "synthetic", "augment_options": {"pad_mode": "mirror"}}, "data")
    with pytest.raises(ConfigError, match="pad_mode='edge' is not allowed; choose one of: zeros, reflect"):
        Augment(crop_pad=1, pad_mode="edge")


def test_run_batches_pad_as_configured(tiny) -> None:
    from teachkit.recipes.context import RunContext

    for mode in ("zeros", "reflect"):
        ctx = RunContext.open(tiny(name=mode, data={"augment": "crop", "augment_options": {"pad_mode": mode}}))
        aug = ctx.batches().augment
        assert aug is not None and aug.pad_mode == mode and aug.crop_pad == 1
        assert (aug.fill is not None) == (mode == "zeros")
