import pytest
import torch

from teachkit.data.strong_augment import (
    CUTOUT_FILL,
    OPS,
    RandAugmentParams,
    apply_params,
    auto_contrast,
    brightness,
    color,
    contrast,
    cutout,
    draw_params,
    equalize,
    posterize,
    rand_augment,
    rotate,
    sharpness,
    shear_x,
    shear_y,
    solarize,
    to_unit,
    translate_x,
    translate_y,
)

F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _ramp(h=4, w=4):
    """A (1, 1, h, w) image with levels 0, 1, ..., h*w - 1 over (h*w - 1), row by row."""
    return (torch.arange(h * w, dtype=F64) / (h * w - 1)).view(1, 1, h, w)


def _v(*values):
    return torch.tensor(values, dtype=F64)


def _params(op, magnitude, n=1, side=0.0):
    index = [name for name, _, _ in OPS].index(op)
    return RandAugmentParams(torch.full((n, 1), index), torch.full((n, 1), float(magnitude), dtype=F64),
                             torch.tensor([[side, 2.0, 2.0]] * n, dtype=F64))


# --- the batch transform --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 3, 8, 8), (4, 1, 7, 9), (2, 3, 2, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_shapes_dtype_and_finite(shape, dtype):
    x = torch.randn(*shape, generator=_gen(1), dtype=dtype)
    out = rand_augment(x, _gen())
    assert out.shape == x.shape and out.dtype == dtype and torch.isfinite(out).all()
    # the view stays in each image's own [min, max]
    lo, hi = x.amin(dim=(1, 2, 3)), x.amax(dim=(1, 2, 3))
    assert (out.amin(dim=(1, 2, 3)) >= lo - 1e-5).all() and (out.amax(dim=(1, 2, 3)) <= hi + 1e-5).all()


def test_deterministic_per_seed_and_each_sample_draws_its_own():
    x = torch.randn(32, 3, 8, 8, generator=_gen(2))
    assert torch.equal(rand_augment(x, _gen(5)), rand_augment(x, _gen(5)))
    assert not torch.equal(rand_augment(x, _gen(5)), rand_augment(x, _gen(6)))
    p = draw_params(256, 8, 8, _gen(0))
    assert p.ops.shape == p.magnitudes.shape == (256, 2) and p.cutout.shape == (256, 3)
    assert set(p.ops.flatten().tolist()) == set(range(len(OPS)))  # every op is drawn, with replacement
    lo = torch.tensor([o[1] for o in OPS], dtype=F64)[p.ops]
    hi = torch.tensor([o[2] for o in OPS], dtype=F64)[p.ops]
    assert ((p.magnitudes >= lo) & (p.magnitudes <= hi)).all()
    assert (p.cutout[:, 0] >= 0).all() and (p.cutout[:, 0] <= 0.5).all()
    assert (p.cutout[:, 1:] >= 1).all() and (p.cutout[:, 1:] <= 8).all()  # np.random.uniform(w): between 1 and w
    # the same image repeated gets different views
    same = rand_augment(x[:1].expand(16, -1, -1, -1).contiguous(), _gen(3))
    assert len({tuple(v.flatten().tolist()) for v in same}) > 8


def test_constant_images_give_no_nan_and_stay_constant():
    x = torch.full((64, 3, 6, 6), 0.7)
    out = rand_augment(x, _gen())
    assert torch.isfinite(out).all() and torch.equal(out, x)
    one = torch.zeros(64, 1, 5, 5)
    assert torch.equal(rand_augment(one, _gen()), one)


def test_one_channel_every_op():
    x = torch.randn(len(OPS), 1, 6, 6, generator=_gen(4), dtype=F64)
    for i, (name, lo, hi) in enumerate(OPS):
        p = RandAugmentParams(torch.full((len(OPS), 2), i), torch.full((len(OPS), 2), (lo + hi) / 2, dtype=F64),
                              torch.zeros(len(OPS), 3, dtype=F64))
        out = apply_params(x, p)
        assert out.shape == x.shape and torch.isfinite(out).all(), name
    assert torch.allclose(color(to_unit(x)[0], _v(*[0.3] * len(OPS))), to_unit(x)[0])  # Color: identity on grey


def test_identity_and_zero_magnitudes_leave_the_image():
    x = torch.randn(3, 3, 5, 5, generator=_gen(7), dtype=F64)
    for op, magnitude in (("identity", 0.5), ("rotate", 0.0), ("shear_x", 0.0), ("shear_y", 0.0),
                          ("translate_x", 0.0), ("translate_y", 0.0), ("solarize", 256.0)):
        torch.testing.assert_close(apply_params(x, _params(op, magnitude, n=3)), x, rtol=0, atol=1e-12, msg=op)


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match=r"expects a float \(N, C, H, W\) image batch, got \(4, 10\)"):
        rand_augment(torch.zeros(4, 10), _gen())


# --- each op on tiny hand-made images -------------------------------------------------------------------------


def test_solarize_inverts_levels_at_or_above_the_threshold():
    x = _v(0.0, 0.25, 0.5, 128 / 255, 1.0).view(1, 1, 1, 5)
    # threshold 128: levels 0, 63.75, 127.5 stay; 128 and 255 invert
    assert solarize(x, _v(128.0)).flatten().tolist() == pytest.approx([0.0, 0.25, 0.5, 127 / 255, 0.0])
    assert torch.equal(solarize(x, _v(0.0)), 1 - x)


def test_rotate_quarter_turn_is_rot90_counter_clockwise():
    x = _ramp()
    assert torch.equal(rotate(x, _v(0.0)), x)
    assert torch.equal(rotate(x, _v(90.0)), torch.rot90(x, 1, dims=(2, 3)))
    assert torch.equal(rotate(x, _v(-90.0)), torch.rot90(x, -1, dims=(2, 3)))


def test_translate_shifts_with_black_fill():
    x = _ramp()
    # v = 0.25 of width 4: output column j reads input column j + 1, so the content moves left
    out = translate_x(x, _v(0.25))
    assert torch.equal(out[..., :3], x[..., 1:]) and (out[..., 3] == 0).all()
    out = translate_y(x, _v(-0.5))  # content moves down by 2 rows
    assert torch.equal(out[..., 2:, :], x[..., :2, :]) and (out[..., :2, :] == 0).all()


def test_shear_about_the_origin():
    x = _ramp()
    # PIL (1, v, 0, 0, 1, 0): output pixel (j, i) reads column floor(j + .5 + v (i + .5)); with v = 0.4 row 0
    # reads j + floor(.7) = j, row 1 reads j + floor(1.1) = j + 1 (black past the right edge)
    out = shear_x(x, _v(0.4))
    assert torch.equal(out[0, 0, 0], x[0, 0, 0])  # 0.5 + 0.2 -> same column
    assert torch.equal(out[0, 0, 1, :3], x[0, 0, 1, 1:]) and out[0, 0, 1, 3] == 0  # 0.5 + 0.6 -> next column
    assert torch.equal(shear_y(x, _v(0.4)), shear_x(x.transpose(2, 3), _v(0.4)).transpose(2, 3))


def test_enhance_ops_hand_computed():
    x = _v(0.2, 0.6, 1.0, 0.0).view(1, 1, 2, 2)
    assert brightness(x, _v(0.5)).flatten().tolist() == pytest.approx([0.1, 0.3, 0.5, 0.0])
    # mean 0.45: 0.45 + 0.5 (x - 0.45)
    assert contrast(x, _v(0.5)).flatten().tolist() == pytest.approx([0.325, 0.525, 0.725, 0.225])
    rgb = torch.tensor([1.0, 0.0, 0.0], dtype=F64).view(1, 3, 1, 1)  # red: luma 0.299
    assert color(rgb, _v(0.0)).flatten().tolist() == pytest.approx([0.299] * 3)
    assert color(rgb, _v(0.5)).flatten().tolist() == pytest.approx([0.6495, 0.1495, 0.1495])
    # autocontrast stretches each channel to [0, 1]; a constant channel stays
    two = torch.stack([torch.tensor([[0.2, 0.4], [0.6, 0.3]]), torch.full((2, 2), 0.5)]).unsqueeze(0).double()
    out = auto_contrast(two, _v(0.0))
    assert out[0, 0].flatten().tolist() == pytest.approx([0.0, 0.5, 1.0, 0.25]) and torch.equal(out[0, 1], two[0, 1])


def test_sharpness_blends_with_pil_smooth_interior_only():
    x = torch.zeros(1, 1, 3, 3, dtype=F64)
    x[0, 0, 1, 1] = 1.0
    # SMOOTH at the centre: 5 / 13; borders kept. Factor 0 = the smoothed image, 1 = the image
    out = sharpness(x, _v(0.0))
    assert out[0, 0, 1, 1].item() == pytest.approx(5 / 13) and out.sum().item() == pytest.approx(5 / 13)
    assert torch.equal(sharpness(x, _v(1.0)), x)
    assert sharpness(x, _v(0.5))[0, 0, 1, 1].item() == pytest.approx(0.5 * 5 / 13 + 0.5)


def test_posterize_keeps_the_top_bits():
    x = _v(255, 17, 100, 0).view(1, 1, 1, 4) / 255
    assert (posterize(x, _v(4.9)) * 255).round().flatten().tolist() == [240, 16, 96, 0]
    assert (posterize(x, _v(7.0)) * 255).round().flatten().tolist() == [254, 16, 100, 0]
    # 8 bits: only the quantisation to 256 levels (PIL's uint8)
    y = torch.rand(1, 1, 4, 4, generator=_gen(), dtype=F64)
    assert torch.equal(posterize(y, _v(8.0)), (y * 255).round() / 255)


def test_equalize_is_pils_lookup_table():
    # 1024 pixels: 300 at level 10, 210 at 50, 514 at 90. PIL: step = (1024 - 514) // 255 = 2, n = 1;
    # lut[10] = 1 // 2 = 0, lut[50] = (1 + 300) // 2 = 150, lut[90] = (1 + 510) // 2 = 255
    levels = torch.cat([torch.full((300,), 10.0), torch.full((210,), 50.0), torch.full((514,), 90.0)])
    x = (levels[torch.randperm(1024, generator=_gen())] / 255).double().view(1, 1, 32, 32)
    out = (equalize(x, _v(0.0)) * 255).round()
    for level, expected in ((10, 0), (50, 150), (90, 255)):
        assert (out[(x * 255).round() == level] == expected).all()
    # step 0 (fewer than 256 pixels besides the last level): identity
    small = _ramp()
    assert torch.allclose(equalize(small, _v(0.0)), small)


def test_cutout_paints_the_reference_box():
    x = torch.zeros(1, 3, 8, 8, dtype=F64)
    # side 0.25 * 8 = 2 px, centre (4, 3): x0 = int(4 - 1) = 3, y0 = 2, x1 = 5, y1 = 4, inclusive
    out = cutout(x, _v(0.25, 4.0, 3.0).view(1, 3))
    painted = (out != 0).any(1)[0]
    assert painted.nonzero().tolist() == [[r, c] for r in range(2, 5) for c in range(3, 6)]
    assert out[0, :, 2, 3].tolist() == pytest.approx([f / 255 for f in CUTOUT_FILL])
    assert torch.equal(cutout(x, _v(0.0, 4.0, 3.0).view(1, 3)), x)
    grey = cutout(torch.zeros(1, 1, 8, 8, dtype=F64), _v(0.25, 4.0, 3.0).view(1, 3))
    assert grey.max().item() == pytest.approx(sum(CUTOUT_FILL) / 765)


def test_ops_run_on_the_min_max_rescaled_image_and_map_back():
    x = 4 * _ramp() - 1  # levels -1 .. 3
    out = apply_params(x, _params("solarize", 0.0))  # invert everything: -1 <-> 3
    torch.testing.assert_close(out, 2 - x, rtol=0, atol=1e-12)


def test_views_do_not_depend_on_an_enclosing_autocast():
    """The engine runs batch transforms inside the run's autocast; the views must be the fp32 ones."""
    from teachkit.data.strong_augment import rand_augment

    x = torch.randn(32, 3, 12, 12)
    plain = rand_augment(x, torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = rand_augment(x, torch.Generator().manual_seed(3))
    assert under.dtype == torch.float32 and torch.equal(plain, under)
