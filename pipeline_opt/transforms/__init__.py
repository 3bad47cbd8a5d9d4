"""Changing data: GPU batch transforms, Compose splitting, the device loader, cheaper JPEG decoding.

* :mod:`~pipeline_opt.transforms.gpu` — ToFloat, ConvertDtype, Normalize, Resize, CenterCrop on batches.
* :mod:`~pipeline_opt.transforms.split` — ``split_transforms(compose) -> (cpu_part, gpu_part)``.
* :mod:`~pipeline_opt.transforms.device_loader` — ``DeviceLoader``: copy, transform, prefetch on a side stream.
* :mod:`~pipeline_opt.transforms.decode` — draft (reduced-DCT) CPU decode and batched nvJPEG decode.
* :mod:`~pipeline_opt.transforms.replay` — random augmentations replayed: parameters drawn in the
  workers from the JPEG header (same draws as the Compose), pixels made on the device;
  ``split_random_transforms(compose) -> (sampler, gpu_part)``.
* :mod:`~pipeline_opt.transforms.random_gpu` — the device side: nvJPEG decode + Kornia augmentations
  fed the replayed parameters (needs Kornia: ``pip install 'pipeline-opt[gpu]'``; loaded on first use).
* :mod:`~pipeline_opt.transforms.random_plan` — ``plan_random_gpu_pipeline(loader)`` for the tuner.
"""

from pipeline_opt.transforms.decode import (
    DraftError,
    DraftLoader,
    EncodedJpegDataset,
    GpuJpegDecoder,
    PackedJpegs,
    draft_dataset,
    draft_loader,
    gpu_jpeg_loader,
    measure_draft_error,
    open_draft,
    packed_jpeg_collate,
)
from pipeline_opt.transforms.device_loader import DeviceLoader, apply_to_images
from pipeline_opt.transforms.gpu import CenterCrop, ConvertDtype, Normalize, Resize, ToFloat
from pipeline_opt.transforms.random_plan import RandomGpuPlan, plan_random_gpu_pipeline
from pipeline_opt.transforms.replay import (
    ReplayBatch,
    ReplayDataset,
    ReplayParams,
    ReplaySampler,
    UnsupportedTransform,
    replay_collate,
)
from pipeline_opt.transforms.replay_parity import ReplayParity, measure_replay_error
from pipeline_opt.transforms.split import (
    GpuPipeline,
    ToUint8CHW,
    offload_dataset_transform,
    split_random_transforms,
    split_transforms,
)

# Box-aware augmentations (augment.py / detection.py) are imported below.

__all__ = [
    "CenterCrop", "ConvertDtype", "DeviceLoader", "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder",
    "GpuPipeline", "Normalize", "PackedJpegs", "Resize", "ToFloat", "ToUint8CHW", "apply_to_images", "draft_dataset",
    "draft_loader", "gpu_jpeg_loader", "measure_draft_error", "offload_dataset_transform", "open_draft",
    "packed_jpeg_collate", "split_transforms",
    # random augmentations replayed on the device
    "RandomGpuPlan", "ReplayBatch", "ReplayDataset", "ReplayParams", "ReplayParity",
    "ReplaySampler", "UnsupportedTransform", "measure_replay_error", "plan_random_gpu_pipeline", "replay_collate",
    "split_random_transforms",
]

_KORNIA_NAMES = frozenset({"RandomGpuPipeline"})  # not in __all__: a star import must work without Kornia


def __getattr__(name: str):
    """Names that need Kornia load on first use, so ``import pipeline_opt`` works without it."""
    if name in _KORNIA_NAMES:
        from pipeline_opt.transforms import random_gpu

        return getattr(random_gpu, name)
    raise AttributeError(f"module 'pipeline_opt.transforms' has no attribute {name!r}")
