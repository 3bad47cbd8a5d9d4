"""Advice for a dataset whose image decode one of its own settings removes from the workers.

The profiler sees how much of a worker's time per sample is spent outside the transforms (reading
and decoding the image). For most datasets the fix is code (decode at reduced size, or on the GPU);
an ultralytics dataset has a setting for it: ``cache="ram"`` decodes each image once and keeps it,
``cache="disk"`` keeps decoded ``.npy`` files next to the images. :func:`decode_advice` names the
setting and what it costs (memory estimated from the image headers, as ultralytics' own check does
from decoded images), or returns ``""`` when the dataset has no such setting or uses it already.
"""

from __future__ import annotations

import math
import random
from typing import Any

from pipeline_opt._core.log import get_logger

log = get_logger("profile.decode_advice")

_HEADERS = 20  # image headers read for the memory estimate
_SAFETY = 1.0  # ultralytics' check_cache_ram margin on top of its estimate: it wants twice the images free
_GB = 1 << 30


def is_uncached_ultralytics_dataset(dataset: Any) -> bool:
    """An ultralytics ``BaseDataset`` (recognised by its attributes) that decodes every image it loads."""
    needed = ("im_files", "ims", "buffer", "load_image", "imgsz", "cache")
    return all(hasattr(dataset, a) for a in needed) and not getattr(dataset, "cache", None) \
        and isinstance(dataset.imgsz, int) and len(dataset.im_files) > 0


def cached_image_bytes(dataset: Any, headers: int = _HEADERS, seed: int = 0) -> float | None:
    """Bytes ``cache="ram"`` would hold for the whole dataset: the mean decoded size of up to
    ``headers`` images (their long side resized to ``imgsz``, as ``load_image`` does) times their
    number. None when no header could be read."""
    from PIL import Image

    files = list(dataset.im_files)
    picked = random.Random(seed).sample(files, min(headers, len(files)))
    channels = int(getattr(dataset, "channels", 3) or 3)
    sizes = []
    for f in picked:
        try:
            with Image.open(f) as im:
                w0, h0 = im.size
        except (OSError, ValueError) as e:
            log.debug("no header from %s: %s", f, e)
            continue
        r = dataset.imgsz / max(h0, w0)
        w, h = (min(math.ceil(w0 * r), dataset.imgsz), min(math.ceil(h0 * r), dataset.imgsz)) if r != 1 else (w0, h0)
        sizes.append(w * h * channels)
    if not sizes:
        return None
    return sum(sizes) / len(sizes) * len(files)


def _find_dataset(obj: Any, depth: int = 4) -> Any:
    """The dataset under ``obj``: itself, or what its ``.loader`` / ``.dataset`` chain leads to
    (a DataLoader, a ``DeviceLoader``, the profiler's dataset proxy)."""
    for _ in range(depth):
        if obj is None or is_uncached_ultralytics_dataset(obj):
            return obj
        inner = vars(obj).get("loader") if hasattr(obj, "__dict__") else None
        obj = inner if inner is not None else getattr(obj, "dataset", None)
    return obj


def decode_advice(source: Any) -> str:
    """The sentence for the decode setting of ``source``'s dataset (``source``: a dataset, or a loader
    or proxy around one), or ``""`` (no such setting, or it is on already)."""
    dataset = _find_dataset(source)
    if dataset is None or not is_uncached_ultralytics_dataset(dataset):
        return ""
    import psutil

    need = cached_image_bytes(dataset)
    n, imgsz = len(dataset.im_files), dataset.imgsz
    head = "ultralytics reads and decodes every image it loads in the workers (cache off)"
    if need is None:
        return f"{head}: train(..., cache='ram') decodes each image once and keeps it in memory, " \
               "cache='disk' keeps decoded .npy files next to the images"
    available = psutil.virtual_memory().available
    size = f"about {need / _GB:.1f} GB for {n} images at imgsz={imgsz}"
    disk = f"cache='disk' keeps decoded .npy files next to the images ({size} of disk)"
    if need * (1 + _SAFETY) <= available:
        return (f"{head}: train(..., cache='ram') decodes each image once and keeps it in memory ({size}; "
                f"{available / _GB:.1f} GB available now), or {disk}")
    return (f"{head}: cache='ram' would need {size}, and ultralytics asks for {1 + _SAFETY:g}x that free, more "
            f"than the {available / _GB:.1f} GB available now; train(..., {disk})")
