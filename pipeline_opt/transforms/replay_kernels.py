"""Batch kernels for replayed augmentations: per-sample parameters, torchvision's arithmetic.

Every kernel takes a float batch ``(B, C, H, W)`` and per-sample parameters (tensors of length
``B``) and computes, on whatever device the batch lives on, what torchvision computes per image on
the CPU. Which arithmetic that is depends on what the image was on the CPU at that point — the
*flavour*:

* ``"pil"`` — a PIL image (ImageFolder yields them): values are integers 0..255 held in float32;
  each op emulates Pillow's C code — ``ImageEnhance`` blends truncate ``d + f * (x - d)`` computed
  in float32, grayscale is Pillow's fixed-point ``L`` (ITU-R 601-2, rounded), contrast blends with
  the rounded mean of ``L``, hue goes through Pillow's 8-bit HSV conversion with a wrapping uint8
  shift, resize rounds half up. Measured bit-identical to Pillow on the colour ops.
* ``"uint8"`` — a uint8 tensor (after ``PILToTensor`` / ``v2.ToImage``): torchvision's tensor
  kernels on uint8 — the same blends in float32, truncated back to uint8, grayscale
  ``0.2989 r + 0.587 g + 0.114 b`` truncated, resize rounded.
* ``"float"`` — a float tensor in [0, 1] (after ``ToTensor`` / ``ToDtype``): torchvision's float
  kernels, for which Kornia's functional kernels (``kornia.enhance``) are used where they agree
  (see ``docs/gpu_ops.md``); Kornia is imported only on that path.

The resize is ``F.interpolate(mode="bilinear", align_corners=False, antialias=...)`` — torchvision's
tensor resize, within one level of Pillow's — never Kornia's (its antialias is a Gaussian blur).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "Flavour", "adjust_brightness", "adjust_contrast", "adjust_hue", "adjust_saturation", "crop_resize",
    "erase_constant", "erase_patches", "hue_shift_pil", "pad", "quantize", "to_grayscale",
]

Flavour = Literal["pil", "uint8", "float"]
FLAVOURS = ("pil", "uint8", "float")

_GRAY_TV = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (tensors)


def _check_flavour(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour={flavour!r} must be one of {FLAVOURS}")


def _per_sample(f: torch.Tensor, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``f`` (B,) as a (B, 1, 1, 1) tensor of ``dtype`` on ``x``'s device."""
    return f.to(device=x.device, dtype=dtype, non_blocking=True).view(-1, 1, 1, 1)


def quantize(x: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """Back to integer levels after a resampling op: Pillow rounds half up, torchvision's uint8 tensor
    resize rounds to nearest even; float images are not quantized."""
    _check_flavour(flavour)
    if flavour == "float":
        return x
    x = torch.floor(x + 0.5) if flavour == "pil" else torch.round(x)
    return x.clamp_(0.0, 255.0)


# ------------------------------------------------------------------------------------------ geometry

def crop_resize(img: torch.Tensor, top: int, left: int, height: int, width: int, size: tuple[int, int],
                antialias: bool, flavour: Flavour) -> torch.Tensor:
    """``img[..., top:top+height, left:left+width]`` resized to ``size`` (bilinear, ``align_corners=False``),
    as torchvision's ``resized_crop``. ``img`` is ``(1, C, H, W)`` or ``(C, H, W)``, uint8 or float
    (a uint8 image is cropped first, so only the crop is converted); the result is float."""
    out = img[..., top:top + height, left:left + width]
    if not out.is_floating_point():
        out = out.to(torch.float32)
    if (height, width) == tuple(size):
        return out
    batch = out if out.dim() == 4 else out.unsqueeze(0)
    res = F.interpolate(batch, size=list(size), mode="bilinear", align_corners=False, antialias=antialias)
    res = res if out.dim() == 4 else res.squeeze(0)
    return quantize(res, flavour)


def _reflect_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    idx = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return idx.clamp(0, n - 1)
    if mode == "reflect":  # mirror without repeating the edge: period 2n - 2
        if n == 1:
            return torch.zeros_like(idx)
        period = 2 * n - 2
        idx = torch.remainder(idx, period)
        return torch.where(idx >= n, period - idx, idx)
    period = 2 * n  # symmetric: mirror repeating the edge
    idx = torch.remainder(idx, period)
    return torch.where(idx >= n, period - 1 - idx, idx)


def pad(img: torch.Tensor, padding: Sequence[int], fill: float | Sequence[float] = 0.0,
        mode: str = "constant") -> torch.Tensor:
    """Pad ``(..., C, H, W)`` by ``(left, top, right, bottom)`` like torchvision's ``pad`` (modes
    constant — one fill or one per channel —, edge, reflect, symmetric)."""
    left, top, right, bottom = (int(p) for p in padding)
    if not any((left, top, right, bottom)):
        return img
    if mode == "constant":
        h, w = img.shape[-2:]
        out = img.new_empty(*img.shape[:-2], h + top + bottom, w + left + right)
        fills = [float(fill)] if isinstance(fill, (int, float)) else [float(v) for v in fill]
        if len(fills) == 1:
            out.fill_(fills[0])
        else:
            out.copy_(torch.tensor(fills, dtype=img.dtype).to(img.device).view(-1, 1, 1).expand_as(out))
        out[..., top:top + h, left:left + w] = img
        return out
    if mode not in ("edge", "reflect", "symmetric"):
        raise ValueError(f"padding_mode={mode!r} must be constant, edge, reflect or symmetric")
    h, w = img.shape[-2:]
    rows = _reflect_index(h, top, bottom, mode, img.device)
    cols = _reflect_index(w, left, right, mode, img.device)
    return img.index_select(-2, rows).index_select(-1, cols)


# ------------------------------------------------------------------------------------------- colour

def _luma_pil(x: torch.Tensor) -> torch.Tensor:
    """Pillow's ``convert("L")``: ``(r*19595 + g*38470 + b*7471 + 0x8000) >> 16`` in int32, as its C code."""
    r, g, b = x.unbind(-3)
    acc = r.to(torch.int32) * 19595 + g.to(torch.int32) * 38470 + b.to(torch.int32) * 7471 + 0x8000
    return torch.bitwise_right_shift(acc, 16).to(x.dtype).unsqueeze(-3)


def _luma_tv(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(-3)
    return (_GRAY_TV[0] * r + _GRAY_TV[1] * g + _GRAY_TV[2] * b).unsqueeze(-3)


def blend_pil(degenerate: torch.Tensor, img: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Pillow's ``Image.blend(degenerate, img, f)`` (``ImageEnhance``): ``d + f * (x - d)`` in float32,
    clipped to 0..255 and truncated, as its C code."""
    return (degenerate + f * (img - degenerate)).clamp_(0.0, 255.0).trunc_()


def blend_u8(img: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's tensor ``_blend`` on uint8: ``f * x + (1 - f) * other``, clamped, truncated.

    torchvision computes ``1 - f`` from a Python float (a double) and rounds each factor to float32
    on use: ``f`` is taken at its own precision (give float64 factors that are not float32 values)."""
    return (f.to(img.dtype) * img + (1.0 - f).to(img.dtype) * other).clamp_(0.0, 255.0).trunc_()


def adjust_brightness(x: torch.Tensor, f: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """Per-sample ``adjust_brightness`` (multiply by ``f``)."""
    _check_flavour(flavour)
    f = _per_sample(f, x)
    if flavour == "pil":
        return blend_pil(torch.zeros_like(x), x, f)
    if flavour == "uint8":
        return blend_u8(x, torch.zeros_like(x), _per_sample(f, x, torch.float64))
    import kornia.enhance as KE

    return KE.adjust_contrast(x, f.view(-1))  # Kornia's "contrast" multiplies: torchvision's brightness


def adjust_contrast(x: torch.Tensor, f: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """Per-sample ``adjust_contrast`` (blend with the mean grey level of each image)."""
    _check_flavour(flavour)
    fs = _per_sample(f, x)
    if flavour == "pil":
        luma = _luma_pil(x)
        total = luma.to(torch.float64).sum(dim=(-3, -2, -1), keepdim=True)
        mean = torch.floor(total / (luma.shape[-1] * luma.shape[-2]) + 0.5).to(x.dtype)  # int(mean + 0.5)
        return blend_pil(mean.expand_as(x), x, fs)
    if flavour == "uint8":
        mean = torch.mean(_luma_tv(x).trunc_(), dim=(-3, -2, -1), keepdim=True)
        return blend_u8(x, mean, _per_sample(f, x, torch.float64))
    import kornia.enhance as KE

    return KE.adjust_contrast_with_mean_subtraction(x, fs.view(-1))


def adjust_saturation(x: torch.Tensor, f: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """Per-sample ``adjust_saturation`` (blend with each pixel's grey level)."""
    _check_flavour(flavour)
    fs = _per_sample(f, x)
    if flavour == "pil":
        return blend_pil(_luma_pil(x).expand_as(x), x, fs)
    if flavour == "uint8":
        return blend_u8(x, _luma_tv(x).trunc_(), _per_sample(f, x, torch.float64))
    import kornia.enhance as KE

    return KE.adjust_saturation_with_gray_subtraction(x, fs.view(-1))


def hue_shift_pil(hue_factors: Sequence[float]) -> list[int]:
    """The uint8 hue shifts torchvision applies on PIL images: ``np.int32(h * 255)`` wrapped to uint8."""
    return [math.trunc(float(h) * 255) % 256 for h in hue_factors]


def _rgb_to_hsv_pil(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pillow's ``rgb2hsv_row`` (float / double arithmetic as its C code), uint8 levels in float64."""
    r, g, b = x.unbind(-3)
    maxc = torch.maximum(r, torch.maximum(g, b))
    minc = torch.minimum(r, torch.minimum(g, b))
    cr = maxc - minc
    grey = cr == 0
    crs = torch.where(grey, torch.ones_like(cr), cr)
    s = cr / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    rc, gc, bc = ((maxc - r) / crs).double(), ((maxc - g) / crs).double(), ((maxc - b) / crs).double()
    h = torch.where(r == maxc, bc - gc, torch.where(g == maxc, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.fmod(h.float().double() / 6.0 + 1.0, 1.0).float().double()
    uh = torch.where(grey, 0.0, (h * 255.0).trunc().clamp(0.0, 255.0))
    us = torch.where(grey, 0.0, (s.double() * 255.0).trunc().clamp(0.0, 255.0))
    return uh, us, maxc.double()


def _hsv_to_rgb_pil(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Pillow's ``hsv2rgb`` (C ``round`` is half away from zero: ``floor(x + 0.5)`` for x >= 0)."""
    hf = h * 6.0 / 255.0
    i = torch.floor(hf)
    f = (hf - i).float().double()
    fs = (s / 255.0).float().double()
    p = torch.floor(v * (1.0 - fs) + 0.5).clamp(0.0, 255.0)
    q = torch.floor(v * (1.0 - fs * f) + 0.5).clamp(0.0, 255.0)
    t = torch.floor(v * (1.0 - fs * (1.0 - f)) + 0.5).clamp(0.0, 255.0)
    sector = torch.remainder(i.long(), 6).unsqueeze(0)
    r = torch.stack([v, q, p, p, t, v]).gather(0, sector)[0]
    g = torch.stack([t, v, v, q, p, p]).gather(0, sector)[0]
    b = torch.stack([p, p, t, v, v, q]).gather(0, sector)[0]
    grey = s == 0
    rgb = torch.stack([torch.where(grey, v, r), torch.where(grey, v, g), torch.where(grey, v, b)], -3)
    return rgb.float()


def adjust_hue(x: torch.Tensor, f: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """Per-sample ``adjust_hue`` by ``f`` in [-0.5, 0.5] (a fraction of the hue circle)."""
    _check_flavour(flavour)
    if flavour == "pil":
        shifts = torch.tensor(hue_shift_pil(f.tolist()), dtype=torch.float64).to(x.device).view(-1, 1, 1)
        h, s, v = _rgb_to_hsv_pil(x)
        h = torch.remainder(h + shifts, 256.0)
        return _hsv_to_rgb_pil(h, s, v).to(x.dtype)
    import kornia.enhance as KE

    radians = _per_sample(f, x).view(-1) * (2 * math.pi)
    if flavour == "float":
        return KE.adjust_hue(x, radians)
    # uint8 tensors: torchvision scales to [0, 1], shifts the hue, scales back with mul(255.999) + trunc
    out = KE.adjust_hue(x * (1.0 / 255.0), radians)
    return out.mul_(255.0 + 1.0 - 1e-3).trunc_().clamp_(0.0, 255.0)


def to_grayscale(x: torch.Tensor, flavour: Flavour) -> torch.Tensor:
    """``rgb_to_grayscale(x, num_output_channels=3)``: the grey level in all three channels."""
    _check_flavour(flavour)
    if flavour == "pil":
        grey = _luma_pil(x)
    elif flavour == "uint8":
        grey = _luma_tv(x).trunc_()
    else:
        grey = _luma_tv(x)
    return grey.expand_as(x).contiguous()


# -------------------------------------------------------------------------------------------- erase

def erase_constant(x: torch.Tensor, boxes: torch.Tensor, apply: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Fill ``boxes`` (B, 4) ``(top, left, height, width)`` with ``value`` (C,) or (1,) where ``apply`` (B,).

    One masked ``where`` over the batch (no per-sample loop); boxes are integers on the host or device.
    """
    b, _, h, w = x.shape
    boxes = boxes.to(device=x.device, dtype=torch.long, non_blocking=True)
    apply = apply.to(device=x.device, dtype=torch.bool, non_blocking=True)
    top, left, bh, bw = boxes.unbind(-1)
    ys = torch.arange(h, device=x.device).view(1, h, 1)
    xs = torch.arange(w, device=x.device).view(1, 1, w)
    inside = ((ys >= top.view(-1, 1, 1)) & (ys < (top + bh).view(-1, 1, 1))
              & (xs >= left.view(-1, 1, 1)) & (xs < (left + bw).view(-1, 1, 1)) & apply.view(-1, 1, 1))
    fill = value.to(device=x.device, dtype=x.dtype, non_blocking=True).view(1, -1, 1, 1)
    return torch.where(inside.unsqueeze(1), fill, x)


def erase_patches(x: torch.Tensor, boxes: Sequence[tuple[int, int, int, int]], indices: Sequence[int],
                  patches: Sequence[torch.Tensor]) -> torch.Tensor:
    """Write per-sample ``patches`` (C, h, w) into ``x[index]`` at ``boxes`` — torchvision's
    ``value="random"``, whose values were drawn on the CPU."""
    out = x.clone()
    for (top, left, h, w), index, patch in zip(boxes, indices, patches):
        out[index, :, top:top + h, left:left + w] = patch.to(device=x.device, dtype=x.dtype, non_blocking=True)
    return out
