"""Split a torchvision Compose into a CPU part (ends in uint8 CHW) and a GPU part (runs per batch).

:func:`split_transforms` walks a torchvision v1 or v2 ``Compose`` and moves the longest tail that can
be reproduced exactly on a collated batch to :mod:`pipeline_opt.transforms.gpu` modules:

* ``ToTensor``, v1 ``ConvertImageDtype`` -> :class:`~.gpu.ToFloat`; ``v2.ToDtype`` ->
  :class:`~.gpu.ConvertDtype` (each bit-identical to its original);
* ``Normalize`` -> :class:`~.gpu.Normalize` (bit-identical);
* bilinear ``Resize`` -> :class:`~.gpu.Resize` (bit-identical on tensors, within 1/255 of PIL);
* ``CenterCrop`` -> :class:`~.gpu.CenterCrop` (bit-identical);
* ``PILToTensor`` / ``v2.ToImage`` / ``v2.ToPureTensor`` become the CPU part's final conversion.

Collation needs equal-sized images, so the tail may only start where every image already has the
same size: after a fixed-size op (``Resize((h, w))``, ``CenterCrop``, ``RandomResizedCrop``,
``RandomCrop``) or anywhere when ``assume_equal_sizes=True`` (all inputs have one size). A
``Resize(int)`` on inputs of different sizes therefore stays on the CPU. A tail without resize /
crop may start anywhere: the original outputs are collated (default collate), so they are equal
in size, and so are the images at the start of a tail that does not change sizes. Random and unknown
transforms are never moved and never dropped; nothing after them moves either (no reordering).
If no tail can start from a uint8 image (e.g. the pipeline is float before its last unknown op),
nothing moves and the reason is recorded.

Random transforms move with :func:`split_random_transforms` instead: the CPU part keeps only their
parameter sampling (:class:`~pipeline_opt.transforms.replay.ReplaySampler`, run on the JPEG
header, same draws as the original) and the GPU part decodes and replays everything
(:class:`~pipeline_opt.transforms.random_gpu.RandomGpuPipeline`, Kornia augmentations).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torchvision.transforms import InterpolationMode

from pipeline_opt._logging import get_logger
from pipeline_opt.transforms import gpu

__all__ = ["GpuPipeline", "ToUint8CHW", "offload_dataset_transform", "split_random_transforms", "split_transforms"]

log = get_logger("transforms.split")

# Ops whose output has the same size as their input, whatever their parameters.
_SIZE_PRESERVING = frozenset({
    "ToTensor", "PILToTensor", "ToImage", "ToPureTensor", "ToPILImage", "ConvertImageDtype", "ToDtype", "Normalize",
    "ColorJitter", "RandomHorizontalFlip", "RandomVerticalFlip", "Grayscale", "RandomGrayscale", "GaussianBlur",
    "RandomInvert", "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "RandomAutocontrast",
    "RandomEqualize", "RandomErasing", "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix",
    "RandomAffine", "RandomPerspective", "RandomPhotometricDistort", "RandomChannelPermutation", "ElasticTransform",
    "GaussianNoise", "ToUint8CHW",
})
# Ops whose output size is fixed by their parameters (so every output has the same size).
_FIXED_SIZE = frozenset({"CenterCrop", "RandomResizedCrop", "RandomCrop"})

_TO_U8 = tuple(c for c in (T1.PILToTensor, getattr(T2, "PILToTensor", None), getattr(T2, "ToImage", None),
                           getattr(T2, "ToPureTensor", None)) if c is not None)
_TO_TENSOR = tuple(c for c in (T1.ToTensor, getattr(T2, "ToTensor", None)) if c is not None)
_CONVERT_V1 = (T1.ConvertImageDtype,)
_CONVERT_V2 = tuple(c for c in (getattr(T2, "ConvertImageDtype", None),) if c is not None)
_CONVERT = _CONVERT_V1 + _CONVERT_V2
_RESIZE = (T1.Resize, T2.Resize)
_CROP = (T1.CenterCrop, T2.CenterCrop)
_NORMALIZE = (T1.Normalize, T2.Normalize)


class ToUint8CHW:
    """The CPU part's last step: a PIL image, HWC/HW uint8 array or uint8 tensor -> uint8 CHW tensor.

    A plain ``torch.Tensor`` comes out (not a ``tv_tensors.Image``), so ``default_collate`` stacks it
    into one uint8 batch. Floating-point input is refused: the GPU part expects 0..255 uint8.
    """

    def __call__(self, img: Any) -> torch.Tensor:
        if isinstance(img, torch.Tensor):
            if img.dtype != torch.uint8:
                raise TypeError(f"ToUint8CHW got a {img.dtype} tensor; the CPU part must end in uint8 "
                                "(split_transforms assumed the transforms before it keep a PIL / uint8 image)")
            out = img.as_subclass(torch.Tensor)
            return out.unsqueeze(0) if out.dim() == 2 else out
        if isinstance(img, np.ndarray):
            if img.dtype != np.uint8:
                raise TypeError(f"ToUint8CHW got a {img.dtype} array; expected uint8 HWC or HW")
            arr = img[:, :, None] if img.ndim == 2 else img
            return torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1).contiguous()
        from PIL import Image

        if isinstance(img, Image.Image):
            return T1.functional.pil_to_tensor(img)
        raise TypeError(f"ToUint8CHW expects a PIL image, a uint8 numpy array or a uint8 tensor, "
                        f"got {type(img).__name__}")

    def __repr__(self) -> str:
        return "ToUint8CHW()"


class GpuPipeline(torch.nn.Sequential):
    """The GPU part of a split: an ``nn.Sequential`` of :mod:`~pipeline_opt.transforms.gpu` modules.

    Call it on a collated uint8 batch ``(B, C, H, W)`` on any device. ``moved`` names the original
    transforms it reproduces, ``kept`` those left on the CPU, ``reason`` says why the split stopped
    where it did; :meth:`describe` lists it all as text. Empty (identity) when nothing moved.
    """

    def __init__(self, modules: list[torch.nn.Module] = (), moved: tuple[str, ...] = (),
                 kept: tuple[str, ...] = (), reason: str = "") -> None:
        super().__init__(*modules)
        self.moved = tuple(moved)
        self.kept = tuple(kept)
        self.reason = reason

    def describe(self) -> list[str]:
        """One line per transform: where it runs and as what."""
        lines = [f"cpu: {name}" for name in self.kept]
        lines += [f"gpu: {name} -> {mod!r}" for name, mod in zip(self.moved, self)]
        if self.reason:
            lines.append(f"note: {self.reason}")
        return lines


@dataclass(frozen=True)
class _State:
    domain: str  # "pil", "uint8", "float" (what the image is before an op)
    equal: bool  # all images of the dataset have the same size here


def _name(t: Any) -> str:
    return type(t).__name__


def _interp_ok(t: Any) -> bool:
    mode = t.interpolation
    try:
        return InterpolationMode(mode) == InterpolationMode.BILINEAR
    except ValueError:
        return mode in (2, InterpolationMode.BILINEAR)  # PIL's integer code for BILINEAR


def _resize_size(t: Any) -> int | tuple[int, int] | None:
    size = t.size
    if size is None or isinstance(size, numbers.Integral):
        return size
    size = list(size)
    return size[0] if len(size) == 1 else (int(size[0]), int(size[1]))


def _gpu_module(t: Any, state: _State) -> torch.nn.Module | None | str:
    """The GPU module reproducing ``t`` applied at ``state``; ``"boundary"`` for uint8 conversions;
    ``None`` when ``t`` cannot be moved."""
    if isinstance(t, _TO_U8):
        return "boundary" if state.domain in ("pil", "uint8") else None
    if isinstance(t, _TO_TENSOR):
        return gpu.ToFloat() if state.domain == "pil" else None
    if isinstance(t, _CONVERT_V1) and not isinstance(t, _CONVERT_V2):  # v1 divides by 255, like ToFloat
        if state.domain == "pil":
            return None
        uint8_to_float = state.domain == "uint8" and t.dtype.is_floating_point
        return gpu.ToFloat(t.dtype) if uint8_to_float else gpu.ConvertDtype(t.dtype, scale=True)
    if isinstance(t, _CONVERT_V2):
        return gpu.ConvertDtype(t.dtype, scale=True) if state.domain != "pil" else None
    if isinstance(t, T2.ToDtype):  # v2 multiplies by 1/255: ConvertDtype calls the same kernel
        if not isinstance(t.dtype, torch.dtype) or state.domain == "pil":
            return None
        return gpu.ConvertDtype(t.dtype, scale=bool(t.scale))
    if isinstance(t, _NORMALIZE):
        return gpu.Normalize(t.mean, t.std) if state.domain == "float" else None
    if isinstance(t, _RESIZE):
        if not _interp_ok(t):
            return None
        # PIL resizes always antialias; tensors follow the flag (None means False, as in torchvision).
        antialias = True if state.domain == "pil" else t.antialias is not None and bool(t.antialias)
        return gpu.Resize(_resize_size(t), antialias=antialias, max_size=t.max_size)
    if isinstance(t, _CROP):
        return gpu.CenterCrop(tuple(t.size))
    return None


def _after(t: Any, state: _State) -> _State:
    """The state after ``t`` runs on the CPU (conservative for unknown ops)."""
    name = _name(t)
    domain = state.domain
    if isinstance(t, _TO_U8):
        domain = "uint8"
    elif isinstance(t, _TO_TENSOR):
        domain = "float"
    elif isinstance(t, _CONVERT) or (isinstance(t, T2.ToDtype) and isinstance(t.dtype, torch.dtype)):
        domain = "float" if t.dtype.is_floating_point else "uint8"
    elif name == "ToPILImage":
        domain = "pil"
    if isinstance(t, _RESIZE):
        equal = state.equal or (t.size is not None and not isinstance(t.size, numbers.Integral) and len(t.size) == 2)
    elif name in _FIXED_SIZE:
        equal = True
    elif name == "RandomRotation":
        equal = state.equal and not getattr(t, "expand", True)
    elif name in _SIZE_PRESERVING:
        equal = state.equal
    else:
        equal = False
    return _State(domain, equal)


def split_transforms(compose: Any, assume_equal_sizes: bool = False) -> tuple[Any, GpuPipeline]:
    """Split ``compose`` into ``(cpu_part, gpu_part)``.

    ``cpu_part`` is a Compose of the same torchvision API (v1 or v2) holding the transforms that stay,
    followed by :class:`ToUint8CHW`; each sample comes out as a uint8 ``(C, H, W)`` tensor.
    ``gpu_part`` (a :class:`GpuPipeline`) reproduces the moved tail on the collated batch, so
    ``gpu_part(default_collate([cpu_part(img) ...]))`` equals the original outputs stacked — exactly
    for dtype / normalize / crop / tensor resize, within 1/255 (pixel units) where a PIL resize is
    replaced. Inputs must be PIL images (as torchvision datasets yield).

    ``assume_equal_sizes=True`` declares that all input images have the same size, which lets size
    changing ops at the head (``Resize(256)``, ``CenterCrop``) move as well.
    """
    if isinstance(compose, T2.Compose):
        api = T2
    elif isinstance(compose, T1.Compose):
        api = T1
    else:
        raise TypeError(f"split_transforms needs a torchvision Compose (transforms.Compose or "
                        f"transforms.v2.Compose), got {type(compose).__name__}; wrap the transforms in one")
    ops = list(compose.transforms)
    states = [_State("pil", bool(assume_equal_sizes))]
    for t in ops:
        states.append(_after(t, states[-1]))
    modules = [_gpu_module(t, s) for t, s in zip(ops, states)]

    start = len(ops)  # the moved tail is ops[start:]; shrink start while the tail stays movable
    while start > 0 and modules[start - 1] is not None:
        start -= 1
    reason = "" if start == 0 else f"{_name(ops[start - 1])} cannot run on a batch; it and everything before stay"
    # A tail without geometry leaves sizes as they are: the original outputs are collated into one
    # tensor, so the sizes at its start are equal whatever ran before (unknown ops included).
    same_size_tail = [all(not isinstance(t, (*_RESIZE, *_CROP)) for t in ops[k:]) for k in range(len(ops) + 1)]
    while start <= len(ops) and (states[start].domain not in ("pil", "uint8")
                                 or not (states[start].equal or same_size_tail[start])):
        why = ("images may differ in size there (pass assume_equal_sizes=True if they do not)"
               if states[start].domain in ("pil", "uint8") else "the image is not uint8 there")
        where = f"op {start} ({_name(ops[start])})" if start < len(ops) else "the end"
        reason = f"the GPU part cannot start at {where}: {why}"
        start += 1
    if start > len(ops):
        log.info("split_transforms: nothing moved (%s)", reason)
        return compose, GpuPipeline(kept=tuple(_name(t) for t in ops), reason=reason + "; nothing moved")

    while start < len(ops) and modules[start] == "boundary":  # leading conversions are the CPU part's job
        start += 1
    kept_ops = ops[:start]
    tail = [(t, m) for t, m in zip(ops[start:], modules[start:])]
    gpu_mods = [m for _, m in tail if isinstance(m, torch.nn.Module)]
    moved = tuple(_name(t) for t, m in tail if isinstance(m, torch.nn.Module))
    cpu_part = api.Compose([*kept_ops, ToUint8CHW()])
    gpu_part = GpuPipeline(gpu_mods, moved=moved, kept=tuple(_name(t) for t in kept_ops) + ("ToUint8CHW",),
                           reason=reason)
    log.info("split_transforms: moved %s to the GPU, kept %s", list(moved), list(gpu_part.kept))
    return cpu_part, gpu_part


def split_random_transforms(compose: Any, then: Callable[[torch.Tensor], torch.Tensor] | None = None,
                            device: torch.device | str | None = None,
                            same_distribution: bool = False) -> tuple[Any, Any]:
    """Split a training ``compose`` (random crops, flips, colour jitter, erasing...) into
    ``(sampler, gpu_part)``: parameters on the CPU, pixels on the device, the same draws.

    ``sampler`` (a :class:`~pipeline_opt.transforms.replay.ReplaySampler`) is the whole CPU part:
    ``sampler.sample(height, width)`` draws one image's parameters exactly as the Compose would
    (same torch RNG calls, same order), from the size alone; use it through
    :class:`~pipeline_opt.transforms.replay.ReplayDataset` (reads the size from the JPEG header)
    and :func:`~pipeline_opt.transforms.replay.replay_collate`. ``gpu_part`` (a
    :class:`~pipeline_opt.transforms.random_gpu.RandomGpuPipeline`) decodes the collated batch on
    ``device`` and replays every transform there; ``then`` — e.g. the user's own
    ``kornia.augmentation.AugmentationSequential`` — runs after it on the float batch with its own
    draws. ``same_distribution=True`` also moves AutoAugment / RandAugment / TrivialAugmentWide,
    drawn on the device: same distribution, not same draws (``sampler.same_draws`` is then False).

    Raises :class:`~pipeline_opt.transforms.replay.UnsupportedTransform` (a ``ValueError``) naming
    the transform that cannot be replayed, and ``ImportError`` (``pip install 'pipeline-opt[gpu]'``)
    when Kornia is missing. Deterministic pipelines keep using :func:`split_transforms`.
    """
    from pipeline_opt.transforms.random_gpu import RandomGpuPipeline
    from pipeline_opt.transforms.replay import ReplaySampler

    sampler = ReplaySampler.from_compose(compose, same_distribution=same_distribution)
    gpu_part = RandomGpuPipeline(sampler, device=device, then=then)
    log.info("split_random_transforms: replaying %s on %s", [s.name for s in sampler.steps], gpu_part.device)
    return sampler, gpu_part


def _find_transform_owner(dataset: Any) -> list[Any]:
    """The chain ``[dataset, dataset.dataset, ...]`` down to the object holding a ``.transform``."""
    chain = [dataset]
    while getattr(chain[-1], "transform", None) is None:
        inner = getattr(chain[-1], "dataset", None)
        if inner is None or len(chain) > 8:
            raise TypeError(f"{type(dataset).__name__} has no .transform (nor a wrapped .dataset with one); "
                            "offload_dataset_transform needs a torchvision-style dataset such as ImageFolder")
        chain.append(inner)
    return chain


def offload_dataset_transform(dataset: Any, assume_equal_sizes: bool = False,
                              split: Callable[..., tuple[Any, GpuPipeline]] = split_transforms
                              ) -> tuple[Any, GpuPipeline]:
    """``(dataset_copy, gpu_part)``: a shallow copy whose ``.transform`` is the CPU part of the split.

    ``dataset`` itself is left untouched. Wrappers with a ``.dataset`` attribute (``Subset``...) are
    copied down to the dataset that holds the transform. A ``.transforms`` that is torchvision's
    ``StandardTransform`` is rebuilt too. ``gpu_part.moved`` is empty when nothing could move (the
    copy then runs the original transform).
    """
    chain = _find_transform_owner(dataset)
    cpu_part, gpu_part = split(chain[-1].transform, assume_equal_sizes=assume_equal_sizes)
    copies = [copy.copy(d) for d in chain]
    for outer, inner in zip(copies, copies[1:]):
        outer.dataset = inner
    owner = copies[-1]
    owner.transform = cpu_part
    standard = getattr(owner, "transforms", None)
    try:
        from torchvision.datasets.vision import StandardTransform
    except ImportError:  # pragma: no cover - torchvision always has it
        StandardTransform = None  # noqa: N806
    if StandardTransform is not None and isinstance(standard, StandardTransform):
        owner.transforms = StandardTransform(cpu_part, standard.target_transform)
    return copies[0], gpu_part
