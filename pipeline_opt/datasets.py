"""Synthetic datasets of real JPEG files, for the demo, the tests and the benchmarks.

* :func:`make_image_folder` — an ``ImageFolder`` layout (``root/class_k/img_i.jpg``) of photo-like
  JPEGs (smooth gradients, shapes, texture and mild sensor noise: they compress like photos).
* :func:`make_yolo_dataset` — a YOLO-format detection set (``images/{train,val}``,
  ``labels/{train,val}`` and a ``data.yaml`` with absolute paths) with boxes that match the drawn
  objects.

Both are deterministic for a seed, generated in parallel processes and cached by their parameters:
a second call with the same arguments returns the existing folder without touching it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.progress import progress_bar

log = get_logger("datasets")

_DONE = ".complete.json"


def default_cache_dir() -> Path:
    """``$PIPELINE_OPT_CACHE`` or ``~/.cache/pipeline_opt``."""
    env = os.environ.get("PIPELINE_OPT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pipeline_opt"


def _validate(n_images: int, size: tuple[int, int], quality: int) -> None:
    if not isinstance(n_images, int) or n_images < 1:
        raise ValueError(f"n_images={n_images!r} must be a positive integer")
    if len(size) != 2 or min(size) < 8:
        raise ValueError(f"size={size!r} must be (width, height) with both >= 8")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality={quality!r} must be in 1..100")


def _photo_like(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A deterministic image with the statistics of a photo: gradients, shapes, texture, noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, ph = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0, 6.28)
        freq = rng.uniform(0.5, 3.0) * 6.28 / max(width, height)
        base[..., c] = 128 + 70 * np.sin(freq * (a * xx + b * yy) + ph) + rng.uniform(-40, 40)
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        w, h = rng.uniform(0.05, 0.4) * width, rng.uniform(0.05, 0.4) * height
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        shape = (x0, y0, x0 + w, y0 + h)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(shape, fill=color)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.8, 2.0))))
    arr = np.asarray(img, dtype=np.float32)
    arr += rng.normal(0.0, 6.0, arr.shape).astype(np.float32)  # sensor-like noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _cached(kind: str, params: dict, root: Path | None) -> tuple[Path, bool]:
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    folder = (Path(root) if root is not None else default_cache_dir() / "datasets") / f"{kind}-{key}"
    done = folder / _DONE
    if done.exists():
        try:
            if json.loads(done.read_text()) == params:
                return folder, True
        except (OSError, json.JSONDecodeError):
            pass
    if folder.exists():
        shutil.rmtree(folder)
    return folder, False


def _run_parallel(fn: Callable, jobs: list[tuple], workers: int | None, progress: bool, what: str) -> None:

    workers = workers or max(1, min(len(os.sched_getaffinity(0)), 8))
    chunks = [jobs[i::workers] for i in range(workers)] if workers > 1 else [jobs]
    bar = progress_bar(total=len(jobs), desc=what, enabled=progress)
    if workers == 1:
        for job in jobs:
            fn(*job)
            bar.update(1)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for n in pool.map(_run_chunk, [fn] * len(chunks), chunks):
                bar.update(n)
    bar.close()


def _run_chunk(fn: Callable, jobs: Iterable[tuple]) -> int:
    n = 0
    for job in jobs:
        fn(*job)
        n += 1
    return n


def _write_classification_image(path: str, seed: int, width: int, height: int, quality: int) -> None:
    rng = np.random.default_rng(seed)
    _photo_like(rng, width, height).save(path, "JPEG", quality=quality)


def make_image_folder(
    n_images: int = 512,
    size: tuple[int, int] = (1280, 960),
    num_classes: int = 10,
    seed: int = 0,
    root: str | Path | None = None,
    quality: int = 90,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """Create (or reuse) an ImageFolder of ``n_images`` JPEGs of ``size`` = (width, height).

    Returns the folder; ``torchvision.datasets.ImageFolder(path)`` reads it.
    """
    size = (int(size[0]), int(size[1]))
    _validate(n_images, size, quality)
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} must be >= 1")
    params = {"n": n_images, "size": list(size), "classes": num_classes, "seed": seed, "q": quality, "v": 1}
    folder, hit = _cached("imagefolder", params, None if root is None else Path(root))
    if hit:
        log.debug("reusing image folder %s", folder)
        return folder
    for c in range(num_classes):
        (folder / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    jobs = [
        (str(folder / f"class_{i % num_classes:03d}" / f"img_{i:06d}.jpg"), seed * 1_000_003 + i, *size, quality)
        for i in range(n_images)
    ]
    log.info("generating %d JPEGs of %dx%d in %s", n_images, size[0], size[1], folder)
    _run_parallel(_write_classification_image, jobs, workers, progress, "images")
    (folder / _DONE).write_text(json.dumps(params))
    return folder


def _write_detection_sample(img_path: str, label_path: str, seed: int, width: int, height: int,
                            quality: int, num_classes: int) -> None:
    rng = np.random.default_rng(seed)
    img = _photo_like(rng, width, height)
    draw = ImageDraw.Draw(img)
    lines = []
    for _ in range(int(rng.integers(1, 8))):
        w = float(rng.uniform(0.05, 0.35)) * width
        h = float(rng.uniform(0.05, 0.35)) * height
        x0 = float(rng.uniform(0, width - w))
        y0 = float(rng.uniform(0, height - h))
        cls = int(rng.integers(0, num_classes))
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if cls % 2 else draw.rectangle)((x0, y0, x0 + w, y0 + h), fill=color, outline=(0, 0, 0))
        lines.append(f"{cls} {(x0 + w / 2) / width:.6f} {(y0 + h / 2) / height:.6f} {w / width:.6f} {h / height:.6f}")
    img.save(img_path, "JPEG", quality=quality)
    Path(label_path).write_text("\n".join(lines) + "\n")


def make_yolo_dataset(
    n_train: int = 128,
    n_val: int = 16,
    size: tuple[int, int] = (640, 480),
    num_classes: int = 4,
    seed: int = 0,
    root: str | Path | None = None,
    quality: int = 90,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """Create (or reuse) a YOLO-format detection set; returns the path of its ``data.yaml``."""
    size = (int(size[0]), int(size[1]))
    _validate(n_train, size, quality)
    if n_val < 1:
        raise ValueError(f"n_val={n_val!r} must be >= 1")
    params = {"train": n_train, "val": n_val, "size": list(size), "classes": num_classes, "seed": seed,
              "q": quality, "v": 1}
    folder, hit = _cached("yolo", params, None if root is None else Path(root))
    if hit:
        return folder / "data.yaml"
    jobs = []
    for split, count, offset in (("train", n_train, 0), ("val", n_val, 10_000_000)):
        (folder / "images" / split).mkdir(parents=True, exist_ok=True)
        (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            jobs.append((str(folder / "images" / split / f"{split}_{i:06d}.jpg"),
                         str(folder / "labels" / split / f"{split}_{i:06d}.txt"),
                         seed * 1_000_003 + offset + i, *size, quality, num_classes))
    log.info("generating a YOLO detection set (%d train, %d val) in %s", n_train, n_val, folder)
    _run_parallel(_write_detection_sample, jobs, workers, progress, "detection images")
    names = "\n".join(f"  {k}: class{k}" for k in range(num_classes))
    (folder / "data.yaml").write_text(
        f"path: {folder.resolve()}\ntrain: images/train\nval: images/val\nnames:\n{names}\n"
    )
    (folder / _DONE).write_text(json.dumps(params))
    return folder / "data.yaml"
