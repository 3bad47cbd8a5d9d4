"""Moving data: the device loader, decoding, staging and shared slots.

* :mod:`~pipeline_opt.loading.device_loader` — ``DeviceLoader``: copy, transform, prefetch on a side stream;
  ``DeviceLoader.through_slots`` is the one way to build a loader that delivers through shared slots.
* :mod:`~pipeline_opt.loading.decode` — draft (reduced-DCT) CPU decode and batched nvJPEG decode of
  packed encoded batches.
* :mod:`~pipeline_opt._core.staging` — small non-blocking host-to-device uploads through reused
  page-locked buffers.
* :mod:`~pipeline_opt.loading.shared_slots` — workers write batches into reused, page-locked
  shared-memory slots; the names of :mod:`~pipeline_opt.loading.slot_layout` (a slot's header and
  payload), :mod:`~pipeline_opt.loading.slot_receiver` (the training process's side),
  :mod:`~pipeline_opt.loading.slot_pool` (the shared state) and :mod:`~pipeline_opt.loading.slot_collate`
  (the workers' side, ``slot_loader``) in one place.
* :mod:`~pipeline_opt.loading.dataloader` — the one adapter to torch's DataLoader: clone with new
  settings, walk wrappers, stop workers (a framework's own loader kind registered there).
* :mod:`~pipeline_opt.loading.batch_formats` — a framework's collate function whose image stack shared
  slots place themselves.
* :mod:`~pipeline_opt.loading.random_plan` — ``plan_random_gpu_pipeline(loader)``: a random training
  pipeline as JPEG bytes + drawn parameters in the workers, decode + replay on the device.
* :mod:`~pipeline_opt.loading.prepare_thread` — ``DeviceLoader(prepare_in_thread=True)``: batches
  taken and prepared (a blocking nvJPEG decode) in a background thread, overlapping the step.
"""

from pipeline_opt.loading.decode import (
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
from pipeline_opt.loading.device_loader import DeviceLoader, apply_to_images
from pipeline_opt.loading.random_plan import RandomGpuPlan, plan_random_gpu_pipeline

__all__ = [
    "DeviceLoader", "DraftError", "DraftLoader", "EncodedJpegDataset", "GpuJpegDecoder", "PackedJpegs",
    "apply_to_images", "draft_dataset", "draft_loader", "gpu_jpeg_loader", "measure_draft_error", "open_draft",
    "RandomGpuPlan", "packed_jpeg_collate", "plan_random_gpu_pipeline",
]
