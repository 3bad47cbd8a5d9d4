"""Bounding boxes on tensors: formats, clipping, candidate filtering and a per-batch container.

Coordinates are *continuous*: an image of width ``W`` spans ``[0, W]`` and pixel ``i`` covers
``[i, i + 1)``. This is the convention of ultralytics (a horizontal flip maps ``x -> W - x``),
not Kornia's ``(W - 1) - x``.

Two formats are supported:

* ``"xyxy"``: ``(x1, y1, x2, y2)`` in pixels;
* ``"xywhn"``: ``(cx, cy, w, h)`` normalised by the image width and height, the format of
  ``batch["bboxes"]`` in ultralytics detection batches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

FORMATS = ("xyxy", "xywhn")


def _check_boxes(boxes: torch.Tensor, name: str = "boxes") -> None:
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (N, 4), got {type(boxes).__name__}")
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"{name} must have shape (N, 4), got {tuple(boxes.shape)}")


def _check_size(size: tuple[int, int]) -> tuple[int, int]:
    if len(size) != 2 or min(size) <= 0:
        raise ValueError(f"size={size!r} must be (height, width) with both > 0")
    return int(size[0]), int(size[1])


def xywhn_to_xyxy(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Normalised ``(cx, cy, w, h)`` -> ``(x1, y1, x2, y2)`` pixels for an image of ``size=(H, W)``."""
    _check_boxes(boxes)
    h, w = _check_size(size)
    cx, cy, bw, bh = boxes.unbind(-1)
    return torch.stack(((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h), -1)


def xyxy_to_xywhn(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``(x1, y1, x2, y2)`` pixels -> normalised ``(cx, cy, w, h)`` for an image of ``size=(H, W)``."""
    _check_boxes(boxes)
    h, w = _check_size(size)
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / (2 * w), (y1 + y2) / (2 * h), (x2 - x1) / w, (y2 - y1) / h), -1)


def clip_xyxy(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Clip ``xyxy`` pixel boxes to an image of ``size=(H, W)`` (to ``[0, W] x [0, H]``)."""
    _check_boxes(boxes)
    h, w = _check_size(size)
    x = boxes[:, 0::2].clamp(0, w)
    y = boxes[:, 1::2].clamp(0, h)
    return torch.stack((x[:, 0], y[:, 0], x[:, 1], y[:, 1]), -1)


def box_candidates(
    before: torch.Tensor,
    after: torch.Tensor,
    wh_thr: float = 2.0,
    ar_thr: float = 100.0,
    area_thr: float = 0.1,
    eps: float = 1e-16,
) -> torch.Tensor:
    """Which augmented boxes to keep, exactly as ultralytics' ``RandomPerspective.box_candidates``.

    Args:
        before: ``(N, 4)`` xyxy boxes before augmentation, already multiplied by the augmentation's
            scale factor (so that ``area_thr`` compares like with like).
        after: ``(N, 4)`` xyxy boxes after augmentation and clipping.
        wh_thr: a kept box is wider and taller than this many pixels.
        ar_thr: a kept box has an aspect ratio (long side / short side) below this.
        area_thr: a kept box keeps more than this fraction of its (scaled) area.
        eps: guards the divisions.

    Returns:
        ``(N,)`` bool mask of the boxes to keep.
    """
    _check_boxes(before, "before")
    _check_boxes(after, "after")
    if before.shape != after.shape:
        raise ValueError(
            f"before {tuple(before.shape)} and after {tuple(after.shape)} must have the same shape"
        )
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    ar = torch.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def degenerate_mask(boxes: torch.Tensor, min_size: float = 0.0) -> torch.Tensor:
    """``(N,)`` bool mask of ``xyxy`` pixel boxes whose width or height is not above ``min_size``.

    The default flags empty and inverted boxes (zero or negative width/height), as left by clipping.
    """
    _check_boxes(boxes)
    if min_size < 0:
        raise ValueError(f"min_size={min_size!r} must be >= 0")
    return ((boxes[:, 2] - boxes[:, 0]) <= min_size) | ((boxes[:, 3] - boxes[:, 1]) <= min_size)


@dataclass(frozen=True)
class BatchBoxes:
    """The boxes of a whole batch, one row per box, with the index of the image each belongs to.

    Mirrors an ultralytics detection batch: ``boxes`` is ``batch["bboxes"]`` (``fmt="xywhn"``),
    ``batch_idx`` is ``batch["batch_idx"]`` and ``cls`` is ``batch["cls"]``. Pixel boxes use
    ``fmt="xyxy"``. Every augmentation keeps ``boxes``, ``batch_idx`` and ``cls`` row-aligned.

    Attributes:
        boxes: ``(N, 4)`` float tensor in format ``fmt``.
        batch_idx: ``(N,)`` tensor (any numeric dtype) of image indices into the batch.
        cls: optional ``(N, ...)`` tensor of classes (or any per-box payload), filtered with the boxes.
        fmt: ``"xyxy"`` (pixels) or ``"xywhn"`` (normalised centre/size).
    """

    boxes: torch.Tensor
    batch_idx: torch.Tensor
    cls: torch.Tensor | None = None
    fmt: str = "xyxy"

    def __post_init__(self) -> None:
        _check_boxes(self.boxes)
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt={self.fmt!r} is not a box format; use one of {FORMATS}")
        if not isinstance(self.batch_idx, torch.Tensor) or self.batch_idx.ndim != 1:
            raise ValueError("batch_idx must be a 1-D tensor with one image index per box")
        if self.batch_idx.shape[0] != self.boxes.shape[0]:
            raise ValueError(
                f"batch_idx has {self.batch_idx.shape[0]} rows but boxes has {self.boxes.shape[0]}; "
                "they must be row-aligned"
            )
        if self.cls is not None and (
            not isinstance(self.cls, torch.Tensor) or self.cls.shape[0] != len(self)
        ):
            raise ValueError(f"cls must be a tensor with {len(self)} rows (one per box), or None")

    def __len__(self) -> int:
        return int(self.boxes.shape[0])

    @property
    def sample_index(self) -> torch.Tensor:
        """``batch_idx`` as ``int64`` (ultralytics stores it as float)."""
        return self.batch_idx.long()

    def xyxy(self, size: tuple[int, int]) -> torch.Tensor:
        """The boxes as ``xyxy`` pixels for images of ``size=(H, W)``."""
        return self.boxes if self.fmt == "xyxy" else xywhn_to_xyxy(self.boxes, size)

    def with_xyxy(self, boxes: torch.Tensor, size: tuple[int, int]) -> BatchBoxes:
        """A copy holding new ``xyxy`` pixel ``boxes`` (same rows), converted back to this format."""
        _check_boxes(boxes)
        if boxes.shape[0] != len(self):
            raise ValueError(f"boxes has {boxes.shape[0]} rows, expected {len(self)}")
        new = boxes if self.fmt == "xyxy" else xyxy_to_xywhn(boxes, size)
        return replace(self, boxes=new.to(self.boxes.dtype))

    def select(self, keep: torch.Tensor) -> BatchBoxes:
        """The rows where the bool mask (or index tensor) ``keep`` selects, all fields together."""
        return replace(
            self,
            boxes=self.boxes[keep],
            batch_idx=self.batch_idx[keep],
            cls=None if self.cls is None else self.cls[keep],
        )

    def clip(self, size: tuple[int, int]) -> BatchBoxes:
        """Boxes clipped to images of ``size=(H, W)``."""
        return self.with_xyxy(clip_xyxy(self.xyxy(size), size), size)

    def drop_degenerate(self, size: tuple[int, int], min_size: float = 0.0) -> BatchBoxes:
        """Drop boxes not wider and taller than ``min_size`` pixels (images of ``size=(H, W)``)."""
        return self.select(~degenerate_mask(self.xyxy(size), min_size))

    def to(self, device: torch.device | str) -> BatchBoxes:
        """The same boxes on ``device``."""
        return replace(
            self,
            boxes=self.boxes.to(device),
            batch_idx=self.batch_idx.to(device),
            cls=None if self.cls is None else self.cls.to(device),
        )
