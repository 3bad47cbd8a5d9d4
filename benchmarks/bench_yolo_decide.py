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

``--windows W`` (default 3, the decision's own) times W windows per trial. With short windows and
many of them (``--steps 8 --windows 8``) ``summary.settle`` shows how a trial settles: per window
position, the median over trials of the window against its trial's later half (``ramp``), and the
decisions replayed from the same windows with the first windows of every trial discarded
(``replayed``: merged into windows of ``--merge`` raw windows, as many as the decision times), so
a longer warm-up is compared with the current one on the same trials.

    python -m benchmarks.bench_yolo_decide --out DIR --steps 10,20 --repeats 2   # H200: ~3 minutes
    python -m benchmarks.bench_yolo_decide --out DIR --steps 8 --windows 8 --merge 2 --repeats 4
    python -m benchmarks.bench_yolo_decide --quick --device cpu
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
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


def trials_of(windows: Sequence[float], per_trial: int) -> list[list[float]]:
    """``windows`` (a decision side's, trial after trial) cut into trials of ``per_trial`` windows;
    [] when they do not divide evenly (a trial cut short by the deadline)."""
    if per_trial < 1 or not windows or len(windows) % per_trial:
        return []
    return [list(windows[i:i + per_trial]) for i in range(0, len(windows), per_trial)]


def ramp(decisions: list[dict[str, Any]], per_trial: int) -> list[float]:
    """Per window position, the median over every trial of ``window / median(trial's later half)``."""
    ratios: list[list[float]] = [[] for _ in range(per_trial)]
    for d in decisions:
        for side in ("cpu", "gpu"):
            for trial in trials_of(d[f"{side}_windows"], per_trial):
                late = statistics.median(trial[per_trial // 2:])
                if late > 0:
                    for i, w in enumerate(trial):
                        ratios[i].append(w / late)
    return [round(statistics.median(r), 3) if r else 0.0 for r in ratios]


def merged(trial: Sequence[float], skip: int, merge: int, keep: int) -> list[float]:
    """Windows ``skip:`` of one trial, ``merge`` consecutive ones at a time combined into one window
    (equal steps each: the harmonic mean of their throughputs), the first ``keep`` of those."""
    rest = list(trial[skip:])
    return [statistics.harmonic_mean(rest[i:i + merge]) for i in range(0, len(rest) - merge + 1, merge)][:keep]


def replay(decisions: list[dict[str, Any]], per_trial: int, merge: int, keep: int = 3,
           min_gain: float | None = None) -> list[dict[str, Any]]:
    """Each decision's verdict again from its own windows, for every number of discarded raw windows
    that still leaves ``keep`` merged windows per trial: a longer warm-up against the current one
    (skip 0), on the same trials."""
    from pipeline_opt.integrations.ultralytics._decide import _verdict
    from pipeline_opt.tune.ab import MIN_GAIN
    from pipeline_opt.tune.measure import Measurement

    out = []
    for skip in range(0, per_trial - merge * keep + 1):
        verdicts = []
        for d in decisions:
            runs: dict[str, list[Measurement]] = {}
            for side in ("cpu", "gpu"):
                trials = trials_of(d[f"{side}_windows"], per_trial)
                runs[side] = [Measurement(windows=tuple(merged(t, skip, merge, keep)), steps_per_window=1,
                                          batch_size=1, startup_s=0.0, elapsed_s=0.0) for t in trials]
            if not runs["cpu"] or len(runs["cpu"]) != len(runs["gpu"]):
                continue
            v = _verdict(runs, list(d["order"]), "", MIN_GAIN if min_gain is None else min_gain, False)
            verdicts.append({"applied": v.applied, "gain": round(v.gain, 4), "noise": round(v.noise, 4)})
        if verdicts:
            out.append({"skip_windows": skip, "decisions": len(verdicts),
                        "kept": sum(v["applied"] for v in verdicts),
                        "median_noise": round(statistics.median(v["noise"] for v in verdicts), 4),
                        "median_gain": round(statistics.median(v["gain"] for v in verdicts), 4),
                        "verdicts": verdicts})
    return out


def settle_summary(decisions: list[dict[str, Any]], per_trial: int, merge: int) -> dict[str, Any]:
    """``summary.settle``: the ramp and the replayed decisions (see the module docstring)."""
    return {"windows_per_trial": per_trial, "merge": merge, "ramp": ramp(decisions, per_trial),
            "replayed": replay(decisions, per_trial, merge)}


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes: Sizes = QUICK if args.quick else Sizes()
    steps = _steps_list(args.steps)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    data_yaml, gen_s = H.yolo_dataset(sizes.n_train, sizes.image_size, seed=args.seed)
    from pipeline_opt.integrations.ultralytics._decide import decide_gpu_augment

    bench = Bench(data_yaml, sizes, device)
    bench.base.close()  # only the GPU-augment pipeline is measured
    pipe = bench._pipeline(gpu_augment=True)
    deadline = H.Deadline(args.budget_s or (60.0 if args.quick else 400.0))
    decisions: list[dict[str, Any]] = []
    config = {**asdict(sizes), "device": str(device), "steps": steps, "repeats": args.repeats,
              "windows": args.windows, "merge": args.merge}
    path = None
    from pipeline_opt.tune.ab import interleave

    def decide(s: int) -> None:
        nonlocal path
        r = sum(x["steps"] == s for x in decisions)
        t0 = time.perf_counter()
        d = decide_gpu_augment(pipe.loader, pipe.model, pipe.step_fn, pipe.device, pipe.switch, steps=s,
                               windows=args.windows, seed=args.seed,
                               time_budget_s=60.0 * max(1.0, args.windows / 3))  # its default, per 3 windows
        decisions.append({"steps": s, "repeat": r, "wall_s": round(time.perf_counter() - t0, 2), **d.to_dict()})
        kept = {str(k): [sum(x["applied"] for x in decisions if x["steps"] == k),
                         sum(x["steps"] == k for x in decisions)] for k in steps}  # kept, decided
        summary = {"dataset_generation_s": gen_s, "cores": H.usable_cores(), "decisions": decisions,
                   "kept": kept, "settle": settle_summary(decisions, args.windows, args.merge)}
        path = H.write_result(args.out, NAME, rows_of(decisions, steps), config=config, summary=summary,
                              started=started, ledger={"model": "yolo11n", "batch": sizes.batch,
                                                       "resolution": sizes.imgsz, "ddp": False, "amp": bench.amp})
        print(f"steps={s} repeat {r}: {'kept' if d.applied else 'not used'} ({kept[str(s)][0]}/{kept[str(s)][1]}), "
              f"gain {d.gain:+.1%}, noise ±{d.noise:.1%}, {decisions[-1]['wall_s']} s", flush=True)

    try:
        interleave(steps, args.repeats, decide, stop=lambda: deadline.left() <= 0)  # the order alternates
    finally:
        pipe.close()
    if path is None:
        raise SystemExit("no decision was measured within the time budget")
    return path


def main(argv: list[str] | None = None) -> int:
    p = H.common_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", default="10,20", help="comma-separated steps per window, one decision each per repeat")
    p.add_argument("--repeats", type=int, default=2, help="decisions per window length")
    p.add_argument("--windows", type=int, default=3, help="timed windows per trial (the decision's default: 3)")
    p.add_argument("--merge", type=int, default=1,
                   help="raw windows merged into one when summary.settle replays the decisions")
    args = p.parse_args(argv)
    for name in ("repeats", "windows", "merge"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} {getattr(args, name)} must be >= 1")
    return H.main_of(args, run)


if __name__ == "__main__":
    sys.exit(main())
