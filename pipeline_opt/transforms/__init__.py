"""Changing data: GPU batch transforms, Compose splitting, the device loader, cheaper JPEG decoding.

* :mod:`~pipeline_opt.transforms.gpu` — ToFloat, ConvertDtype, Normalize, Resize, CenterCrop on batches.
* :mod:`~pipeline_opt.transforms.split` — ``split_transforms(compose) -> (cpu_part, gpu_part)``.
* The device loader and the decoders live in :mod:`pipeline_opt.loading`; their names stay importable
  from here (``DeviceLoader``, ``GpuJpegDecoder``, ``gpu_jpeg_loader``, ...), loaded on first use.
* :mod:`~pipeline_opt.transforms.replay` — random augmentations replayed: parameters drawn in the
  workers from the JPEG header (same draws as the Compose), pixels made on the device;
  ``split_random_transforms(compose) -> (sampler, gpu_part)``.
* :mod:`~pipeline_opt.transforms.random_gpu` — the device side: nvJPEG decode + Kornia augmentations
  fed the replayed parameters (needs Kornia: ``pip install 'pipeline-opt[gpu]'``; loaded on first use).
* ``plan_random_gpu_pipeline(loader)`` (the tuner's plan for that path) lives in
  :mod:`pipeline_opt.loading.random_plan`; importable from here too.
"""

from pipeline_opt.loading.random_plan import RandomGpuPlan, plan_random_gpu_pipeline
from pipeline_opt.transforms.gpu import CenterCrop, ConvertDtype, Normalize, Resize, ToFloat
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


_LOADING = frozenset({"RandomGpuPlan", "plan_random_gpu_pipeline", "DeviceLoader", "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder",
                      "PackedJpegs", "apply_to_images", "draft_dataset", "draft_loader", "gpu_jpeg_loader",
                      "measure_draft_error", "open_draft", "packed_jpeg_collate"})


def __getattr__(name: str):
    """Names loaded on first use: those that need Kornia (so ``import pipeline_opt`` works without it),
    and the device loader and decoders this package has always exported, from :mod:`pipeline_opt.loading`."""
    if name in _KORNIA_NAMES:
        from pipeline_opt.transforms import random_gpu

        return getattr(random_gpu, name)
    if name in _LOADING:
        import pipeline_opt.loading as loading

        return getattr(loading, name)
    raise AttributeError(f"module 'pipeline_opt.transforms' has no attribute {name!r}")
