"""Trainer benchmark: ultralytics' own ``YOLO(...).train`` with pipeline_opt attached.

YOLO11n (from yolo11n.yaml) at 640 px, batch 64, ``amp="bf16"``, 8 workers, on the 2048-image
synthetic detection set (as ``bench_yolo``). Where ``bench_yolo`` measures the trainer-free pipeline,
this one measures the trainer a user runs: each run is a child process that calls
``YOLO("yolo11n.yaml").train(...)`` with ``attach(profile=True, tune=False, ...)`` and
``PERF_BENCH=1``, so training ends with status 0 once the profile window is measured. The run's
``report.json`` gives the trainer's throughput over ``steps`` training steps (optimizer included)
after ``warmup`` steps; the warm-up covers the batches the workers pre-filled and every shared slot's
first use (each slot is page-locked once, on its first batch).

Rows (one window per child process; the rows run in interleaved rounds, alternating the order)
    limit: trainer on one replayed batch       one real batch (CPU augmentation), pinned, handed to the
                                               trainer again at every step by a worker-less loader:
                                               the trainer's step with the data pipeline removed
    trainer, CPU augmentation                  attach(gpu_augment=False): ultralytics as built
    trainer, GPU HSV/flip                      attach(gpu_augment="force")
    trainer, GPU HSV/flip + shared slots       attach(gpu_augment="force", shared_slots="force")
    trainer, GPU HSV/flip/warp + shared slots  attach(gpu_augment="force", gpu_affine="force",
                                               shared_slots="force"); the workers only crop the Mosaic canvas
    ..., cache='ram'                           the warp row with train(cache="ram"): ultralytics decodes
                                               every image once, before training, and the workers read
                                               them from memory (what the profile report recommends
                                               when decoding holds the workers back)

    python -m benchmarks.bench_yolo_trainer --out DIR            # H200: about 5 minutes (3 rounds)
    python -m benchmarks.bench_yolo_trainer --quick --device cpu  # a CPU smoke run
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_yolo_trainer.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from pipeline_opt.tune.ab import interleave as ab_interleave  # noqa: E402
from pipeline_opt.tune.ab import judge  # noqa: E402

NAME = "bench_yolo_trainer"

# row name -> attach() arguments that differ between the rows
LIMIT_ROW = "limit: trainer on one replayed batch"
ROWS: dict[str, dict[str, Any]] = {
    LIMIT_ROW: {"gpu_augment": False, "replay": True},
    "trainer, CPU augmentation": {"gpu_augment": False},
    "trainer, GPU HSV/flip": {"gpu_augment": "force"},
    "trainer, GPU HSV/flip + shared slots": {"gpu_augment": "force", "shared_slots": "force"},
    "trainer, GPU HSV/flip/warp + shared slots": {"gpu_augment": "force", "gpu_affine": "force",
                                                  "shared_slots": "force"},
    "trainer, GPU HSV/flip/warp + shared slots, cache='ram'": {"gpu_augment": "force", "gpu_affine": "force",
                                                               "shared_slots": "force", "cache": "ram"},
}
SLOTS_ROW = "trainer, GPU HSV/flip + shared slots"
WARP_ROW = "trainer, GPU HSV/flip/warp + shared slots"
WARP_RAM_ROW = "trainer, GPU HSV/flip/warp + shared slots, cache='ram'"
GPU_ROW = "trainer, GPU HSV/flip"


@dataclass(frozen=True)
class Sizes:
    n_train: int = 2048
    image_size: tuple[int, int] = (640, 480)
    imgsz: int = 640
    batch: int = 64
    workers: int = 8
    steps: int = 40
    warmup: int = 56  # > workers x (prefetch 4 + 2 extra slots): every slot used once before the window
    trace_steps: int = 4  # torch.profiler steps after the window: the training thread's top CPU ops, GPU idle
    rounds: int = 3
    child_timeout_s: float = 150.0
    budget_s: float = 330.0  # no new round starts after this


QUICK = Sizes(n_train=16, image_size=(160, 120), imgsz=64, batch=4, workers=1, steps=2, warmup=2, trace_steps=1,
              rounds=1, child_timeout_s=120.0, budget_s=240.0)


class _Indices(torch.utils.data.Dataset):
    """``n`` samples that are their own index (the replayed batch ignores them)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class _Replay:
    """Collate function returning the same pinned batch (a fresh dict: the trainer replaces its entries)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def __call__(self, samples: list) -> dict:
        return dict(self.batch)


def install_replay(trainer: Any) -> None:
    """Replace ``trainer.train_loader`` by a worker-less loader that replays one of its real batches,
    pinned (``on_pretrain_routine_end``, before attach's callbacks: they profile the replay)."""
    real = trainer.train_loader
    it = iter(real)
    batch = next(it)
    del it
    pinned = {k: (v.pin_memory() if isinstance(v, torch.Tensor) and torch.cuda.is_available() else v)
              for k, v in batch.items()}
    n = len(real.sampler) if hasattr(real, "sampler") else len(real) * real.batch_size
    if callable(getattr(real, "close", None)):
        real.close()  # its workers would take CPU from the step
    trainer.train_loader = torch.utils.data.DataLoader(_Indices(n), batch_size=real.batch_size, shuffle=False,
                                                       num_workers=0, collate_fn=_Replay(pinned))


def child(args: Any) -> int:
    """One training run with the row's attach() arguments; exits 0 once the profile is saved."""
    os.environ["PERF_BENCH"] = "1"
    from pipeline_opt.integrations.ultralytics import attach, prepare_offline_env

    prepare_offline_env()
    from ultralytics import YOLO

    work = Path(args.workdir)
    options = json.loads(args.attach)
    model = YOLO("yolo11n.yaml")
    cache = options.pop("cache", False)  # a train() argument, not attach()'s
    if options.pop("replay", False):
        model.add_callback("on_pretrain_routine_end", install_replay)  # before attach's own
    # workers through attach too: ultralytics forces workers=0 on a CPU device, attach's override comes after
    attach(model, profile=True, tune=False, steps=args.steps, warmup=args.warmup, trace_steps=args.trace_steps or 0,
           output_dir=work / "pipeline_opt", workers=args.workers, **options)
    device = "cpu" if args.device == "cpu" else 0
    try:
        model.train(data=args.data, epochs=100, imgsz=args.imgsz, batch=args.batch, workers=args.workers,
                    cache=cache, device=device, amp="bf16" if device != "cpu" else False, val=False, plots=False, save=False,
                    close_mosaic=0, pretrained=False, project=str(work), name="run", exist_ok=True,
                    verbose=False, seed=args.seed, deterministic=False)
    except SystemExit as exc:  # PERF_BENCH ends the run here, status 0
        return int(exc.code or 0)
    return 3  # the window never completed


def run_one(args: Any, sizes: Sizes, data: Path, row: str, work: Path) -> dict[str, Any]:
    """One child run of ``row``: its throughput, data wait and shared-slot counts, or the failure."""
    cmd = [sys.executable, "-m", "benchmarks.bench_yolo_trainer", "--child", "--data", str(data),
           "--workdir", str(work), "--attach", json.dumps(ROWS[row]), "--steps", str(sizes.steps),
           "--warmup", str(sizes.warmup), "--trace-steps", str(sizes.trace_steps), "--imgsz", str(sizes.imgsz),
           "--batch", str(sizes.batch), "--workers", str(sizes.workers), "--seed", str(args.seed)]
    if args.device:
        cmd += ["--device", args.device]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=H.REPO_ROOT, timeout=sizes.child_timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {sizes.child_timeout_s:.0f} s"}
    wall = time.monotonic() - t0
    report_path = work / "pipeline_opt" / "report.json"
    if proc.returncode != 0 or not report_path.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        return {"failed": f"exit status {proc.returncode}: {tail}"}
    report = json.loads(report_path.read_text())
    summary = json.loads((work / "pipeline_opt" / "integration.json").read_text())
    steps = report.get("steps") or []
    gpu = summary.get("gpu_augment") or {}
    return {"throughput": float(report["throughput"]), "data_wait_frac": report.get("data_wait_frac"),
            # the training process's CPU per step, and the training thread's wait for a free core
            "main_cpu_s": report.get("main_cpu_s"), "main_runqueue_s": report.get("main_runqueue_s"),
            "main_thread_cpu_s": report.get("main_thread_cpu_s"),  # the training thread's own part of main_cpu_s
            # from the traced steps after the window: where the training thread's CPU goes, and the GPU idle
            "traced_steps": report.get("traced_steps"), "gpu_idle_frac": report.get("gpu_idle_frac"),
            "top_cpu_ops": (report.get("top_cpu_ops") or [])[:10],
            "steps": len(steps), "wall_s": wall, "workers": sizes.workers, "shared_slots": summary.get("shared_slots"),
            "gpu_augment_applied": gpu.get("applied", False),
            "moved_to_device": [s["name"] for s in gpu.get("cpu_stages_disabled") or []],
            "image_cache": summary.get("image_cache"),
            "train_loader": summary.get("train_loader")}


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = H.sizes_for(args, Sizes(), QUICK)
    device = H.pick_device(args.device)
    data, gen_s = H.yolo_dataset(sizes.n_train, sizes.image_size, seed=args.seed)
    H.log.info("dataset ready in %.1f s: %s", gen_s, data)
    names = selected_rows(args.rows)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    flat: list[str] = []

    def out_of_time() -> bool:  # asked between runs; a round, once begun, is finished
        if len(flat) % len(names) == 0 and time.monotonic() - started > sizes.budget_s:
            H.log.info("budget of %.0f s reached after %d round(s)", sizes.budget_s, len(flat) // len(names))
            return True
        return False

    with tempfile.TemporaryDirectory(prefix="po-yolo-trainer-") as tmp:
        def measure(name: str) -> None:
            r = len(flat) // len(names)
            out = run_one(args, sizes, data, name, Path(tmp) / f"r{r}-{names.index(name)}")
            H.log.info("round %d %s: %s", r, name, {k: v for k, v in out.items() if k != "train_loader"})
            results[name].append(out)
            flat.append(name)

        ab_interleave(names, sizes.rounds, measure, stop=out_of_time)
    order_log = [flat[i:i + len(names)] for i in range(0, len(flat), len(names))]
    rows = []
    for name in names:
        ok = [o for o in results[name] if "throughput" in o]
        failed = [o["failed"] for o in results[name] if "failed" in o]
        meta = {"attach": ROWS[name], "runs": results[name]}
        if not ok:
            rows.append(H.not_run(name, "failed", failed[0] if failed else "not run", meta))
            continue
        waits = [o["data_wait_frac"] for o in ok if o.get("data_wait_frac") is not None]
        rows.append(H.row_of(name, [o["throughput"] for o in ok], meta,
                             data_wait_frac=statistics.median(waits) if waits else None))
    by = {r.name: r for r in rows}
    measured = [r for r in rows if r.status == "ok"]
    spread = max((r.stats["spread"] for r in measured), default=None)
    slots_vs_gpu = H.ratio(by.get(SLOTS_ROW), by.get(GPU_ROW))
    repeated = bool(measured) and min(r.stats["n"] for r in measured) >= 2
    limit = by.get(LIMIT_ROW)
    vs_limit = {name: H.ratio(by.get(name), limit) for name in names if name != LIMIT_ROW}
    summary = {
        "vs_limit": vs_limit,
        "rows_run": names,
        "targets": {f"{row} >= 0.95x limit": None if vs_limit.get(row) is None else vs_limit[row] >= 0.95
                    for row in (SLOTS_ROW, WARP_ROW)},
        "slots_vs_gpu_augment": slots_vs_gpu,
        "cache_ram_vs_decoding_workers": H.ratio(by.get(WARP_RAM_ROW), by.get(WARP_ROW)),
        "gpu_augment_vs_cpu": H.ratio(by.get(GPU_ROW), by.get("trainer, CPU augmentation")),
        "largest_spread": spread,
        # a verdict needs repeated runs: one run per row has no spread to compare with
        "slots_gain_beyond_spread": None if slots_vs_gpu is None or spread is None or not repeated
        else abs(slots_vs_gpu - 1.0) > spread,
        "feature_verdicts": feature_verdicts(by, spread if repeated else None),
        "caveats": caveats(results) + limit_caveats(vs_limit, spread, repeated),
        "orders": order_log,
        "dataset_generation_s": gen_s,
    }
    path = H.write_result(
        args.out, NAME, rows, config={**asdict(sizes), "device": str(device)}, summary=summary, started=started,
        ledger={"model": "yolo11n", "batch": sizes.batch, "resolution": sizes.imgsz, "ddp": False,
                "amp": "bf16" if device.type == "cuda" else "fp32"})
    print(H.format_table(rows, title=f"{NAME} ({device})"))
    print(json.dumps({k: v for k, v in summary.items() if k != "orders"}, indent=1, default=str))
    return path


ROW_KEYS = dict(zip(("limit", "cpu", "gpu", "slots", "slots_warp", "slots_warp_ram"), ROWS))  # --rows names


def selected_rows(spec: str | None) -> list[str]:
    """The rows of ``spec`` (comma-separated keys of ``ROW_KEYS``, in the table's order); all without it."""
    if not spec:
        return list(ROWS)
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ROW_KEYS]
    if unknown or not keys:
        raise SystemExit(f"--rows {spec!r}: unknown {unknown}; choose from {list(ROW_KEYS)}")
    return [name for key, name in ROW_KEYS.items() if key in keys]


def caveats(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Runs that did not measure what their row says: slots asked for but not applied, GPU
    augmentation forced but not applied, another image cache than the row's (ultralytics turns
    ``cache="ram"`` off where the memory is short)."""
    out = []
    for name, runs in results.items():
        ok = [o for o in runs if "throughput" in o]
        cache = ROWS[name].get("cache")
        other = sum(1 for o in ok if o.get("image_cache") != cache)
        if other:
            out.append(f"{name}: the image cache was not {cache!r} in {other} of {len(ok)} runs")
        if ROWS[name].get("shared_slots"):
            missed = sum(1 for o in ok if not (o.get("shared_slots") or {}).get("applied"))
            if missed:
                out.append(f"{name}: shared slots not applied in {missed} of {len(ok)} runs")
        if ROWS[name].get("gpu_augment"):
            missed = sum(1 for o in ok if not o.get("gpu_augment_applied"))
            if missed:
                out.append(f"{name}: GPU augmentation not applied in {missed} of {len(ok)} runs")
            expected = expected_moves(ROWS[name])
            wrong = sum(1 for o in ok if expected != set(o.get("moved_to_device") or ()))
            if wrong:
                out.append(f"{name}: moved other stages to the device than {sorted(expected)} "
                           f"in {wrong} of {len(ok)} runs")
    return out


def expected_moves(options: dict[str, Any]) -> set[str]:
    """The CPU stages a GPU row's ``attach`` options move to the device (ultralytics' defaults:
    HSV, the horizontal flip; the warp with ``gpu_affine``)."""
    moved = {"RandomHSV", "RandomFlip(horizontal)"}
    if options.get("gpu_affine"):
        moved.add("RandomPerspective")
    return moved


FEATURES = {  # feature -> (the row with it, the same row without it)
    "shared slots": (SLOTS_ROW, GPU_ROW),
}


def feature_verdicts(by: dict[str, Any], noise: float | None) -> dict[str, str]:
    """Each worker feature against the same row without it, in the tuner's words
    (:func:`pipeline_opt.tune.ab.judge` with the rows' largest spread as the noise): the evidence
    for keeping or removing it. Without repeated runs there is no noise to judge against."""
    out = {}
    for feature, (with_row, without_row) in FEATURES.items():
        a, b = by.get(with_row), by.get(without_row)
        if a is None or b is None or a.status != "ok" or b.status != "ok":
            continue
        if noise is None:
            out[feature] = f"{a.median / b.median:.2f}x with one run per row: no verdict"
        else:
            out[feature] = f"{a.median / b.median:.2f}x: {judge(a.median, b.median, noise).sentence}"
    return out


def limit_caveats(vs_limit: dict[str, float | None], spread: float | None, repeated: bool) -> list[str]:
    """Rows that read above the limit row beyond the rows' largest spread (any amount with one run
    per row): there the limit row was no upper bound, so a ratio to it says little."""
    margin = spread if repeated and spread is not None else 0.0
    return [f"{name} read {r:.2f}x the limit row, beyond the spread ({margin:.0%}): the limit row was no "
            f"upper bound in this run{'' if repeated else ' (one run per row; rerun with --rounds 3)'}"
            for name, r in vs_limit.items() if r is not None and r > 1.0 + margin]


def main(argv: list[str] | None = None) -> int:
    p = H.common_parser(__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse_hidden())
    for flag, kind in (("--data", str), ("--workdir", str), ("--attach", str), ("--steps", int),
                       ("--warmup", int), ("--trace-steps", int), ("--imgsz", int), ("--batch", int),
                       ("--workers", int)):
        p.add_argument(flag, type=kind, default=None, help=argparse_hidden())
    p.add_argument("--rows", default=None,
                   help="comma-separated rows to run (default: all): " + ", ".join(ROW_KEYS))
    args = p.parse_args(argv)
    if args.child:
        H.setup_logging(args.verbose)
        return child(args)
    return H.main_of(args, run)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
