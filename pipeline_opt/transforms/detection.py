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

from pipeline_opt._logging import get_logger
from pipeline_opt.transforms.augment import (
    RandomHorizontalFlip,
    RandomHSV,
    RandomPerspective,
    RandomVerticalFlip,
    _make_generator,
)
from pipeline_opt.transforms.boxes import BatchBoxes

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
        min_box_size: after all transforms boxes are clipped to the image, and boxes whose width or
            height is not above this many pixels are dropped (with their ``cls`` and ``batch_idx``).
        seed: makes the draws reproducible (one CPU generator shared by the stages).
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
    ) -> None:
        super().__init__()
        generator = _make_generator(seed, None)
        kw = {"generator": generator}
        self.affine = RandomPerspective(degrees, translate, scale, shear, perspective, **kw)
        self.hsv = RandomHSV(hsv_h, hsv_s, hsv_v, channel_order=channel_order, **kw)
        self.flipud = RandomVerticalFlip(flipud, **kw)
        self.fliplr = RandomHorizontalFlip(fliplr, **kw)
        if float(min_box_size) < 0:
            raise ValueError(f"min_box_size={min_box_size!r} must be >= 0")
        self.min_box_size = float(min_box_size)

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
        return f"min_box_size={self.min_box_size}"

    def forward(self, batch: dict) -> dict:
        """Augment ``batch`` (not modified in place); return a new dict with the augmented entries."""
        if not isinstance(batch, Mapping) or "img" not in batch:
            raise TypeError("batch must be an ultralytics batch dict with an 'img' tensor")
        img = batch["img"]
        if not isinstance(img, torch.Tensor) or img.ndim != 4:
            raise ValueError(
                f"batch['img'] must be a (B, C, H, W) tensor, got {getattr(img, 'shape', type(img))}"
            )
        geometric = not self.affine.is_identity or self.fliplr.p > 0 or self.flipud.p > 0
        present = [k for k in _GEOMETRIC_KEYS if k in batch]
        if geometric and present:
            raise ValueError(
                f"batch has {present}: DetectionGPUAugment moves detection boxes only; "
                "keep geometric augmentation on the CPU for segmentation/pose (fliplr=flipud=0, affine=False)"
            )
        boxes = self._boxes(batch, img)
        size = (img.shape[-2], img.shape[-1])
        if not self.affine.is_identity:
            img, boxes = self.affine(img, boxes)
        img, boxes = self.hsv(img, boxes)
        img, boxes = self.flipud(img, boxes)
        img, boxes = self.fliplr(img, boxes)
        boxes = boxes.clip(size).drop_degenerate(size, self.min_box_size)
        out = dict(batch)
        out.update(img=img, bboxes=boxes.boxes, cls=boxes.cls, batch_idx=boxes.batch_idx)
        return out

    @staticmethod
    def _boxes(batch: Mapping, img: torch.Tensor) -> BatchBoxes:
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
        return BatchBoxes(bboxes.to(img.device), batch_idx.to(img.device), cls.to(img.device), fmt="xywhn")
