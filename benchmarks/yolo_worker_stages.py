"""Per-sample time of an ultralytics training dataset's stages in one process (no GPU).

The trainer-free YOLO pipeline (``gpu_augment="force", gpu_affine="force"``, batch 64, 640 px, synthetic
640x480 JPEGs: ``--images``, 2048 by default as in ``bench_yolo_trainer``) is built in a child process
per run (``--runs`` runs), and ``dataset[i]`` plus each stage is timed over ``--samples`` samples after
a warm-up.

    python -m benchmarks.yolo_worker_stages --out DIR [--samples 1000] [--runs 3] [--loader-batches 30 --workers 2]

With ``--loader-batches N`` each run also iterates the same pipeline's DataLoader with ``--workers``
worker processes (batch 64, no model, no device copy) and records the images per second it delivers
over ``N`` batches after ``--loader-warmup`` batches.

Writes ``DIR/yolo_worker_stages.json`` (ms per sample per stage and run, host CPU, versions; runs and
medians under the pipeline's name, ``default``) and prints a Markdown table of the medians. A CPU-side
measurement: it says where a worker's time goes and what the workers deliver, not what the trainer
gains (``bench_yolo_trainer`` measures that).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PIPELINE = "default"  # the name the runs and medians are recorded under
WARMUP = 300  # samples before timing: every worker-side cache and the Mosaic buffer filled


def loader_rate(data: str, workers: int, batches: int, warmup: int) -> float:
    """Images per second the pipeline's DataLoader delivers with ``workers`` processes (no model)."""
    from pipeline_opt.integrations.ultralytics import build_yolo_pipeline

    pipe = build_yolo_pipeline(data, batch=64, workers=workers, device="cpu", gpu_augment="force",
                               gpu_affine="force")
    def endless():  # ultralytics' InfiniteDataLoader keeps its workers but ends each iter() after an epoch
        while True:
            yield from pipe.loader

    try:
        it = endless()
        for _ in range(warmup):
            next(it)
        start = time.perf_counter()
        images = sum(len(next(it)["img"]) for _ in range(batches))
        return images / (time.perf_counter() - start)
    finally:
        pipe.close()


def child(samples: int, images: int = 2048, loader: tuple[int, int, int] = (0, 0, 0)) -> dict[str, float]:
    """One run: ms per sample for ``getitem``, ``load_image`` and each stage; with ``loader`` =
    ``(workers, batches, warmup)`` and batches > 0, ``loader_img_s`` too."""
    import cv2

    from pipeline_opt.datasets import make_yolo_dataset
    from pipeline_opt.integrations.ultralytics import build_yolo_pipeline

    cv2.setNumThreads(0)  # as in a DataLoader worker
    data = make_yolo_dataset(n_train=images, n_val=8, size=(640, 480), seed=0)
    pipe = build_yolo_pipeline(data, batch=64, workers=0, device="cpu", gpu_augment="force", gpu_affine="force")
    times: dict[str, float] = collections.defaultdict(float)

    def timed(fn, name):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            times[name] += time.perf_counter() - start
            return out
        return call

    try:
        ds = pipe.dataset
        ds.load_image = timed(ds.load_image, "load_image")
        top = ds.transforms.transforms
        inner = top[0].transforms  # Mosaic, CopyPaste, RandomPerspective
        for i, t in enumerate(list(inner)):
            inner[i] = timed(t, "pre:" + type(t).__name__)
        for i, t in enumerate(list(top[1:]), start=1):
            top[i] = timed(t, type(t).__name__)
        for i in range(WARMUP):
            ds[i % len(ds)]
        times.clear()
        for i in range(samples):
            start = time.perf_counter()
            ds[i % len(ds)]
            times["getitem"] += time.perf_counter() - start
        out = {name: 1000 * total / samples for name, total in times.items()}
    finally:
        pipe.close()
    if loader[1] > 0:
        out["loader_img_s"] = loader_rate(data, *loader)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--loader-batches", type=int, default=0)
    p.add_argument("--loader-warmup", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        loader = (args.workers, args.loader_batches, args.loader_warmup)
        print(json.dumps(child(args.samples, args.images, loader)))
        return 0
    from benchmarks import harness as H

    def measure() -> dict[str, float]:
        out = subprocess.run([sys.executable, "-m", "benchmarks.yolo_worker_stages", "--out", str(args.out),
                              "--samples", str(args.samples), "--images", str(args.images), "--child",
                              "--loader-batches", str(args.loader_batches),
                              "--loader-warmup", str(args.loader_warmup), "--workers", str(args.workers)],
                             capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        if out.returncode:
            raise SystemExit(f"the run failed (exit status {out.returncode}):\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    runs = {PIPELINE: [measure() for _ in range(args.runs)]}
    stages = sorted({k for rs in runs.values() for run in rs for k in run},
                    key=lambda k: (k != "loader_img_s", k != "getitem", k))
    medians = {v: {k: statistics.median(run.get(k, 0.0) for run in rs) for k in stages} for v, rs in runs.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"samples": args.samples, "images": args.images, "loader": {"workers": args.workers, "batches": args.loader_batches,
                                                 "warmup": args.loader_warmup}, "runs": runs, "medians_ms": medians, "env": H.environment(),
              "commit": os.environ.get("PO_COMMIT", "unknown")}
    (args.out / "yolo_worker_stages.json").write_text(json.dumps(record, indent=2))
    lines = [f"| stage (ms/sample; loader_img_s: images/s; median of {args.runs}) | {PIPELINE} |", "|---|---:|"]
    lines += [f"| {k} | {medians[PIPELINE][k]:.2f} |" for k in stages]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
