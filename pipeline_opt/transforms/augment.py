"""Random, box-aware batch augmentations for the GPU, equivalent to ultralytics' CPU ones.

Every module here works on a whole ``(B, C, H, W)`` batch on any device, ``uint8`` (0..255) or
floating point (taken to be in ``[0, 1]``), and returns the same dtype. Random parameters are drawn
per sample on the CPU (from ``generator``, or a generator seeded with ``seed``, or torch's global RNG)
so that a seed gives the same augmentation on every device. Each module splits its work into
``sample_params(batch_size, size)`` and ``apply(images, params, boxes)``; ``forward`` chains the two,
and tests (or callers) can inject parameters into ``apply``.

``forward(images, boxes=None)`` returns the images, or ``(images, boxes)`` when a
:class:`~pipeline_opt.transforms.boxes.BatchBoxes` is given (pixel ``xyxy`` or normalised ``xywh``
with ``batch_idx``); boxes come back in the format they arrived in, row-aligned with ``batch_idx``
and ``cls``.

Equivalence with ultralytics 8.4 (``ultralytics/data/augment.py``):

* :class:`RandomHorizontalFlip` / :class:`RandomVerticalFlip` equal ``torch.flip`` pixel for pixel;
  boxes map ``x -> W - x`` (continuous coordinates, as ultralytics' ``Instances.fliplr``; Kornia's
  ``(W - 1) - x`` is one pixel off).
* :class:`RandomHSV` reproduces ``RandomHSV``: the same ``r = uniform(-1, 1, 3) * gains`` per image,
  the same 8-bit lookup tables in OpenCV's 0..180 hue convention, and an integer re-implementation of
  OpenCV's 8-bit ``RGB2HSV`` (bit-exact) and of its vectorised ``HSV2RGB`` (it truncates; off by one
  on ~0.02% of colours where OpenCV fuses a multiply-add, and on pixels OpenCV processes in its
  scalar row tail, which rounds instead). Ultralytics batches (``batch["img"]``) are RGB: its
  ``Format`` reverses OpenCV's BGR channels unless ``bgr`` is set, so ``channel_order="RGB"`` is the
  default; HSV is symmetric in the channel order as long as the order is declared.
* :class:`RandomPerspective` builds ``M = T @ S @ R @ P @ C`` exactly as ultralytics'
  ``RandomPerspective._compute_affine_matrix`` (same draws in the same order, per sample), warps with
  ``F.grid_sample`` (bilinear, ``align_corners=False`` with OpenCV's pixel-centre coordinates,
  constant border 114), transforms the four box corners, takes min/max, clips and filters with
  ``box_candidates``. OpenCV quantises bilinear weights to 1/32 pixel, so pixels differ from
  ``cv2.warpAffine`` by a few levels at sharp edges (mean absolute difference well below 1/255).
  Kornia's ``warp_perspective`` is not used: its ``align_corners`` default and its normalisation
  shift content by half a pixel against OpenCV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline_opt._core.step import to_device_async
from pipeline_opt._core.threads import single_intra_op_thread
from pipeline_opt.transforms.boxes import BatchBoxes, box_candidates, clip_xyxy
from pipeline_opt.transforms.fused import fused_available, hsv_flip

__all__ = [
    "AffineParams",
    "FlipParams",
    "HSVParams",
    "RandomAffine",
    "RandomHSV",
    "RandomHorizontalFlip",
    "RandomPerspective",
    "RandomVerticalFlip",
    "affine_matrices",
    "hsv_luts",
    "hsv_to_rgb_u8",
    "rgb_to_hsv_u8",
]

_HSV_SHIFT = 12


# --------------------------------------------------------------------------------------------- helpers
def _check_images(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a (B, C, H, W) torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}; add a batch dim")
    if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
        raise TypeError(f"images dtype {images.dtype} is not supported; use uint8 (0..255) or float (0..1)")


def _check_boxes_arg(boxes: BatchBoxes | None) -> None:
    if boxes is not None and not isinstance(boxes, BatchBoxes):
        raise TypeError(
            f"boxes must be a pipeline_opt.transforms.boxes.BatchBoxes, got {type(boxes).__name__}; "
            "wrap (N, 4) boxes with their batch_idx: BatchBoxes(boxes, batch_idx, cls, fmt='xyxy'|'xywhn')"
        )


def _check_prob(name: str, p: float) -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}={p!r} must be a probability in [0, 1]")
    return float(p)


def _check_nonneg(name: str, value: float) -> float:
    if float(value) < 0:
        raise ValueError(f"{name}={value!r} must be >= 0")
    return float(value)


def _make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator | None:
    if seed is not None and generator is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise ValueError("generator must be a CPU torch.Generator (parameters are drawn on the CPU)")
        return generator
    if seed is not None:
        return torch.Generator().manual_seed(int(seed))
    return None


def _to_uint8(images: torch.Tensor) -> torch.Tensor:
    if images.dtype == torch.uint8:
        return images
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


def _from_uint8(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return images if dtype == torch.uint8 else images.to(dtype) / 255


def _result(images: torch.Tensor, boxes: BatchBoxes | None):
    return images if boxes is None else (images, boxes)


class _RandomBatchAugment(nn.Module):
    """Shared plumbing: the random generator, input checks and ``forward = apply(sample_params)``."""

    def __init__(self, seed: int | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = _make_generator(seed, generator)

    def _uniform(self, low: float, high: float, n: int) -> torch.Tensor:
        """``n`` float64 draws from U(low, high) on the CPU."""
        return low + (high - low) * torch.rand(n, generator=self.generator, dtype=torch.float64)

    def sample_params(self, batch_size: int, size: tuple[int, int]):  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, images: torch.Tensor, params, boxes: BatchBoxes | None = None):  # pragma: no cover
        raise NotImplementedError

    def forward(self, images: torch.Tensor, boxes: BatchBoxes | None = None):
        """Augment ``images`` (and ``boxes``) with freshly drawn per-sample parameters."""
        _check_images(images)
        _check_boxes_arg(boxes)
        params = self.sample_params(images.shape[0], (images.shape[-2], images.shape[-1]))
        return self.apply(images, params, boxes)


# ------------------------------------------------------------------------------------------------ flip
@dataclass(frozen=True)
class FlipParams:
    """Which samples of a batch are flipped: ``flip`` is a ``(B,)`` bool tensor."""

    flip: torch.Tensor


class _RandomFlip(_RandomBatchAugment):
    _dim = -1  # image dim flipped

    def __init__(self, p: float = 0.5, *, seed: int | None = None, generator: torch.Generator | None = None):
        super().__init__(seed, generator)
        self.p = _check_prob("p", p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def sample_params(self, batch_size: int, size: tuple[int, int] | None = None) -> FlipParams:
        """Draw one Bernoulli(p) per sample (ultralytics: ``random.random() < p``)."""
        return FlipParams(torch.rand(batch_size, generator=self.generator, dtype=torch.float64) < self.p)

    def _check_params(self, params: FlipParams, batch_size: int) -> None:
        if tuple(params.flip.shape) != (batch_size,):
            raise ValueError(f"params.flip has shape {tuple(params.flip.shape)}, expected ({batch_size},)")

    def apply(self, images: torch.Tensor, params: FlipParams, boxes: BatchBoxes | None = None):
        """Flip the samples where ``params.flip`` is set; mirror their boxes."""
        _check_images(images)
        _check_boxes_arg(boxes)
        self._check_params(params, images.shape[0])
        flip = to_device_async(params.flip, images.device)
        out = torch.where(flip.view(-1, 1, 1, 1), images.flip(self._dim), images)
        return _result(out, None if boxes is None else self.apply_boxes(boxes, params, images.shape[self._dim]))

    def apply_boxes(self, boxes: BatchBoxes, params: FlipParams, extent: int) -> BatchBoxes:
        """Mirror the boxes of the flipped samples; ``extent`` is the image size along the flipped axis.

        Works on the boxes' own device and never waits for it (the flags are copied asynchronously).
        """
        _check_boxes_arg(boxes)
        if boxes is None or len(boxes) == 0:
            return boxes
        sel = to_device_async(params.flip, boxes.boxes.device)[boxes.sample_index].unsqueeze(-1)
        b = boxes.boxes
        if boxes.fmt == "xywhn":
            c = 0 if self._dim == -1 else 1
            mirrored = b.clone()
            mirrored[:, c] = 1 - b[:, c]
        else:
            lo, hi = (0, 2) if self._dim == -1 else (1, 3)
            mirrored = b.clone()
            mirrored[:, lo] = extent - b[:, hi]
            mirrored[:, hi] = extent - b[:, lo]
        return BatchBoxes(torch.where(sel, mirrored, b), boxes.batch_idx, boxes.cls, boxes.fmt)


class RandomHorizontalFlip(_RandomFlip):
    """Flip each sample left-right with probability ``p`` (ultralytics ``RandomFlip("horizontal")``).

    Pixels equal ``torch.flip(images, [-1])`` exactly; boxes map ``x -> W - x``.
    """

    _dim = -1


class RandomVerticalFlip(_RandomFlip):
    """Flip each sample upside down with probability ``p`` (ultralytics ``RandomFlip("vertical")``)."""

    _dim = -2


# ------------------------------------------------------------------------------------------------- HSV
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


class RandomHSV(_RandomBatchAugment):
    """Random hue / saturation / value jitter per sample, equivalent to ultralytics' ``RandomHSV``.

    Args:
        hgain, sgain, vgain: maximum relative change of hue, saturation and value (ultralytics
            ``hsv_h``, ``hsv_s``, ``hsv_v``).
        channel_order: ``"RGB"`` (ultralytics batches, torchvision) or ``"BGR"`` (OpenCV arrays).
        seed, generator: randomness source (see the module docstring).
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
            _check_nonneg("hgain", hgain),
            _check_nonneg("sgain", sgain),
            _check_nonneg("vgain", vgain),
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
        _check_images(images)
        _check_boxes_arg(boxes)
        if params.gains.shape != (images.shape[0], 3):
            raise ValueError(
                f"params.gains has shape {tuple(params.gains.shape)}, expected ({images.shape[0]}, 3)"
            )
        if not self.active(images):
            return _result(images, boxes)
        x = _to_uint8(images)
        if self.fused and fused_available(x.device):  # one Triton kernel, bit-identical to the torch operations below
            out = hsv_flip(x, hsv_luts(params.gains), channel_order=self.channel_order)
            return _result(_from_uint8(out, images.dtype), boxes)
        if self.channel_order == "BGR":
            x = x.flip(1)
        luts = to_device_async(hsv_luts(params.gains), images.device)  # (B, 3, 256)
        hsv = rgb_to_hsv_u8(x)
        offset = torch.arange(luts.shape[0] * 3, device=images.device, dtype=torch.int32).view(-1, 3, 1, 1)
        mapped = luts.reshape(-1)[hsv + offset * 256]  # int32 indices: half the memory of int64
        out = hsv_to_rgb_u8(mapped)
        if self.channel_order == "BGR":
            out = out.flip(1)
        return _result(_from_uint8(out, images.dtype), boxes)


# ------------------------------------------------------------------------------------------ perspective
@dataclass(frozen=True)
class AffineParams:
    """Per-sample warps in pixel coordinates (OpenCV convention: pixel ``i`` is centred at ``i``).

    Attributes:
        matrix: ``(B, 3, 3)`` float64 maps input ``(x, y, 1)`` to output coordinates.
        scale: ``(B,)`` float64 zoom of each matrix, used by the box filter (``box_candidates``).
        output_size: ``(H, W)`` of the warped images.
        perspective: whether to divide by the homogeneous coordinate (``warpPerspective``).
    """

    matrix: torch.Tensor
    scale: torch.Tensor
    output_size: tuple[int, int]
    perspective: bool = False


def affine_matrices(
    input_size: tuple[int, int],
    output_size: tuple[int, int],
    angle: torch.Tensor,
    scale: torch.Tensor,
    shear_x: torch.Tensor,
    shear_y: torch.Tensor,
    translate_x: torch.Tensor,
    translate_y: torch.Tensor,
    perspective_x: torch.Tensor,
    perspective_y: torch.Tensor,
) -> torch.Tensor:
    """Ultralytics' ``M = T @ S @ R @ P @ C`` for a batch of parameters (each ``(B,)``, float64).

    ``angle`` and shears are in degrees, ``translate_*`` are the fractions of the output size drawn
    in ``[0.5 - t, 0.5 + t]``; sizes are ``(H, W)``. Returns ``(B, 3, 3)`` float64.
    """
    n = angle.shape[0]
    eye = torch.eye(3, dtype=torch.float64).repeat(n, 1, 1)
    c, p, r, s, t = eye.clone(), eye.clone(), eye.clone(), eye.clone(), eye.clone()
    c[:, 0, 2] = -input_size[1] / 2
    c[:, 1, 2] = -input_size[0] / 2
    p[:, 2, 0] = perspective_x
    p[:, 2, 1] = perspective_y
    a = torch.deg2rad(angle.to(torch.float64))
    alpha, beta = scale * torch.cos(a), scale * torch.sin(a)  # cv2.getRotationMatrix2D(center=(0,0))
    r[:, 0, 0], r[:, 0, 1], r[:, 1, 0], r[:, 1, 1] = alpha, beta, -beta, alpha
    s[:, 0, 1] = torch.tan(torch.deg2rad(shear_x.to(torch.float64)))
    s[:, 1, 0] = torch.tan(torch.deg2rad(shear_y.to(torch.float64)))
    t[:, 0, 2] = translate_x * output_size[1]
    t[:, 1, 2] = translate_y * output_size[0]
    return t @ s @ r @ p @ c


def _warp(images: torch.Tensor, params: AffineParams, fill: float) -> torch.Tensor:
    """Inverse-map every output pixel centre through ``matrix`` and sample bilinearly, border ``fill``."""
    b, _, h_in, w_in = images.shape
    h_out, w_out = params.output_size
    device = images.device
    with single_intra_op_thread():  # a batch of 3x3 inverses: no thread pool (see pipeline_opt._core.threads)
        inv = torch.linalg.inv(params.matrix.to(torch.float64)).to(torch.float32)
    inv = to_device_async(inv, device)
    xs = torch.arange(w_out, device=device, dtype=torch.float32).view(1, 1, w_out)
    ys = torch.arange(h_out, device=device, dtype=torch.float32).view(1, h_out, 1)

    def row(k: int) -> torch.Tensor:
        return inv[:, k, 0].view(b, 1, 1) * xs + inv[:, k, 1].view(b, 1, 1) * ys + inv[:, k, 2].view(b, 1, 1)

    sx, sy = row(0), row(1)
    if params.perspective:
        sz = row(2)
        sx, sy = sx / sz, sy / sz
    # pixel centre i sits at normalised (2 i + 1) / size - 1 with align_corners=False
    grid = torch.stack(((2 * sx + 1) / w_in - 1, (2 * sy + 1) / h_in - 1), -1)
    work = images.to(torch.float32) - fill  # zero padding on (img - fill) == constant `fill` border
    out = F.grid_sample(work, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill
    if images.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out.to(images.dtype)


def _warp_boxes(xyxy: torch.Tensor, matrix: torch.Tensor, perspective: bool) -> torch.Tensor:
    """Map the 4 corners of each ``(N, 4)`` box with its ``(N, 3, 3)`` matrix; the enclosing box."""
    x1, y1, x2, y2 = xyxy.unbind(-1)
    xs = torch.stack((x1, x2, x1, x2), -1)
    ys = torch.stack((y1, y2, y2, y1), -1)
    pts = torch.stack((xs, ys, torch.ones_like(xs)), -1)  # (N, 4, 3)
    out = pts @ matrix.transpose(-1, -2)
    px, py = (
        (out[..., 0] / out[..., 2], out[..., 1] / out[..., 2]) if perspective else (out[..., 0], out[..., 1])
    )
    return torch.stack((px.amin(-1), py.amin(-1), px.amax(-1), py.amax(-1)), -1)


class RandomPerspective(_RandomBatchAugment):
    """Random rotation, scale, shear, translation and perspective per sample, with boxes.

    The GPU equivalent of ultralytics' ``RandomPerspective``: same parameters, same matrix, same
    box transform, clipping and ``box_candidates`` filter (``wh_thr``, ``ar_thr``, ``area_thr``),
    border filled with ``fill`` (114, in uint8 units; ``fill / 255`` for float batches).

    Args:
        degrees: rotation range ``+-degrees``.
        translate: translation range, fraction of the output size (``0.5 +- translate``).
        scale: zoom range ``1 +- scale``, or an explicit ``(min, max)``.
        shear: shear range ``+-shear`` degrees, for x and y.
        perspective: perspective range ``+-perspective`` for the two projective terms.
        output_size: ``(H, W)`` of the output; ``None`` keeps the input size. Ultralytics'
            ``size=(w, h)`` (older versions: ``border``) corresponds to ``output_size=(h, w)``.
        fill: border value.
        wh_thr, ar_thr, area_thr: the box filter of ultralytics (``box_candidates``).
        seed, generator: randomness source.
    """

    def __init__(
        self,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: float | tuple[float, float] = 0.5,
        shear: float = 0.0,
        perspective: float = 0.0,
        *,
        output_size: tuple[int, int] | None = None,
        fill: float = 114.0,
        wh_thr: float = 2.0,
        ar_thr: float = 100.0,
        area_thr: float = 0.1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(seed, generator)
        self.degrees = _check_nonneg("degrees", degrees)
        self.translate = _check_nonneg("translate", translate)
        if isinstance(scale, (tuple, list)):
            if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
                raise ValueError(f"scale={scale!r} as a range must be (min, max) with 0 < min <= max")
            self.scale_range = (float(scale[0]), float(scale[1]))
        else:
            if not 0 <= float(scale) < 1:
                raise ValueError(f"scale={scale!r} must be in [0, 1) (zoom 1 +- scale) or a (min, max) tuple")
            self.scale_range = (1 - float(scale), 1 + float(scale))
        self.shear = _check_nonneg("shear", shear)
        self.perspective = _check_nonneg("perspective", perspective)
        if output_size is not None and (len(output_size) != 2 or min(output_size) <= 0):
            raise ValueError(f"output_size={output_size!r} must be (height, width) with both > 0, or None")
        self.output_size = None if output_size is None else (int(output_size[0]), int(output_size[1]))
        self.fill = float(fill)
        self.wh_thr, self.ar_thr, self.area_thr = float(wh_thr), float(ar_thr), float(area_thr)

    def extra_repr(self) -> str:
        return (
            f"degrees={self.degrees}, translate={self.translate}, scale={self.scale_range}, shear={self.shear}, "
            f"perspective={self.perspective}, output_size={self.output_size}, fill={self.fill}"
        )

    @property
    def is_identity(self) -> bool:
        """True when every draw gives the identity warp (and the size is kept)."""
        return (
            self.output_size is None
            and self.degrees == self.translate == self.shear == self.perspective == 0
            and self.scale_range == (1.0, 1.0)
        )

    def sample_params(self, batch_size: int, size: tuple[int, int]) -> AffineParams:
        """Draw ultralytics' parameters per sample, in its order, and build the matrices."""
        out_size = self.output_size or (int(size[0]), int(size[1]))
        draw = self._uniform
        n = batch_size
        with single_intra_op_thread():  # (B,)-sized CPU tensors: no thread pool (see pipeline_opt._core.threads)
            px, py = draw(-self.perspective, self.perspective, n), draw(-self.perspective, self.perspective, n)
            angle = draw(-self.degrees, self.degrees, n)
            scale = draw(*self.scale_range, n)
            shx, shy = draw(-self.shear, self.shear, n), draw(-self.shear, self.shear, n)
            t = self.translate
            tx, ty = draw(0.5 - t, 0.5 + t, n), draw(0.5 - t, 0.5 + t, n)
            matrix = affine_matrices(tuple(size), out_size, angle, scale, shx, shy, tx, ty, px, py)
        return AffineParams(matrix, scale, out_size, perspective=bool(self.perspective))

    def apply(self, images: torch.Tensor, params: AffineParams, boxes: BatchBoxes | None = None):
        """Warp each sample with its matrix; transform, clip and filter the boxes."""
        _check_images(images)
        _check_boxes_arg(boxes)
        if params.matrix.shape != (images.shape[0], 3, 3):
            raise ValueError(
                f"params.matrix has shape {tuple(params.matrix.shape)}, expected ({images.shape[0]}, 3, 3)"
            )
        fill = self.fill if images.dtype == torch.uint8 else self.fill / 255.0
        out = _warp(images, params, fill) if images.shape[0] else images
        if boxes is None:
            return out
        with single_intra_op_thread():  # a few hundred rows, on the CPU in the steps' case
            return out, self.apply_boxes(boxes, params, (images.shape[-2], images.shape[-1]))

    def apply_boxes(self, boxes: BatchBoxes, params: AffineParams, in_size: tuple[int, int]) -> BatchBoxes:
        """The boxes of images of ``in_size`` after the warps: transformed, clipped, filtered."""
        if len(boxes) == 0:
            return boxes.with_xyxy(boxes.xyxy(in_size), params.output_size)
        dev, dtype = boxes.boxes.device, boxes.boxes.dtype
        idx = boxes.sample_index
        before = boxes.xyxy(in_size).to(torch.float64)
        matrix = to_device_async(params.matrix.to(torch.float64), dev)[idx]
        after = clip_xyxy(_warp_boxes(before, matrix, params.perspective), params.output_size)
        scaled = before * to_device_async(params.scale.to(torch.float64), dev)[idx].unsqueeze(-1)
        keep = box_candidates(scaled, after, self.wh_thr, self.ar_thr, self.area_thr)
        moved = boxes.with_xyxy(after.to(dtype), params.output_size)
        return moved.select(keep)


class RandomAffine(RandomPerspective):
    """:class:`RandomPerspective` without the projective terms (ultralytics ``perspective=0``)."""

    def __init__(
        self,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: float | tuple[float, float] = 0.5,
        shear: float = 0.0,
        **kwargs,
    ) -> None:
        if "perspective" in kwargs:
            raise TypeError("RandomAffine has no perspective; use RandomPerspective(perspective=...)")
        super().__init__(degrees, translate, scale, shear, 0.0, **kwargs)
