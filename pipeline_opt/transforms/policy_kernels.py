"""The auto-augment operations on a batch, each sample with its own magnitude, in the CPU original's arithmetic.

torchvision's ``AutoAugment`` / ``RandAugment`` / ``TrivialAugmentWide`` apply one of fifteen
operations per draw (:data:`~pipeline_opt.transforms.policy_draws.OPS`). Here each one runs on the
samples that drew it, batched, on integer levels held in float32 ``(B, C, H, W)``, as the CPU
pipeline computed it at that point (the *flavour*, see :mod:`~pipeline_opt.transforms.replay_kernels`):

* ``"pil"``: Pillow's code paths. Geometry is Pillow's ``Image.transform(AFFINE)``: nearest
  neighbour in its 16.16 fixed-point walk (its scale-only path for translations), bilinear with its
  edge clamping and truncation; ``Image.rotate``'s matrix, rounded to 15 decimals, and its exact
  transposes for 180 (and 90 / 270 on square images). Colour ops are ``ImageEnhance`` blends (the
  sharpness degenerate is the ``SMOOTH`` 3x3 filter with edges kept), ``ImageOps`` look-up tables
  (autocontrast, equalize with its 256 divisor, posterize, solarize, invert).
* ``"uint8"``: torchvision's tensor kernels: the affine grid of ``F.affine`` / ``F.rotate`` sampled
  by ``grid_sample`` and rounded, blends truncated, equalize with its 255 divisor.

The measured distance to the CPU original, per op and flavour, is in ``docs/gpu_ops.md``.
Pure torch: no Kornia here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from pipeline_opt.transforms import replay_kernels as RK
from pipeline_opt.transforms.policy_draws import OPS

__all__ = ["GEOMETRIC_OPS", "apply_op", "apply_timm_op", "autocontrast", "equalize", "inverse_affine", "posterize", "sharpness",
           "solarize", "solarize_add", "warp"]

GEOMETRIC_OPS = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})
_FIX = 65536.0


def inverse_affine(center: Sequence[float], angle: float, translate: Sequence[float], scale: float,
                   shear: Sequence[float]) -> list[float]:
    """The output-to-input affine map torchvision computes for ``F.affine`` / ``F.rotate`` (rotation
    about ``center``, then shear, scale and translation, inverted), as 6 numbers ``a b c d e f``."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _pil_rotation(angle: float, h: int, w: int) -> list[float] | int:
    """Pillow's ``Image.rotate(angle)`` (no expand, no centre): a transpose (number of quarter turns
    counter-clockwise) where it takes one, else its affine matrix."""
    angle = angle % 360.0
    if angle == 0:
        return 0
    if angle == 180:
        return 2
    if angle in (90, 270) and w == h:
        return 1 if angle == 90 else 3
    rad = -math.radians(angle)
    m = [round(math.cos(rad), 15), round(math.sin(rad), 15), 0.0,
         round(-math.sin(rad), 15), round(math.cos(rad), 15), 0.0]
    cx, cy = w / 2.0, h / 2.0
    m[2], m[5] = m[0] * -cx + m[1] * -cy + m[2], m[3] * -cx + m[4] * -cy + m[5]
    m[2] += cx
    m[5] += cy
    return m


def op_matrix(op: str, magnitude: float, h: int, w: int, flavour: str) -> list[float] | int:
    """The input-coordinate map of geometric ``op``: 6 affine numbers, or quarter turns for Pillow's transposes."""
    if op == "Rotate":
        if flavour == "pil":
            return _pil_rotation(magnitude, h, w)
        return inverse_affine([0.0, 0.0], -magnitude, [0.0, 0.0], 1.0, [0.0, 0.0])
    if op in ("ShearX", "ShearY"):
        shear = math.degrees(math.atan(magnitude))
        shear_xy = [shear, 0.0] if op == "ShearX" else [0.0, shear]
        center = [0.0, 0.0] if flavour == "pil" else [-w * 0.5, -h * 0.5]
        return inverse_affine(center, 0.0, [0.0, 0.0], 1.0, shear_xy)
    t = [float(int(magnitude)), 0.0] if op == "TranslateX" else [0.0, float(int(magnitude))]
    center = [w * 0.5, h * 0.5] if flavour == "pil" else [0.0, 0.0]
    return inverse_affine(center, 0.0, t, 1.0, [0.0, 0.0])


def _fill_of(fill: Sequence[float] | None, x: torch.Tensor) -> torch.Tensor:
    values = [0.0] * x.shape[1] if fill is None else list(fill)
    if len(values) == 1:
        values = values * x.shape[1]
    return torch.tensor(values, dtype=x.dtype, device=x.device).view(1, -1, 1)


def _gather(x: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
    """``x[b, :, yi, xi]`` per sample: x (B, C, H, W), indices (B, N) in range -> (B, C, N)."""
    b, c, h, w = x.shape
    flat = (yi * w + xi).unsqueeze(1).expand(b, c, -1)
    return x.reshape(b, c, h * w).gather(2, flat)


def _pixel_grid(h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float64),
                            torch.arange(w, device=device, dtype=torch.float64), indexing="ij")
    return xs.reshape(1, -1), ys.reshape(1, -1)


def _warp_pil_nearest(x: torch.Tensor, m: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    xs, ys = _pixel_grid(h, w, x.device)
    a0, a1, a2, a3, a4, a5 = (m[:, i:i + 1] for i in range(6))
    scale_only = (m[:, 1] == 0) & (m[:, 3] == 0)
    # Pillow's scale path: floating point, COORD (negative -> -1, else truncation)
    fx = a2 + a0 * (xs + 0.5)
    fy = a5 + a4 * (ys + 0.5)
    sx = torch.where(fx < 0, -1.0, fx.trunc())
    sy = torch.where(fy < 0, -1.0, fy.trunc())
    # its fixed-point path: 16.16 integers, arithmetic shift
    def fix(v: torch.Tensor) -> torch.Tensor:
        return torch.floor(v * _FIX + 0.5).to(torch.int64)
    i0, i1, i3, i4 = fix(a0), fix(a1), fix(a3), fix(a4)
    i2 = fix(a2 + a0 * 0.5 + a1 * 0.5)
    i5 = fix(a5 + a3 * 0.5 + a4 * 0.5)
    xi64, yi64 = xs.to(torch.int64), ys.to(torch.int64)
    qx = torch.bitwise_right_shift(i2 + yi64 * i1 + xi64 * i0, 16).to(torch.float64)
    qy = torch.bitwise_right_shift(i5 + yi64 * i4 + xi64 * i3, 16).to(torch.float64)
    px = torch.where(scale_only.view(-1, 1), sx, qx)
    py = torch.where(scale_only.view(-1, 1), sy, qy)
    inside = (px >= 0) & (px < w) & (py >= 0) & (py < h)
    xi = px.clamp(0, w - 1).to(torch.int64)
    yi = py.clamp(0, h - 1).to(torch.int64)
    out = torch.where(inside.unsqueeze(1), _gather(x, xi, yi), fill)
    return out.view(b, c, h, w)


def _warp_pil_bilinear(x: torch.Tensor, m: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    xs, ys = _pixel_grid(h, w, x.device)
    a0, a1, a2, a3, a4, a5 = (m[:, i:i + 1] for i in range(6))
    fx = a0 * (xs + 0.5) + a1 * (ys + 0.5) + a2
    fy = a3 * (xs + 0.5) + a4 * (ys + 0.5) + a5
    inside = (fx >= 0) & (fx < w) & (fy >= 0) & (fy < h)
    fx, fy = fx - 0.5, fy - 0.5
    x0, y0 = torch.floor(fx), torch.floor(fy)
    dx, dy = (fx - x0).unsqueeze(1), (fy - y0).unsqueeze(1)
    xa = x0.clamp(0, w - 1).to(torch.int64)
    xb = (x0 + 1).clamp(0, w - 1).to(torch.int64)
    ya = y0.clamp(0, h - 1).to(torch.int64)
    has_next = ((y0 + 1 >= 0) & (y0 + 1 < h)).unsqueeze(1)
    yb = (y0 + 1).clamp(0, h - 1).to(torch.int64)
    xd = x.to(torch.float64)
    top_a, top_b = _gather(xd, xa, ya), _gather(xd, xb, ya)
    bot_a, bot_b = _gather(xd, xa, yb), _gather(xd, xb, yb)
    v1 = top_a + (top_b - top_a) * dx
    v2 = torch.where(has_next, bot_a + (bot_b - bot_a) * dx, v1)
    v = (v1 + (v2 - v1) * dy).trunc().to(x.dtype)
    return torch.where(inside.unsqueeze(1), v, fill).view(b, c, h, w)


def _warp_tensor(x: torch.Tensor, m: torch.Tensor, interpolation: str, fill: Sequence[float] | None) -> torch.Tensor:
    """torchvision's tensor ``affine`` / ``rotate``: its affine grid in float32, ``grid_sample``, rounding."""
    b, c, h, w = x.shape
    theta = m.to(torch.float32).view(b, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=x.device)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w, device=x.device))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h, device=x.device).unsqueeze(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32, device=x.device)
    grid = base.view(1, h * w, 3).expand(b, -1, -1).bmm(rescaled).view(b, h, w, 2)
    src = x if fill is None else torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
    out = F.grid_sample(src, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
    if fill is not None:
        out, mask = out[:, :-1], out[:, -1:].expand(-1, c, -1, -1)
        fill_img = _fill_of(fill, x).view(1, -1, 1, 1).expand_as(out)
        out = torch.where(mask < 0.5, fill_img, out) if interpolation == "nearest" else \
            out * mask + (1.0 - mask) * fill_img
    return out.round()


def warp(x: torch.Tensor, matrices: Sequence[list[float] | int], flavour: str, interpolation: str,
         fill: Sequence[float] | None) -> torch.Tensor:
    """Each sample of ``x`` mapped through its own :func:`op_matrix` (quarter turns: Pillow's transposes)."""
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation={interpolation!r}: only 'nearest' and 'bilinear' are replayed")
    out = x.clone()
    turns = [i for i, m in enumerate(matrices) if isinstance(m, int)]
    for i in turns:
        out[i] = torch.rot90(x[i], matrices[i], dims=(-2, -1)) if matrices[i] else x[i]
    mapped = [i for i, m in enumerate(matrices) if not isinstance(m, int)]
    if not mapped:
        return out
    index = torch.tensor(mapped, device=x.device)
    m = torch.tensor([matrices[i] for i in mapped], dtype=torch.float64, device=x.device)
    part = x.index_select(0, index)
    if flavour == "pil":
        f = _fill_of(fill, part)
        part = _warp_pil_nearest(part, m, f) if interpolation == "nearest" else _warp_pil_bilinear(part, m, f)
    else:
        part = _warp_tensor(part, m, interpolation, fill)
    return out.index_copy(0, index, part)


def _per_sample(values: Sequence[float], x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(values), dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)


def _factors(magnitudes: Sequence[float]) -> torch.Tensor:
    """``1 + magnitude`` per sample in float64: torchvision's factor is a Python float (see ``blend_u8``)."""
    return torch.tensor([1.0 + m for m in magnitudes], dtype=torch.float64)


def sharpness(x: torch.Tensor, factors: torch.Tensor, flavour: str) -> torch.Tensor:
    """``adjust_sharpness``: blend with the 3x3 smoothed image (``[1 1 1; 1 5 1; 1 1 1] / 13``), edges kept."""
    if x.shape[-1] <= 2 or x.shape[-2] <= 2:
        return x
    c = x.shape[1]
    kernel = torch.ones(3, 3, dtype=torch.float32, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / kernel.sum()).expand(c, 1, 3, 3)
    smooth = F.conv2d(x, kernel, groups=c)
    degenerate = x.clone()
    if flavour == "pil":
        degenerate[..., 1:-1, 1:-1] = (smooth + 0.5).trunc().clamp(0, 255)
        return RK.blend_pil(degenerate, x, factors.to(x.dtype))
    degenerate[..., 1:-1, 1:-1] = smooth.round()
    return RK.blend_u8(x, degenerate, factors)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the top ``bits`` bits of every level (both flavours: ``x & ~(2**(8 - bits) - 1)``)."""
    step = torch.pow(2.0, 8.0 - bits)
    return torch.floor(x / step) * step


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Invert the levels at or above ``threshold`` (both flavours)."""
    return torch.where(x >= threshold, 255.0 - x, x)


def _lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Per (sample, channel) look-up: lut (B, C, 256)."""
    b, c, h, w = x.shape
    idx = x.to(torch.int64).view(b, c, h * w)
    return lut.to(x.dtype).gather(2, idx).view(b, c, h, w)


def autocontrast(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """Stretch each channel's levels to 0..255 (Pillow: its ``int(i * scale + offset)`` table)."""
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    if flavour == "pil":
        levels = torch.arange(256, dtype=torch.float64, device=x.device).view(1, 1, 256)
        lo64, hi64 = lo.view(x.shape[0], -1, 1).double(), hi.view(x.shape[0], -1, 1).double()
        span = (hi64 - lo64).clamp(min=1)
        scale = torch.full_like(span, 255.0) / span  # a true division, as Python's (``255.0 / t`` multiplies by 1 / t)
        lut = (levels * scale + (-lo64 * scale)).trunc().clamp(0, 255)
        lut = torch.where(hi64 <= lo64, levels, lut)
        return _lut(x, lut)
    scale = 255.0 / (hi - lo)
    same = ~torch.isfinite(scale)
    lo = torch.where(same, 0.0, lo)
    scale = torch.where(same, 1.0, scale)
    return ((x - lo) * scale).clamp(0, 255).trunc()


@functools.cache
def pillow_equalize_divisor() -> int:
    """The divisor of the installed Pillow's ``ImageOps.equalize`` step (Pillow moved from 256 to 255),
    measured on a 511 x 1 image whose two answers differ (level 1 becomes 128 with 255, 255 with 256)."""
    probe = Image.frombytes("L", (511, 1), bytes([0] * 255 + [1] * 255 + [2]))
    return 255 if ImageOps.equalize(probe).getpixel((255, 0)) == 128 else 256


def equalize(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """Histogram equalization per channel: ``lut[i] = (cum[i - 1] + step // 2) // step`` with
    ``step = (pixels - count of the last level present) // 255`` (torchvision; the installed Pillow's
    divisor for PIL images, :func:`pillow_equalize_divisor`)."""
    b, c, h, w = x.shape
    idx = x.to(torch.int64).view(b, c, h * w)
    hist = torch.zeros(b, c, 256, dtype=torch.int64, device=x.device).scatter_add_(2, idx, torch.ones_like(idx))
    last = torch.where(hist > 0, torch.arange(256, device=x.device), -1).amax(dim=2, keepdim=True)
    top = hist.gather(2, last.clamp(min=0))
    step = torch.div(h * w - top, pillow_equalize_divisor() if flavour == "pil" else 255, rounding_mode="floor")
    cum = torch.cat([torch.zeros_like(hist[..., :1]), hist.cumsum(2)[..., :-1]], dim=2)
    lut = torch.div(cum + torch.div(step, 2, rounding_mode="floor"), step.clamp(min=1), rounding_mode="floor")
    lut = lut.clamp(0, 255)
    identity = torch.arange(256, device=x.device).expand_as(lut)
    lut = torch.where(step == 0, identity, lut)
    return _lut(x, lut)


def apply_op(op: str, x: torch.Tensor, magnitudes: Sequence[float], flavour: str, interpolation: str,
             fill: Sequence[float] | None) -> torch.Tensor:
    """``op`` (a name of :data:`OPS`) on every sample of ``x``, sample ``i`` with ``magnitudes[i]``."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if op == "Identity":
        return x
    if op in GEOMETRIC_OPS:
        h, w = x.shape[-2:]
        return warp(x, [op_matrix(op, m, h, w, flavour) for m in magnitudes], flavour, interpolation, fill)
    if op == "Brightness":
        return RK.adjust_brightness(x, _factors(magnitudes), flavour)
    if op == "Color":
        return RK.adjust_saturation(x, _factors(magnitudes), flavour)
    if op == "Contrast":
        return RK.adjust_contrast(x, _factors(magnitudes), flavour)
    if op == "Sharpness":
        return sharpness(x, _factors(magnitudes).to(x.device).view(-1, 1, 1, 1), flavour)
    if op == "Posterize":
        return posterize(x, _per_sample([float(int(m)) for m in magnitudes], x))
    if op == "Solarize":
        return solarize(x, _per_sample(magnitudes, x))
    if op == "AutoContrast":
        return autocontrast(x, flavour)
    if op == "Equalize":
        return equalize(x, flavour)
    return 255.0 - x  # Invert


def _timm_matrix(op: str, value: float, h: int, w: int) -> list[float] | int:
    """The ``Image.transform(AFFINE)`` data timm passes for ``op`` (its Rotate is ``Image.rotate``)."""
    if op == "Rotate":
        return _pil_rotation(value, h, w)
    if op == "ShearX":
        return [1.0, value, 0.0, 0.0, 1.0, 0.0]
    if op == "ShearY":
        return [1.0, 0.0, 0.0, value, 1.0, 0.0]
    if op == "TranslateX":
        return [1.0, 0.0, value, 0.0, 1.0, 0.0]
    return [1.0, 0.0, 0.0, 0.0, 1.0, value]  # TranslateY


def solarize_add(x: torch.Tensor, add: torch.Tensor, threshold: float = 128.0) -> torch.Tensor:
    """timm's ``solarize_add``: levels below ``threshold`` get ``add`` (capped at 255)."""
    return torch.where(x < threshold, (x + add).clamp(max=255.0), x)


def apply_timm_op(op: str, x: torch.Tensor, values: Sequence[float], interpolation: str,
                  fill: Sequence[float] | None) -> torch.Tensor:
    """timm's auto-augment op ``op`` (a name of :data:`~pipeline_opt.transforms.timm_draws.TIMM_OPS`) on PIL-flavour
    levels, sample ``i`` with the argument timm passed to Pillow (``values[i]``): Pillow's arithmetic as above."""
    if op in ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"):
        h, w = x.shape[-2:]
        return warp(x, [_timm_matrix(op, v, h, w) for v in values], "pil", interpolation, fill)
    factors = torch.tensor(list(values), dtype=torch.float64)
    if op == "Brightness":
        return RK.adjust_brightness(x, factors, "pil")
    if op == "Color":
        return RK.adjust_saturation(x, factors, "pil")
    if op == "Contrast":
        return RK.adjust_contrast(x, factors, "pil")
    if op == "Sharpness":
        return sharpness(x, factors.to(x.device).view(-1, 1, 1, 1), "pil")
    if op == "Posterize":  # timm returns the image unchanged for 8 bits or more
        return posterize(x, _per_sample([min(8.0, float(int(v))) for v in values], x))
    if op == "Solarize":
        return solarize(x, _per_sample(values, x))
    if op == "SolarizeAdd":
        return solarize_add(x, _per_sample(values, x))
    if op == "AutoContrast":
        return autocontrast(x, "pil")
    if op == "Equalize":
        return equalize(x, "pil")
    if op == "Invert":
        return 255.0 - x
    raise ValueError(f"op={op!r} is not a timm op replayed here")
