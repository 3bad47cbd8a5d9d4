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
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt.transforms.jpeg_header import jpeg_folder_problem

NVJPEG_WORKERS = 4  # the most workers the GPU-decode candidate starts with: they only read files


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
        from pipeline_opt.loader_clone import clone_loader
        from pipeline_opt.loading import DeviceLoader
        from pipeline_opt.loading.decode import EncodedJpegDataset, GpuJpegDecoder, packed_jpeg_collate

        decoder = GpuJpegDecoder(self.size, mean=self.mean, std=self.std, crop=self.crop, device=device)
        clone = clone_loader(loader, dataset=EncodedJpegDataset(self.samples), collate_fn=packed_jpeg_collate,
                             **overrides)
        return DeviceLoader(clone, device=device, batch_transform=decoder, prepare_in_thread=prepare_in_thread)


def _steps(transform: Any) -> list[Any] | None:
    steps = getattr(transform, "transforms", None)
    return None if steps is None else list(steps)


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return int(value[0]), int(value[0])
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def _resize(step: Any) -> tuple[int | tuple[int, int] | None, str]:
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2

    if not isinstance(step, (T1.Resize, T2.Resize)):
        return None, f"the transform starts with {type(step).__name__}, not a Resize"
    mode = getattr(step.interpolation, "value", step.interpolation)
    if str(mode).lower() != "bilinear":
        return None, f"Resize uses {mode} interpolation; the GPU decoder resizes bilinearly"
    if getattr(step, "max_size", None) is not None or getattr(step, "antialias", True) is False:
        return None, "Resize has max_size or antialias=False, which the GPU decoder does not reproduce"
    size = step.size
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 1):
        return int(size if isinstance(size, int) else size[0]), ""
    pair = _pair(size)
    return (pair, "") if pair else (None, f"Resize(size={size!r}) is not understood")


def _to_float(steps: list[Any]) -> tuple[int, str]:
    """How many steps make the float [0, 1] tensor (1 or 2), or 0 and why not."""
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2

    if steps and isinstance(steps[0], T1.ToTensor):
        return 1, ""
    if steps and isinstance(steps[0], T1.ConvertImageDtype):
        return 0, "ConvertImageDtype without ToTensor"
    if len(steps) >= 2 and isinstance(steps[0], (T2.ToImage, T1.PILToTensor)) \
            and isinstance(steps[1], (T2.ToDtype, T1.ConvertImageDtype)):
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
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2
    from torch.utils.data import default_collate

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
    if rest and isinstance(rest[0], (T1.CenterCrop, T2.CenterCrop)):
        crop, rest = _pair(rest[0].size), rest[1:]
    if crop is None and isinstance(size, int):
        return None, f"Resize({size}) keeps the aspect ratio and no CenterCrop follows: the images differ in size"
    n, why = _to_float(rest)
    if not n:
        return None, why
    rest = rest[n:]
    mean = std = None
    if rest and isinstance(rest[0], (T1.Normalize, T2.Normalize)) and not getattr(rest[0], "inplace", False):
        mean, std, rest = tuple(map(float, rest[0].mean)), tuple(map(float, rest[0].std)), rest[1:]
    if rest:
        return None, f"{type(rest[0]).__name__} after the conversion is not reproduced by the GPU decoder"
    return NvjpegDecode(size=size, crop=crop, mean=mean, std=std,
                        samples=tuple((str(p), y) for p, y in samples)), ""
