"""Batch transforms that run on any device and match torchvision's results.

Each class is a plain :class:`torch.nn.Module` working on a ``(B, C, H, W)`` batch (a single
``(C, H, W)`` image works too) of ``uint8`` or floating-point values, on whatever device the batch
lives on. They compute exactly what torchvision computes on tensors:

* :class:`ToFloat` — ``uint8 -> float / 255`` (floats pass through), bit-identical to ``ToTensor``
  and v1 ``ConvertImageDtype(torch.float32)``.
* :class:`ConvertDtype` — ``v2.functional.to_dtype`` (with or without value scaling), bit-identical
  to ``v2.ToDtype`` (which multiplies by 1/255: one float ulp off a division on some values).
* :class:`Normalize` — ``(x - mean) / std``, bit-identical to torchvision's ``Normalize``.
* :class:`Resize` — bilinear, ``align_corners=False``, antialiased: bit-identical to torchvision's
  tensor resize on float input (and on uint8 except v2's fixed-point CPU kernel: one level at most),
  (including its integer-size = shorter-side rule and ``max_size``) and within 1/255 of
  PIL ``BILINEAR``. Kornia's own resize is not used: its antialias is a Gaussian blur (up to 44/255
  off PIL) and ``kornia.augmentation.Resize`` defaults to ``align_corners=True``.
* :class:`CenterCrop` — torchvision's centre crop, including its rounding of odd offsets and the
  zero padding when the crop is larger than the image.

Inside ``kornia.augmentation.AugmentationSequential`` these modules are applied to the ``"input"``
key only (Kornia calls plain modules on the image and leaves the other data keys alone). That is
right for :class:`ToFloat`, :class:`ConvertDtype` and :class:`Normalize`; :class:`Resize` and
:class:`CenterCrop` change geometry, so use them there only without box / mask / keypoint keys
(the box-aware augmentations live in :mod:`pipeline_opt.transforms.augment`).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["CenterCrop", "ConvertDtype", "Normalize", "Resize", "ToFloat", "resized_size"]


def _check_image(x: object, who: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who} expects a torch.Tensor batch (B, C, H, W) or image (C, H, W), got {type(x).__name__}")
    if x.dim() < 3:
        raise ValueError(f"{who} expects a (B, C, H, W) or (C, H, W) tensor, got shape {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise TypeError(f"{who} expects uint8 or floating-point images, got dtype {x.dtype}")
    return x


def _as_float(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``uint8 -> dtype / 255`` (torchvision's ``convert_image_dtype``); floats pass through."""
    if x.is_floating_point():
        return x
    if x.dtype != torch.uint8:
        raise TypeError(f"integer images must be uint8 to be scaled to [0, 1], got {x.dtype}; convert them first")
    return x.to(dtype).div_(255.0)


class ToFloat(torch.nn.Module):
    """``uint8 -> float / 255``; floating-point input is returned as it is (no copy).

    Bit-identical to torchvision's ``ToTensor`` scaling and v1 ``ConvertImageDtype(torch.float32)``
    on uint8 images (``v2.ToDtype`` multiplies by 1/255 instead: use :class:`ConvertDtype` for it).
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r} must be a floating-point torch.dtype, e.g. torch.float32")
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_image(x, type(self).__name__)
        return _as_float(x, self.dtype)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}"


class ConvertDtype(torch.nn.Module):
    """Convert to ``dtype`` like ``torchvision.transforms.v2.functional.to_dtype(x, dtype, scale)``.

    With ``scale=True`` the value range follows the dtype (uint8 0..255, float 0..1), which is also
    what v1 ``ConvertImageDtype`` does; with ``scale=False`` only the dtype changes.
    """

    def __init__(self, dtype: torch.dtype, scale: bool = True) -> None:
        super().__init__()
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={dtype!r} must be a torch.dtype, e.g. torch.float32")
        self.dtype = dtype
        self.scale = bool(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2.functional import to_dtype

        x = _check_image(x, type(self).__name__)
        return to_dtype(x, self.dtype, scale=self.scale)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, scale={self.scale}"


class Normalize(torch.nn.Module):
    """``(x - mean) / std`` per channel, bit-identical to torchvision's ``Normalize`` on float input.

    uint8 input is first scaled to [0, 1] (as :class:`ToFloat` does), so ``Normalize`` can take the
    raw batch that a uint8 pipeline ships. ``mean`` / ``std`` are kept as Python floats and turned
    into a tensor of the batch's dtype on the batch's device once (cached), as torchvision does.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(_float_list(mean, "mean"), dtype=torch.float64)
        std_t = torch.as_tensor(_float_list(std, "std"), dtype=torch.float64)
        if mean_t.numel() != std_t.numel():
            raise ValueError(f"mean has {mean_t.numel()} values but std has {std_t.numel()}; give one per channel")
        if (std_t == 0).any():
            raise ValueError(f"std={list(std)} contains a zero; every channel needs a non-zero std")
        self.mean = tuple(mean_t.tolist())
        self.std = tuple(std_t.tolist())
        self._values = (self.mean, self.std)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _params(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (like.device, like.dtype)
        hit = self._cache.get(key)
        if hit is None:
            # torchvision builds mean/std with torch.as_tensor(list, dtype=x.dtype): same rounding here.
            mean = torch.as_tensor(self._values[0], dtype=like.dtype, device=like.device).view(-1, 1, 1)
            std = torch.as_tensor(self._values[1], dtype=like.dtype, device=like.device).view(-1, 1, 1)
            hit = self._cache[key] = (mean, std)
        return hit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_float(_check_image(x, type(self).__name__))
        channels = x.shape[-3]
        if channels != len(self._values[0]) and len(self._values[0]) != 1:
            raise ValueError(
                f"Normalize has {len(self._values[0])} channel values but the batch has {channels} channels "
                f"(shape {tuple(x.shape)}); give one mean/std per channel"
            )
        mean, std = self._params(x)
        return (x - mean) / std

    def extra_repr(self) -> str:
        return f"mean={list(self._values[0])}, std={list(self._values[1])}"


def _float_list(values: Sequence[float] | float, name: str) -> list[float]:
    if isinstance(values, numbers.Number):
        return [float(values)]
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={values!r} must be a number or a sequence of numbers (one per channel)") from None
    if not out:
        raise ValueError(f"{name}={values!r} is empty; give one value per channel")
    return out


def _parse_size(size: int | Sequence[int] | None, max_size: int | None) -> tuple[int, ...] | None:
    if size is None:
        if not isinstance(max_size, int) or isinstance(max_size, bool):
            raise ValueError("size=None needs an integer max_size (the longer side), e.g. Resize(None, max_size=512)")
        return None
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (int(size),)
    if not isinstance(size, Sequence) or len(size) not in (1, 2) or \
            not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in size):
        raise ValueError(f"size={size!r} must be an int (shorter side) or a (height, width) pair of ints")
    size = tuple(int(s) for s in size)
    if min(size) < 1:
        raise ValueError(f"size={size!r} must be positive")
    if max_size is not None:
        if len(size) != 1:
            raise ValueError(f"max_size={max_size!r} is only allowed with an int size (shorter side), not size={size}")
        if max_size <= size[0]:
            raise ValueError(f"max_size={max_size} must be larger than the shorter-side size {size[0]}")
    return size


def resized_size(height: int, width: int, size: int | Sequence[int] | None,
                 max_size: int | None = None) -> tuple[int, int]:
    """The ``(height, width)`` torchvision's ``Resize(size, max_size=...)`` produces for an image.

    An int (or one-element) ``size`` sets the shorter side and scales the longer side by the same
    factor, truncated; ``max_size`` then caps the longer side. A pair is the exact ``(h, w)``.
    """
    parsed = _parse_size(size, max_size)
    short, long = (width, height) if width <= height else (height, width)
    if parsed is None:
        new_short, new_long = int(max_size * short / long), max_size
    elif len(parsed) == 2:
        return parsed[0], parsed[1]
    else:
        new_short, new_long = parsed[0], int(parsed[0] * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if width <= height else (new_short, new_long)


class Resize(torch.nn.Module):
    """Bilinear resize equal to torchvision's tensor ``Resize`` (and within 1/255 of PIL BILINEAR).

    ``size`` is an int (shorter side, aspect kept, longer side truncated as torchvision does), a
    ``(height, width)`` pair, or ``None`` with ``max_size`` (longer side). The kernel is
    ``F.interpolate(mode="bilinear", align_corners=False, antialias=antialias)``. The dtype is kept
    like torchvision does: float32/float64 are resized in their dtype, float16 in float32 and cast
    back, uint8 in float32 and rounded back to uint8 — on every device, so results do not depend on
    where it runs. That is exactly torchvision v1 everywhere and v2 on CUDA; v2 on an AVX2 CPU uses
    a fixed-point uint8 kernel that can differ from it by one level. With ``out_dtype`` (a float dtype) the result
    is returned in that dtype without rounding, values in the input's range (0..255 for uint8).
    """

    def __init__(self, size: int | Sequence[int] | None, antialias: bool = True, max_size: int | None = None,
                 out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.size = _parse_size(size, max_size)
        self.max_size = max_size
        if not isinstance(antialias, bool):
            raise ValueError(f"antialias={antialias!r} must be True or False")
        self.antialias = antialias
        if out_dtype is not None and (not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point):
            raise ValueError(f"out_dtype={out_dtype!r} must be None (keep the input dtype) or a float dtype")
        self.out_dtype = out_dtype

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` an image of ``height x width`` is resized to."""
        size = None if self.size is None else list(self.size)
        return resized_size(height, width, size, self.max_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_image(x, type(self).__name__)
        shape = x.shape
        new_h, new_w = self.output_size(shape[-2], shape[-1])
        if (new_h, new_w) == (shape[-2], shape[-1]):
            return x if self.out_dtype is None else x.to(self.out_dtype)
        batch = x.reshape(-1, *shape[-3:])
        dtype = batch.dtype
        native = dtype in (torch.float32, torch.float64)
        work = batch if native else batch.to(self.out_dtype or torch.float32)
        out = F.interpolate(work, size=[new_h, new_w], mode="bilinear", align_corners=False,
                            antialias=self.antialias)
        if self.out_dtype is not None:
            out = out.to(self.out_dtype)
        elif out.dtype != dtype:
            out = (out.round_() if not dtype.is_floating_point else out).to(dtype)
        return out.reshape(*shape[:-2], new_h, new_w)

    def extra_repr(self) -> str:
        size = None if self.size is None else (self.size[0] if len(self.size) == 1 else self.size)
        return f"size={size}, antialias={self.antialias}, max_size={self.max_size}"


class CenterCrop(torch.nn.Module):
    """torchvision's ``CenterCrop``: offsets ``round((H - h) / 2)`` (Python rounding, as torchvision),
    zero padding (``(d // 2, (d + 1) // 2)`` per side) when the crop is larger than the image."""

    def __init__(self, size: int | Sequence[int]) -> None:
        super().__init__()
        if isinstance(size, numbers.Integral) and not isinstance(size, bool):
            size = (int(size), int(size))
        elif isinstance(size, Sequence) and len(size) == 1:
            size = (size[0], size[0])
        if not isinstance(size, Sequence) or len(size) != 2 or \
                not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0 for s in size):
            raise ValueError(f"size={size!r} must be a positive int or a (height, width) pair of positive ints")
        self.size = (int(size[0]), int(size[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_image(x, type(self).__name__)
        ch, cw = self.size
        h, w = x.shape[-2:]
        if ch > h or cw > w:
            pad_l = (cw - w) // 2 if cw > w else 0
            pad_t = (ch - h) // 2 if ch > h else 0
            pad_r = (cw - w + 1) // 2 if cw > w else 0
            pad_b = (ch - h + 1) // 2 if ch > h else 0
            x = F.pad(x, [pad_l, pad_r, pad_t, pad_b], value=0.0)
            h, w = x.shape[-2:]
        top = int(round((h - ch) / 2.0))
        left = int(round((w - cw) / 2.0))
        return x[..., top:top + ch, left:left + cw]

    def extra_repr(self) -> str:
        return f"size={self.size}"
