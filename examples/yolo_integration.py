"""YOLO11 training with the pipeline_opt integration: profile, tune and GPU augmentation.

    python examples/yolo_integration.py --images 64 --epochs 1
    python examples/yolo_integration.py --images 16 --imgsz 160 --batch 4 --device cpu   # smoke run

``attach(model)`` adds trainer callbacks: once the loader is built it is tuned (workers,
pin_memory, prefetch_factor measured on real trainer steps), HSV / flip run batched on the GPU
instead of per sample in the workers, and a window of steps is profiled. Everything stays offline:
the model comes from ``yolo11n.yaml`` (no weights) and the dataset is generated locally.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import pipeline_opt as po
from pipeline_opt.datasets import make_yolo_dataset
from pipeline_opt.integrations.ultralytics import attach, prepare_offline_env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=64, help="synthetic training images (cached)")
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--budget", type=float, default=30.0, help="tuning time budget (seconds)")
    p.add_argument("--steps", type=int, default=10, help="profiled steps")
    p.add_argument("--no-tune", action="store_true", help="profile and GPU augmentation only (quick smoke runs)")
    p.add_argument("--device", default="0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--project", type=Path, default=Path("runs_pipeline_opt"))
    args = p.parse_args()

    prepare_offline_env()  # before importing ultralytics: no font download, no update checks
    from ultralytics import YOLO

    po.enable_console_logging()
    data = make_yolo_dataset(n_train=args.images, n_val=max(2, args.images // 8),
                             size=(args.imgsz, args.imgsz * 3 // 4), progress=True)
    model = YOLO("yolo11n.yaml")
    out = args.project.resolve() / "pipeline_opt"
    integration = attach(model, profile=True, tune=not args.no_tune, gpu_augment=True, output_dir=out,
                         tune_budget_s=args.budget, steps=args.steps, warmup=1)
    model.train(data=str(data), epochs=args.epochs, imgsz=args.imgsz, batch=args.batch, device=args.device,
                workers=args.workers, plots=False, close_mosaic=0, pretrained=False, val=False, amp=False,
                project=str(args.project.resolve()), name="example", exist_ok=True, verbose=False)

    run = integration.run
    if run is not None and run.report is not None:
        print(run.report.table())
    summary = out / "integration.json"
    if summary.is_file():
        print("integration summary:", json.dumps(json.loads(summary.read_text()).get("tuning"), default=str)[:2000])
    print("reports in", out)


if __name__ == "__main__":
    main()
