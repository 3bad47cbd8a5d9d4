"""Dataset-changing candidates: GPU offload of tensor transforms, and JPEG draft decoding.

Both are plans computed once from the user's dataset; a candidate that uses them gets a shallow
copy of the dataset with the CPU part of the transform (and, for draft decoding, a draft-decoding
image loader) and, for the offload, a :class:`pipeline_opt.transforms.DeviceLoader` that applies
the GPU part to each batch. The user's dataset object is never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.loading import decode
from pipeline_opt.transforms.jpeg_header import JPEG_SUFFIXES
from pipeline_opt.transforms.registry import device_exactness, info_of
from pipeline_opt.transforms.split import replace_transform, split_transforms

log = get_logger("tune.offload")


@dataclass(frozen=True)
class GpuOffload:
    """The dataset's transform split in two: the CPU part stays in the workers."""

    cpu_transform: Callable | None
    gpu_transform: Callable
    names: tuple[str, ...]


@dataclass(frozen=True)
class DraftDecode:
    """A JPEG loader that decodes at reduced DCT scale, never below ``min_size`` (w, h) of the first Resize."""

    image_loader: Callable[[str], Any]
    target: Any  # the Resize size the draft must still cover


def transform_names(transform: Any) -> tuple[str, ...]:
    """Class names of the steps of a Compose / Sequential / list, or of the callable itself."""
    steps = getattr(transform, "transforms", None)
    if steps is None and isinstance(transform, (torch.nn.Sequential, list, tuple)):
        steps = list(transform)
    if steps is None:
        return (type(transform).__name__,)
    return tuple(type(t).__name__ for t in steps)


def _is_empty(transform: Any) -> bool:
    if transform is None:
        return True
    steps = getattr(transform, "transforms", None)
    if steps is None and isinstance(transform, (torch.nn.Sequential, list, tuple)):
        steps = list(transform)
    return steps is not None and len(steps) == 0


def plan_gpu_offload(dataset: Any, exact: bool = False) -> tuple[GpuOffload | None, str]:
    """Split ``dataset.transform`` with :func:`pipeline_opt.transforms.split_transforms`.

    Returns ``(plan, "")`` or ``(None, why not)``. With ``exact``, only bit-identical transforms
    move (``ToFloat``, ``ConvertDtype``, ``Normalize``, ``CenterCrop``): a Resize (within 1/255 of
    PIL on the device, :mod:`pipeline_opt.tune.exactness`) and everything before it stay on the CPU;
    the second element then says what was held back, also when a plan remains.
    """
    transform = getattr(dataset, "transform", None)
    if transform is None:
        return None, f"{type(dataset).__name__} has no .transform to split"
    try:
        cpu, gpu = split_transforms(transform)
        held = ""
        if exact and gpu.exactness != "bitwise":
            held = (f"{'+'.join(tolerance_names(gpu))} stays on the CPU (exact=True): on the device it is within "
                    "1/255 of PIL bilinear, not bit-identical")
            cpu, gpu = split_transforms(transform, exact=True)
    except (TypeError, ValueError) as exc:
        return None, f"the transform cannot be split: {exc}"
    if _is_empty(gpu):
        return None, held or "no transform of the dataset can run on the device"
    return GpuOffload(cpu_transform=None if _is_empty(cpu) else cpu, gpu_transform=gpu,
                      names=transform_names(gpu)), held


def tolerance_names(gpu_part: Any) -> tuple[str, ...]:
    """The names of the device modules of ``gpu_part`` that are not bit-identical to the CPU op."""
    return tuple(name for name in transform_names(gpu_part) if device_exactness(name) != "bitwise")


def _first_step(transform: Any) -> Any:
    steps = getattr(transform, "transforms", None)
    return steps[0] if steps else None


def plan_draft_decode(dataset: Any) -> tuple[DraftDecode | None, str]:
    """A draft-decoding plan for an ImageFolder-like JPEG dataset whose transform starts with a Resize."""
    samples = getattr(dataset, "samples", None)
    if not samples or not callable(getattr(dataset, "loader", None)):
        return None, f"{type(dataset).__name__} is not an ImageFolder-like dataset (no .samples / .loader)"
    path = str(samples[0][0])
    if not path.lower().endswith(JPEG_SUFFIXES):
        return None, f"the images are not JPEGs ({path.rsplit('.', 1)[-1]})"
    first = _first_step(getattr(dataset, "transform", None))
    size = getattr(first, "size", None)
    info = info_of(first)
    if info is None or info.op != "resize" or info.origin != "torchvision" or size is None:
        return None, "the transform does not start with a Resize (draft decoding needs the target size)"
    try:
        image_loader = decode.draft_loader(size)
    except (TypeError, ValueError) as exc:
        return None, f"draft decoding does not support Resize(size={size!r}): {exc}"
    return DraftDecode(image_loader=image_loader, target=size), ""


def variant_dataset(dataset: Any, gpu: GpuOffload | None, draft: DraftDecode | None) -> Any:
    """A shallow copy of ``dataset`` with the CPU part of the transform and/or the draft loader."""
    if gpu is None and draft is None:
        return dataset
    new = copy.copy(dataset)
    if gpu is not None:
        replace_transform(new, gpu.cpu_transform)
    if draft is not None:
        new.loader = draft.image_loader
    return new
