"""Changing data: GPU batch transforms, Compose splitting, the device loader, cheaper JPEG decoding.

* :mod:`~pipeline_opt.transforms.gpu` — ToFloat, ConvertDtype, Normalize, Resize, CenterCrop on batches.
* :mod:`~pipeline_opt.transforms.split` — ``split_transforms(compose) -> (cpu_part, gpu_part)``.
* :mod:`~pipeline_opt.transforms.device_loader` — ``DeviceLoader``: copy, transform, prefetch on a side stream.
* :mod:`~pipeline_opt.transforms.decode` — draft (reduced-DCT) CPU decode and batched nvJPEG decode.
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
from pipeline_opt.transforms.split import GpuPipeline, ToUint8CHW, offload_dataset_transform, split_transforms

# Box-aware augmentations (augment.py / detection.py) are imported below.

__all__ = [
    "CenterCrop", "ConvertDtype", "DeviceLoader", "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder",
    "GpuPipeline", "Normalize", "PackedJpegs", "Resize", "ToFloat", "ToUint8CHW", "apply_to_images", "draft_dataset",
    "draft_loader", "gpu_jpeg_loader", "measure_draft_error", "offload_dataset_transform", "open_draft",
    "packed_jpeg_collate", "split_transforms",
]
