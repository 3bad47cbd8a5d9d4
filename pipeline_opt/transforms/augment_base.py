"""What every random batch augmentation shares: argument checks, the generator, uint8 helpers, the base class.

Every augmentation of :mod:`~pipeline_opt.transforms.flip`, :mod:`~pipeline_opt.transforms.hsv` and
:mod:`~pipeline_opt.transforms.affine` works on a whole ``(B, C, H, W)`` batch on any device, ``uint8``
(0..255) or floating point (taken to be in ``[0, 1]``), and returns the same dtype. Random parameters
are drawn per sample on the CPU (from ``generator``, or a generator seeded with ``seed``, or torch's
global RNG) so that a seed gives the same augmentation on every device. Each module splits its work
into ``sample_params(batch_size, size)`` and ``apply(images, params, boxes)``; ``forward`` chains the
two, and tests (or callers) can inject parameters into ``apply``.

``forward(images, boxes=None)`` returns the images, or ``(images, boxes)`` when a
:class:`~pipeline_opt.transforms.boxes.BatchBoxes` is given (pixel ``xyxy`` or normalised ``xywh``
with ``batch_idx``); boxes come back in the format they arrived in, row-aligned with ``batch_idx``
and ``cls``.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline_opt.transforms.boxes import BatchBoxes

__all__ = [
    "RandomBatchAugment",
    "augment_result",
    "check_boxes_arg",
    "check_images",
    "check_nonneg",
    "check_prob",
    "from_uint8",
    "make_generator",
    "to_uint8",
]


def check_images(images: torch.Tensor) -> None:
    """Raise unless ``images`` is a ``(B, C, H, W)`` uint8 or floating-point tensor."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a (B, C, H, W) torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}; add a batch dim")
    if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
        raise TypeError(f"images dtype {images.dtype} is not supported; use uint8 (0..255) or float (0..1)")


def check_boxes_arg(boxes: BatchBoxes | None) -> None:
    """Raise unless ``boxes`` is ``None`` or a :class:`~pipeline_opt.transforms.boxes.BatchBoxes`."""
    if boxes is not None and not isinstance(boxes, BatchBoxes):
        raise TypeError(
            f"boxes must be a pipeline_opt.transforms.boxes.BatchBoxes, got {type(boxes).__name__}; "
            "wrap (N, 4) boxes with their batch_idx: BatchBoxes(boxes, batch_idx, cls, fmt='xyxy'|'xywhn')"
        )


def check_prob(name: str, p: float) -> float:
    """``p`` as a float, checked to be a probability in ``[0, 1]``."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}={p!r} must be a probability in [0, 1]")
    return float(p)


def check_nonneg(name: str, value: float) -> float:
    """``value`` as a float, checked to be ``>= 0``."""
    if float(value) < 0:
        raise ValueError(f"{name}={value!r} must be >= 0")
    return float(value)


def make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator | None:
    """The CPU generator the draws come from: ``generator``, one seeded with ``seed``, or ``None`` (global RNG)."""
    if seed is not None and generator is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise ValueError("generator must be a CPU torch.Generator (parameters are drawn on the CPU)")
        return generator
    if seed is not None:
        return torch.Generator().manual_seed(int(seed))
    return None


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``images`` as uint8 levels (floats in ``[0, 1]`` are scaled by 255 and rounded)."""
    if images.dtype == torch.uint8:
        return images
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


def from_uint8(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``images`` back to ``dtype`` (floats in ``[0, 1]``)."""
    return images if dtype == torch.uint8 else images.to(dtype) / 255


def augment_result(images: torch.Tensor, boxes: BatchBoxes | None):
    """What ``forward`` / ``apply`` return: the images, or ``(images, boxes)`` when boxes were given."""
    return images if boxes is None else (images, boxes)


class RandomBatchAugment(nn.Module):
    """Shared plumbing: the random generator, input checks and ``forward = apply(sample_params)``."""

    def __init__(self, seed: int | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = make_generator(seed, generator)

    def _uniform(self, low: float, high: float, n: int) -> torch.Tensor:
        """``n`` float64 draws from U(low, high) on the CPU."""
        return low + (high - low) * torch.rand(n, generator=self.generator, dtype=torch.float64)

    def sample_params(self, batch_size: int, size: tuple[int, int]):  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, images: torch.Tensor, params, boxes: BatchBoxes | None = None):  # pragma: no cover
        raise NotImplementedError

    def forward(self, images: torch.Tensor, boxes: BatchBoxes | None = None):
        """Augment ``images`` (and ``boxes``) with freshly drawn per-sample parameters."""
        check_images(images)
        check_boxes_arg(boxes)
        params = self.sample_params(images.shape[0], (images.shape[-2], images.shape[-1]))
        return self.apply(images, params, boxes)
