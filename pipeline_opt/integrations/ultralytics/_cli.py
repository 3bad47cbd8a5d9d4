"""``pipeline-opt yolo``: profile the ultralytics pipeline as built, tune it, print before / after.

"before" is the data path and step ``yolo train`` runs (ultralytics' loader settings, CPU
augmentation); "after" is the integration's pipeline (GPU colour / flip augmentation where it
measured faster than the CPU stages, unless ``--no-gpu-augment``, and the loader settings the
tuner measured to be faster). Without ``--data`` the built-in synthetic detection set is
generated (and cached) first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline_opt._core.log import enable_console_logging, get_logger
from pipeline_opt.datasets import make_yolo_dataset
from pipeline_opt.integrations.ultralytics._env import prepare_offline_env
from pipeline_opt.integrations.ultralytics._pipeline import build_yolo_pipeline, profile_yolo, tune_yolo
from pipeline_opt.integrations.ultralytics._step import AMP_CHOICES
from pipeline_opt.report.text import before_after_table

log = get_logger("integrations.ultralytics")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline-opt yolo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help="detection data.yaml (default: the synthetic set)")
    p.add_argument("--model", default="yolo11n.yaml", help="model YAML, built from scratch (default yolo11n.yaml)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=8, help="ultralytics' workers argument for the 'before' loader")
    p.add_argument("--device", default=None, help="cuda device (0, cuda:1) or cpu; default: cuda:0 if present")
    p.add_argument("--amp", choices=AMP_CHOICES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--budget", type=float, default=60.0, help="tuning time budget in seconds")
    p.add_argument("--steps", type=int, default=30, help="measured steps of each profile")
    p.add_argument("--warmup", type=int, default=5, help="steps left out first")
    p.add_argument("--no-gpu-augment", action="store_true", help="keep HSV / flips on the CPU")
    p.add_argument("--gpu-affine", action="store_true",
                   help="also try RandomPerspective's warp on the GPU: measured against the colour/flip alone, kept "
                        "only if faster (it pays where the workers are the bottleneck, e.g. few cores)")
    p.add_argument("--shared-slots", action="store_true",
                   help="also try delivering the images through reused page-locked worker buffers (CUDA; kept "
                        "only if not slower than the 3%% minimum gain)")
    p.add_argument("--cache", choices=("ram", "disk"), default=None,
                   help="ultralytics' image cache, for the before and the after run alike (the report recommends "
                        "it when reading and decoding hold the workers back)")
    p.add_argument("--synthetic-images", type=int, default=128, help="train images of the synthetic set")
    p.add_argument("--out", default=None, help="directory for before/, after/, tune/ and summary.json")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    return p


def _validate(args: argparse.Namespace) -> None:
    if args.budget <= 0:
        raise ValueError(f"--budget {args.budget} must be > 0 seconds")
    if args.steps < 1 or args.warmup < 0:
        raise ValueError(f"--steps {args.steps} must be >= 1 and --warmup {args.warmup} >= 0")
    if args.gpu_affine and args.no_gpu_augment:
        raise ValueError("--gpu-affine cannot be combined with --no-gpu-augment")
    if args.data is not None and not Path(args.data).is_file():
        raise ValueError(f"--data {args.data}: no such file; pass a detection data.yaml or leave --data out "
                         "for the synthetic set")


def run(args: argparse.Namespace) -> dict:
    """Profile before, tune, profile after; returns the summary written to ``--out``."""
    prepare_offline_env()

    data = args.data
    if data is None:

        data = str(make_yolo_dataset(n_train=args.synthetic_images, n_val=max(4, args.synthetic_images // 8)))
        _out(f"no --data given: using the synthetic detection set {data}")
    common = {"model_cfg": args.model, "imgsz": args.imgsz, "batch": args.batch, "workers": args.workers,
              "device": args.device, "amp": args.amp}
    if args.cache is not None:
        common["cache"] = args.cache
    before_pipe = build_yolo_pipeline(data, **common)
    try:
        before = profile_yolo(before_pipe, steps=args.steps, warmup=args.warmup)
    finally:
        before_pipe.close()
    gpu = not args.no_gpu_augment
    pipe = build_yolo_pipeline(data, gpu_augment=gpu, gpu_affine=args.gpu_affine, **common)
    result = None
    try:
        result = tune_yolo(pipe, time_budget_s=args.budget, shared_slots=args.shared_slots)
        after = profile_yolo(pipe, steps=args.steps, warmup=args.warmup, loader=result.loader)
    finally:
        pipe.close()
        if result is not None and callable(getattr(result.loader, "close", None)):
            result.loader.close()
    config = dict(result.config)
    config["gpu_augment"] = list(pipe.cpu_stages_disabled)  # empty when the measured decision kept the CPU
    original = dict(before.loader_config)
    original["gpu_augment"] = []
    _out(result.table())
    _out("")
    _out(f"pipeline-opt yolo: {args.model} at {pipe.imgsz} px, batch {args.batch}, {pipe.amp} on {pipe.device}")
    if result.gpu_augment is not None:
        _out(f"GPU augmentation: {result.gpu_augment['verdict']}")
    if result.gpu_affine is not None:
        _out(f"GPU warp: {result.gpu_affine['verdict']}")
    _out("before = ultralytics as built; after = " + ("GPU augmentation + " if pipe.gpu_augment_active else "")
         + "tuned loader")
    _out(before_after_table(before, after, config=config, original_config=original))
    summary = {"data": str(data), "model": args.model, "imgsz": pipe.imgsz, "batch": args.batch,
               "device": str(pipe.device), "amp": pipe.amp, "cache": args.cache, "before_throughput": before.throughput,
               "after_throughput": after.throughput,
               "speedup": after.throughput / before.throughput if before.throughput else None,
               "config": config, "original_config": original, "tune_noise": result.noise,
               "gpu_augment_decision": result.gpu_augment, "gpu_affine_decision": result.gpu_affine}
    if args.out is not None:
        out = Path(args.out)
        before.save(out / "before")
        after.save(out / "after")
        result.save(out / "tune")
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        _out(f"\nreports: {out.resolve()}")
    return summary


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipeline-opt yolo``; returns the exit status (2 for bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.verbose:
        enable_console_logging()
    try:
        _validate(args)
        run(args)
    except ValueError as exc:
        sys.stderr.write(f"pipeline-opt yolo: error: {exc}\n")
        return 2
    return 0
