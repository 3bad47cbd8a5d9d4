"""What the main-process step profiler measured: :class:`MainResult`, with a :class:`BatchReceipt`
per batch taken from the loader (the trace merge matches them with the workers' batches)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from pipeline_opt.profile.report import OpStat, StepRecord


@dataclass(frozen=True)
class BatchReceipt:
    """One batch the main thread took from the loader."""

    step: int  # loop step (0-based, skipped steps included)
    epoch: int
    position: int  # batch number within its epoch
    t_request_ns: int
    t_received_ns: int


@dataclass(frozen=True)
class MainResult:
    """What the main process measured."""

    steps: tuple[StepRecord, ...]
    window_s: float
    samples: int
    throughput: float
    receipts: tuple[BatchReceipt, ...]
    spans: tuple[tuple[str, int, int, int], ...]  # (name, step, t0_ns, t1_ns) on the main thread
    session_ns: tuple[int, int]
    window_ns: tuple[int, int]
    traced_steps: int  # measured steps torch.profiler recorded (the last ones of the window)
    traced_ns: tuple[int, int]  # the traced part of the window (0, 0 when nothing was traced)
    torch_events: tuple[dict[str, Any], ...]  # torch.profiler chrome events on the epoch-µs clock
    top_cpu_ops: tuple[OpStat, ...]
    top_cuda_ops: tuple[OpStat, ...]
    sync_s: float  # self CPU seconds in host-device sync / collective ops over the window
    sync_ops: tuple[str, ...]
    gpu_idle_frac: float | None
    cpu_s: float = 0.0  # CPU seconds of this process (every thread, no worker process) over the window
    memory: Any = None  # MemoryStats: CUDA peak memory per measured step (not measured on CPU)
    data_cpu_s: float = 0.0  # CPU seconds of this process (all threads) inside next(loader) over the window
    # seconds the training thread was runnable but waited for a core over the window; None: not measurable
    runqueue_s: float | None = None
    # seconds the training thread itself ran on a CPU over the window (its share of cpu_s); None: not measurable
    thread_cpu_s: float | None = None


def median(values: list[float]) -> float:
    """Median of ``values`` (0.0 when empty)."""
    return float(statistics.median(values)) if values else 0.0
