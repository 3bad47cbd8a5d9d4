"""Batches of encoded JPEGs: packed into one tensor in a worker, decoded together on a device.

A worker's collate (:func:`packed_jpeg_collate`) packs a batch's encoded bytes into one uint8 tensor
plus sizes — one shared-memory handle per batch instead of one per image; :func:`unpack_jpegs` gives
the per-file views back and :func:`decode_jpegs` decodes them with ``torchvision.io.decode_jpeg(list,
device=...)`` (nvJPEG on CUDA, libjpeg on the CPU). The decoders that use them are
:class:`pipeline_opt.loading.decode.GpuJpegDecoder` and the replayed random augmentations
(:mod:`pipeline_opt.transforms.random_gpu`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

__all__ = ["PackedJpegs", "decode_jpegs", "packed_jpeg_collate", "unpack_jpegs"]


class PackedJpegs(NamedTuple):
    """A batch of encoded JPEGs: ``data`` holds all files back to back, ``sizes[i]`` bytes each."""

    data: torch.Tensor  # uint8 (sum(sizes),)
    sizes: torch.Tensor  # int64 (B,)
    labels: Any  # collated labels (int64 (B,) for class indices)


def packed_jpeg_collate(batch: Sequence[tuple[torch.Tensor, Any]]) -> PackedJpegs:
    """Pack ``[(bytes_tensor, label), ...]`` into one :class:`PackedJpegs` (a DataLoader ``collate_fn``).

    In a worker process the packed bytes are written straight into shared memory (as
    ``default_collate`` does for stacked tensors), so the batch crosses to the main process as one
    handle plus two small tensors.
    """
    if not batch:
        raise ValueError("packed_jpeg_collate got an empty batch")
    blobs = [b for b, _ in batch]
    for b in blobs:
        if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1:
            raise TypeError("packed_jpeg_collate expects (1-D uint8 tensor, label) samples, as "
                            f"EncodedJpegDataset yields; got {type(b).__name__}")
    sizes = torch.tensor([b.numel() for b in blobs], dtype=torch.int64)
    total = int(sizes.sum())
    out = None
    if torch.utils.data.get_worker_info() is not None:
        storage = blobs[0]._typed_storage()._new_shared(total, device="cpu")
        out = blobs[0].new(storage).resize_(total)
    data = torch.cat(blobs, out=out)
    labels = torch.utils.data.default_collate([y for _, y in batch])
    return PackedJpegs(data, sizes, labels)


def unpack_jpegs(data: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """The per-file views of a packed batch (no copy)."""
    if data.dim() != 1 or data.dtype != torch.uint8:
        raise TypeError(f"data must be a 1-D uint8 tensor, got {data.dtype} of shape {tuple(data.shape)}")
    counts = [int(s) for s in sizes.tolist()]
    if sum(counts) != data.numel():
        raise ValueError(f"sizes add up to {sum(counts)} bytes but data holds {data.numel()}")
    return list(torch.split(data, counts))


def decode_jpegs(blobs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode encoded JPEGs (1-D uint8 tensors in host memory) to RGB uint8 ``(3, H, W)`` on ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision >= 0.29 deprecates its image IO in favour of TorchCodec
        warnings.filterwarnings("ignore", message="The image decoding and encoding", category=DeprecationWarning)
        out = decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device)
    return list(out) if isinstance(out, (list, tuple)) else [out]
