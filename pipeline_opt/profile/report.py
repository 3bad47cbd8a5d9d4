"""Result dataclasses of :func:`pipeline_opt.profile` (the API contract; fields may be added).

All results are frozen. ``to_dict()`` is JSON-serialisable; ``table()`` is the text summary;
``save(dir)`` writes report.json, summary.txt, trace.json (main process + every worker, one clock)
and report.html.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline_opt._core.render import render

BOTTLENECKS = ("data", "compute", "launch", "sync", "balanced")


@dataclass(frozen=True)
class WorkerStats:
    """What one DataLoader worker process (or the main process when num_workers=0) did."""

    worker_id: int  # -1 when the main process played the worker (num_workers=0)
    pid: int
    samples: int
    batches: int
    mean_sample_s: float  # wall seconds per sample in __getitem__ (incl. transforms)
    transform_s: dict[str, float]  # mean seconds per sample, per transform name
    collate_s: float  # total seconds in collate
    busy_s: float  # total wall seconds producing samples + collating
    cpu_percent: float  # CPU% of the worker process over its measured life (100 = one core)
    rss_bytes: int  # resident set size at the last report


@dataclass(frozen=True)
class StepRecord:
    """One measured training step (steady state)."""

    index: int
    data_wait_s: float  # main thread blocked in next(loader)
    h2d_s: float  # host-to-device copy (+ GPU transforms when the device loader does them)
    compute_s: float  # the step itself, synchronised
    step_s: float  # data_wait_s + h2d_s + compute_s (wall time between step starts)
    samples: int
    launch_s: float = 0.0  # host seconds the main thread spent issuing the step (= compute_s on CPU)
    epoch: int = 0  # the loader's epoch this step's batch came from (0: the first)


@dataclass(frozen=True)
class OpStat:
    """One row of torch.profiler key_averages()."""

    name: str
    calls: int
    self_cpu_s: float
    self_cuda_s: float


@dataclass(frozen=True)
class ProfileReport:
    """What :func:`pipeline_opt.profile` measured, and the diagnosis built on it."""

    throughput: float  # samples/s over the steady-state window
    step_time_s: float  # median step time
    data_wait_frac: float  # 0..1, share of step time blocked on the loader
    gpu_idle_frac: float | None  # 0..1 from the CUDA trace; None on CPU
    bottleneck: str  # one of BOTTLENECKS
    evidence: tuple[str, ...] = ()
    recommendations: tuple[str, ...] = ()
    workers: tuple[WorkerStats, ...] = ()
    collate_s: float = 0.0  # mean seconds of collate per batch
    batch_cpu_s: float = 0.0  # mean worker wall seconds to produce one batch (samples + collate)
    compute_time_s: float = 0.0  # median synchronised compute time per step
    limit_throughput: float | None = None  # same step on a device-resident replayed batch
    efficiency: float | None = None  # throughput / limit_throughput
    top_cpu_ops: tuple[OpStat, ...] = ()
    top_cuda_ops: tuple[OpStat, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    batch_size: int = 0
    device: str = "cpu"
    loader_config: dict[str, Any] = field(default_factory=dict)  # num_workers, pin_memory, ...
    environment: dict[str, Any] = field(default_factory=dict)  # torch version, cpu count, gpu name ...
    sync_frac: float = 0.0  # share of the window in host-device syncs / collectives (self CPU time)
    traced_steps: int = 0  # measured steps torch.profiler recorded (op tables, GPU idle, sync come from them)
    validation: Any = None  # ValidationInterference: the steps after validation passes (profile_loop, attach)
    memory: Any = None  # MemoryStats: peak CUDA memory per measured step, headroom ("not measured" on CPU)
    # CPU seconds per measured step of the training process outside making batches in its own main
    # thread (the step, the pin-memory thread, intra-op threads, receiving the workers' batches); 0: unknown
    main_cpu_s: float = 0.0
    # seconds per measured step the training thread was runnable but waited for a core (workers or other
    # processes holding them); None where the kernel does not report it
    main_runqueue_s: float | None = None
    # seconds per measured step the training thread itself ran on a CPU (a part of main_cpu_s; the
    # rest is the process's other threads); None where the kernel does not report it
    main_thread_cpu_s: float | None = None
    trace_events: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"bottleneck={self.bottleneck!r} is not one of {BOTTLENECKS}")

    def to_dict(self) -> dict[str, Any]:
        """Everything in the report except the raw trace events, JSON-serialisable."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "trace_events"}
        return json.loads(json.dumps(_plain(out)))

    def table(self) -> str:
        """The human-readable summary (also written as summary.txt)."""
        text = render("profile_table", self)
        if self.memory is not None:
            text += "\n\n" + "\n".join(self.memory.lines())
        if self.validation is not None:
            lines = [f"validation: {self.validation.summary}"]
            lines += [f"  - {r}" for r in self.validation.recommendations]
            text += "\n\n" + "\n".join(lines)
        return text

    def trace(self) -> dict[str, Any]:
        """The merged Chrome/Perfetto trace (main process and every worker on one clock)."""
        return {"traceEvents": list(self.trace_events), "displayTimeUnit": "ms"}

    def save(self, directory: str | Path) -> Path:
        """Write report.json, summary.txt, trace.json and report.html into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "report.json").write_text(json.dumps(self.to_dict(), indent=2))
        (d / "summary.txt").write_text(self.table() + "\n")
        (d / "trace.json").write_text(json.dumps(self.trace()))
        (d / "report.html").write_text(render("profile_html", self.to_dict()))
        return d


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "to_dict"):
            return value.to_dict()
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN -> null
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
