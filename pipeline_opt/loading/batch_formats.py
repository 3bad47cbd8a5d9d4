"""Collate functions whose image stack a caller may place itself (a framework's batch format).

A framework's collate function that stacks every sample's image with ``torch.stack`` into ordinary
memory can be described once as a :class:`StackedCollate`: how to recognise it, which tensors it would
stack, and how to collate the rest around a stack made elsewhere. Shared slots
(:class:`~pipeline_opt.loading.slot_collate.SlotCollate`) then stack the images straight into a reused,
page-locked slot and the batch is otherwise the function's own. An integration registers its
framework's format (:func:`register_stacked_collate`); nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StackedCollate", "find_collate", "register_stacked_collate", "stacked_collate_of"]

_MAX_DEPTH = 8


@dataclass(frozen=True)
class StackedCollate:
    """A collate function that stacks one image tensor per sample.

    ``matches(collate_fn)``: it is this function; ``images(samples)``: the tensors it would stack,
    or None when they cannot be stacked into one tensor (the function then runs as it is);
    ``collate_around(collate_fn, samples, images)``: its batch of ``samples`` with ``images``
    (already stacked) in the images' place.
    """

    name: str
    matches: Callable[[Any], bool]
    images: Callable[[list], list[torch.Tensor] | None]
    collate_around: Callable[[Callable[[list], Any], list, torch.Tensor], Any]


_FORMATS: list[StackedCollate] = []


def register_stacked_collate(fmt: StackedCollate) -> StackedCollate:
    """Add ``fmt`` (once: another format of the same name is refused)."""
    if any(f.name == fmt.name for f in _FORMATS):
        if fmt in _FORMATS:
            return fmt
        raise ValueError(f"a collate format named {fmt.name!r} is registered already")
    _FORMATS.append(fmt)
    return fmt


def stacked_collate_of(collate_fn: Any) -> StackedCollate | None:
    """The registered format of ``collate_fn`` itself, or None."""
    return next((f for f in _FORMATS if f.matches(collate_fn)), None)


def find_collate(collate_fn: Any, cls: type) -> Any:
    """The ``cls`` instance in the chain ``collate_fn``, ``collate_fn.collate_fn``, ... (collate
    wrappers keep the function they wrap there: the profiler's, shared slots'), else None."""
    for _ in range(_MAX_DEPTH):
        if collate_fn is None or isinstance(collate_fn, cls):
            return collate_fn
        collate_fn = getattr(collate_fn, "collate_fn", None)
    return None
