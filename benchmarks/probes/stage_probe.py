"""Per-sample ms of each YOLO dataset stage, channel-last vs -first: benchmarks/results/20261205-e71b302-worker-stages-h100.

One process, no DataLoader; the folder's README.md holds the numbers.

    python benchmarks/probes/stage_probe.py 1000          # channel-last delivery (the default since e71b302)
    CHW=1 python benchmarks/probes/stage_probe.py 1000    # Format's channel-first RGB copy left in the worker
"""

from __future__ import annotations

import collections
import os
import sys
import time

import cv2

from pipeline_opt.datasets import make_yolo_dataset
from pipeline_opt.integrations import _yolo_augment
from pipeline_opt.integrations.ultralytics import build_yolo_pipeline

cv2.setNumThreads(0)
if os.environ.get("CHW"):
    _yolo_augment.DEVICE_LAYOUT = False
LABEL = "chw" if os.environ.get("CHW") else "hwc"
times: dict[str, float] = collections.defaultdict(float)


def timed(fn, name):
    def call(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times[name] += time.perf_counter() - start
        return out
    return call


def main(n: int) -> None:
    data = make_yolo_dataset(n_train=256, n_val=8, size=(640, 480), seed=0)
    pipe = build_yolo_pipeline(data, batch=64, workers=0, device="cpu", gpu_augment="force", gpu_affine="force")
    ds = pipe.dataset
    ds.load_image = timed(ds.load_image, "load_image")
    top = ds.transforms.transforms
    inner = top[0].transforms  # Mosaic, CopyPaste, RandomPerspective
    for i, t in enumerate(list(inner)):
        inner[i] = timed(t, "  inner:" + type(t).__name__)
    for i, t in enumerate(list(top)):
        top[i] = timed(t, "T:" + type(t).__name__)
    for i in range(20):
        ds[i]
    times.clear()
    for i in range(n):
        start = time.perf_counter()
        ds[i % len(ds)]
        times["getitem"] += time.perf_counter() - start
    for name, total in sorted(times.items(), key=lambda kv: -kv[1]):
        print(LABEL, f"{name:40s} {1000 * total / n:7.2f} ms/sample")
    pipe.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
