"""Detection benchmark: YOLO11n (from yolo11n.yaml) at 640 px, batch 64, bf16, trainer-free.

The step is ultralytics' own pieces without the trainer, as pipeline_opt's
``build_yolo_pipeline`` assembles them: ``build_yolo_dataset`` + ``build_dataloader``
(InfiniteDataLoader, prefetch 4, pinned) on a generated detection set, ``DetectionModel`` and
``model.loss``, ``/255`` on the device as ``preprocess_batch`` does, backward; plus an SGD step
owned by the benchmark.
2048 training images of 640x480: more than the 512-image Mosaic buffer a batch of 64 gets, so the
workers keep decoding (a set that fits the buffer looks unrealistically fast).

Rows (each at all usable cores and at 8 cores; the 8-core part runs in a child process whose CPU
affinity is set before torch starts, so every thread and worker inherits it)
    limit         one pinned batch replayed through the step (the data pipeline removed)
    default       ultralytics' loader as the trainer builds it (workers=8)
    shared slots  the same loader settings, images delivered through pipeline_opt's reused
                  page-locked worker buffers (pipeline_opt.loading.shared_slots), untuned
    integration   pipeline_opt's ultralytics integration: GPU augmentation where it wins, then
                  tune_yolo(shared_slots=True): the loader tuned on real steps, shared slots
                  among the knobs (Sizes.integration_shared_slots)
Every loader row runs ``warmup_s`` (8 s) of untimed steps once, before its first window.
The three are measured in interleaved rounds (alternating order); medians and spreads are reported.

    python -m benchmarks.bench_yolo --out DIR           # H200: about 7-8 minutes (both core settings)
    python -m benchmarks.bench_yolo --quick --device cpu
"""

from __future__ import annotations

import os
import sys


def _early_affinity(argv: list[str]) -> None:
    """Apply ``--cores N`` before torch (and its thread pools) starts."""
    if "--cores" in argv:
        n = int(argv[argv.index("--cores") + 1])
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: max(1, n)])


if __name__ == "__main__":
    _early_affinity(sys.argv)

import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):  # `python benchmarks/bench_yolo.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402

NAME = "bench_yolo"


@dataclass(frozen=True)
class Sizes:
    n_train: int = 2048
    image_size: tuple[int, int] = (640, 480)
    imgsz: int = 640
    batch: int = 64
    default_workers: int = 8
    restricted_cores: int = 8
    tune_budget_s: float = 45.0
    rounds: int = 3
    budget_s: float = 120.0  # per core setting: the interleaved windows, counted once the integration is tuned
    min_steps: int = 8
    min_seconds: float = 2.0
    max_seconds: float = 8.0
    warmup_s: float = 8.0  # untimed steps once per loader row before its first window
    integration_shared_slots: bool = True  # tune_yolo(shared_slots=...): let the tuner try the slots
    integration_gpu_affine: bool = True  # build_yolo_pipeline(gpu_affine=...): the warp decided (measured) too


QUICK = Sizes(n_train=16, image_size=(160, 120), imgsz=64, batch=2, default_workers=1, restricted_cores=1,
              tune_budget_s=5.0, rounds=2, budget_s=40.0, min_steps=2, min_seconds=0.0, max_seconds=1.0,
              warmup_s=0.5)


class Bench:
    """The pipelines of the rows, built with pipeline_opt's trainer-free ultralytics helpers.

    One DetectionModel and one SGD optimizer serve every row: ``step(batch)`` is the pipeline's
    ``step_fn(model, batch)`` (device copy, optional GPU augmentation, ``/255``, loss, backward)
    followed by the optimizer step the benchmark owns.
    """

    def __init__(self, data_yaml: Path, sizes: Sizes, device: torch.device) -> None:
        api = H.optional("pipeline_opt.integrations.ultralytics", "build_yolo_pipeline", "tune_yolo")
        if not api:
            raise SystemExit(f"bench_yolo needs pipeline_opt.integrations.ultralytics: {api.reason}")
        self.build, self.tune = api
        self.data_yaml, self.sizes, self.device = data_yaml, sizes, device
        self.amp = "bf16" if device.type == "cuda" else "fp32"
        self.base = self._pipeline(gpu_augment=False)
        self.model = self.base.model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def _pipeline(self, gpu_augment: bool, gpu_affine: bool = False) -> Any:
        return self.build(self.data_yaml, "yolo11n.yaml", imgsz=self.sizes.imgsz, batch=self.sizes.batch,
                          workers=self.sizes.default_workers, device=self.device, amp=self.amp,
                          gpu_augment=gpu_augment, gpu_affine=gpu_affine, plots=False, close_mosaic=0,
                          pretrained=False)

    def stepper(self, step_fn: Any) -> Any:
        def step(batch: dict) -> None:
            step_fn(self.model, batch)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

        return step


def _count(batch: dict) -> int:
    return int(batch["img"].shape[0])


# --------------------------------------------------------------------------------------------------
# rows


def limit_candidate(bench: Bench) -> H.Candidate:
    """One real batch of the default loader, pinned, copied and stepped every iteration."""
    loader = bench.base.loader
    it = iter(loader)
    batch = next(it)
    pinned = {k: (v.pin_memory() if isinstance(v, torch.Tensor) and bench.device.type == "cuda" else v)
              for k, v in batch.items()}
    del it
    return H.Candidate("limit (replayed pinned batch)", lambda: H.replay(pinned), bench.stepper(bench.base.step_fn),
                       count=_count, discard=3, meta={"what": "one real batch, pinned, copied and stepped each time"})


def integration_candidate(bench: Bench) -> H.Candidate:
    """pipeline_opt's integration: CPU HSV/flip (then the warp) moved to the GPU where each wins,
    then the loader tuned on real steps."""
    pipe = bench._pipeline(gpu_augment=True, gpu_affine=bench.sizes.integration_gpu_affine)
    budget = bench.sizes.tune_budget_s
    t0 = time.perf_counter()
    slots = bench.sizes.integration_shared_slots
    result = bench.tune(pipe, time_budget_s=budget, shared_slots=slots)
    info = {"tuning_wall_s": time.perf_counter() - t0, "time_budget_s": budget, "config": result.config,
            "shared_slots_allowed": slots,
            "speedup_reported": result.speedup, "noise_reported": getattr(result, "noise", None),
            "trials": len(result.trials), "cpu_stages_disabled": list(pipe.cpu_stages_disabled),
            "gpu_augment_decision": getattr(result, "gpu_augment", None),
            "gpu_affine_decision": getattr(result, "gpu_affine", None), "trial_log": H.trial_log(result)}
    pipe.close()  # the tuner measured clones; the pipeline's own loader is not used
    return H.Candidate("integration (tuned, GPU augment if it wins)", lambda: result.loader, bench.stepper(pipe.step_fn),
                       count=_count, meta=info, on_close=_close_loader)


SLOTS_ROW = "default + shared slots"


def _per_batch_ms(seconds: float, batches: int) -> float | None:
    return round(1e3 * seconds / batches, 2) if batches else None


def slot_meta(loader: Any) -> dict[str, Any]:
    """A shared-slots DeviceLoader's counts and timing for a row's meta: ``slot_stats`` (slotted, by
    reference, the workers' time per batch) and ``receive_stats`` (the receiving thread's)."""
    stats, rx = loader.slot_stats(), loader.receive_stats()
    return {
        "slot_stats": None if stats is None else {
            **asdict(stats), "slotted_frac": stats.slotted_frac,
            "worker_fetch_ms_per_batch": _per_batch_ms(stats.fetch_s, stats.total),
            "worker_collate_ms_per_batch": _per_batch_ms(stats.collate_s, stats.total)},
        "receive_stats": None if rx is None else {
            **asdict(rx), "wait_ms_per_batch": rx.wait_ms_per_batch, "work_ms_per_batch": rx.work_ms_per_batch,
            "cpu_ms_per_batch": rx.cpu_ms_per_batch},
    }


def slots_candidate(bench: Bench) -> H.Candidate:
    """The default loader's settings, images through reused page-locked worker buffers (no tuning)."""
    from pipeline_opt.loading import DeviceLoader

    cand = H.Candidate(SLOTS_ROW, lambda: DeviceLoader(bench.base.loader, device=bench.device,
                                                       reuse_buffers=True),
                       bench.stepper(bench.base.step_fn), count=_count,
                       meta={"workers": bench.base.loader.num_workers})

    def close(loader: Any) -> None:
        cand.meta.update(slot_meta(loader))
        loader.close()

    cand.on_close = close
    return cand


def _close_loader(loader: Any) -> None:
    """Shut an InfiniteDataLoader's persistent workers down (it keeps its own iterator)."""
    close = getattr(loader, "close", None)
    if callable(close):
        close()


def run_part(args: Any, sizes: Sizes, device: torch.device, suffix: str) -> tuple[list[H.Row], dict[str, Any]]:
    """All rows at the current CPU affinity. ``sizes.budget_s`` bounds the interleaved windows and
    starts once the integration is tuned (at ``a400052`` a shared budget left the limit row one
    window after ~70 s of tuning)."""
    data_yaml, gen_s = H.yolo_dataset(sizes.n_train, sizes.image_size, seed=args.seed)
    bench = Bench(data_yaml, sizes, device)
    window = {"min_steps": sizes.min_steps, "min_seconds": sizes.min_seconds, "max_seconds": sizes.max_seconds}
    limit = limit_candidate(bench)
    limit.window(device, min_steps=3, min_seconds=0.0, max_seconds=5.0)  # cuDNN + allocator warm-up
    cands = [limit, H.Candidate(f"default (ultralytics, workers={sizes.default_workers})", lambda: bench.base.loader,
                                bench.stepper(bench.base.step_fn), count=_count,
                                meta={"workers": bench.base.loader.num_workers}, on_close=_close_loader)]
    cands.append(slots_candidate(bench))
    rows: list[H.Row] = []
    info: dict[str, Any] = {"dataset_generation_s": gen_s, "cores": H.usable_cores()}
    try:
        cands.append(integration_candidate(bench))
        info["integration"] = cands[-1].meta
    except Exception as exc:
        H.log.exception("integration failed")
        rows.append(H.not_run("integration (tuned, GPU augment if it wins)", "failed", f"{type(exc).__name__}: {exc}"))
    for cand in cands[1:]:  # every loader row starts as warm as one that ran before
        cand.warmup_s = sizes.warmup_s
    measured = H.interleave(cands, sizes.rounds, device, deadline=H.Deadline(sizes.budget_s), **window)
    measured_rows = H.rows_of(cands, measured)
    limit_row = measured_rows[0]
    rows = [r.with_extra(efficiency=H.ratio(r, limit_row)) for r in measured_rows] + rows
    rows = [replace(r, name=f"{r.name} @{suffix}", meta={**r.meta, "cores": H.usable_cores()}) for r in rows]
    return rows, info


def summarize(rows: list[H.Row], suffixes: list[str]) -> dict[str, Any]:
    by = {r.name: r for r in rows}
    out: dict[str, Any] = {}
    for sfx in suffixes:
        limit = by.get(f"limit (replayed pinned batch) @{sfx}")
        default = next((r for n, r in by.items() if n.startswith("default") and n.endswith(f"@{sfx}")), None)
        integ = by.get(f"integration (tuned, GPU augment if it wins) @{sfx}")
        slots = by.get(f"{SLOTS_ROW} @{sfx}")
        x_limit = H.ratio(integ, limit)
        d_limit = H.ratio(default, limit)
        noise = max((r.stats["spread"] for r in (limit, default, integ, slots) if r is not None and r.status == "ok"),
                    default=None)
        out[sfx] = {
            "integration_vs_limit": x_limit,
            "default_vs_limit": d_limit,
            "integration_vs_default": H.ratio(integ, default),
            "shared_slots_vs_limit": H.ratio(slots, limit),
            "shared_slots_vs_default": H.ratio(slots, default),
            "noise_max_spread": noise,
            "target integration >= 0.95x limit": None if x_limit is None else x_limit >= 0.95,
            "default within noise of limit": None if d_limit is None or noise is None else d_limit >= 1 - noise,
            "caveats": limit_caveats(limit, [r for r in (default, slots, integ) if r is not None]),
        }
    return out


LIMIT_SPREAD_CAVEAT = 0.2  # a limit whose windows spread more than this is flagged


def limit_caveats(limit: H.Row | None, loader_rows: list[H.Row]) -> list[str]:
    """Why a ratio against ``limit`` may not be a result: the replayed batch is the ceiling of
    every loader row in principle, so a loader row above it, or a limit whose own windows spread
    widely, means the limit was measured low (on the H200 one run's limit read 824 img/s while
    the untuned default + shared slots read 880, and the summary said "met" for a 1.02x)."""
    if limit is None or limit.status != "ok" or not limit.median:
        return []
    out = []
    above = [r for r in loader_rows if r.status == "ok" and r.median and r.median > limit.median]
    if above:
        names = ", ".join(f"{r.name} ({r.median:,.0f})" for r in above)
        out.append(f"the limit ({limit.median:,.0f} img/s) read below {names}: it was no ceiling in this run, "
                   "so ratios against it are not results")
    spread = limit.stats.get("spread", 0.0)
    if spread > LIMIT_SPREAD_CAVEAT:
        out.append(f"the limit's windows spread {spread:.0%} (over {LIMIT_SPREAD_CAVEAT:.0%})")
    return out


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = H.sizes_for(args, Sizes(), QUICK)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="po-yolo-") as tmp:
        suffix = "all cores" if args.cores is None else f"{args.cores} cores"
        rows, info = run_part(args, sizes, device, suffix)
        parts = {suffix: info}
        suffixes = [suffix]
        if args.cores is None and not args.no_restricted:
            n = min(sizes.restricted_cores, H.usable_cores())
            child_rows, child_info = run_child(args, n, Path(tmp) / "child")
            rows += child_rows
            parts[f"{n} cores"] = child_info
            suffixes.append(f"{n} cores")
    summary = {"parts": parts, **summarize(rows, suffixes)}
    path = H.write_result(
        args.out, NAME, rows, config={**asdict(sizes), "device": str(device), "cores_arg": args.cores},
        summary=summary, started=started,
        ledger={"model": "yolo11n", "batch": sizes.batch, "resolution": sizes.imgsz, "ddp": False,
                "amp": "bf16" if device.type == "cuda" else "fp32"})
    if args.cores is None:
        print(H.format_table(rows, title=f"{NAME} ({device})"))
        print(json.dumps({k: v for k, v in summary.items() if k != "parts"}, indent=1, default=str))
    return path


def run_child(args: Any, cores: int, out: Path) -> tuple[list[H.Row], dict[str, Any]]:
    """The same rows in a child process restricted to ``cores`` cores."""
    cmd = [sys.executable, "-m", "benchmarks.bench_yolo", "--cores", str(cores), "--out", str(out),
           "--seed", str(args.seed)]
    for flag, value in (("--quick", args.quick), ("--device", args.device), ("--rounds", args.rounds),
                        ("--budget-s", args.budget_s)):
        if value:
            cmd += [flag] if value is True else [flag, str(value)]
    name = f"all rows @{cores} cores"
    try:
        # its windows' budget, plus dataset, model and the integration's tuning (~75 s on the H200)
        subprocess.run(cmd, cwd=H.REPO_ROOT, check=True, timeout=(args.budget_s or Sizes.budget_s) + 240)
        result = json.loads((out / f"{NAME}.json").read_text())
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        return [H.not_run(name, "failed", f"child process: {type(exc).__name__}: {exc}")], {}
    rows = [_row_from_dict(d) for d in result["rows"] + result["not_measured"]]
    return rows, result["summary"].get("parts", {}).get(f"{cores} cores", {})


def _row_from_dict(d: dict[str, Any]) -> H.Row:
    known = {"name", "status", "reason", "stats", "samples", "meta", "windows"}
    skip = known | {"throughput", "spread", "unit"}
    extra = {k: v for k, v in d.items() if k not in skip}
    return H.Row(name=d["name"], status=d["status"], reason=d.get("reason", ""), stats=d.get("stats", {}),
                 samples=tuple(d.get("samples", ())), meta=d.get("meta", {}), windows=tuple(d.get("windows", ())),
                 extra=extra)


def main(argv: list[str] | None = None) -> int:
    p = H.common_parser(__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=None, help="run restricted to this many cores (child mode)")
    p.add_argument("--no-restricted", action="store_true", help="skip the 8-core part")
    args = p.parse_args(argv)
    return H.main_of(args, run)


if __name__ == "__main__":
    sys.exit(main())
