"""Changing data: the transform registry, GPU batch transforms, Compose splitting, replayed random augmentations.

* :mod:`~pipeline_opt.transforms.gpu` — ToFloat, ConvertDtype, Normalize, Resize, CenterCrop on batches.
* :mod:`~pipeline_opt.transforms.split` — ``split_transforms(compose) -> (cpu_part, gpu_part)``.
* :mod:`~pipeline_opt.transforms.registry` — what the library knows about each transform class.
* :mod:`~pipeline_opt.transforms.jpeg_batch` — encoded JPEG batches packed in a worker, decoded on a device.
* The device loader and the decoders live in :mod:`pipeline_opt.loading` (their old names here warn).
* :mod:`~pipeline_opt.transforms.replay` — random augmentations replayed: parameters drawn in the
  workers from the JPEG header (same draws as the Compose), pixels made on the device;
  ``split_random_transforms(compose) -> (sampler, gpu_part)``.
* :mod:`~pipeline_opt.transforms.random_gpu` — the device side: nvJPEG decode + Kornia augmentations
  fed the replayed parameters (needs Kornia: ``pip install 'pipeline-opt[gpu]'``; loaded on first use);
  the Replay* augmentations themselves live in :mod:`~pipeline_opt.transforms.replay_ops`.
* :mod:`~pipeline_opt.transforms.augment` — box-aware batch augmentations (ultralytics' flips, HSV,
  affine / perspective), re-exported from :mod:`~pipeline_opt.transforms.flip`,
  :mod:`~pipeline_opt.transforms.hsv` and :mod:`~pipeline_opt.transforms.affine`.
* ``plan_random_gpu_pipeline(loader)`` (the tuner's plan for that path) lives in
  :mod:`pipeline_opt.loading.random_plan`.
"""

import sys
import warnings

from pipeline_opt.transforms import timm_recipe  # noqa: F401  (registers timm's classes by path; no timm import)
from pipeline_opt.transforms.gpu import CenterCrop, ConvertDtype, Normalize, Resize, ToFloat
from pipeline_opt.transforms.jpeg_batch import PackedJpegs, packed_jpeg_collate
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
    "CenterCrop", "ConvertDtype", "GpuPipeline", "Normalize", "PackedJpegs", "Resize", "ToFloat", "ToUint8CHW",
    "offload_dataset_transform", "packed_jpeg_collate", "split_transforms",
    # random augmentations replayed on the device
    "ReplayBatch", "ReplayDataset", "ReplayParams", "ReplayParity", "ReplaySampler", "UnsupportedTransform",
    "measure_replay_error", "replay_collate", "split_random_transforms",
]

# Loaded on first use (they need Kornia): not in __all__, so a star import works without it. The package's
# own modules reach them here too (``pipeline_opt.transforms.RandomGpuPipeline``): this is where Kornia loads.
_KORNIA_NAMES = frozenset({"RandomGpuPipeline", "replay_module"})

# Names this package exported before their home became pipeline_opt.loading: still readable here, with
# a DeprecationWarning, taken from the loaded pipeline_opt.loading (import pipeline_opt loads it; this
# package does not import the layer above it).
_MOVED_TO_LOADING = frozenset({
    "DeviceLoader", "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder", "RandomGpuPlan",
    "apply_to_images", "draft_dataset", "draft_loader", "gpu_jpeg_loader", "measure_draft_error", "open_draft",
    "plan_random_gpu_pipeline",
})


def __getattr__(name: str):
    """The Kornia side on first use (so ``import pipeline_opt`` works without Kornia), and the names that
    moved to :mod:`pipeline_opt.loading` (deprecated here)."""
    if name in _KORNIA_NAMES:
        from pipeline_opt.transforms import random_gpu

        return getattr(random_gpu, name)
    if name in _MOVED_TO_LOADING:
        loading = sys.modules.get("pipeline_opt.loading")
        if loading is not None:
            warnings.warn(f"pipeline_opt.transforms.{name} moved to pipeline_opt.loading.{name}; import it from "
                          "there", DeprecationWarning, stacklevel=2)
            return getattr(loading, name)
    raise AttributeError(f"module 'pipeline_opt.transforms' has no attribute {name!r}")
