"""Random affine and perspective warps of a batch, with boxes (ultralytics ``RandomPerspective``).

:class:`RandomPerspective` builds ``M = T @ S @ R @ P @ C`` exactly as ultralytics'
``RandomPerspective._compute_affine_matrix`` (same draws in the same order, per sample), warps with
``F.grid_sample`` (bilinear, ``align_corners=False`` with OpenCV's pixel-centre coordinates,
constant border 114), transforms the four box corners, takes min/max, clips and filters with
``box_candidates``. OpenCV quantises bilinear weights to 1/32 pixel, so pixels differ from
``cv2.warpAffine`` by a few levels at sharp edges (mean absolute difference well below 1/255).
Kornia's ``warp_perspective`` is not used: its ``align_corners`` default and its normalisation
shift content by half a pixel against OpenCV. Batches, dtypes, seeds and boxes as in
:mod:`~pipeline_opt.transforms.augment_base`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline_opt._core.step import to_device_async
from pipeline_opt._core.threads import single_intra_op_thread
from pipeline_opt.transforms.augment_base import (
    RandomBatchAugment,
    check_boxes_arg,
    check_images,
    check_nonneg,
)
from pipeline_opt.transforms.boxes import BatchBoxes, box_candidates, clip_xyxy

__all__ = ["AffineParams", "RandomAffine", "RandomPerspective", "affine_matrices"]


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


class RandomPerspective(RandomBatchAugment):
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
        self.degrees = check_nonneg("degrees", degrees)
        self.translate = check_nonneg("translate", translate)
        if isinstance(scale, (tuple, list)):
            if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
                raise ValueError(f"scale={scale!r} as a range must be (min, max) with 0 < min <= max")
            self.scale_range = (float(scale[0]), float(scale[1]))
        else:
            if not 0 <= float(scale) < 1:
                raise ValueError(f"scale={scale!r} must be in [0, 1) (zoom 1 +- scale) or a (min, max) tuple")
            self.scale_range = (1 - float(scale), 1 + float(scale))
        self.shear = check_nonneg("shear", shear)
        self.perspective = check_nonneg("perspective", perspective)
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
        check_images(images)
        check_boxes_arg(boxes)
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
