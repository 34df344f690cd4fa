"""Batched tensor RandAugment(n=2, m=10) plus Cutout: the "strong" view of FixMatch-style training (MLKD).

What it is. The strong transform of Jin, Wang & Lin 2023, "Multi-Level Logit Distillation" (CVPR), as in
the authors' ``mdistiller/dataset/cifar100.py`` (``RandAugment(2, 10)``, a FixMatch copy): for every image,
``n = 2`` ops drawn uniformly *with replacement* (``random.choices``) from the 14 ops of :data:`OPS`, each
with its own magnitude ``lo + (hi - lo) * U(0, 1)`` (``m`` is unused there: "deprecated"), applied in order;
then Cutout with side ``U(0, 1) * 0.5`` of the width, always (a side of 0 leaves the image unchanged).
Every sample draws its own ops, magnitudes and cutout box. The op list and ranges (checked against the
reference's ``augment_list``)::

    AutoContrast  -         Brightness 0.05..0.95   Color 0.05..0.95   Contrast 0.05..0.95
    Equalize      -         Identity   -            Posterize 4..8 bits (int(v): 4..7)
    Rotate        -30..30 deg (counter-clockwise)   Sharpness 0.05..0.95
    ShearX/Y      -0.3..0.3                         Solarize threshold 0..256
    TranslateX/Y  -0.3..0.3 of the width / height   (Invert is defined there but not in the list)

How it maps PIL onto teachkit tensors. teachkit images are float (N, C, H, W) tensors standardised per
channel (not uint8 in [0, 255]), with 1 channel (digits, MNIST) or 3. Each image is rescaled to [0, 1]
by its *own* minimum and maximum over all its channels and pixels, the ops run in that range (0 plays
PIL's black, 1 its white, ``v / 255`` its level ``v``), values are clamped to [0, 1] after every op (PIL
clips to uint8), and the result is mapped back with the same min / max. A constant image stays exactly
as it is (no division by zero). Geometric ops are one ``affine_grid`` / ``grid_sample`` per op with
nearest sampling and zero (black) fill, reproducing PIL's inverse affine maps on pixel centres
(``Image.rotate`` about the centre, ``Image.transform(AFFINE)`` shears / translations about the origin,
PIL's default NEAREST resampling and black fill).

Deviations from the PIL version (all deliberate, documented here):

- continuous values: PIL rounds to 256 levels after every op; here only Posterize and Equalize quantise
  (``round(255 x)``), Solarize compares ``255 x >= threshold`` on the continuous value, and the enhance
  ops (Brightness, Color, Contrast, Sharpness) blend without rounding;
- Contrast's grey level is the exact mean of the grey image (PIL rounds it to an integer level);
- Color and Contrast take the grey image as ITU-R 601 luma ``0.299 R + 0.587 G + 0.114 B`` for 3
  channels (PIL's ``convert("L")``), the mean over channels otherwise, so Color is the identity on 1-channel
  images (as on PIL "L" images);
- Equalize is PIL's ``ImageOps.equalize`` lookup table exactly (per channel, ``step = (N - last bin) //
  255``, ``lut[i] = (step // 2 + #pixels below i) // step``), but on the image quantised to 256 levels
  from the min/max-rescaled floats, so it approximates PIL's equalisation of the original uint8 pixels;
- Sharpness blends with PIL's SMOOTH 3x3 filter (kernel 1 1 1 / 1 5 1 / 1 1 1, scale 13), the border
  pixels kept (as PIL copies them); images under 3x3 are left unchanged by it;
- Cutout fills with PIL's ``(125, 123, 114) / 255`` for 3 channels and their mean for other channel
  counts, and paints the columns / rows ``x0 .. floor(x1)`` inclusive, approximating PIL's rectangle; its
  centre is drawn as the reference draws it, ``np.random.uniform(w)`` = uniform between w and 1 (not
  0..w: a quirk of the reference, kept);
- nearest sampling at an exact tie between two pixels rounds as ``grid_sample`` does (PIL floors);
- the weak view's crop / flip are not redrawn: the reference draws an independent crop and flip for
  the strong view; here the strong view is made from the weak one (the caller's choice, see MLKD);
- random numbers come from a torch CPU generator (:func:`draw_params`), not Python's ``random``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: RandAugment's op list: (name, lowest, highest magnitude), in the reference's ``augment_list`` order
OPS: tuple[tuple[str, float, float], ...] = (
    ("auto_contrast", 0.0, 1.0), ("brightness", 0.05, 0.95), ("color", 0.05, 0.95), ("contrast", 0.05, 0.95),
    ("equalize", 0.0, 1.0), ("identity", 0.0, 1.0), ("posterize", 4.0, 8.0), ("rotate", -30.0, 30.0),
    ("sharpness", 0.05, 0.95), ("shear_x", -0.3, 0.3), ("shear_y", -0.3, 0.3), ("solarize", 0.0, 256.0),
    ("translate_x", -0.3, 0.3), ("translate_y", -0.3, 0.3),
)
#: ops per image (RandAugment n) and the reference's (unused) magnitude m
N_OPS = 2
MAGNITUDE = 10
#: Cutout's side as a fraction of the width is U(0, 1) * CUTOUT_MAX
CUTOUT_MAX = 0.5
#: Cutout's fill colour (the reference's RGB, out of 255)
CUTOUT_FILL = (125.0, 123.0, 114.0)
#: ITU-R 601-2 luma weights (PIL's convert("L"))
LUMA = (0.299, 0.587, 0.114)


class RandAugmentParams(NamedTuple):
    """One batch's random draws: ``ops`` (N, n) indices into :data:`OPS`, ``magnitudes`` (N, n) in each op's
    range, ``cutout`` (N, 3): side as a fraction of the width in [0, 0.5], centre x and y in pixels."""

    ops: Tensor
    magnitudes: Tensor
    cutout: Tensor


def draw_params(batch: int, height: int, width: int, generator: torch.Generator, n: int = N_OPS) -> RandAugmentParams:
    """Draw, in this order from ``generator`` (CPU): op indices (N, n) uniform over :data:`OPS` (with
    replacement), magnitude fractions (N, n), then (N, 3) for Cutout (side, centre x, centre y). float64."""
    ops = torch.randint(0, len(OPS), (batch, n), generator=generator)
    u = torch.rand(batch, n, generator=generator, dtype=torch.float64)
    lo = torch.tensor([op[1] for op in OPS], dtype=torch.float64)[ops]
    hi = torch.tensor([op[2] for op in OPS], dtype=torch.float64)[ops]
    c = torch.rand(batch, 3, generator=generator, dtype=torch.float64)
    # reference: v = U * 0.5; x0 = np.random.uniform(w) -> uniform(low=w, high=1)
    cutout = torch.stack([c[:, 0] * CUTOUT_MAX, width + (1 - width) * c[:, 1], height + (1 - height) * c[:, 2]], 1)
    return RandAugmentParams(ops, lo + (hi - lo) * u, cutout)


# ---------------------------------------------------------------------------------------------- helpers


def _per_image(v: Tensor, x: Tensor) -> Tensor:
    """(N,) magnitudes as (N, 1, 1, 1) in ``x``'s dtype and device."""
    return v.to(device=x.device, dtype=x.dtype).view(-1, 1, 1, 1)


def _grey(x: Tensor) -> Tensor:
    """(N, 1, H, W) grey image: luma for 3 channels, the channel mean otherwise."""
    if x.shape[1] == 3:
        w = torch.tensor(LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return (x * w).sum(1, keepdim=True)
    return x.mean(1, keepdim=True)


def _blend(degenerate: Tensor, x: Tensor, v: Tensor) -> Tensor:
    """PIL ``Image.blend(degenerate, x, v)`` = ``degenerate + v (x - degenerate)``, clamped to [0, 1]."""
    return (degenerate + _per_image(v, x) * (x - degenerate)).clamp(0.0, 1.0)


def _quantise(x: Tensor) -> Tensor:
    """Levels 0..255 (long) of a [0, 1] image."""
    return (x * 255.0).round().clamp(0, 255).long()


def _affine(x: Tensor, mats: Tensor) -> Tensor:
    """Sample ``x`` through per-image PIL-style inverse maps ``mats`` (N, 2, 3) in pixel coordinates (the
    output pixel centre (j + .5, i + .5) reads the input at ``mats @ (j + .5, i + .5, 1)``), nearest, black fill."""
    n, _, h, w = x.shape
    mats = mats.to("cpu", torch.float64)  # composed on the CPU in float64 (MPS has no float64)
    # normalised (align_corners=False) <-> continuous pixel coordinates
    to_pix = torch.tensor([[w / 2, 0, w / 2], [0, h / 2, h / 2], [0, 0, 1]], dtype=torch.float64)
    to_norm = torch.tensor([[2 / w, 0, -1], [0, 2 / h, -1], [0, 0, 1]], dtype=torch.float64)
    full = torch.cat([mats, torch.tensor([[[0.0, 0.0, 1.0]]], dtype=torch.float64).expand(n, 1, 3)], 1)
    theta = (to_norm @ full @ to_pix)[:, :2].to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def _mats(a: Tensor, b: Tensor, c: Tensor, d: Tensor, e: Tensor, f: Tensor) -> Tensor:
    return torch.stack([torch.stack([a, b, c], -1), torch.stack([d, e, f], -1)], -2)


# ---------------------------------------------------------------------------------------------- ops on [0, 1]


def auto_contrast(x: Tensor, v: Tensor) -> Tensor:
    """``ImageOps.autocontrast``: each channel stretched so its min is 0 and max 1 (unchanged if constant)."""
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    span = hi - lo
    return torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), x)


def brightness(x: Tensor, v: Tensor) -> Tensor:
    """``ImageEnhance.Brightness(v)``: blend with black, ``v x``."""
    return _blend(torch.zeros_like(x), x, v)


def color(x: Tensor, v: Tensor) -> Tensor:
    """``ImageEnhance.Color(v)``: blend with the grey image (identity on 1 channel)."""
    return _blend(_grey(x).expand_as(x), x, v)


def contrast(x: Tensor, v: Tensor) -> Tensor:
    """``ImageEnhance.Contrast(v)``: blend with the grey image's mean level (exact mean, not rounded)."""
    return _blend(_grey(x).mean(dim=(1, 2, 3), keepdim=True).expand_as(x), x, v)


def equalize(x: Tensor, v: Tensor) -> Tensor:
    """``ImageOps.equalize`` per channel on the image quantised to 256 levels (PIL's lookup table exactly)."""
    n, c, h, w = x.shape
    q = _quantise(x).view(n * c, h * w)
    counts = torch.zeros(n * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, q, torch.ones_like(q))
    last_bin = 255 - (counts > 0).flip(1).long().argmax(1, keepdim=True)
    step = (h * w - counts.gather(1, last_bin)) // 255  # (N*C, 1)
    below = counts.cumsum(1) - counts
    lut = ((step // 2 + below) // step.clamp_min(1)).clamp(max=255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device).expand_as(lut))
    return (lut.gather(1, q).to(x.dtype) / 255.0).view(n, c, h, w)


def identity(x: Tensor, v: Tensor) -> Tensor:
    """The image unchanged."""
    return x


def posterize(x: Tensor, v: Tensor) -> Tensor:
    """``ImageOps.posterize(int(v))``: keep the top ``max(1, int(v))`` bits of each 8-bit level."""
    bits = v.floor().clamp(1, 8).to(torch.long).to(x.device)
    step = torch.pow(2, 8 - bits).view(-1, 1, 1, 1)
    return (torch.div(_quantise(x), step, rounding_mode="floor") * step).to(x.dtype) / 255.0


def rotate(x: Tensor, v: Tensor) -> Tensor:
    """``Image.rotate(v)``: ``v`` degrees counter-clockwise about the centre (w/2, h/2), black corners."""
    h, w = x.shape[2], x.shape[3]
    a = -v.to("cpu", torch.float64) * math.pi / 180.0
    cos, sin = a.cos(), a.sin()
    cx, cy = w / 2.0, h / 2.0
    # PIL: in = R (out - centre) + centre with R = [[cos, sin], [-sin, cos]] of -angle
    return _affine(x, _mats(cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy))


def sharpness(x: Tensor, v: Tensor) -> Tensor:
    """``ImageEnhance.Sharpness(v)``: blend with PIL's SMOOTH-filtered image (borders kept)."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    if h < 3 or w < 3:
        return x
    k = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(c, 1, 3, 3)
    smooth = x.clone()
    smooth[:, :, 1:-1, 1:-1] = F.conv2d(x, k, groups=c)
    return _blend(smooth, x, v)


def shear_x(x: Tensor, v: Tensor) -> Tensor:
    """``transform(AFFINE, (1, v, 0, 0, 1, 0))``: the output (x, y) reads the input at (x + v y, y)."""
    s = v.to("cpu", torch.float64)
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    return _affine(x, _mats(one, s, zero, zero, one, zero))


def shear_y(x: Tensor, v: Tensor) -> Tensor:
    """``transform(AFFINE, (1, 0, 0, v, 1, 0))``: the output (x, y) reads the input at (x, y + v x)."""
    s = v.to("cpu", torch.float64)
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    return _affine(x, _mats(one, zero, zero, s, one, zero))


def solarize(x: Tensor, v: Tensor) -> Tensor:
    """``ImageOps.solarize(v)``: levels ``255 x >= v`` inverted to ``1 - x``."""
    return torch.where(x * 255.0 >= _per_image(v, x), 1.0 - x, x)


def translate_x(x: Tensor, v: Tensor) -> Tensor:
    """``transform(AFFINE, (1, 0, v w, 0, 1, 0))``: the output (x, y) reads the input at (x + v w, y), so the
    content moves left by ``v w`` pixels for v > 0; black fill."""
    t = v.to("cpu", torch.float64)
    one, zero = torch.ones_like(t), torch.zeros_like(t)
    return _affine(x, _mats(one, zero, t * x.shape[3], zero, one, zero))


def translate_y(x: Tensor, v: Tensor) -> Tensor:
    """``transform(AFFINE, (1, 0, 0, 0, 1, v h))``: the content moves up by ``v h`` pixels for v > 0."""
    t = v.to("cpu", torch.float64)
    one, zero = torch.ones_like(t), torch.zeros_like(t)
    return _affine(x, _mats(one, zero, zero, zero, one, t * x.shape[2]))


def cutout(x: Tensor, params: Tensor) -> Tensor:
    """The reference's ``Cutout(v)``: a square of side ``v * w`` pixels (v = ``params[:, 0]``) with top-left
    ``(int(max(0, cx - side/2)), int(max(0, cy - side/2)))`` and far corner ``min(w or h, corner + side)``,
    painted inclusive of both ends with :data:`CUTOUT_FILL`; v = 0 leaves the image unchanged."""
    n, c, h, w = x.shape
    p = params.to(torch.float64)
    side = p[:, 0] * w
    x0 = (p[:, 1] - side / 2).clamp_min(0).floor()
    y0 = (p[:, 2] - side / 2).clamp_min(0).floor()
    x1 = torch.minimum(x0 + side, torch.full_like(x0, float(w))).floor()
    y1 = torch.minimum(y0 + side, torch.full_like(y0, float(h))).floor()
    cols = torch.arange(w, dtype=torch.float64)
    rows = torch.arange(h, dtype=torch.float64)
    inside_x = (cols >= x0[:, None]) & (cols <= x1[:, None])
    inside_y = (rows >= y0[:, None]) & (rows <= y1[:, None])
    mask = (inside_y[:, :, None] & inside_x[:, None, :] & (side > 0)[:, None, None]).to(x.device)
    fill = [f / 255.0 for f in CUTOUT_FILL] if c == 3 else [sum(CUTOUT_FILL) / (3 * 255.0)] * c
    fill_t = torch.tensor(fill, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    return torch.where(mask[:, None], fill_t, x)


#: the op functions, in :data:`OPS` order
OP_FUNCTIONS = (auto_contrast, brightness, color, contrast, equalize, identity, posterize, rotate, sharpness,
                shear_x, shear_y, solarize, translate_x, translate_y)


# ---------------------------------------------------------------------------------------------- the batch transform


def to_unit(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(x01, lo, span)``: each image rescaled to [0, 1] by its own min / max (0 for a constant image)."""
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    span = x.amax(dim=(1, 2, 3), keepdim=True) - lo
    return (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), lo, span


def apply_params(x: Tensor, params: RandAugmentParams, cut: bool = True) -> Tensor:
    """The strong view of the (N, C, H, W) float batch ``x`` under ``params`` (see the module docstring):
    rescale each image to [0, 1], apply its ops in order, then Cutout (when ``cut``), and map back."""
    if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"strong augmentation expects a float (N, C, H, W) image batch, got {shape}")
    out, lo, span = to_unit(x)
    ops, magnitudes = params.ops.cpu(), params.magnitudes.cpu()  # magnitudes stay on the CPU in float64
    for k in range(ops.shape[1]):
        for i, fn in enumerate(OP_FUNCTIONS):
            rows = (ops[:, k] == i).nonzero().flatten()
            if rows.numel() == 0 or fn is identity:
                continue
            on_device = rows.to(out.device)
            out = out.index_copy(0, on_device, fn(out[on_device], magnitudes[rows, k]).clamp(0.0, 1.0).to(out.dtype))
    if cut:
        out = cutout(out, params.cutout)
    return lo + out * span


def rand_augment(x: Tensor, generator: torch.Generator, n: int = N_OPS, cut: bool = True) -> Tensor:
    """RandAugment(n, m=10) + Cutout on a float (N, C, H, W) batch, each image its own ops and magnitudes,
    all drawn from the CPU ``generator`` (:func:`draw_params`): the same generator state gives the same views."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"strong augmentation expects a float (N, C, H, W) image batch, got {shape}")
    params = draw_params(x.shape[0], x.shape[2], x.shape[3], generator, n)
    # the engine calls a method's batch transform inside the run's autocast (bf16 on GPUs): the ops' convs and
    # sampling grids must run in the input's own precision, or the views depend on the precision setting
    with torch.autocast(x.device.type, enabled=False):
        return apply_params(x, params, cut)
