"""Profiler overhead: the same training loop with pipeline_opt's profiler on and off.

Pipeline: an image folder of 1024 JPEGs of 640x480, Resize((224, 224)) + ToTensor + Normalize in
``cores - 2`` workers, ResNet-50 batch 128 bf16 channels_last with an SGD step (the classification
benchmark's step). Short steps and busy workers: the case where profiling costs show most.

Rows (interleaved rounds, alternating order, medians). The profile_loop rows split the cost into
its two parts: the worker proxies and torch.profiler's per-op tracing in the main process.
    plain                                        the loader, no profiler
    profile_loop workers on, every step traced   po.profile_loop(..., trace_steps=None) measuring every
                                                 step (a fresh one per window: one torch.profiler
                                                 session at a time)
    profile_loop workers on, untraced            trace_steps=0: step timing + worker profiling only
    profile_loop workers off, untraced           step timing only
    po.profile <variant>                         po.profile's own throughput (report.throughput) with the
                                                 default trace_steps, with every step traced, and with
                                                 workers off; rounds alternate the order
The summary gives each as a ratio of plain; the target is >= 0.95 (overhead <= 5%).

    python -m benchmarks.bench_overhead --out DIR         # H200: about 1.5 minutes
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_overhead.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torchvision  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks.bench_classification import Point, Trainer, build_source  # noqa: E402
from benchmarks.bench_classification import Sizes as ClsSizes  # noqa: E402

NAME = "bench_overhead"


@dataclass(frozen=True)
class Sizes:
    n_images: int = 1024
    image_size: tuple[int, int] = (640, 480)
    crop: int = 224
    batch: int = 128
    model: str = "resnet50"
    workers: int = 0  # 0 = usable cores - 2
    rounds: int = 3
    profile_rounds: int = 2
    profile_steps: int = 30
    loop_steps: int = 400  # profile_loop stays active for this many steps (covers every window)
    budget_s: float = 230.0
    min_steps: int = 12
    min_seconds: float = 2.5
    max_seconds: float = 8.0


QUICK = Sizes(n_images=24, image_size=(160, 120), crop=32, batch=4, model="resnet18", workers=1, rounds=2,
              profile_rounds=1, profile_steps=3, loop_steps=50, budget_s=40.0, min_steps=2, min_seconds=0.0,
              max_seconds=1.0)


class ProfiledLoop:
    """A profile_loop candidate's source and step: the training step, then ``prof.step()``."""

    def __init__(self, trainer: Trainer, make: Any) -> None:
        self.trainer, self.make, self.prof = trainer, make, None

    def source(self) -> Any:
        self.prof = self.make()
        return self.prof

    def step(self, batch: Any) -> None:
        self.trainer.step(batch)
        self.prof.step()


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = QUICK if args.quick else Sizes()
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    if args.budget_s:
        sizes = replace(sizes, budget_s=args.budget_s)
    deadline = H.Deadline(sizes.budget_s)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    root, gen_s = H.image_folder(sizes.n_images, sizes.image_size, seed=args.seed)
    num_classes = len(torchvision.datasets.folder.find_classes(root)[0])
    trainer = Trainer(sizes.model, device, num_classes)
    workers = sizes.workers or max(1, H.usable_cores() - 2)
    cls_sizes = ClsSizes(n_images=sizes.n_images, image_size=sizes.image_size, crop=sizes.crop, batch=sizes.batch,
                         model=sizes.model)
    point = Point(workers, device.type == "cuda", False, "pil")

    def loader() -> Any:
        return build_source(root, cls_sizes, point, device)

    window = {"min_steps": sizes.min_steps, "min_seconds": sizes.min_seconds, "max_seconds": sizes.max_seconds}
    meta = {**asdict(point), "model": sizes.model, "batch": sizes.batch}
    # plain is rebuilt for every window too: every row pays the same worker start-up and queue refill
    cands = [H.Candidate("plain", loader, trainer.step, meta=meta, fresh=True)]
    rows: list[H.Row] = []
    profile_loop = H.optional("pipeline_opt", "profile_loop")
    if profile_loop:
        for traced, on in ((True, True), (False, True), (False, False)):
            def make(on: bool = on, traced: bool = traced) -> Any:
                return profile_loop(loader(), model=trainer.model, steps=sizes.loop_steps, warmup=0,
                                    device=device, worker_profiling=on, trace_steps=None if traced else 0)

            loop = ProfiledLoop(trainer, make)
            name = f"profile_loop workers {'on' if on else 'off'}, {'every step traced' if traced else 'untraced'}"
            cands.append(H.Candidate(name, loop.source, loop.step,
                                     meta={**meta, "worker_profiling": on, "traced": traced},
                                     on_close=lambda prof: prof.close(), fresh=True))
    else:
        rows.append(H.not_run("profile_loop", "missing", profile_loop.reason))
    trainer.step(_warm_batch(sizes, device, num_classes))  # cuDNN warm-up
    measured = H.interleave(cands, sizes.rounds, device, deadline=deadline, **window)
    loop_rows = H.rows_of(cands, measured)
    plain = loop_rows[0]
    rows = [r.with_extra(vs_plain=H.ratio(r, plain)) for r in loop_rows] + rows
    rows += profile_rows(sizes, trainer, loader, device, deadline, plain)
    summary = {"dataset_generation_s": gen_s, "workers": workers}
    for r in rows:
        if r.status == "ok" and r.name != "plain":
            summary[f"{r.name} / plain"] = r.extra.get("vs_plain")
    summary["target overhead <= 5%"] = {k: (None if v is None else v >= 0.95) for k, v in summary.items()
                                        if k.endswith("/ plain")}
    path = H.write_result(args.out, NAME, rows, config={**asdict(sizes), "device": str(device)}, summary=summary,
                          started=started,
                          ledger={"model": sizes.model, "batch": sizes.batch, "resolution": sizes.crop, "ddp": False,
                                  "amp": "bf16" if trainer.amp else "fp32"})
    print(H.format_table(rows, title=f"{NAME} ({device})", reference=plain if plain.status == "ok" else None))
    return path


def _warm_batch(sizes: Sizes, device: torch.device, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(sizes.batch, 3, sizes.crop, sizes.crop, device=device),
            torch.randint(0, num_classes, (sizes.batch,), device=device))


PROFILE_VARIANTS: dict[str, dict[str, Any]] = {
    "po.profile workers on (default trace_steps)": {"worker_profiling": True},
    "po.profile workers on, every step traced": {"worker_profiling": True, "trace_steps": None},
    "po.profile workers off (default trace_steps)": {"worker_profiling": False},
}


def profile_rows(sizes: Sizes, trainer: Trainer, loader: Any, device: torch.device, deadline: H.Deadline,
                 plain: H.Row) -> list[H.Row]:
    """po.profile's own throughput for each of PROFILE_VARIANTS, the order alternating by round."""
    profile = H.optional("pipeline_opt", "profile")
    if not profile:
        return [H.not_run("po.profile", "missing", profile.reason)]
    names = list(PROFILE_VARIANTS)
    values: dict[str, list[float]] = {n: [] for n in names}
    traced: dict[str, int] = {}
    errors: dict[str, str] = {}
    for r in range(sizes.profile_rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            if deadline.expired() or name in errors:
                continue
            try:
                report = profile(loader(), trainer.model, step_fn=trainer.step_fn, steps=sizes.profile_steps,
                                 device=device, limit=False, **PROFILE_VARIANTS[name])
                values[name].append(report.throughput)
                traced[name] = report.traced_steps
            except Exception as exc:
                H.log.exception("po.profile failed")
                errors[name] = f"{type(exc).__name__}: {exc}"
    rows = []
    for name in names:
        meta = {**PROFILE_VARIANTS[name], "steps": sizes.profile_steps, "traced_steps": traced.get(name)}
        if values[name]:
            row = H.row_of(name, values[name], meta)
            rows.append(row.with_extra(vs_plain=H.ratio(row, plain)))
        else:
            rows.append(H.not_run(name, "failed" if name in errors else "skipped", errors.get(name, "time budget"),
                                  meta))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = H.common_parser(__doc__.splitlines()[0]).parse_args(argv)
    H.setup(args)
    path = run(args)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
