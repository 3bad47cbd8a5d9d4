"""Split a torchvision Compose into a CPU part (ends in uint8 CHW) and a GPU part (runs per batch).

:func:`split_transforms` walks a torchvision v1 or v2 ``Compose`` and moves the longest tail that can
be reproduced on a collated batch to :mod:`pipeline_opt.transforms.gpu` modules, as each class's entry
in :mod:`~pipeline_opt.transforms.registry` says (its exact class: a subclass stays on the CPU):

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torchvision.datasets.vision import StandardTransform

import pipeline_opt.transforms as transforms_package
from pipeline_opt._core.log import get_logger
from pipeline_opt.transforms import registry
from pipeline_opt.transforms.cpu_ops import ToUint8CHW
from pipeline_opt.transforms.replay import ReplaySampler

__all__ = ["GpuPipeline", "ToUint8CHW", "offload_dataset_transform", "replace_transform", "split_random_transforms",
           "split_transforms"]

log = get_logger("transforms.split")


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

    @property
    def exactness(self) -> str:
        """``bitwise`` when every module gives the CPU op's bits, ``tolerance`` when one is within a bound."""
        classes = [registry.info_of(m) for m in self]
        return "tolerance" if any(i is None or i.exactness != "bitwise" for i in classes) else "bitwise"

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


def _gpu_module(t: Any, state: _State, exact: bool) -> torch.nn.Module | None | str:
    """The GPU module reproducing ``t`` applied at ``state`` (:data:`registry.BOUNDARY` for uint8
    conversions); ``None`` when ``t`` cannot be moved (or, with ``exact``, not bit for bit)."""
    info = registry.info_of(t)
    if info is None or info.to_device is None:
        return None
    if exact and info.exactness != "bitwise":
        return None
    return info.to_device(t, state.domain)


def _after(t: Any, state: _State) -> _State:
    """The state after ``t`` runs on the CPU (unknown ops: the domain kept, sizes no longer equal)."""
    return _State(registry.domain_after(t, state.domain), registry.equal_sizes_after(t, state.equal))


def _is_geometric(t: Any) -> bool:
    info = registry.info_of(t)
    return info is not None and info.op in ("resize", "center_crop")


def split_transforms(compose: Any, assume_equal_sizes: bool = False, exact: bool = False) -> tuple[Any, GpuPipeline]:
    """Split ``compose`` into ``(cpu_part, gpu_part)``.

    ``cpu_part`` is a Compose of the same torchvision API (v1 or v2) holding the transforms that stay,
    followed by :class:`ToUint8CHW`; each sample comes out as a uint8 ``(C, H, W)`` tensor.
    ``gpu_part`` (a :class:`GpuPipeline`) reproduces the moved tail on the collated batch, so
    ``gpu_part(default_collate([cpu_part(img) ...]))`` equals the original outputs stacked — exactly
    for dtype / normalize / crop / tensor resize, within 1/255 (pixel units) where a PIL resize is
    replaced. Inputs must be PIL images (as torchvision datasets yield).

    ``assume_equal_sizes=True`` declares that all input images have the same size, which lets size
    changing ops at the head (``Resize(256)``, ``CenterCrop``) move as well. ``exact=True`` moves only
    what the device reproduces bit for bit (a Resize, within 1/255 of PIL there, and everything before
    it stay on the CPU); ``gpu_part.exactness`` says which the split gives.
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
    modules = [_gpu_module(t, s, exact) for t, s in zip(ops, states)]

    start = len(ops)  # the moved tail is ops[start:]; shrink start while the tail stays movable
    while start > 0 and modules[start - 1] is not None:
        start -= 1
    reason = "" if start == 0 else f"{_name(ops[start - 1])} cannot run on a batch; it and everything before stay"
    # A tail without geometry leaves sizes as they are: the original outputs are collated into one
    # tensor, so the sizes at its start are equal whatever ran before (unknown ops included).
    same_size_tail = [not any(_is_geometric(t) for t in ops[k:]) for k in range(len(ops) + 1)]
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

    while start < len(ops) and modules[start] == registry.BOUNDARY:  # leading conversions are the CPU part's job
        start += 1
    kept_ops = ops[:start]
    tail = [(t, m) for t, m in zip(ops[start:], modules[start:])]
    gpu_mods = [m for _, m in tail if isinstance(m, torch.nn.Module)]
    moved = tuple(_name(t) for t, m in tail if isinstance(m, torch.nn.Module))
    cpu_part = api.Compose([*kept_ops, ToUint8CHW()])
    gpu_part = GpuPipeline(gpu_mods, moved=moved, kept=tuple(_name(t) for t in kept_ops) + (ToUint8CHW.__name__,),
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
    draws; AutoAugment / RandAugment / TrivialAugmentWide are replayed the same way
    (``same_distribution`` is accepted for compatibility and changes nothing).

    Raises :class:`~pipeline_opt.transforms.replay.UnsupportedTransform` (a ``ValueError``) naming
    the transform that cannot be replayed, and ``ImportError`` (``pip install 'pipeline-opt[gpu]'``)
    when Kornia is missing. Deterministic pipelines keep using :func:`split_transforms`.
    """
    sampler = ReplaySampler.from_compose(compose, same_distribution=same_distribution)
    gpu_part = transforms_package.RandomGpuPipeline(sampler, device=device, then=then)  # Kornia loads here
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


def replace_transform(dataset: Any, transform: Any) -> None:
    """Set ``dataset.transform`` (a copy of the user's dataset) to ``transform``; a ``.transforms`` that is
    torchvision's ``StandardTransform`` (a VisionDataset keeps both) is rebuilt around it."""
    dataset.transform = transform
    standard = getattr(dataset, "transforms", None)
    if isinstance(standard, StandardTransform):
        dataset.transforms = StandardTransform(transform, standard.target_transform)


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
    replace_transform(copies[-1], cpu_part)
    return copies[0], gpu_part
