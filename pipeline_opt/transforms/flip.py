"""Random horizontal and vertical flips of a batch, with boxes (ultralytics ``RandomFlip``).

:class:`RandomHorizontalFlip` / :class:`RandomVerticalFlip` equal ``torch.flip`` pixel for pixel;
boxes map ``x -> W - x`` (continuous coordinates, as ultralytics' ``Instances.fliplr``; Kornia's
``(W - 1) - x`` is one pixel off). Batches, dtypes, seeds and boxes as in
:mod:`~pipeline_opt.transforms.augment_base`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline_opt._core.step import to_device_async
from pipeline_opt.transforms.augment_base import (
    RandomBatchAugment,
    augment_result,
    check_boxes_arg,
    check_images,
    check_prob,
)
from pipeline_opt.transforms.boxes import BatchBoxes

__all__ = ["FlipParams", "RandomHorizontalFlip", "RandomVerticalFlip"]


@dataclass(frozen=True)
class FlipParams:
    """Which samples of a batch are flipped: ``flip`` is a ``(B,)`` bool tensor."""

    flip: torch.Tensor


class _RandomFlip(RandomBatchAugment):
    _dim = -1  # image dim flipped

    def __init__(self, p: float = 0.5, *, seed: int | None = None, generator: torch.Generator | None = None):
        super().__init__(seed, generator)
        self.p = check_prob("p", p)

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
        check_images(images)
        check_boxes_arg(boxes)
        self._check_params(params, images.shape[0])
        flip = to_device_async(params.flip, images.device)
        out = torch.where(flip.view(-1, 1, 1, 1), images.flip(self._dim), images)
        return augment_result(out, None if boxes is None else self.apply_boxes(boxes, params, images.shape[self._dim]))

    def apply_boxes(self, boxes: BatchBoxes, params: FlipParams, extent: int) -> BatchBoxes:
        """Mirror the boxes of the flipped samples; ``extent`` is the image size along the flipped axis.

        Works on the boxes' own device and never waits for it (the flags are copied asynchronously).
        """
        check_boxes_arg(boxes)
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
