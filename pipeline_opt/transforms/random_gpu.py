"""The device side of replayed augmentations: Kornia augmentations fed the workers' draws.

:class:`RandomGpuPipeline` takes a :class:`~pipeline_opt.transforms.replay.ReplayBatch` (encoded
JPEGs + per-sample parameter rows, from :class:`~pipeline_opt.transforms.replay.ReplayDataset`
workers) and produces what the original torchvision Compose would have produced for each image:

1. decode the batch with ``torchvision.io.decode_jpeg(..., device=...)`` — nvJPEG on CUDA, libjpeg
   on the CPU (the same decoder as Pillow there: that is how the CPU tests check it);
2. per sample, until every image has the same size: the geometric steps (crop + resize,
   RandomCrop's padding, Resize, CenterCrop) and anything before them;
3. on the stacked batch: a ``kornia.augmentation.AugmentationSequential`` of the remaining steps,
   each a Kornia augmentation (subclass of ``GeometricAugmentationBase2D`` /
   ``IntensityAugmentationBase2D``) given the replayed parameters through ``params=`` (a list of
   ``ParamItem``, see :meth:`RandomGpuPipeline.param_items`), plus plain modules for the
   deterministic conversions (ToTensor, Normalize);
4. optionally ``then``: the user's own Kornia ``AugmentationSequential`` (its own draws).

The Replay* augmentations and :func:`~pipeline_opt.transforms.replay_ops.replay_module` live in
:mod:`~pipeline_opt.transforms.replay_ops` (re-exported here); they also work alone, in any
``AugmentationSequential``.

Kornia is an optional dependency: importing this module without it raises an ``ImportError``
naming ``pip install 'pipeline-opt[gpu]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

try:
    from kornia.augmentation import AugmentationSequential
    from kornia.augmentation.container.params import ParamItem
except ImportError as e:  # pragma: no cover - exercised by the no-kornia test through a subprocess
    raise ImportError(
        "pipeline_opt.transforms.random_gpu needs Kornia (kornia>=0.9), which is not installed: "
        "pip install 'pipeline-opt[gpu]' (or pip install 'kornia>=0.9')") from e

from pipeline_opt._core.log import get_logger
from pipeline_opt.transforms import timm_ops  # noqa: F401  (registers timm's device modules)
from pipeline_opt.transforms.batch_mix import MIX_WIDTH, apply_batch_mix
from pipeline_opt.transforms.jpeg_batch import decode_jpegs, unpack_jpegs
from pipeline_opt.transforms.replay import (
    GEOMETRIC,
    ReplayBatch,
    ReplaySampler,
    ReplayStep,
    draws_patches,
    patch_shapes,
    recognise,
)
from pipeline_opt.transforms.replay_ops import (
    ReplayAugment,
    ReplayAutoAugment,
    ReplayCenterCrop,
    ReplayColorJitter,
    ReplayCrop,
    ReplayErasing,
    ReplayGrayscale,
    ReplayHorizontalFlip,
    ReplayResize,
    ReplayResizedCrop,
    ReplayVerticalFlip,
    replay_module,
)

__all__ = [
    "RandomGpuPipeline", "ReplayCenterCrop", "ReplayColorJitter", "ReplayCrop", "ReplayErasing", "ReplayGrayscale",
    "ReplayHorizontalFlip", "ReplayAutoAugment", "ReplayResize", "ReplayResizedCrop", "ReplayVerticalFlip",
    "replay_module",
]

log = get_logger("transforms.random_gpu")


class RandomGpuPipeline(torch.nn.Module):
    """Decode a :class:`ReplayBatch` on ``device`` and replay the original Compose on it.

    Returns ``(images, labels)``: images ``(B, C, h, w)`` on ``device`` — float32 if the Compose
    ends in a float tensor, uint8 if it ends in ``PILToTensor`` / ``ToImage`` — and the labels as
    collated. Give it to ``DeviceLoader(loader, batch_transform=pipeline)`` (decode reads host
    memory), or call it on a batch directly. ``then`` (e.g. a user's
    ``kornia.augmentation.AugmentationSequential``) runs on the float result, with its own draws.

    ``augment`` is the ``AugmentationSequential`` of the batch-wise steps; ``per_sample`` the steps
    run image by image before the batch has one size. :meth:`describe` lists what runs where.
    """

    def __init__(self, steps: Sequence[ReplayStep] | ReplaySampler, device: torch.device | str | None = None,
                 then: Callable[[torch.Tensor], torch.Tensor] | None = None, batch_mix: bool = False) -> None:
        super().__init__()
        steps = steps.steps if isinstance(steps, ReplaySampler) else tuple(steps)
        if not steps or not all(isinstance(s, ReplayStep) for s in steps):
            raise TypeError("steps must be the ReplayStep s of recognise(compose) or a ReplaySampler")
        if then is not None and not callable(then):
            raise TypeError(f"then={then!r} must be callable (e.g. a kornia AugmentationSequential) or None")
        self.steps = steps
        self.batch_mix = bool(batch_mix)  # a ReplayCollate appended a MixUp / CutMix draw to every row
        self.width = sum(s.width for s in steps) + (MIX_WIDTH if self.batch_mix else 0)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, which is not available; pass device='cpu'")
        last_geometric = max(i for i, s in enumerate(steps) if s.kind in GEOMETRIC)
        mods = [(s, replay_module(s)) for s in steps]
        self._per_sample = [(s, m) for s, m in mods[:last_geometric + 1] if m is not None]
        batch = [(s, m) for s, m in mods[last_geometric + 1:] if m is not None]
        self.per_sample = torch.nn.ModuleList([m for _, m in self._per_sample])
        self._batch_steps = tuple(s for s, _ in batch)
        # no box / mask keys here: skip Kornia's chained transformation matrix (pure overhead per batch)
        self.augment = (AugmentationSequential(*[m for _, m in batch], transformation_matrix_mode="skip")
                        if batch else None)
        self.then = then
        self.out_uint8 = not any(s.kind == "to_float" for s in steps)
        if self.batch_mix and self.out_uint8:
            raise ValueError("MixUp / CutMix mix float images; this pipeline ends in uint8 (no ToTensor / ToDtype), "
                             "so the original's mix would fail on it too")
        self._with_patches = [s for s in steps if draws_patches(s)]

    @classmethod
    def from_compose(cls, compose: Any, device: torch.device | str | None = None,
                     then: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     same_distribution: bool = False) -> RandomGpuPipeline:
        return cls(recognise(compose, same_distribution=same_distribution), device=device, then=then)

    def describe(self) -> list[str]:
        """One line per step: where it runs (per sample / batch) and as what."""
        lines = ["device: decode JPEG (nvJPEG on CUDA, libjpeg on CPU)"]
        tail = ["device, batch: MixUp / CutMix with the worker's draw (labels mixed in the worker)"] if self.batch_mix \
            else []
        lines += [f"device, per sample: {s.describe()} -> {type(m).__name__}" for s, m in self._per_sample]
        if self.augment is not None:
            lines += [f"device, batch: {s.describe()} -> {type(m).__name__}"
                      for s, m in zip(self._batch_steps, self.augment.children())]
        lines += tail
        if self.then is not None:
            lines.append(f"device, batch: then {type(self.then).__name__} (own draws)")
        return lines

    def _split_patches(self, params: torch.Tensor, patches: torch.Tensor,
                       patch_sizes: torch.Tensor) -> dict[int, list[list[torch.Tensor]]]:
        """Per step that ships drawn values (random erase): per sample, the list of its patches."""
        if not self._with_patches:
            return {}
        out = {id(s): [[] for _ in range(params.shape[0])] for s in self._with_patches}
        flat = patches.to(self.device, non_blocking=True) if patches.numel() else patches
        starts = torch.cumsum(patch_sizes, 0) - patch_sizes
        for b, start in enumerate(starts.tolist()):
            row = params[b].tolist()
            for s in self.steps:  # the sampler appended them in step order
                for shape in patch_shapes(s, row):
                    n = shape[0] * shape[1] * shape[2]
                    out[id(s)][b].append(flat[start:start + n].view(shape))
                    start += n
        return out

    def param_items(self, params: torch.Tensor, shape: Sequence[int],
                    patches: dict[int, list[list[torch.Tensor]]] | None = None) -> list[Any]:
        """The ``params=`` list for :attr:`augment` (Kornia ``ParamItem`` s, one per child)."""
        items = []
        for (name, module), step in zip(self.augment.named_children(), self._batch_steps):
            if isinstance(module, ReplayAugment):
                data = module.replay_params(params, (patches or {}).get(id(step)), shape=shape)
                items.append(ParamItem(name, data))
            else:
                items.append(ParamItem(name, None))
        return items

    def decode(self, data: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
        """Packed JPEG bytes -> list of uint8 ``(1, 3, H, W)`` images on the device."""
        if data.is_cuda:
            raise ValueError("the packed JPEG bytes are already on the GPU; the decoder reads host memory. Give the "
                             "pipeline as DeviceLoader(batch_transform=...) so it runs before the copy")
        return [img.unsqueeze(0) for img in decode_jpegs(unpack_jpegs(data, sizes), self.device)]

    def forward(self, batch: ReplayBatch | Sequence[Any]) -> tuple[torch.Tensor, Any]:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 6):
            raise TypeError(f"RandomGpuPipeline expects a ReplayBatch (data, sizes, params, patches, patch_sizes, "
                            f"labels) from replay_collate, got {type(batch).__name__}")
        data, sizes, params, patches, patch_sizes, labels = batch
        params = params.cpu()
        if params.shape[-1] != self.width:
            raise ValueError(f"the batch carries {params.shape[-1]} parameters per sample but this pipeline's steps "
                             f"use {self.width}: the dataset's sampler and the pipeline were built from different "
                             "Composes")
        split = self._split_patches(params, patches, patch_sizes)
        images = self.decode(data, sizes)
        out = []
        for b, x in enumerate(images):
            for step, module in self._per_sample:
                if not x.is_floating_point() and not isinstance(module, ReplayResizedCrop):
                    x = x.to(torch.float32)  # a leading resized crop converts only its crop
                if isinstance(module, ReplayAugment):
                    p = module.replay_params(params[b:b + 1], [split[id(step)][b]] if id(step) in split else None,
                                             shape=x.shape)
                    x = module.replay_single(x, p)
                else:
                    x = module(x)
            out.append(x.to(torch.float32))
        x = torch.cat(out)
        if self.augment is not None:
            x = self.augment(x, params=self.param_items(params, tuple(x.shape), split))
        if self.out_uint8:
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        if self.batch_mix:
            x = apply_batch_mix(x, params[0, -MIX_WIDTH:].tolist())
        if self.then is not None:
            x = self.then(x.float().div_(255.0) if self.out_uint8 else x)
        return x, labels

    def extra_repr(self) -> str:
        return f"device={self.device}, steps={[s.name for s in self.steps]}"
