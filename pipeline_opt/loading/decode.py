"""Cheaper JPEG decoding: reduced-scale CPU decode (``Image.draft``) and batched GPU decode (nvJPEG).

Draft decoding (CPU, opt-in). libjpeg can decode at 1/2, 1/4 or 1/8 scale by dropping DCT
coefficients, which costs a fraction of a full decode. When the pipeline resizes the image down
anyway, :func:`open_draft` asks for the largest reduction that still leaves the image at least as
large as the resize target (never smaller), then the pipeline's own resize runs as before. Use
:func:`draft_loader` as ``ImageFolder(loader=...)`` or :func:`draft_dataset` on an existing
dataset, and :func:`measure_draft_error` for the error against a full decode. Caveat: with an int
(shorter-side) resize the longer side is computed from the drafted image's aspect, which the
rounding-up of odd sizes can change by one pixel; ``measure_draft_error`` counts those cases.

GPU decoding. Workers only read files (:class:`EncodedJpegDataset`), their collate
(:func:`packed_jpeg_collate`) packs a batch's encoded bytes into one uint8 tensor plus sizes — one
shared-memory handle per batch instead of one per image — and :class:`GpuJpegDecoder`, given to
:class:`~pipeline_opt.loading.device_loader.DeviceLoader` as ``batch_transform``, decodes the batch
with ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG), resizes with the faithful
:class:`~pipeline_opt.transforms.gpu.Resize` and normalises, on the loader's side stream. On a CPU
device it decodes with libjpeg through the same call, so it runs (and is tested) anywhere.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

import pipeline_opt.transforms.gpu as gpu
from pipeline_opt._core.device import resolve_device
from pipeline_opt._core.log import get_logger
from pipeline_opt.loading.device_loader import DeviceLoader
from pipeline_opt.transforms.jpeg_batch import PackedJpegs, decode_jpegs, packed_jpeg_collate, unpack_jpegs
from pipeline_opt.transforms.registry import info_of

__all__ = [
    "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder", "PackedJpegs", "draft_dataset",
    "draft_loader", "draft_target_of", "gpu_jpeg_loader", "measure_draft_error", "open_draft", "packed_jpeg_collate", "unpack_jpegs",
]

log = get_logger("transforms.decode")

Target = int | tuple[int, int]


# ----------------------------------------------------------------------------------- draft decoding

def _check_target(target: Any) -> Target:
    if isinstance(target, numbers.Integral) and not isinstance(target, bool) and target > 0:
        return int(target)
    if isinstance(target, Sequence) and len(target) == 1:
        return _check_target(target[0])
    if isinstance(target, Sequence) and len(target) == 2 and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in target):
        return int(target[0]), int(target[1])
    raise ValueError(f"target={target!r} must be a positive int (shorter side after the resize) or a "
                     "(height, width) pair, like torchvision's Resize size")


def _draft_request(target: Target) -> tuple[int, int]:
    """The ``(width, height)`` to pass to ``Image.draft``: both sides must stay >= this."""
    if isinstance(target, int):
        return target, target  # shorter side >= target  <=>  both sides >= target
    return target[1], target[0]


def open_draft(path: str | os.PathLike, target: Any) -> Image.Image:
    """Open ``path`` as RGB, decoded at the largest DCT reduction that keeps it >= ``target``.

    ``target`` is the pipeline's resize size: an int (shorter side) or ``(height, width)``. Non-JPEG
    files and images already near the target decode at full size.
    """
    request = _draft_request(_check_target(target))
    with open(path, "rb") as f:
        img = Image.open(f)
        img.draft("RGB", request)
        return img.convert("RGB")


class DraftLoader:
    """A picklable ``ImageFolder(loader=...)`` callable: ``path -> open_draft(path, target)``."""

    def __init__(self, target: Any) -> None:
        self.target = _check_target(target)

    def __call__(self, path: str | os.PathLike) -> Image.Image:
        return open_draft(path, self.target)

    def __repr__(self) -> str:
        return f"DraftLoader(target={self.target})"


def draft_loader(target: Any) -> DraftLoader:
    """A torchvision-compatible image loader that draft-decodes to at least ``target``."""
    return DraftLoader(target)


def draft_target_of(compose: Any) -> Target | None:
    """The resize target of a torchvision Compose whose first size-changing op is a bilinear Resize.

    Leading conversions (``ToImage``, ``PILToTensor``) are skipped. ``None`` when the pipeline does
    not start with a deterministic resize (a random crop first, for example): drafting is then not
    known to be harmless.
    """
    for t in getattr(compose, "transforms", [compose]):
        info = info_of(t)
        op = info.op if info is not None and info.origin == "torchvision" else ""
        if op == "to_uint8":
            continue
        if op == "resize" and t.size is not None and t.max_size is None:
            size = [t.size] if isinstance(t.size, int) else list(t.size)
            return _check_target(size[0] if len(size) == 1 else tuple(size))
        return None
    return None


def draft_dataset(dataset: Any, target: Any = None) -> Any:
    """A shallow copy of ``dataset`` (an ``ImageFolder`` / ``DatasetFolder``) that draft-decodes.

    ``target`` defaults to :func:`draft_target_of` the dataset's transform; a ``ValueError`` says so
    when it cannot be inferred.
    """
    import copy

    if not callable(getattr(dataset, "loader", None)):
        raise TypeError(f"{type(dataset).__name__} has no .loader to replace; draft decoding needs an "
                        "ImageFolder / DatasetFolder (or build one with loader=draft_loader(target))")
    if target is None:
        target = draft_target_of(getattr(dataset, "transform", None))
        if target is None:
            raise ValueError("cannot infer the draft target: the dataset's transform does not start with a "
                             "Resize; pass target=(height, width) or the shorter side explicitly")
    out = copy.copy(dataset)
    out.loader = DraftLoader(target)
    return out


@dataclass(frozen=True)
class DraftError:
    """Draft vs full decode after the final resize, in /255 pixel units, over ``images`` files."""

    images: int
    mean_abs: float  # mean absolute difference per pixel value
    max_abs: float  # largest difference of any pixel value
    p99_abs: float  # 99th percentile of all pixel differences (pooled over the images)
    size_mismatches: int  # images whose resized size differs from the full decode's (int targets)
    mean_reduction: float  # mean decoded-area ratio full / draft (1.0 = no reduction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_draft_error(paths: Sequence[str | os.PathLike], target: Any) -> DraftError:
    """Decode each file fully and drafted, resize both to ``target`` (PIL bilinear, torchvision's
    ``Resize`` semantics) and compare. A drafted image whose resize lands one pixel off (see the
    module docstring) is resized to the full decode's size for the comparison and counted."""
    import torchvision.transforms.functional as TF

    target = _check_target(target)
    if not paths:
        raise ValueError("paths is empty; give the JPEG files to compare")
    size = [target] if isinstance(target, int) else list(target)
    diffs, maxima, ratios, mismatches = [], [], [], 0
    for path in paths:
        with Image.open(path) as f:
            full = f.convert("RGB")
        draft = open_draft(path, target)
        ratios.append(full.width * full.height / (draft.width * draft.height))
        a = TF.resize(full, size, interpolation=TF.InterpolationMode.BILINEAR)
        b = TF.resize(draft, size, interpolation=TF.InterpolationMode.BILINEAR)
        if a.size != b.size:
            mismatches += 1
            b = draft.resize(a.size, Image.Resampling.BILINEAR)
        d = np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16))
        diffs.append(d.ravel())
        maxima.append(int(d.max()))
    pooled = np.concatenate(diffs)
    return DraftError(images=len(paths), mean_abs=float(pooled.mean()), max_abs=float(max(maxima)),
                      p99_abs=float(np.percentile(pooled, 99)), size_mismatches=mismatches,
                      mean_reduction=float(np.mean(ratios)))


# ------------------------------------------------------------------------------------- GPU decoding

class EncodedJpegDataset(torch.utils.data.Dataset):
    """``(encoded bytes as a uint8 tensor, label)`` per file: workers only read, never decode.

    ``samples`` is a sequence of ``(path, label)`` pairs (``ImageFolder.samples``); see
    :meth:`from_image_folder`.
    """

    def __init__(self, samples: Sequence[tuple[str | os.PathLike, Any]]) -> None:
        samples = list(samples)
        if not samples:
            raise ValueError("samples is empty; give (path, label) pairs, e.g. ImageFolder(root).samples")
        for item in samples[:1]:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(f"samples must hold (path, label) pairs, got {item!r}")
        self.samples = [(str(p), y) for p, y in samples]
        self.targets = [y for _, y in self.samples]

    @classmethod
    def from_image_folder(cls, dataset_or_root: Any) -> EncodedJpegDataset:
        """From a torchvision ``ImageFolder`` (its ``.samples``) or the root folder of one."""
        samples = getattr(dataset_or_root, "samples", None)
        if samples is None:
            from torchvision.datasets import ImageFolder

            if not Path(dataset_or_root).is_dir():
                raise ValueError(f"{dataset_or_root!r} is neither an ImageFolder nor a folder")
            samples = ImageFolder(str(dataset_or_root)).samples
        return cls(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        path, label = self.samples[index]
        data = np.fromfile(path, dtype=np.uint8)
        return torch.from_numpy(data), label


class GpuJpegDecoder:
    """Decode a :class:`PackedJpegs` batch on ``device``, resize, crop, scale and normalise it.

    Equivalent to the CPU pipeline ``Resize(size)`` [+ ``CenterCrop(crop)``] + ``ToTensor()``
    [+ ``Normalize(mean, std)``] on each image. ``size`` is ``(height, width)``, or an int (shorter
    side) together with ``crop`` so every image ends the same size. Images of equal decoded size are
    resized together (one kernel per size group). The resize runs in float and is not rounded to
    uint8 as PIL's is, so it differs from the PIL pipeline by at most ~1/255 plus the decoder
    difference (nvJPEG vs libjpeg: IDCT and chroma upsampling differ by a few levels on some pixels;
    on CPU torchvision's decoder is libjpeg, like PIL's).

    Returns ``(images, labels)``: images ``(B, 3, h, w)`` float on ``device``; labels unchanged.
    Give it to ``DeviceLoader(loader, batch_transform=decoder)``, or call it on a batch directly.
    """

    def __init__(self, size: int | Sequence[int], mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, crop: int | Sequence[int] | None = None,
                 device: torch.device | str | None = None, antialias: bool = True) -> None:
        self.resize = gpu.Resize(size, antialias=antialias, out_dtype=torch.float32)
        self.crop = None if crop is None else gpu.CenterCrop(crop)
        if self.crop is None and len(self.resize.size) != 2:
            raise ValueError(f"size={size!r} is a shorter side, so images would differ in size; give "
                             "size=(height, width) or a crop=... to make the batch one size")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.normalize = None if mean is None else gpu.Normalize(mean, std)
        self.device = resolve_device(device)

    def decode(self, data: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """Packed bytes -> ``(B, 3, h, w)`` float images on the device (normalised if configured)."""
        if data.is_cuda:
            raise ValueError("the packed JPEG bytes are already on the GPU; nvJPEG reads host memory. Give "
                             "the decoder as DeviceLoader(batch_transform=...) so it runs before the copy")
        images = decode_jpegs(unpack_jpegs(data, sizes), self.device)
        out: list[torch.Tensor | None] = [None] * len(images)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, img in enumerate(images):
            groups.setdefault(tuple(img.shape[-2:]), []).append(i)
        for index in groups.values():
            batch = self.resize(torch.stack([images[i] for i in index]))
            if self.crop is not None:
                batch = self.crop(batch)
            for j, i in enumerate(index):
                out[i] = batch[j]
        result = torch.stack(out).div_(255.0)
        return result if self.normalize is None else self.normalize(result)

    def __call__(self, batch: PackedJpegs | Sequence[Any]) -> tuple[torch.Tensor, Any]:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 3):
            raise TypeError(f"GpuJpegDecoder expects a PackedJpegs batch (data, sizes, labels) from "
                            f"packed_jpeg_collate, got {type(batch).__name__}")
        data, sizes, labels = batch
        return self.decode(data, sizes), labels

    def __repr__(self) -> str:
        return (f"GpuJpegDecoder({self.resize.extra_repr()}, crop={None if self.crop is None else self.crop.size}, "
                f"normalize={self.normalize is not None}, device={self.device})")


def gpu_jpeg_loader(dataset: Any, decoder: GpuJpegDecoder, *, prepare_in_thread: bool = True,
                    **loader_kwargs: Any) -> Any:
    """A ``DeviceLoader`` over the encoded files of ``dataset`` (an ``ImageFolder``), decoded by ``decoder``.

    ``loader_kwargs`` go to ``torch.utils.data.DataLoader`` (``batch_size``, ``num_workers``,
    ``shuffle``...); ``collate_fn`` is :func:`packed_jpeg_collate` and ``pin_memory`` defaults to
    whether the decoder's device is CUDA. ``prepare_in_thread`` (the default) decodes in a background
    thread (``DeviceLoader(prepare_in_thread=True)``): nvJPEG blocks its caller until a batch is
    decoded, so from the training loop that wait sits between two steps, while from the thread the
    step runs as the next batch decodes (faster beyond the noise in the committed classification
    benchmarks; ``False`` decodes in the loop).
    """

    if "collate_fn" in loader_kwargs:
        raise ValueError("gpu_jpeg_loader sets collate_fn=packed_jpeg_collate itself; do not pass one")
    loader_kwargs.setdefault("pin_memory", decoder.device.type == "cuda")
    encoded = dataset if isinstance(dataset, EncodedJpegDataset) else EncodedJpegDataset.from_image_folder(dataset)
    loader = torch.utils.data.DataLoader(encoded, collate_fn=packed_jpeg_collate, **loader_kwargs)
    return DeviceLoader(loader, device=decoder.device, batch_transform=decoder, prepare_in_thread=prepare_in_thread)

