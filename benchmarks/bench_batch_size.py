"""Batch-size advice against the true limit: ``po.max_batch_size`` and ultralytics' AutoBatch.

Two workloads, each with its real training step (bf16 autocast on CUDA):

* classification: ResNet-50, 224 px, batch 128, SGD with momentum (``bench_classification``'s step);
* YOLO: YOLO11n from yolo11n.yaml, 640 px, batch 64, the trainer-free ultralytics pipeline's step.

For each, on one GPU:

    po.max_batch_size      the line's prediction of the largest batch that keeps 10% of the device's
                           memory free, the size it verified with real steps (the largest whose peak
                           stayed within 90%), its probes; seconds taken
    true limit             the largest batch a real training step (two steps, the second one's
                           allocator state being the steady one) runs at without running out of
                           memory: doubling from the loader's batch, then bisection to 2%; each probe
                           starts from a released allocator cache (``peak_bytes``), so its peak is
                           its own and not an earlier, larger probe's
    AutoBatch (YOLO)       ``ultralytics.utils.autobatch.autobatch`` at its default fraction of free
                           memory (0.6), and at 0.9 (the same headroom as ``max_batch_size``)

Rows are the step's images/s at the loader's batch, at the verified size and at the true limit (what
raising the batch gives); ``summary.<workload>`` holds every size and each prediction over the true
limit. On a CPU device only the loader's batch is timed: the rest needs CUDA and says so.

    python -m benchmarks.bench_batch_size --out DIR            # GPU: ~2-4 minutes
    python -m benchmarks.bench_batch_size --quick --device cpu # the smoke run
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_batch_size.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402

NAME = "bench_batch_size"


@dataclass(frozen=True)
class Sizes:
    cls_model: str = "resnet50"
    cls_batch: int = 128
    cls_crop: int = 224
    yolo_batch: int = 64
    imgsz: int = 640
    yolo_images: int = 64
    yolo_image_size: tuple[int, int] = (640, 480)
    margin: float = 0.10
    resolution: float = 0.02  # the true limit's bisection stops within 2% of it
    max_batch: int = 16384
    time_steps: int = 3
    budget_s: float = 420.0


QUICK = Sizes(cls_model="resnet18", cls_batch=4, cls_crop=32, yolo_batch=4, imgsz=64, yolo_images=8,
              yolo_image_size=(96, 64), time_steps=1, budget_s=120.0)


@dataclass
class Workload:
    name: str
    loader: Any
    model: torch.nn.Module
    step: Callable[[torch.nn.Module, Any], Any]
    autobatch_model: torch.nn.Module | None = None  # an ultralytics model AutoBatch can size
    close: Callable[[], None] = lambda: None


def classification(sizes: Sizes, device: torch.device) -> Workload:
    import torchvision

    from benchmarks.bench_classification import Trainer, cpu_compose
    from pipeline_opt.datasets import make_image_folder

    # one batch is all it reads (the template max_batch_size repeats); two classes fill any batch
    root = make_image_folder(n_images=sizes.cls_batch, size=(640, 480), num_classes=2, workers=H.usable_cores())
    dataset = torchvision.datasets.ImageFolder(root, transform=cpu_compose(sizes.cls_crop))
    loader = torch.utils.data.DataLoader(dataset, batch_size=sizes.cls_batch)
    trainer = Trainer(sizes.cls_model, device, num_classes=len(dataset.classes))
    return Workload("classification", loader, trainer.model, trainer.step_fn)


def yolo(sizes: Sizes, device: torch.device) -> Workload:
    from pipeline_opt.integrations.ultralytics import build_yolo_pipeline

    data, _ = H.yolo_dataset(sizes.yolo_images, sizes.yolo_image_size)
    pipe = build_yolo_pipeline(data, imgsz=sizes.imgsz, batch=sizes.yolo_batch, workers=0, device=device)
    return Workload("yolo", pipe.loader, pipe.model, pipe.step_fn, autobatch_model=pipe.model, close=pipe.close)


def true_limit(work: Workload, build: Callable[[int], Any], start: int, device: torch.device, sizes: Sizes,
               deadline: H.Deadline, memory: Any = None) -> dict[str, Any]:
    """The largest batch whose two real steps run without running out of memory, and the smallest that
    did not (None when ``max_batch`` ran or the time ran out first). Each probe goes through
    :func:`~pipeline_opt.profile.batch_size.peak_bytes`, which releases the allocator's cache first, so
    the peaks recorded are each size's own. ``memory``: the readings (default ``torch.cuda`` on
    ``device``; a fake allocator in the CPU tests)."""
    from pipeline_opt._core.step import ModelStateGuard
    from pipeline_opt.profile.batch_size import peak_bytes
    from pipeline_opt.profile.memory import CudaMemory

    memory = CudaMemory(device) if memory is None else memory
    fits, fails, peak, probes = 0, None, None, []
    with ModelStateGuard(work.model):
        n = start
        while n <= sizes.max_batch and not deadline.expired():
            got = peak_bytes(work.step, work.model, build(n), device, memory)
            probes.append((n, got))
            if got is None:
                fails = n
                break
            fits, peak, n = n, got, 2 * n
        while fails is not None and fails - fits > max(1, int(sizes.resolution * fits)) and not deadline.expired():
            mid = (fits + fails) // 2
            got = peak_bytes(work.step, work.model, build(mid), device, memory)
            probes.append((mid, got))
            if got is None:
                fails = mid
            else:
                fits, peak = mid, got
    return {"fits": fits, "fails": fails, "peak_bytes": peak, "probes": probes,
            "complete": fails is not None and fails - fits <= max(1, int(sizes.resolution * fits))}


def autobatch_sizes(model: torch.nn.Module, imgsz: int, device: torch.device) -> dict[str, Any]:
    """ultralytics' AutoBatch on a copy of ``model`` at its default fraction (0.6) and at 0.9."""
    from ultralytics.utils.autobatch import autobatch

    out: dict[str, Any] = {}
    benchmark_mode = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False  # AutoBatch returns its default batch under cuDNN's autotuner
    try:
        for fraction in (0.6, 0.9):
            torch.cuda.empty_cache()
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out[str(fraction)] = autobatch(copy.deepcopy(model).train(), imgsz, fraction=fraction)
            out[f"{fraction}_s"] = round(time.perf_counter() - t0, 2)
    finally:
        torch.backends.cudnn.benchmark = benchmark_mode
    return out


def measure(work: Workload, sizes: Sizes, device: torch.device, deadline: H.Deadline
            ) -> tuple[list[H.Row], dict[str, Any]]:
    from pipeline_opt._core.step import ModelStateGuard, batch_size_of
    from pipeline_opt.profile.batch_size import max_batch_size, resize_batch, step_throughput
    from pipeline_opt.tune.measure import first_batch

    template = first_batch(work.loader)
    current = batch_size_of(template)

    def build(n: int) -> Any:
        return resize_batch(template, n)

    def timed(label: str, n: int) -> H.Row:
        with ModelStateGuard(work.model):
            rate = step_throughput(work.step, work.model, build(n), device, sizes.time_steps)
        return H.row_of(f"{work.name}: {label} (batch {n})", [rate], {"batch": n})

    rows = [timed("the loader's batch", current)]
    if device.type != "cuda":
        rows.append(H.not_run(f"{work.name}: max_batch_size, true limit, AutoBatch", "skipped",
                              f"needs CUDA (device is {device.type})"))
        return rows, {"current": current}
    t0 = time.perf_counter()
    advice = max_batch_size(work.loader, work.model, work.step, device, margin=sizes.margin, time_steps=0)
    advice_s = time.perf_counter() - t0
    limit = true_limit(work, build, current, device, sizes, deadline)
    summary: dict[str, Any] = {"current": current, "max_batch_size": {**advice.to_dict(), "seconds": advice_s},
                               "true_limit": limit}
    if work.autobatch_model is not None and not deadline.expired():
        try:
            summary["autobatch"] = autobatch_sizes(work.autobatch_model, sizes.imgsz, device)
        except Exception as exc:  # AutoBatch is a comparison, not the subject: keep the rest
            H.log.exception("AutoBatch failed")
            summary["autobatch"] = {"error": f"{type(exc).__name__}: {exc}"}
    true = limit["fits"]
    if true:
        summary["max_batch_size_predicted_vs_true_limit"] = advice.predicted / true
        summary["max_batch_size_verified_vs_true_limit"] = advice.verified / true if advice.verified else None
        for fraction in ("0.6", "0.9"):
            value = summary.get("autobatch", {}).get(fraction)
            if isinstance(value, int):
                summary[f"autobatch_{fraction}_vs_true_limit"] = value / true
    for label, n in (("max_batch_size's verified size", advice.verified), ("the true limit", true)):
        if n and n != current and not deadline.expired():
            rows.append(timed(label, n))
    return rows, summary


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = H.sizes_for(args, Sizes(), QUICK)
    device = H.pick_device(args.device)
    deadline = H.Deadline(sizes.budget_s)
    rows: list[H.Row] = []
    summary: dict[str, Any] = {"margin": sizes.margin}
    for make in (classification, yolo):
        try:
            work = make(sizes, device)
        except ImportError as exc:
            rows.append(H.not_run(make.__name__, "missing", str(exc)))
            continue
        try:
            got, summary[work.name] = measure(work, sizes, device, deadline)
            rows += got
        except Exception as exc:
            H.log.exception("%s failed", work.name)
            rows.append(H.not_run(work.name, "failed", f"{type(exc).__name__}: {exc}"))
        finally:
            work.close()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    path = H.write_result(args.out, NAME, rows, config={**asdict(sizes), "device": str(device)}, summary=summary,
                          started=started)
    print(H.format_table(rows, title=f"{NAME} ({device})"))
    return path


def main(argv: list[str] | None = None) -> int:
    args = H.common_parser(__doc__.splitlines()[0]).parse_args(argv)
    return H.main_of(args, run)


if __name__ == "__main__":
    raise SystemExit(main())
