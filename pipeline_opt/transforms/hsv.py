"""Random hue / saturation / value jitter of a batch, equivalent to ultralytics' ``RandomHSV``.

:class:`RandomHSV` reproduces ``RandomHSV``: the same ``r = uniform(-1, 1, 3) * gains`` per image,
the same 8-bit lookup tables in OpenCV's 0..180 hue convention, and an integer re-implementation of
OpenCV's 8-bit ``RGB2HSV`` (bit-exact) and of its vectorised ``HSV2RGB`` (it truncates; off by one
on ~0.02% of colours where OpenCV fuses a multiply-add, and on pixels OpenCV processes in its
scalar row tail, which rounds instead). Ultralytics batches (``batch["img"]``) are RGB: its
``Format`` reverses OpenCV's BGR channels unless ``bgr`` is set, so ``channel_order="RGB"`` is the
default; HSV is symmetric in the channel order as long as the order is declared. Batches, dtypes,
seeds and boxes as in :mod:`~pipeline_opt.transforms.augment_base`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline_opt._core.step import to_device_async
from pipeline_opt.transforms.augment_base import (
    RandomBatchAugment,
    augment_result,
    check_boxes_arg,
    check_images,
    check_nonneg,
    from_uint8,
    to_uint8,
)
from pipeline_opt.transforms.boxes import BatchBoxes
from pipeline_opt.transforms.fused import fused_available, hsv_flip

__all__ = ["HSVParams", "RandomHSV", "hsv_luts", "hsv_to_rgb_u8", "rgb_to_hsv_u8"]

_HSV_SHIFT = 12


def rgb_to_hsv_u8(rgb: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit ``COLOR_RGB2HSV`` on ``(..., 3, H, W)`` uint8; returns int32 H (0..179), S, V.

    Integer arithmetic identical to OpenCV's ``RGB2HSV_b`` (12-bit fixed-point division tables).
    """
    x = rgb.to(torch.int32)
    r, g, b = x.unbind(-3)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    half = 1 << (_HSV_SHIFT - 1)
    # sdiv[v] = round((255 << 12) / v) and hdiv[d] = round((180 << 12) / (6 d)); float32 gives the same
    # integers as OpenCV's float64 tables for every 8-bit value (checked exhaustively in the tests).
    sdiv = torch.round(float(255 << _HSV_SHIFT) / v.clamp(min=1).to(torch.float32)).to(torch.int32)
    hdiv = torch.round(float((180 << _HSV_SHIFT) / 6) / diff.clamp(min=1).to(torch.float32)).to(torch.int32)
    s = (diff * sdiv + half) >> _HSV_SHIFT
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * torch.where(diff > 0, hdiv, 0) + half) >> _HSV_SHIFT
    h = torch.where(h < 0, h + 180, h)
    return torch.stack((h, s, v), -3)


def hsv_to_rgb_u8(hsv: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit ``COLOR_HSV2RGB`` (vectorised path) on ``(..., 3, H, W)`` H (0..179), S, V.

    Float32 arithmetic in OpenCV's order, sector selection as its ``HSV2RGB_simd`` and truncation
    to uint8 as its vectorised 8-bit path.
    """
    h, s, v = hsv.to(torch.float32).unbind(-3)
    s = s * (1.0 / 255.0)
    v = v * (1.0 / 255.0)
    h = h * (6.0 / 180.0)
    pre = torch.trunc(h)
    frac = h - pre
    sector = pre - torch.trunc(pre * (1.0 / 6.0)) * 6.0  # 0..5, kept as float like OpenCV
    t0, t1 = v, v * (1 - s)
    t2, t3 = v * (1 - s * frac), v * (1 - s * (1 - frac))
    w = torch.where
    b = w(sector < 2, t1, w(sector == 2, t3, w(sector > 4, t2, t0)))
    g = w(sector < 1, t3, w(sector < 3, t0, w(sector == 3, t2, t1)))
    r = w(sector < 1, t0, w(sector == 1, t2, w(sector < 4, t1, w(sector == 4, t3, t0))))
    rgb = torch.stack((r, g, b), -3)
    return torch.trunc(rgb * 255.0).clamp_(0, 255).to(torch.uint8)


def hsv_luts(gains: torch.Tensor) -> torch.Tensor:
    """Ultralytics' per-image lookup tables for ``r = gains`` (``(B, 3)``) -> ``(B, 3, 256)`` uint8.

    ``hue = (x + r0 * 180) % 180``, ``sat = clip(x * (1 + r1), 0, 255)``, ``val = clip(x * (1 + r2))``,
    truncated to uint8: computed with numpy in float64 on the CPU, the very expressions of
    ultralytics (numpy's float ``%`` is exact where ``torch.remainder`` may round); numpy is also
    cheaper than torch operations on arrays this small, and the training thread pays for it per
    batch. The result is on ``gains``' device.
    """
    if gains.ndim != 2 or gains.shape[-1] != 3:
        raise ValueError(f"gains must have shape (B, 3), got {tuple(gains.shape)}")
    r = gains.detach().to("cpu", torch.float64).numpy()
    x = np.arange(256, dtype=np.float64)
    hue = _mod180(x + r[:, :1] * 180).astype(np.uint8)
    sat = np.clip(x * (r[:, 1:2] + 1), 0, 255).astype(np.uint8)
    val = np.clip(x * (r[:, 2:3] + 1), 0, 255).astype(np.uint8)
    sat[:, 0] = 0
    luts = torch.from_numpy(np.stack((hue, sat, val), 1))
    return luts if gains.device.type == "cpu" else luts.to(gains.device)


def _mod180(a: np.ndarray) -> np.ndarray:
    """numpy's ``a % 180`` for float64 (the same values; ``-0.0`` may keep its sign, which no
    uint8 cast sees), without numpy's slow general divmod.

    For ``a`` in ``[-180, 540)`` (hue gains up to 1) numpy computes ``fmod(a, 180)``, plus 180 when
    that is negative. There ``fmod`` is ``a``, ``a - 180`` or ``a - 360``, and those two
    subtractions are exact (Sterbenz: ``b / 2 <= a <= 2 b``); the ``+ 180`` is the same addition
    numpy makes. Other ranges take numpy's ``%``.
    """
    if a.size == 0 or a.min() < -180 or a.max() >= 540:
        return a % 180
    return np.where(a >= 360, a - 360, np.where(a >= 180, a - 180, np.where(a < 0, a + 180, a)))


@dataclass(frozen=True)
class HSVParams:
    """Per-sample HSV gains: ``gains`` is ``(B, 3)``, ultralytics' ``r = uniform(-1, 1, 3) * gains``."""

    gains: torch.Tensor


class RandomHSV(RandomBatchAugment):
    """Random hue / saturation / value jitter per sample, equivalent to ultralytics' ``RandomHSV``.

    Args:
        hgain, sgain, vgain: maximum relative change of hue, saturation and value (ultralytics
            ``hsv_h``, ``hsv_s``, ``hsv_v``).
        channel_order: ``"RGB"`` (ultralytics batches, torchvision) or ``"BGR"`` (OpenCV arrays).
        seed, generator: randomness source (see :mod:`~pipeline_opt.transforms.augment_base`).
        fused: on CUDA with Triton, one fused kernel (:mod:`pipeline_opt.transforms.fused`, bit-identical);
            ``False`` runs the torch operations (e.g. to time them).

    Float inputs are quantised to 8 bits first: the ultralytics operation is defined on uint8
    lookup tables. Batches with a channel count other than 3 pass through unchanged (as in
    ultralytics). With all gains 0 the module is the identity.
    """

    def __init__(
        self,
        hgain: float = 0.5,
        sgain: float = 0.5,
        vgain: float = 0.5,
        *,
        channel_order: str = "RGB",
        seed: int | None = None,
        generator: torch.Generator | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__(seed, generator)
        self.fused = bool(fused)
        self.gains = (
            check_nonneg("hgain", hgain),
            check_nonneg("sgain", sgain),
            check_nonneg("vgain", vgain),
        )
        if channel_order not in ("RGB", "BGR"):
            raise ValueError(f"channel_order={channel_order!r} must be 'RGB' or 'BGR'")
        self.channel_order = channel_order

    def extra_repr(self) -> str:
        h, s, v = self.gains
        return f"hgain={h}, sgain={s}, vgain={v}, channel_order={self.channel_order!r}"

    def sample_params(self, batch_size: int, size: tuple[int, int] | None = None) -> HSVParams:
        """Draw ``uniform(-1, 1, 3) * gains`` per sample."""
        u = torch.rand(batch_size, 3, generator=self.generator, dtype=torch.float64) * 2 - 1
        return HSVParams(u * torch.tensor(self.gains, dtype=torch.float64))

    def active(self, images: torch.Tensor) -> bool:
        """Whether :meth:`apply` changes ``images`` (3 channels, a non-zero gain, a non-empty batch)."""
        return images.shape[1] == 3 and any(self.gains) and images.shape[0] > 0

    def apply(self, images: torch.Tensor, params: HSVParams, boxes: BatchBoxes | None = None):
        """Apply the gains of ``params`` to each sample; boxes pass through untouched.

        On CUDA with Triton the work is one fused kernel (:mod:`pipeline_opt.transforms.fused`)."""
        check_images(images)
        check_boxes_arg(boxes)
        if params.gains.shape != (images.shape[0], 3):
            raise ValueError(
                f"params.gains has shape {tuple(params.gains.shape)}, expected ({images.shape[0]}, 3)"
            )
        if not self.active(images):
            return augment_result(images, boxes)
        x = to_uint8(images)
        if self.fused and fused_available(x.device):  # one Triton kernel, bit-identical to the torch operations below
            out = hsv_flip(x, hsv_luts(params.gains), channel_order=self.channel_order)
            return augment_result(from_uint8(out, images.dtype), boxes)
        if self.channel_order == "BGR":
            x = x.flip(1)
        luts = to_device_async(hsv_luts(params.gains), images.device)  # (B, 3, 256)
        hsv = rgb_to_hsv_u8(x)
        offset = torch.arange(luts.shape[0] * 3, device=images.device, dtype=torch.int32).view(-1, 3, 1, 1)
        mapped = luts.reshape(-1)[hsv + offset * 256]  # int32 indices: half the memory of int64
        out = hsv_to_rgb_u8(mapped)
        if self.channel_order == "BGR":
            out = out.flip(1)
        return augment_result(from_uint8(out, images.dtype), boxes)
