"""Random, box-aware batch augmentations for the GPU, equivalent to ultralytics' CPU ones.

This module re-exports them from their homes, so ``from pipeline_opt.transforms.augment import ...``
keeps working:

* :mod:`~pipeline_opt.transforms.augment_base` — what they share: argument checks, the random
  generator, uint8 helpers and :class:`~pipeline_opt.transforms.augment_base.RandomBatchAugment`
  (``forward = apply(sample_params)``); its docstring states the batch, dtype, seed and box contract.
* :mod:`~pipeline_opt.transforms.flip` — :class:`RandomHorizontalFlip`, :class:`RandomVerticalFlip`
  (:class:`FlipParams`).
* :mod:`~pipeline_opt.transforms.hsv` — :class:`RandomHSV` (:class:`HSVParams`) and OpenCV's 8-bit
  colour conversions :func:`rgb_to_hsv_u8`, :func:`hsv_to_rgb_u8`, ultralytics' :func:`hsv_luts`.
* :mod:`~pipeline_opt.transforms.affine` — :class:`RandomPerspective`, :class:`RandomAffine`
  (:class:`AffineParams`, :func:`affine_matrices`).

Each module's docstring says how close it is to ultralytics 8.4 (``ultralytics/data/augment.py``).
"""

from __future__ import annotations

from pipeline_opt.transforms.affine import AffineParams, RandomAffine, RandomPerspective, affine_matrices
from pipeline_opt.transforms.augment_base import (
    RandomBatchAugment,
    augment_result,
    check_boxes_arg,
    check_images,
    check_nonneg,
    check_prob,
    from_uint8,
    make_generator,
    to_uint8,
)
from pipeline_opt.transforms.flip import FlipParams, RandomHorizontalFlip, RandomVerticalFlip
from pipeline_opt.transforms.hsv import HSVParams, RandomHSV, hsv_luts, hsv_to_rgb_u8, rgb_to_hsv_u8

__all__ = [
    "AffineParams",
    "FlipParams",
    "HSVParams",
    "RandomAffine",
    "RandomBatchAugment",
    "RandomHSV",
    "RandomHorizontalFlip",
    "RandomPerspective",
    "RandomVerticalFlip",
    "affine_matrices",
    "augment_result",
    "check_boxes_arg",
    "check_images",
    "check_nonneg",
    "check_prob",
    "from_uint8",
    "hsv_luts",
    "hsv_to_rgb_u8",
    "make_generator",
    "rgb_to_hsv_u8",
    "to_uint8",
]
