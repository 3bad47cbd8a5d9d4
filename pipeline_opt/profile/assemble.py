"""Turn the main-process and worker measurements into a :class:`ProfileReport`.

Shared by ``po.profile`` and the in-loop profiler: medians and window shares, the per-worker
aggregates Little's law needs, the diagnosis and the merged trace.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from pipeline_opt.profile.collector import WorkerRecord
from pipeline_opt.profile.decode_advice import decode_advice
from pipeline_opt.profile.diagnosis import SETTING_SHARE, Measurements, diagnose, outside_share
from pipeline_opt.profile.main_result import MainResult, median
from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.profile.trace import build_trace


def usable_cpus() -> int:
    """Cores this process may run on (CPU affinity), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pillow_simd_installed() -> bool:
    """True when the installed PIL is Pillow-SIMD."""
    try:
        import PIL

        return importlib.metadata.version("pillow-simd") == PIL.__version__ and ".post" in PIL.__version__
    except (ImportError, importlib.metadata.PackageNotFoundError):
        return False


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and hardware the numbers were measured on."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "pillow_simd": pillow_simd_installed(),
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    try:
        import PIL

        env["pillow"] = PIL.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def model_facts(model: torch.nn.Module | None) -> tuple[str, bool]:
    """(parameter dtype name, whether the model has convolutions)."""
    if model is None:
        return "float32", False
    dtype = next((str(p.dtype).replace("torch.", "") for p in model.parameters()), "float32")
    has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    return dtype, has_conv


def _clamp(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def _main_cpu_per_step(main: MainResult, num_workers: int) -> float:
    """The training process's CPU seconds per measured step, less the main thread's CPU inside
    ``next(loader)`` when it makes the batches itself (``num_workers=0``: workers would take that)."""
    if not main.steps or main.cpu_s <= 0:
        return 0.0
    own = main.cpu_s - (main.data_cpu_s if num_workers == 0 else 0.0)
    return max(own, 0.0) / len(main.steps)


def _thread_cpu_per_step(main: MainResult) -> float | None:
    """Seconds per measured step the training thread itself ran on a CPU, or None (not measurable)."""
    if main.thread_cpu_s is None or not main.steps:
        return None
    return main.thread_cpu_s / len(main.steps)


def _runqueue_per_step(main: MainResult) -> float | None:
    """Seconds per measured step the training thread waited for a core, or None (not measurable)."""
    if main.runqueue_s is None or not main.steps:
        return None
    return main.runqueue_s / len(main.steps)


def build_report(main: MainResult, records: Sequence[WorkerRecord], *, loader_config: dict[str, Any],
                 device: torch.device, model: torch.nn.Module | None,
                 limit_throughput: float | None, dataset: Any = None,
                 thread_spans: Sequence[tuple[str, int, int]] = ()) -> ProfileReport:
    """The report for one profiling session (``dataset``: the loader or its dataset, for advice that
    names the dataset's own settings; ``thread_spans``: a DeviceLoader's preparing thread, for the trace)."""
    steps = main.steps
    if not steps:
        raise RuntimeError("no step was measured: run at least warm-up + 1 steps before asking for the report")
    window = main.window_s
    data_wait_frac = _clamp(sum(s.data_wait_s for s in steps) / window) if window > 0 else 0.0
    traced_s = max(main.traced_ns[1] - main.traced_ns[0], 0) / 1e9
    sync_frac = _clamp(main.sync_s / traced_s) if traced_s > 0 else 0.0  # op times cover the traced steps
    batches = sum(r.batches for r in records)
    samples = sum(r.samples for r in records)
    sample_ns = sum(r.sample_ns for r in records)
    collate_ns = sum(r.collate_ns for r in records)
    worker_batches = sum(r.batches for r in records if r.worker_id >= 0)  # unshared bytes are counted in workers
    unshared = sum(r.unshared_bytes for r in records) / worker_batches if worker_batches else 0.0
    transform_ns: dict[str, int] = {}
    for r in records:
        for name, ns in r.transform_ns.items():
            transform_ns[name] = transform_ns.get(name, 0) + ns
    transform_s = {k: v / samples / 1e9 for k, v in transform_ns.items()} if samples else {}
    sample_s = sample_ns / samples / 1e9 if samples else 0.0
    batch_cpu_s = (sample_ns + collate_ns) / batches / 1e9 if batches else 0.0
    step_time = median([s.step_s for s in steps])
    compute = median([s.compute_s for s in steps])
    throughput = main.throughput
    efficiency = throughput / limit_throughput if limit_throughput else None
    dtype, has_conv = model_facts(model)
    env = environment(device)
    num_workers = int(loader_config.get("num_workers") or 0)
    main_cpu_s = _main_cpu_per_step(main, num_workers)
    runqueue_s = _runqueue_per_step(main)
    measurements = Measurements(
        device_type=device.type,
        step_time_s=step_time,
        compute_time_s=compute,
        data_wait_frac=data_wait_frac,
        gpu_idle_frac=main.gpu_idle_frac,
        launch_time_s=median([s.launch_s for s in steps]),
        sync_frac=sync_frac,
        sync_ops=main.sync_ops,
        batch_cpu_s=batch_cpu_s,
        sample_s=sample_s,
        transform_s=transform_s,
        num_workers=num_workers,
        prefetch_factor=loader_config.get("prefetch_factor"),
        pin_memory=bool(loader_config.get("pin_memory")),
        persistent_workers=bool(loader_config.get("persistent_workers")),
        usable_cpus=env["usable_cpus"],
        pillow_simd=env["pillow_simd"],
        model_dtype=dtype,
        has_conv=has_conv,
        throughput=throughput,
        limit_throughput=limit_throughput,
        decode_advice=decode_advice(dataset) if (outside_share(sample_s, transform_s) or 0.0) >= SETTING_SHARE else "",
        unshared_batch_bytes=unshared,
        main_cpu_s=main_cpu_s or None,
        intra_op_threads=torch.get_num_threads(),
        main_runqueue_s=runqueue_s,
        main_runqueue_frac=_clamp(main.runqueue_s / window) if main.runqueue_s is not None and window > 0 else None,
        main_thread_cpu_s=_thread_cpu_per_step(main),
        window_step_s=window / len(steps) if window > 0 else None,
    )
    diagnosis = diagnose(measurements)
    trace_events = build_trace(main, records, main_pid=os.getpid(),
                               num_workers=num_workers, thread_spans=thread_spans)
    return ProfileReport(
        throughput=throughput,
        step_time_s=step_time,
        data_wait_frac=data_wait_frac,
        gpu_idle_frac=main.gpu_idle_frac,
        memory=main.memory,
        bottleneck=diagnosis.bottleneck,
        evidence=diagnosis.evidence,
        recommendations=diagnosis.recommendations,
        workers=tuple(r.stats() for r in records),
        collate_s=collate_ns / batches / 1e9 if batches else 0.0,
        batch_cpu_s=batch_cpu_s,
        compute_time_s=compute,
        limit_throughput=limit_throughput,
        efficiency=efficiency,
        top_cpu_ops=main.top_cpu_ops,
        top_cuda_ops=main.top_cuda_ops,
        steps=steps,
        batch_size=int(loader_config.get("batch_size") or (steps[0].samples if steps else 0)),
        device=str(device),
        loader_config=dict(loader_config),
        environment=env,
        sync_frac=sync_frac,
        traced_steps=main.traced_steps,
        main_cpu_s=main_cpu_s,
        main_runqueue_s=runqueue_s,
        main_thread_cpu_s=measurements.main_thread_cpu_s,
        trace_events=tuple(trace_events),
    )
