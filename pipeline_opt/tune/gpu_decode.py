"""The GPU JPEG decode candidate (nvJPEG): workers only read files, the device decodes and resizes.

A plan exists when the dataset is ImageFolder-like over JPEGs (``.samples`` + the default image
loader, no ``target_transform``), the loader batches with the default collate, and the transform
is a chain :class:`pipeline_opt.loading.decode.GpuJpegDecoder` reproduces: ``Resize((h, w))`` or
``Resize(int)`` + ``CenterCrop``, then ``ToTensor`` (or ``ToImage`` + ``ToDtype(float32,
scale=True)``), then an optional ``Normalize``. The candidate's loader is a DeviceLoader whose
``batch_transform`` is the decoder, around a clone of the user's DataLoader (same sampler, order,
generator ...) over an :class:`~pipeline_opt.loading.decode.EncodedJpegDataset` copy of the
samples with :func:`~pipeline_opt.loading.decode.packed_jpeg_collate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from pipeline_opt.loading import DeviceLoader
from pipeline_opt.loading.dataloader import clone_loader
from pipeline_opt.loading.decode import EncodedJpegDataset, GpuJpegDecoder, packed_jpeg_collate
from pipeline_opt.transforms.jpeg_header import jpeg_folder_problem
from pipeline_opt.transforms.registry import info_of, is_bilinear, pair, resize_size

NVJPEG_WORKERS = 4  # the most workers the GPU-decode candidate starts with: they only read files
# the GPU-decode candidate's changes to a LoaderConfig: the device decodes (and replays), so no
# offload of its own; pinned memory speeds the decoder's host-to-device copies; the decode runs in
# a background thread, overlapping the step
GPU_DECODE_CHANGE = MappingProxyType({"decode": "nvjpeg", "gpu_transforms": (), "pin_memory": True,
                                      "decode_thread": True})


def gpu_decode_workers(incumbent_workers: int, max_workers: int) -> int:
    """The workers the GPU-decode candidate starts with: at most :data:`NVJPEG_WORKERS`.

    With the decode on the GPU a worker reads files (and, for a random Compose, draws parameters),
    so the count that fed a CPU decode is far more than it needs, and the extra processes compete
    with the training process and the decoding thread for the cores. In the committed 16-core
    classification grids the GPU decode in a thread read the same at 2 to 8 workers and slowest
    at 16 in three of four runs; the tuner then climbs from this count
    (:meth:`~pipeline_opt.tune.search.Search.tune_workers`), to Little's law's count when the
    step still waits on data."""
    light = max(1, min(NVJPEG_WORKERS, max_workers))
    return min(incumbent_workers, light) if incumbent_workers > 0 else light


@dataclass(frozen=True)
class NvjpegDecode:
    """How to rebuild the loader with GPU decoding: the decoder's arguments and the encoded dataset."""

    size: int | tuple[int, int]
    crop: tuple[int, int] | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    samples: tuple[tuple[str, Any], ...]

    def build(self, loader: DataLoader, device: torch.device, overrides: dict[str, Any], *,
              prepare_in_thread: bool = True) -> Any:
        """A DeviceLoader decoding on ``device`` (in a background thread unless ``prepare_in_thread=False``)
        around a clone of ``loader`` with ``overrides``."""
        decoder = GpuJpegDecoder(self.size, mean=self.mean, std=self.std, crop=self.crop, device=device)
        clone = clone_loader(loader, dataset=EncodedJpegDataset(self.samples), collate_fn=packed_jpeg_collate,
                             **overrides)
        return DeviceLoader(clone, device=device, batch_transform=decoder, prepare_in_thread=prepare_in_thread)


def _steps(transform: Any) -> list[Any] | None:
    steps = getattr(transform, "transforms", None)
    return None if steps is None else list(steps)


def _op(step: Any) -> str:
    """The registry's name for what ``step`` does, for torchvision's classes ("" for anything else)."""
    info = info_of(step)
    return info.op if info is not None and info.origin == "torchvision" else ""


def _resize(step: Any) -> tuple[int | tuple[int, int] | None, str]:
    if _op(step) != "resize":
        return None, f"the transform starts with {type(step).__name__}, not a Resize"
    if not is_bilinear(step):
        mode = getattr(step.interpolation, "value", step.interpolation)
        return None, f"Resize uses {mode} interpolation; the GPU decoder resizes bilinearly"
    if getattr(step, "max_size", None) is not None or getattr(step, "antialias", True) is False:
        return None, "Resize has max_size or antialias=False, which the GPU decoder does not reproduce"
    size = resize_size(step)
    return (size, "") if size is not None else (None, f"Resize(size={step.size!r}) is not understood")


def _to_float(steps: list[Any]) -> tuple[int, str]:
    """How many steps make the float [0, 1] tensor (1 or 2), or 0 and why not."""
    first = _op(steps[0]) if steps else ""
    if first == "to_tensor":
        return 1, ""
    if first == "convert_dtype":
        return 0, f"{type(steps[0]).__name__} without ToTensor"
    if first == "to_uint8" and len(steps) >= 2 and _op(steps[1]) == "convert_dtype":
        dtype = getattr(steps[1], "dtype", None)
        dtype = dtype.get(torch.Tensor, None) if isinstance(dtype, dict) else dtype
        scale = getattr(steps[1], "scale", True)
        if dtype == torch.float32 and scale:
            return 2, ""
        return 0, f"{type(steps[1]).__name__}(dtype={dtype}, scale={scale}) is not a float32 [0, 1] conversion"
    name = type(steps[0]).__name__ if steps else "nothing"
    return 0, f"the Resize is followed by {name}, not ToTensor / ToImage + ToDtype"


def plan_nvjpeg_decode(loader: DataLoader) -> tuple[NvjpegDecode | None, str]:
    """A GPU-decode plan for ``loader`` (any device: the caller decides where it runs), or ``(None, why)``."""
    dataset = loader.dataset
    problem = jpeg_folder_problem(dataset)
    if problem:
        return None, problem
    samples = dataset.samples
    if getattr(dataset, "target_transform", None) is not None:
        return None, "the dataset has a target_transform, which the encoded dataset does not apply"
    if loader.batch_size is None and loader.batch_sampler is None:
        return None, "the loader does not batch (batch_size=None)"
    if loader.collate_fn is not default_collate and getattr(loader.collate_fn, "__name__", "") != "default_collate":
        return None, f"the loader has its own collate_fn ({getattr(loader.collate_fn, '__name__', loader.collate_fn)})"
    steps = _steps(getattr(dataset, "transform", None))
    if not steps:
        return None, "the dataset's transform is not a Compose starting with a Resize"
    size, why = _resize(steps[0])
    if size is None:
        return None, why
    rest, crop = steps[1:], None
    if rest and _op(rest[0]) == "center_crop":
        crop, rest = pair(rest[0].size), rest[1:]
    if crop is None and isinstance(size, int):
        return None, f"Resize({size}) keeps the aspect ratio and no CenterCrop follows: the images differ in size"
    n, why = _to_float(rest)
    if not n:
        return None, why
    rest = rest[n:]
    mean = std = None
    if rest and _op(rest[0]) == "normalize" and not getattr(rest[0], "inplace", False):
        mean, std, rest = tuple(map(float, rest[0].mean)), tuple(map(float, rest[0].std)), rest[1:]
    if rest:
        return None, f"{type(rest[0]).__name__} after the conversion is not reproduced by the GPU decoder"
    return NvjpegDecode(size=size, crop=crop, mean=mean, std=std,
                        samples=tuple((str(p), y) for p, y in samples)), ""
