"""Ultralytics-style detection augmentation of a whole batch on its device.

:class:`DetectionGPUAugment` replaces, in ``preprocess_batch``, the per-sample CPU transforms
``RandomPerspective`` -> ``RandomHSV`` -> ``RandomFlip(vertical)`` -> ``RandomFlip(horizontal)``
of ultralytics' ``v8_transforms`` (same order, same hyperparameters, per-sample draws) on a batch
dict ``{"img": uint8 (B, 3, H, W), "bboxes": (N, 4) normalised xywh, "cls": (N, 1),
"batch_idx": (N,)}``. ``img`` stays uint8 (``preprocess_batch`` divides by 255 afterwards) and the
boxes, classes and batch indices are filtered together.

What the affine part means after Mosaic
---------------------------------------
On the CPU, ultralytics warps the 2S x 2S Mosaic canvas with ``RandomPerspective(size=(S, S))``:
``C`` moves the canvas centre to the origin and ``T`` puts it back near the centre of the S x S
output, so the warp also crops. On the GPU we only see the final S x S images. Applying the same
formula to an S x S image (what this class does; the equivalent of ``border=0``, and exactly what
ultralytics does itself when Mosaic is off) maps every canvas point to the same output point as
the CPU path, **provided the CPU side still crops the canvas to its central S x S** (a
``RandomPerspective`` with all gains 0 and ``size=(S, S)``: an integer translation, no
resampling). The integration that moves the affine to the GPU must set that up. Limits:

* content outside the central crop is gone, so zoom-out (``scale`` draws below 1) and large
  translations show the 114 border where the CPU path would still show Mosaic tiles;
* ``box_candidates`` sees boxes already clipped to the crop, so a box cut by the crop edge is
  judged on its visible part (a few more such boxes survive than on the CPU).

To keep ultralytics' own CPU ``RandomPerspective`` and move only colour and flips, build with
``from_hyp(args, affine=False)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import to_device_async
from pipeline_opt._core.threads import single_intra_op_thread
from pipeline_opt.transforms.affine import RandomPerspective
from pipeline_opt.transforms.augment_base import make_generator
from pipeline_opt.transforms.boxes import BatchBoxes
from pipeline_opt.transforms.flip import FlipParams, RandomHorizontalFlip, RandomVerticalFlip
from pipeline_opt.transforms.fused import fused_available, hsv_flip
from pipeline_opt.transforms.hsv import HSVParams, RandomHSV, hsv_luts

__all__ = ["DetectionGPUAugment"]

log = get_logger("transforms.detection")

_HYP_NAMES = (
    "hsv_h",
    "hsv_s",
    "hsv_v",
    "fliplr",
    "flipud",
    "degrees",
    "translate",
    "scale",
    "shear",
    "perspective",
)
_GEOMETRIC_KEYS = ("masks", "keypoints", "segments", "sem_masks")


class DetectionGPUAugment(nn.Module):
    """GPU RandomPerspective + RandomHSV + flips for ultralytics detection batches.

    Args:
        hsv_h, hsv_s, hsv_v: ultralytics' HSV gains.
        fliplr, flipud: probabilities of a horizontal / vertical flip per image.
        degrees, translate, scale, shear, perspective: ultralytics' ``RandomPerspective`` ranges;
            with all of them 0 the warp is skipped.
        channel_order: of ``batch["img"]``; ultralytics batches are ``"RGB"``.
        min_box_size: after a warp (or whenever this is > 0) boxes are clipped to the image, and
            boxes whose width or height is not above this many pixels are dropped (with their
            ``cls`` and ``batch_idx``). Without a warp and with 0 (the default) boxes are only
            mirrored, as ultralytics' RandomFlip does, and the call never waits for the device.
            With a filter, boxes that arrive on the CPU are warped, flipped and filtered there and
            copied to the images' device once, so the call does not wait either; boxes already on
            the device are filtered there (the host waits once per mask).
        seed: makes the draws reproducible (one CPU generator shared by the stages).

    ``warp_enabled`` (default True) turns the warp off and on without rebuilding the module: the
    integration measures colour/flip alone against colour/flip + warp with one module.

    On CUDA with Triton, HSV and both flips run as one fused kernel
    (:mod:`pipeline_opt.transforms.fused`), bit-identical to the separate modules (``fused=False``: those).
    """

    def __init__(
        self,
        hsv_h: float = 0.015,
        hsv_s: float = 0.7,
        hsv_v: float = 0.4,
        fliplr: float = 0.5,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: float | tuple[float, float] = 0.5,
        shear: float = 0.0,
        perspective: float = 0.0,
        seed: int | None = None,
        *,
        flipud: float = 0.0,
        channel_order: str = "RGB",
        min_box_size: float = 0.0,
        fused: bool = True,
    ) -> None:
        super().__init__()
        generator = make_generator(seed, None)
        kw = {"generator": generator}
        self.affine = RandomPerspective(degrees, translate, scale, shear, perspective, **kw)
        self.hsv = RandomHSV(hsv_h, hsv_s, hsv_v, channel_order=channel_order, fused=fused, **kw)
        self.flipud = RandomVerticalFlip(flipud, **kw)
        self.fliplr = RandomHorizontalFlip(fliplr, **kw)
        if float(min_box_size) < 0:
            raise ValueError(f"min_box_size={min_box_size!r} must be >= 0")
        self.min_box_size = float(min_box_size)
        self.warp_enabled = True

    @property
    def fused(self) -> bool:
        """Whether colour and flips run as one Triton kernel where it can (CUDA); ``False``: torch operations."""
        return self.hsv.fused

    @fused.setter
    def fused(self, value: bool) -> None:
        self.hsv.fused = bool(value)

    @property
    def warps(self) -> bool:
        """Whether a call warps the images (a non-identity affine range, and ``warp_enabled``)."""
        return self.warp_enabled and not self.affine.is_identity

    @classmethod
    def from_hyp(
        cls, args: Any, *, affine: bool = True, seed: int | None = None, **kwargs
    ) -> DetectionGPUAugment:
        """Build from ultralytics hyperparameters (``trainer.args``, a namespace, or a dict).

        Reads ``hsv_h hsv_s hsv_v fliplr flipud degrees translate scale shear perspective``; names
        that are absent keep this class's defaults. ``affine=False`` zeroes the geometric ranges
        (keep ultralytics' CPU ``RandomPerspective`` then). Extra keyword arguments go to ``__init__``.
        """
        if isinstance(args, Mapping):
            values = {k: args[k] for k in _HYP_NAMES if k in args}
        elif args is not None:
            values = {k: getattr(args, k) for k in _HYP_NAMES if hasattr(args, k)}
        else:
            raise TypeError(
                "args must be an ultralytics args namespace or a dict of hyperparameters, got None"
            )
        if not affine:
            values.update(degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0)
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
        return cls(**values, seed=seed, **kwargs)

    def extra_repr(self) -> str:
        return f"min_box_size={self.min_box_size}, warp_enabled={self.warp_enabled}"

    def forward(self, batch: dict) -> dict:
        """Augment ``batch`` (not modified in place); return a new dict with the augmented entries."""
        if not isinstance(batch, Mapping) or "img" not in batch:
            raise TypeError("batch must be an ultralytics batch dict with an 'img' tensor")
        img = batch["img"]
        if not isinstance(img, torch.Tensor) or img.ndim != 4:
            raise ValueError(
                f"batch['img'] must be a (B, C, H, W) tensor, got {getattr(img, 'shape', type(img))}"
            )
        warped = self.warps
        geometric = warped or self.fliplr.p > 0 or self.flipud.p > 0
        present = [k for k in _GEOMETRIC_KEYS if k in batch]
        if geometric and present:
            raise ValueError(
                f"batch has {present}: DetectionGPUAugment moves detection boxes only; "
                "keep geometric augmentation on the CPU for segmentation/pose (fliplr=flipud=0, affine=False)"
            )
        size = (img.shape[-2], img.shape[-1])
        filters = warped or self.min_box_size > 0
        # Filtering selects rows by a mask, and on the GPU every mask makes the host wait for the
        # device. Boxes that arrive on the CPU (the step moves only the images before augmenting)
        # are therefore warped, flipped and filtered there, a few hundred rows, and copied to the
        # device once at the end; without a filter they go to the device at once (nothing waits).
        boxes = self._boxes(batch, img)
        boxes = self._on(boxes, boxes.boxes.device if filters else img.device)
        if warped:
            img, boxes = self.affine(img, boxes)
        n = img.shape[0]
        # the draws in ultralytics' order (HSV, vertical flip, horizontal flip), then one pass
        with single_intra_op_thread():  # small CPU tensors: no thread pool (see pipeline_opt._core.threads)
            hsv, ud, lr = self.hsv.sample_params(n), self.flipud.sample_params(n), self.fliplr.sample_params(n)
        img = self._colour_and_flips(img, hsv, ud, lr)
        with single_intra_op_thread():
            boxes = self.flipud.apply_boxes(boxes, ud, img.shape[-2])
            boxes = self.fliplr.apply_boxes(boxes, lr, img.shape[-1])
            if filters:
                # the warp crops and can empty boxes; colour and flips cannot, and ultralytics filters
                # nothing after them, so without a warp the boxes keep their count (and nothing syncs)
                boxes = self._on(boxes.clip(size).drop_degenerate(size, self.min_box_size), img.device)
        out = dict(batch)
        out.update(img=img, bboxes=boxes.boxes, cls=boxes.cls, batch_idx=boxes.batch_idx)
        return out

    def _colour_and_flips(self, img: torch.Tensor, hsv: HSVParams, ud: FlipParams, lr: FlipParams) -> torch.Tensor:
        """HSV, vertical and horizontal flip of the images: one fused kernel where it can run."""
        colour = self.hsv.active(img)
        if self.fused and img.dtype == torch.uint8 and img.shape[1] == 3 and fused_available(img.device):
            if not colour and not self.flipud.p and not self.fliplr.p:
                return img
            return hsv_flip(img, hsv_luts(hsv.gains) if colour else None,
                            flip_ud=ud.flip if self.flipud.p else None, flip_lr=lr.flip if self.fliplr.p else None,
                            channel_order=self.hsv.channel_order)
        img = self.hsv.apply(img, hsv)
        if self.flipud.p:
            img = self.flipud.apply(img, ud)
        if self.fliplr.p:
            img = self.fliplr.apply(img, lr)
        return img

    @staticmethod
    def _on(boxes: BatchBoxes, device: torch.device) -> BatchBoxes:
        """``boxes`` on ``device`` through asynchronous copies (the host never waits)."""
        return BatchBoxes(to_device_async(boxes.boxes, device), to_device_async(boxes.batch_idx, device),
                          None if boxes.cls is None else to_device_async(boxes.cls, device), fmt=boxes.fmt)

    @staticmethod
    def _boxes(batch: Mapping, img: torch.Tensor) -> BatchBoxes:
        """The batch's boxes where they are (none: an empty set on the images' device)."""
        bboxes = batch.get("bboxes")
        if bboxes is None:
            bboxes = img.new_zeros((0, 4), dtype=torch.float32)
        n = bboxes.shape[0]
        batch_idx = batch.get("batch_idx")
        if batch_idx is None:
            if n:
                raise ValueError("batch has 'bboxes' but no 'batch_idx'; ultralytics' collate_fn provides it")
            batch_idx = bboxes.new_zeros((0,))
        cls = batch.get("cls")
        if cls is None:
            cls = bboxes.new_zeros((n, 1))
        return BatchBoxes(bboxes, batch_idx, cls, fmt="xywhn")
