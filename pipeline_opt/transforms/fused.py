"""One GPU kernel for ultralytics' colour + flip augmentation of a uint8 batch (Triton).

:class:`~pipeline_opt.transforms.hsv.RandomHSV` written as torch operations launches ~70
kernels per batch, each reading and writing the whole batch in int32 or float32: for a
64x3x640x640 batch that is gigabytes of memory traffic and dozens of launches from the training
thread, which a launch-bound step (YOLO11n) pays for directly. :func:`hsv_flip` does the same
work in ONE kernel that reads each pixel once and writes it once: OpenCV's 8-bit ``RGB2HSV``
(the integer arithmetic of :func:`~pipeline_opt.transforms.hsv.rgb_to_hsv_u8`, its two
division tables computed once per device by the same float32 expressions), the per-image lookup
tables, ``HSV2RGB`` in float32 in the reference's order, and the vertical / horizontal flips as a
mirrored read. Floating-point contraction (FMA) is switched off so every float operation rounds
as the separate torch kernels do: the output equals the torch reference bit for bit (tested on
the GPU, and on the CPU through Triton's interpreter).

Used automatically on CUDA tensors when Triton imports; ``RandomHSV(fused=False)`` /
``DetectionGPUAugment(fused=False)`` run the torch reference instead. All per-sample parameters travel in one small page-locked
host-to-device copy, so the call never waits for the device.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import to_device_async

log = get_logger("transforms.fused")

__all__ = ["fused_available", "hsv_flip", "hsv_tables"]

_HSV_SHIFT = 12
_BLOCK = 1024
_PARAM_STRIDE = 3 * 256 + 2  # per sample: H, S, V lookup tables, then the flip flags (vertical, horizontal)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=1)
def _triton():
    """The ``triton`` module, or ``None`` when it is not installed (or fails to import)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install: the torch reference still works
        log.debug("Triton unavailable (%s): colour augmentation runs as torch operations", exc)
        return None
    return triton


def fused_available(device: torch.device | str) -> bool:
    """Whether :func:`hsv_flip` can run on ``device``: CUDA with Triton (CPU only under
    ``TRITON_INTERPRET=1``, for tests)."""
    dev = torch.device(device)
    if dev.type != "cuda" and not (dev.type == "cpu" and _interpreting()):
        return False
    return _triton() is not None


def hsv_tables(device: torch.device | str = "cpu") -> torch.Tensor:
    """OpenCV's 8-bit division tables as ``(2, 256)`` int32: ``[0]`` is the saturation divisor for
    ``v`` and ``[1]`` the hue divisor for ``max - min`` (the float32 expressions of
    :func:`~pipeline_opt.transforms.hsv.rgb_to_hsv_u8`, whose divisor is clamped to >= 1)."""
    return _hsv_tables_cached(str(torch.device(device)))


@functools.lru_cache(maxsize=8)
def _hsv_tables_cached(device: str) -> torch.Tensor:
    x = torch.arange(256, dtype=torch.int32).clamp(min=1).to(torch.float32)
    sdiv = torch.round(float(255 << _HSV_SHIFT) / x).to(torch.int32)
    hdiv = torch.round(float((180 << _HSV_SHIFT) / 6) / x).to(torch.int32)
    return torch.stack((sdiv, hdiv)).to(device)


def _params(luts: torch.Tensor | None, flip_ud: torch.Tensor | None, flip_lr: torch.Tensor | None,
            batch: int) -> torch.Tensor:
    """The ``(B, 770)`` uint8 parameter block (lookup tables, flip flags) on the CPU.

    Built with numpy: torch's CPU fill / copy of a block this size (> 32,768 elements) would run
    on the intra-op thread pool, which waits for descheduled threads while loader workers keep
    the cores busy (see :mod:`pipeline_opt._core.staging`)."""
    out = np.zeros((batch, _PARAM_STRIDE), dtype=np.uint8)
    if luts is not None:
        out[:, :768] = luts.to("cpu", torch.uint8).reshape(batch, 768).numpy()
    for col, flags in ((768, flip_ud), (769, flip_lr)):
        if flags is not None:
            out[:, col] = flags.to("cpu").reshape(batch).numpy()
    return torch.from_numpy(out)


def hsv_flip(images: torch.Tensor, luts: torch.Tensor | None = None, *, flip_ud: torch.Tensor | None = None,
             flip_lr: torch.Tensor | None = None, channel_order: str = "RGB") -> torch.Tensor:
    """Colour lookup (optional) and per-sample flips of a uint8 ``(B, 3, H, W)`` batch in one kernel.

    Args:
        images: uint8 ``(B, 3, H, W)`` on a device where :func:`fused_available` holds.
        luts: ``(B, 3, 256)`` uint8 per-image H / S / V tables (:func:`~pipeline_opt.transforms.hsv.hsv_luts`),
            or ``None`` for flips only.
        flip_ud, flip_lr: ``(B,)`` bool, which samples to flip upside down / left-right (``None``: none).
        channel_order: ``"RGB"`` or ``"BGR"``, the order of ``images``' channels.

    Returns a new uint8 tensor; equal to ``RandomHSV.apply`` followed by the flips, bit for bit.
    """
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4 \
            or images.shape[1] != 3:
        raise ValueError(f"images must be a uint8 (B, 3, H, W) tensor, got "
                         f"{getattr(images, 'dtype', type(images).__name__)} {tuple(getattr(images, 'shape', ()))}")
    if channel_order not in ("RGB", "BGR"):
        raise ValueError(f"channel_order={channel_order!r} must be 'RGB' or 'BGR'")
    if not fused_available(images.device):
        raise RuntimeError(f"the fused kernel cannot run on {images.device} (needs CUDA and Triton); "
                           "check fused_available() first or use RandomHSV / the flip modules")
    b, _, h, w = images.shape
    if luts is not None and tuple(luts.shape) != (b, 3, 256):
        raise ValueError(f"luts has shape {tuple(luts.shape)}, expected ({b}, 3, 256)")
    src = images.contiguous()
    out = torch.empty_like(src)
    if b == 0 or h * w == 0:
        return out
    params = to_device_async(_params(luts, flip_ud, flip_lr, b), src.device)
    tables = hsv_tables(src.device)
    kernel = _kernel()
    grid = (-(-(h * w) // _BLOCK), b)
    extra = {} if _interpreting() else {"enable_fp_fusion": False, "num_warps": 4}
    with torch.cuda.device(src.device) if src.is_cuda else contextlib.nullcontext():  # Triton launches on the current device
        kernel[grid](src, out, params, tables, h, w, h * w, DO_HSV=luts is not None, BGR=channel_order == "BGR",
                     BLOCK=_BLOCK, **extra)
    return out


@functools.lru_cache(maxsize=1)
def _kernel():
    """Compile-on-first-use Triton kernel (defined lazily: importing this module needs no Triton)."""
    triton = _triton()
    tl = triton.language

    @triton.jit
    def hsv_flip_kernel(src_ptr, dst_ptr, param_ptr, table_ptr, H, W, HW, DO_HSV: tl.constexpr, BGR: tl.constexpr,
                        BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        n = tl.program_id(1)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < HW
        y = offs // W
        x = offs - y * W
        prm = param_ptr + n.to(tl.int64) * 770
        flip_ud = tl.load(prm + 768).to(tl.int32)
        flip_lr = tl.load(prm + 769).to(tl.int32)
        sy = tl.where(flip_ud != 0, H - 1 - y, y)
        sx = tl.where(flip_lr != 0, W - 1 - x, x)
        base = n.to(tl.int64) * 3 * HW
        src_off = base + sy * W + sx
        c0 = tl.load(src_ptr + src_off, mask=mask, other=0)
        c1 = tl.load(src_ptr + src_off + HW, mask=mask, other=0)
        c2 = tl.load(src_ptr + src_off + 2 * HW, mask=mask, other=0)
        if DO_HSV:
            if BGR:
                r = c2.to(tl.int32)
                b = c0.to(tl.int32)
            else:
                r = c0.to(tl.int32)
                b = c2.to(tl.int32)
            g = c1.to(tl.int32)
            # OpenCV RGB2HSV_b (12-bit fixed point), as rgb_to_hsv_u8
            v = tl.maximum(tl.maximum(r, g), b)
            diff = v - tl.minimum(tl.minimum(r, g), b)
            sdiv = tl.load(table_ptr + v, mask=mask, other=0)
            hdiv = tl.load(table_ptr + 256 + diff, mask=mask, other=0)
            s = (diff * sdiv + 2048) >> 12
            hh = tl.where(v == r, g - b, tl.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
            hh = (hh * tl.where(diff > 0, hdiv, 0) + 2048) >> 12
            hh = tl.where(hh < 0, hh + 180, hh)
            # the per-image lookup tables
            hm = tl.load(prm + hh, mask=mask, other=0).to(tl.float32)
            sm = tl.load(prm + 256 + s, mask=mask, other=0).to(tl.float32)
            vm = tl.load(prm + 512 + v, mask=mask, other=0).to(tl.float32)
            # OpenCV HSV2RGB (vectorised path), as hsv_to_rgb_u8
            sf = sm * (1.0 / 255.0)
            vf = vm * (1.0 / 255.0)
            hf = hm * (6.0 / 180.0)
            pre = hf.to(tl.int32).to(tl.float32)  # trunc (hf >= 0)
            frac = hf - pre
            sector = pre - (pre * (1.0 / 6.0)).to(tl.int32).to(tl.float32) * 6.0
            t0 = vf
            t1 = vf * (1.0 - sf)
            t2 = vf * (1.0 - sf * frac)
            t3 = vf * (1.0 - sf * (1.0 - frac))
            bo = tl.where(sector < 2, t1, tl.where(sector == 2, t3, tl.where(sector > 4, t2, t0)))
            go = tl.where(sector < 1, t3, tl.where(sector < 3, t0, tl.where(sector == 3, t2, t1)))
            ro = tl.where(sector < 1, t0, tl.where(sector == 1, t2, tl.where(sector < 4, t1,
                                                                             tl.where(sector == 4, t3, t0))))
            ri = tl.minimum(tl.maximum((ro * 255.0).to(tl.int32), 0), 255)
            gi = tl.minimum(tl.maximum((go * 255.0).to(tl.int32), 0), 255)
            bi = tl.minimum(tl.maximum((bo * 255.0).to(tl.int32), 0), 255)
            if BGR:
                c0 = bi.to(tl.uint8)
                c2 = ri.to(tl.uint8)
            else:
                c0 = ri.to(tl.uint8)
                c2 = bi.to(tl.uint8)
            c1 = gi.to(tl.uint8)
        dst_off = base + offs
        tl.store(dst_ptr + dst_off, c0, mask=mask)
        tl.store(dst_ptr + dst_off + HW, c1, mask=mask)
        tl.store(dst_ptr + dst_off + 2 * HW, c2, mask=mask)

    return hsv_flip_kernel
