"""Random augmentations replayed: parameters drawn on the CPU, pixels made on the device.

A torchvision training pipeline such as ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``,
``ColorJitter(...)``, ``ToTensor()``, ``Normalize(...)``, ``RandomErasing()`` spends its CPU time on
pixels (decode, resample, colour), not on its random draws. Here the worker keeps the draws and
drops the pixels:

1. :func:`recognise` turns the Compose into :class:`ReplayStep` s — one per transform, with the
   arithmetic the CPU pipeline uses at that point (*flavour*: PIL image, uint8 tensor or float
   tensor) — or says which transform cannot be replayed.
2. :class:`ReplaySampler` calls each original transform's own parameter sampling (v1
   ``get_params`` / v2 ``make_params``, ``torch.rand(1) < p`` for the probabilistic ones) in the
   order and with the RNG calls its ``forward`` makes, on an image of the size read from the JPEG
   header: with the same seed it draws the same crop boxes, flip bits, colour factors and order,
   erase boxes and values as the original pipeline, and leaves the torch RNG in the same state.
3. :class:`ReplayDataset` yields ``(encoded bytes, ReplayParams, label)`` per file;
   :func:`replay_collate` packs a batch into one :class:`ReplayBatch` (bytes, sizes, one float64
   parameter row per sample, the drawn erase patches, labels).

The device side (decode with nvJPEG, crop + resize per sample, the rest per batch as Kornia
augmentations fed these parameters) is :class:`pipeline_opt.transforms.random_gpu.RandomGpuPipeline`.
Nothing here imports Kornia.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

from pipeline_opt._core.log import get_logger
from pipeline_opt.transforms import gpu, registry
from pipeline_opt.transforms.jpeg_batch import packed_jpeg_collate
from pipeline_opt.transforms.jpeg_header import read_jpeg_header
from pipeline_opt.transforms.policy_draws import draw_augmix, draw_policy
from pipeline_opt.transforms.timm_draws import draw_timm_erase, draw_timm_policy
from pipeline_opt.transforms.transform_info import ReplaySpec, UnsupportedTransform

__all__ = [
    "ReplayBatch", "ReplayDataset", "ReplayParams", "ReplaySampler", "ReplayStep",
    "UnsupportedTransform", "draws_patches", "patch_shapes", "recognise", "replay_collate", "sample_step",
    "size_after", "step_of",
]

log = get_logger("transforms.replay")

# Row width (float64 slots per sample) of each kind that draws parameters.
# (a policy's width is in its options: two per operation slot)
_WIDTH = {"resized_crop": 4, "crop": 10, "hflip": 1, "vflip": 1, "color_jitter": 8, "random_grayscale": 1,
          "erase": 5}
# Kinds that change the image size (so the batch can only be stacked after the last of them).
GEOMETRIC = frozenset({"resized_crop", "crop", "center_crop", "resize"})
@dataclass(frozen=True, eq=False)
class ReplayStep:
    """One transform of the original pipeline, as the replay sees it.

    ``kind`` says what it does (``resized_crop``, ``crop``, ``center_crop``, ``resize``, ``hflip``,
    ``vflip``, ``color_jitter``, ``grayscale``, ``random_grayscale``, ``to_uint8``, ``to_float``,
    ``normalize``, ``erase``, ``auto_augment``); ``flavour`` the arithmetic of the image it runs on in the
    CPU pipeline (``pil``, ``uint8``, ``float``); ``offset`` / ``width`` its slots in the per-sample
    parameter row; ``transform`` the original object (its sampling functions are called);
    ``options`` the static settings the device side needs (sizes, probabilities, fill values...).
    """

    kind: str
    name: str
    api: str  # "v1" or "v2" (torchvision), or another framework's name ("timm")
    flavour: str
    transform: Any
    offset: int = 0
    width: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.name} ({self.api}, {self.kind} on {self.flavour})"


class ReplayParams(NamedTuple):
    """One sample's drawn parameters: the float64 row and the random erase patches (C, h, w), if any."""

    row: torch.Tensor
    patches: tuple[torch.Tensor, ...]


class ReplayBatch(NamedTuple):
    """A collated batch: encoded JPEGs back to back, their byte sizes, the parameter rows ``(B, P)``,
    the erase patches flattened back to back with each sample's element count, the labels."""

    data: torch.Tensor
    sizes: torch.Tensor
    params: torch.Tensor
    patches: torch.Tensor
    patch_sizes: torch.Tensor
    labels: Any


# ------------------------------------------------------------------------------------ recognition

def _api(t: Any) -> str:
    """``v1`` / ``v2`` for torchvision's classes, the framework for another's (timm's v1-style ones)."""
    if isinstance(t, T2.Transform):
        return "v2"
    info = registry.info_of(t)
    return info.origin if info is not None and info.origin not in ("torchvision", "pipeline_opt") else "v1"


def _v1_padding(padding: Any) -> tuple[int, int, int, int]:
    """v1 ``padding`` -> (left, top, right, bottom), as ``F.pad`` reads it."""
    if padding is None:
        return 0, 0, 0, 0
    if isinstance(padding, numbers.Integral):
        p = int(padding)
        return p, p, p, p
    padding = [int(p) for p in padding]
    if len(padding) == 1:
        return (padding[0],) * 4
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    if len(padding) == 4:
        return padding[0], padding[1], padding[2], padding[3]
    raise UnsupportedTransform(f"RandomCrop(padding={padding!r}) must be an int or 1, 2 or 4 values")


def _replayed_names() -> str:
    names = sorted({i.name if i.origin == "torchvision" else f"{i.origin}'s {i.name}" for i in registry.registered()
                    if i.replay is not None and i.origin != "pipeline_opt"})
    return ", ".join(names)


def _spec(t: Any, flavour: str) -> ReplaySpec:
    """``t``'s :class:`ReplaySpec` on an image of ``flavour``, from its registry entry; raises
    :class:`UnsupportedTransform` naming what is not replayed."""
    info = registry.info_of(t)
    if info is None or info.replay is None:
        raise UnsupportedTransform(f"{type(t).__name__} is not replayed on the GPU (replayed: {_replayed_names()}; "
                                   "exact classes, not subclasses)")
    return info.replay(t, flavour)


def _warn_same_distribution(same_distribution: bool) -> None:
    if same_distribution:
        warnings.warn("same_distribution=True is no longer needed: AutoAugment, RandAugment and TrivialAugmentWide "
                      "are replayed with the same draws; the argument changes nothing", DeprecationWarning,
                      stacklevel=3)


def _is_fixed_size(spec: ReplaySpec) -> bool:
    size = spec.options.get("size")
    return spec.kind in ("resized_crop", "crop", "center_crop") or (
        spec.kind == "resize" and size is not None and not isinstance(size, numbers.Integral) and len(size) == 2)


def recognise(compose: Any, same_distribution: bool = False) -> tuple[ReplayStep, ...]:
    """The :class:`ReplayStep` s of a torchvision (v1 or v2) ``Compose`` applied to PIL images.

    Raises :class:`UnsupportedTransform` naming the first transform that cannot be replayed, or
    when the pipeline does not end in one image size (the batch could not be stacked) or does not
    end as a float tensor or uint8 tensor. The random policies (``AutoAugment``, ``RandAugment``,
    ``TrivialAugmentWide``) are replayed with the same draws like every other step;
    ``same_distribution`` is accepted for compatibility and changes nothing.
    """
    _warn_same_distribution(same_distribution)
    if not isinstance(compose, (T1.Compose, T2.Compose)):
        raise UnsupportedTransform(f"a torchvision Compose (transforms.Compose or transforms.v2.Compose) is needed, "
                                   f"got {type(compose).__name__}; wrap the transforms in one")
    steps: list[ReplayStep] = []
    flavour, offset, fixed = "pil", 0, False
    for t in compose.transforms:
        spec = _spec(t, flavour)
        width = spec.options.get("width", _WIDTH.get(spec.kind, 0))
        steps.append(ReplayStep(kind=spec.kind, name=type(t).__name__, api=_api(t), flavour=flavour, transform=t,
                                offset=offset, width=width, options=spec.options))
        offset += width
        flavour = spec.domain_after
        fixed = fixed or _is_fixed_size(spec)
    if not steps:
        raise UnsupportedTransform("the Compose is empty: nothing to replay")
    if not fixed:
        raise UnsupportedTransform("no transform gives every image one size (RandomResizedCrop, RandomCrop, "
                                   "CenterCrop or Resize((h, w))): the decoded images could not be stacked")
    if flavour == "pil":
        raise UnsupportedTransform("the pipeline ends with a PIL image; end it with ToTensor / PILToTensor / ToImage")
    return tuple(steps)


# ---------------------------------------------------------------------------------------- sampling

def _make_params(t: Any, flat_inputs: list[Any]) -> dict[str, Any]:
    """A v2 transform's parameter sampling: ``make_params`` (torchvision >= 0.21), ``_get_params`` before."""
    fn = getattr(t, "make_params", None)
    return (fn if fn is not None else t._get_params)(flat_inputs)


def _shape_only(channels: int, height: int, width: int) -> torch.Tensor:
    """A tensor of shape (C, H, W) with no storage: the sampling functions read only its size."""
    return torch.empty((), dtype=torch.uint8).expand(channels, height, width)


class ReplaySampler:
    """Draw one sample's parameters the way the original Compose draws them.

    ``sample(height, width)`` walks the steps and, for each random transform, makes exactly the
    torch RNG calls its ``forward`` makes, through its own sampling function where it has one
    (v1 ``get_params`` with the same arguments, v2 ``make_params`` on a shape-only image), and
    ``torch.rand(1)`` against ``p`` for the probabilistic ones. Sizes flow through the
    deterministic steps as torchvision computes them, so every draw sees the image size its
    transform would see. Picklable (module-level, holds the original transforms).
    """

    def __init__(self, steps: Sequence[ReplayStep]) -> None:
        self.steps = tuple(steps)
        self.width = sum(s.width for s in self.steps)
        self.same_draws = True  # every step makes its original's draws (kept for callers that check it)

    @classmethod
    def from_compose(cls, compose: Any, same_distribution: bool = False) -> ReplaySampler:
        return cls(recognise(compose, same_distribution=same_distribution))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` of the pipeline's output for an input of that size."""
        h, w = height, width
        for step in self.steps:
            h, w = size_after(step, h, w)
        return h, w

    def sample(self, height: int, width: int) -> ReplayParams:
        """The parameters for one image of ``height x width`` (from its JPEG header)."""
        row = np.zeros(self.width, dtype=np.float64)
        patches: list[torch.Tensor] = []
        c, h, w = 3, int(height), int(width)
        for step in self.steps:
            if step.width:
                row[step.offset:step.offset + step.width] = sample_step(step, c, h, w, patches)
            h, w = size_after(step, h, w)
        return ReplayParams(torch.from_numpy(row), tuple(patches))

    def __repr__(self) -> str:
        return f"ReplaySampler([{', '.join(s.describe() for s in self.steps)}])"


def size_after(step: ReplayStep, h: int, w: int) -> tuple[int, int]:
    """The image size after ``step`` on an ``h x w`` image (torchvision's rules)."""
    o = step.options
    if step.kind in ("resized_crop", "center_crop", "crop"):
        return o["size"]
    if step.kind == "resize":
        return gpu.resized_size(h, w, o["size"], o["max_size"])
    return h, w


def sample_step(step: ReplayStep, c: int, h: int, w: int, patches: list[torch.Tensor]) -> list[float]:
    """One step's parameter row for a ``c x h x w`` image, drawn as its transform's forward draws;
    random erase patches are appended to ``patches``. Empty for steps that draw nothing."""
    sampler = _SAMPLERS.get(step.kind)
    return [] if sampler is None else sampler(step, c, h, w, patches)


def step_of(transform: Any, flavour: str = "float") -> ReplayStep:
    """A single :class:`ReplayStep` (row offset 0) for ``transform`` applied to a ``flavour`` image."""
    if flavour not in ("pil", "uint8", "float"):
        raise ValueError(f"flavour={flavour!r} must be 'pil', 'uint8' or 'float'")
    spec = _spec(transform, flavour)
    return ReplayStep(kind=spec.kind, name=type(transform).__name__, api=_api(transform), flavour=flavour,
                      transform=transform, width=spec.options.get("width", _WIDTH.get(spec.kind, 0)),
                      options=spec.options)


def _sample_resized_crop(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    t = step.transform
    if step.api != "v2":  # v1, and timm's RandomResizedCropAndInterpolation (the same get_params arguments)
        top, left, bh, bw = t.get_params(_shape_only(c, h, w), t.scale, t.ratio)
    else:
        p = _make_params(t, [_shape_only(c, h, w)])
        top, left, bh, bw = p["top"], p["left"], p["height"], p["width"]
    return [top, left, bh, bw]


def _sample_crop(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    t = step.transform
    th, tw = step.options["size"]
    if step.api == "v2":
        p = _make_params(t, [_shape_only(c, h, w)])
        left, top, right, bottom = p["padding"] if p["needs_pad"] else (0, 0, 0, 0)
        return [left, top, right, bottom, 0, 0, 0, 0, p["top"], p["left"]]
    # v1 forward: pad with ``padding``, then pad_if_needed (width, then height), then get_params
    first = _v1_padding(t.padding)
    ph, pw = h + first[1] + first[3], w + first[0] + first[2]
    second = [0, 0, 0, 0]
    if t.pad_if_needed and pw < tw:
        second[0] = second[2] = tw - pw
        pw += 2 * (tw - pw)
    if t.pad_if_needed and ph < th:
        second[1] = second[3] = th - ph
        ph += 2 * (th - ph)
    top, left, _, _ = t.get_params(_shape_only(c, ph, pw), (th, tw))
    return [*first, *second, top, left]


def _sample_flip(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    return [float(bool(torch.rand(1) < step.transform.p))]


def _sample_color_jitter(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    t = step.transform
    if step.api == "v1":
        order, b, ct, s, hue = t.get_params(t.brightness, t.contrast, t.saturation, t.hue)
    else:
        p = _make_params(t, [_shape_only(c, h, w)])
        order, b, ct, s, hue = (p["fn_idx"], p["brightness_factor"], p["contrast_factor"],
                                p["saturation_factor"], p["hue_factor"])
    factors = [math.nan if v is None else float(v) for v in (b, ct, s, hue)]
    return [float(i) for i in order.tolist()] + factors


def _sample_random_grayscale(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    return [float(bool(torch.rand(1) < step.transform.p))]


def _sample_erase(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    t = step.transform
    if step.api == "v1":
        if not torch.rand(1) < t.p:
            return [0.0, 0, 0, 0, 0]
        value = step.options["value"]
        top, left, eh, ew, v = t.get_params(_shape_only(c, h, w), scale=t.scale, ratio=t.ratio,
                                            value=None if value is None else list(value))
        if (eh, ew) == (h, w):  # no box found in 10 tries: torchvision writes the image onto itself
            return [0.0, 0, 0, 0, 0]
    else:
        if torch.rand(1) >= t.p:
            return [0.0, 0, 0, 0, 0]
        p = _make_params(t, [_shape_only(c, h, w)])
        if p["v"] is None:
            return [0.0, 0, 0, 0, 0]
        top, left, eh, ew, v = p["i"], p["j"], p["h"], p["w"], p["v"]
    if step.options["value"] is None:
        patches.append(v)
    return [1.0, top, left, eh, ew]


def _sample_auto_augment(step: ReplayStep, c: int, h: int, w: int, patches: list) -> list[float]:
    return draw_policy(step.transform, h, w)


_SAMPLERS: dict[str, Callable[..., list[float]]] = {
    "resized_crop": _sample_resized_crop, "crop": _sample_crop, "hflip": _sample_flip, "vflip": _sample_flip,
    "color_jitter": _sample_color_jitter, "random_grayscale": _sample_random_grayscale, "erase": _sample_erase,
    "auto_augment": _sample_auto_augment,
    "augmix": lambda step, c, h, w, patches: draw_augmix(step.transform, h, w),
    "timm_augment": lambda step, c, h, w, patches: draw_timm_policy(step.transform, h, w),
    "timm_erase": lambda step, c, h, w, patches: draw_timm_erase(step.transform, c, h, w, patches),
}


def patch_shapes(step: ReplayStep, row: Sequence[float]) -> list[tuple[int, int, int]]:
    """The ``(C, h, w)`` of each erase patch ``step`` drew for one sample (``row``: that sample's whole
    parameter row), in the order the sampler appended them; empty for steps that draw no pixel values."""
    o, r = step.options, row[step.offset:step.offset + step.width]
    if step.kind == "erase" and o["value"] is None and float(r[0]) > 0.5:
        return [(3, int(r[3]), int(r[4]))]
    if step.kind == "timm_erase" and o["mode"] != "const":
        boxes = [r[1 + 4 * i:5 + 4 * i] for i in range(int(r[0]))]
        return [(3, int(h), int(w)) if o["mode"] == "pixel" else (3, 1, 1) for _, _, h, w in boxes]
    return []


def draws_patches(step: ReplayStep) -> bool:
    """Whether ``step`` ships drawn pixel values (random erase patches) besides its row."""
    return (step.kind == "erase" and step.options["value"] is None) or (
        step.kind == "timm_erase" and step.options["mode"] != "const")


# ---------------------------------------------------------------------------------- dataset, collate

class ReplayDataset(torch.utils.data.Dataset):
    """``(encoded bytes as a 1-D uint8 tensor, ReplayParams, label)`` per JPEG file.

    Workers read the file, take the image size from its header and draw the augmentation parameters
    with ``sampler`` — no decoding. ``samples`` holds ``(path, label)`` pairs
    (``ImageFolder.samples``); ``target_transform`` is applied to the label as ImageFolder does.
    """

    def __init__(self, samples: Sequence[tuple[str | os.PathLike, Any]], sampler: ReplaySampler,
                 target_transform: Callable[[Any], Any] | None = None) -> None:
        samples = list(samples)
        if not samples:
            raise ValueError("samples is empty; give (path, label) pairs, e.g. ImageFolder(root).samples")
        if not (isinstance(samples[0], (tuple, list)) and len(samples[0]) == 2):
            raise ValueError(f"samples must hold (path, label) pairs, got {samples[0]!r}")
        if not isinstance(sampler, ReplaySampler):
            raise TypeError(f"sampler must be a ReplaySampler, got {type(sampler).__name__}; build one with "
                            "ReplaySampler.from_compose(dataset.transform)")
        self.samples = [(str(p), y) for p, y in samples]
        self.targets = [y for _, y in self.samples]
        self.sampler = sampler
        self.target_transform = target_transform

    @classmethod
    def from_image_folder(cls, dataset: Any, same_distribution: bool = False) -> ReplayDataset:
        """From an ``ImageFolder``-like dataset: its ``samples``, ``transform`` and ``target_transform``."""
        samples = getattr(dataset, "samples", None)
        if not samples:
            raise TypeError(f"{type(dataset).__name__} has no .samples list of (path, label); "
                            "ReplayDataset needs an ImageFolder-like dataset of JPEG files")
        sampler = ReplaySampler.from_compose(getattr(dataset, "transform", None), same_distribution=same_distribution)
        return cls(samples, sampler, getattr(dataset, "target_transform", None))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ReplayParams, Any]:
        path, label = self.samples[index]
        data = np.fromfile(path, dtype=np.uint8)
        try:
            header = read_jpeg_header(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        params = self.sampler.sample(header.height, header.width)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return torch.from_numpy(data), params, label


def replay_collate(batch: Sequence[tuple[torch.Tensor, ReplayParams, Any]]) -> ReplayBatch:
    """Pack ``[(bytes, ReplayParams, label), ...]`` into one :class:`ReplayBatch` (a ``collate_fn``).

    The bytes go into one (shared-memory, in a worker) tensor as :func:`packed_jpeg_collate` does;
    the parameter rows are stacked into a ``(B, P)`` float64 tensor; the random erase patches are
    flattened back to back.
    """
    if not batch:
        raise ValueError("replay_collate got an empty batch")
    for item in batch[:1]:
        if not (isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[1], ReplayParams)):
            raise TypeError("replay_collate expects (bytes tensor, ReplayParams, label) samples as ReplayDataset "
                            f"yields; got {type(item).__name__} of length {len(item) if hasattr(item, '__len__') else '?'}")
    packed = packed_jpeg_collate([(b, y) for b, _, y in batch])
    params = torch.stack([p.row for _, p, _ in batch])
    flat = [patch.reshape(-1).to(torch.float32) for _, p, _ in batch for patch in p.patches]
    patch_sizes = torch.tensor([sum(patch.numel() for patch in p.patches) for _, p, _ in batch], dtype=torch.int64)
    patches = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float32)
    return ReplayBatch(packed.data, packed.sizes, params, patches, patch_sizes, packed.labels)
