"""ultralytics-style collating around an image tensor stacked somewhere chosen by the caller.

ultralytics' ``YOLODataset.collate_fn`` stacks every sample's ``img`` with ``torch.stack`` into
ordinary memory. In a DataLoader worker that tensor is then copied once more, into shared memory, when
the worker sends the batch (torch's own ``default_collate`` allocates it there in the first place).
The helpers here stack the images straight into a tensor of the caller's choosing and let the collate
function do the rest, so the batch is the same, keys in the same (sorted) order:

* :class:`SharedImageCollate` stacks them with ``default_collate``, which allocates in shared memory
  in a worker: one copy of the batch's images fewer per batch in every worker (79 MB at
  64 x 640 x 640 x 3);
* :class:`pipeline_opt.loading.shared_slots.SlotCollate` stacks into a reused, page-locked slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import default_collate, get_worker_info

from pipeline_opt.integrations.ultralytics._internals import is_ultralytics_collate_fn

_MAX_DEPTH = 8


def find_collate(collate_fn: Any, cls: type) -> Any:
    """The ``cls`` instance in the chain ``collate_fn``, ``collate_fn.collate_fn``, ... (collate
    wrappers keep the function they wrap there: the profiler's, shared slots', ours), else None."""
    for _ in range(_MAX_DEPTH):
        if collate_fn is None or isinstance(collate_fn, cls):
            return collate_fn
        collate_fn = getattr(collate_fn, "collate_fn", None)
    return None


def is_ultralytics_collate(fn: Any) -> bool:
    """Whether ``fn`` is ultralytics' ``YOLODataset.collate_fn`` (stacks ``img``, sorts the keys),
    also under wrappers that return exactly what it returns (:class:`SharedImageCollate`)."""
    for _ in range(_MAX_DEPTH):
        if not getattr(type(fn), "same_batches_as_collate_fn", False):
            break
        fn = fn.collate_fn
    return is_ultralytics_collate_fn(fn)


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


class SharedImageCollate:
    """Wraps ultralytics' collate function: in a worker, the batch's images are stacked straight into
    shared memory (the worker then sends them without another copy); everything else, and any batch
    whose images cannot be stacked, is the wrapped function's. In the training process it is the
    wrapped function. The batches are the same, value for value and key for key."""

    same_batches_as_collate_fn = True  # shared slots look through it to ultralytics' function

    def __init__(self, collate_fn: Callable[[list], Any]) -> None:
        if not callable(collate_fn):
            raise TypeError(f"collate_fn={collate_fn!r} must be callable")
        self.collate_fn = collate_fn

    def __repr__(self) -> str:
        return f"SharedImageCollate({getattr(self.collate_fn, '__qualname__', self.collate_fn)!r})"

    def __call__(self, samples: list) -> Any:
        images = stackable_images(samples) if get_worker_info() is not None else None
        if images is None:
            return self.collate_fn(samples)
        # torch's default_collate stacks a list of tensors into shared memory when called in a worker
        return collate_around(self.collate_fn, samples, default_collate(images))


def install_shared_image_collate(loader: Any) -> bool:
    """Give ``loader`` (a DataLoader with ultralytics' collate function, workers not started yet) a
    :class:`SharedImageCollate`; True when installed now. A loader whose workers already run (its
    ``iterator`` is set), one with another collate function, or one that has it already, is left as
    it is."""
    collate = getattr(loader, "collate_fn", None)
    if isinstance(collate, SharedImageCollate) or not is_ultralytics_collate(collate):
        return False
    if getattr(loader, "iterator", None) is not None or getattr(loader, "_iterator", None) is not None:
        return False
    loader.collate_fn = SharedImageCollate(collate)
    return True
