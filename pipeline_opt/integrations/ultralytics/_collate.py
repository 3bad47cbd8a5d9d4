"""ultralytics-style collating around an image tensor stacked somewhere chosen by the caller.

ultralytics' ``YOLODataset.collate_fn`` stacks every sample's ``img`` with ``torch.stack`` into
ordinary memory. :class:`pipeline_opt.loading.slot_collate.SlotCollate` stacks them straight into a
reused, page-locked slot instead and lets the collate function do the rest with these helpers, so the
batch is the same, keys in the same (sorted) order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def stackable_images(samples: list) -> list[torch.Tensor] | None:
    """The samples' ``img`` tensors when every sample is a mapping with a CPU tensor ``img`` of one
    shape and dtype (what ``torch.stack`` takes), else None."""
    if not samples or not all(isinstance(s, Mapping) for s in samples):
        return None
    images = [s.get("img") for s in samples]
    first = images[0]
    if not isinstance(first, torch.Tensor) or first.device.type != "cpu":
        return None
    if any(not isinstance(t, torch.Tensor) or t.shape != first.shape or t.dtype != first.dtype
           or t.device != first.device for t in images):
        return None
    return images


def collate_around(collate_fn: Callable[[list], Any], samples: list, images: torch.Tensor) -> dict:
    """``collate_fn``'s batch of ``samples`` with ``images`` (already stacked) as its ``img``: the
    function collates everything else, and the keys are sorted as ultralytics sorts them."""
    rest = collate_fn([{k: v for k, v in s.items() if k != "img"} for s in samples])
    rest["img"] = images
    return dict(sorted(rest.items()))
