"""GPU-augmentation decision benchmark: can the measured decision resolve CPU vs GPU HSV/flip?

The ultralytics integration keeps the GPU HSV/flip only when ``decide_gpu_augment`` (A B A B trials,
each on a fresh clone of the loader) measures it faster beyond the noise. This script runs that
decision several times on the ``bench_yolo`` pipeline (YOLO11n, 640 px, batch 64, 8 workers), once
per window length in ``--steps``, the settings interleaved (10, 20, 10, 20, ...), and reports per
decision the pooled CPU and GPU throughput, the noise it measured, the gain, whether it kept the
GPU augmentation and how long it took.

Rows: ``CPU HSV/flip, windows of S steps`` and ``GPU HSV/flip, windows of S steps`` with every
window of every decision of that setting. S is the ``steps`` asked for; since ``d6210ae`` the
decision rounds it up to whole rounds of the workers (16 for 10 at 8 workers), which the rows'
``meta.window_steps`` and each decision's ``window_steps`` record. ``summary.decisions``: the decisions themselves. The JSON
is rewritten after each decision, so a run cut short keeps what it measured.

    python -m benchmarks.bench_yolo_decide --out DIR --steps 10,20 --repeats 2   # H200: ~3 minutes
    python -m benchmarks.bench_yolo_decide --quick --device cpu
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_yolo_decide.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import harness as H
from benchmarks.bench_yolo import QUICK, Bench, Sizes

NAME = "bench_yolo_decide"


def _steps_list(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        steps = []
    if not steps or any(s < 1 for s in steps):
        raise SystemExit(f"--steps {text!r} must be comma-separated integers >= 1, e.g. 10,20")
    return steps


def rows_of(decisions: list[dict[str, Any]], steps: list[int]) -> list[H.Row]:
    """One CPU and one GPU row per window length, with every window of its decisions."""
    rows = []
    for s in steps:
        mine = [d for d in decisions if d["steps"] == s]
        for side in ("cpu", "gpu"):
            windows = [w for d in mine for w in d[f"{side}_windows"]]
            name = f"{side.upper()} HSV/flip, windows of {s} steps"
            meta = {"decisions": len(mine), "window_steps": sorted({d.get("window_steps", s) for d in mine})}
            rows.append(H.row_of(name, windows, meta=meta) if windows
                        else H.not_run(name, "failed", "no window measured"))
    return rows


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes: Sizes = QUICK if args.quick else Sizes()
    steps = _steps_list(args.steps)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    data_yaml, gen_s = H.yolo_dataset(sizes.n_train, sizes.image_size, seed=args.seed)
    from pipeline_opt.integrations._yolo_decide import decide_gpu_augment

    bench = Bench(data_yaml, sizes, device)
    bench.base.close()  # only the GPU-augment pipeline is measured
    pipe = bench._pipeline(gpu_augment=True)
    deadline = H.Deadline(args.budget_s or (60.0 if args.quick else 400.0))
    decisions: list[dict[str, Any]] = []
    config = {**asdict(sizes), "device": str(device), "steps": steps, "repeats": args.repeats}
    path = None
    try:
        for r in range(args.repeats):
            for s in steps if r % 2 == 0 else steps[::-1]:
                if deadline.left() <= 0:
                    break
                t0 = time.perf_counter()
                d = decide_gpu_augment(pipe.loader, pipe.model, pipe.step_fn, pipe.device, pipe.switch, steps=s,
                                       seed=args.seed)
                decisions.append({"steps": s, "repeat": r, "wall_s": round(time.perf_counter() - t0, 2),
                                  **d.to_dict()})
                kept = {str(k): [sum(x["applied"] for x in decisions if x["steps"] == k),
                                 sum(x["steps"] == k for x in decisions)] for k in steps}  # kept, decided
                summary = {"dataset_generation_s": gen_s, "cores": H.usable_cores(), "decisions": decisions,
                           "kept": kept}
                path = H.write_result(args.out, NAME, rows_of(decisions, steps), config=config, summary=summary,
                                      started=started, ledger={"model": "yolo11n", "batch": sizes.batch,
                                                               "resolution": sizes.imgsz, "ddp": False,
                                                               "amp": bench.amp})
                print(f"steps={s} repeat {r}: {'kept' if d.applied else 'not used'} ({kept[str(s)][0]}/{kept[str(s)][1]}), "
                      f"gain {d.gain:+.1%}, noise ±{d.noise:.1%}, {decisions[-1]['wall_s']} s", flush=True)
    finally:
        pipe.close()
    if path is None:
        raise SystemExit("no decision was measured within the time budget")
    return path


def main(argv: list[str] | None = None) -> int:
    p = H.common_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", default="10,20", help="comma-separated steps per window, one decision each per repeat")
    p.add_argument("--repeats", type=int, default=2, help="decisions per window length")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats} must be >= 1")
    return H.main_of(args, run)


if __name__ == "__main__":
    sys.exit(main())
