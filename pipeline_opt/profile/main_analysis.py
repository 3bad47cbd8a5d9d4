"""The main-process window's analysis: the raw marks of each step and torch.profiler's output turned
into step records, op tables, the host-device sync time, the trace's events on the epoch clock,
the GPU idle fraction and the ops that allocated most. Pure functions of what
:class:`~pipeline_opt.profile.main_profiler.StepProfiler` recorded; they read no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.profile import trace as trace_mod
from pipeline_opt.profile.diagnosis import is_sync_op
from pipeline_opt.profile.main_result import BatchReceipt
from pipeline_opt.profile.memory import MemoryStats
from pipeline_opt.profile.report import OpStat, StepRecord

log = get_logger("profile.main")

RANGE_NAMES = ("data_wait", "h2d", "step")
MEMORY_TOP_OPS = 5  # ops named as the largest allocators in the memory section
_IGNORED_OP_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)", "pipeline_opt::")


@dataclass
class StepMarks:
    """The host clock marks (ns) and CUDA events of one loop step, filled in as the step runs."""

    index: int
    t_request: int = 0
    t_received: int = 0
    t_h2d_end: int = 0
    t_step0: int = 0
    t_end: int = 0
    samples: int = 0
    events: list[Any] = field(default_factory=list)  # CUDA events: [before h2d, before step, after step]


def step_records(measured: Sequence[StepMarks], receipts: Iterable[BatchReceipt], window_end_ns: int,
                 cuda: bool) -> tuple[StepRecord, ...]:
    """The measured window's steps: a step lasts until the next one requests its batch (the last one
    until the window's end); on CUDA the copy and compute times are the CUDA events' intervals."""
    out = []
    epoch_of = {r.step: r.epoch for r in receipts}
    for k, s in enumerate(measured):
        nxt = measured[k + 1].t_request if k + 1 < len(measured) else window_end_ns
        if cuda and len(s.events) == 3:
            h2d = s.events[0].elapsed_time(s.events[1]) / 1e3
            compute = s.events[1].elapsed_time(s.events[2]) / 1e3
        else:
            h2d = (s.t_h2d_end - s.t_received) / 1e9 if s.t_h2d_end else 0.0
            compute = (s.t_end - s.t_step0) / 1e9
        out.append(StepRecord(
            index=s.index,
            data_wait_s=(s.t_received - s.t_request) / 1e9,
            h2d_s=h2d,
            compute_s=compute,
            step_s=max(nxt - s.t_request, 0) / 1e9,
            samples=s.samples,
            launch_s=(s.t_end - s.t_step0) / 1e9,
            epoch=epoch_of.get(s.index, 0),
        ))
    return tuple(out)


def torch_events(trace: dict[str, Any] | None, traced: Sequence[StepMarks]) -> tuple[tuple[dict[str, Any], ...], bool]:
    """torch.profiler's chrome events moved onto the epoch-µs clock, and whether the clocks could be
    matched (on the traced steps' ``data_wait`` ranges); ``((), False)`` without a trace."""
    if not trace:
        return (), False
    raw = trace.get("traceEvents", [])
    ours = [s.t_request / 1e3 for s in traced]
    offset = trace_mod.clock_offset_us(raw, ours, "data_wait", trace.get("baseTimeNanoseconds"))
    if offset is None:
        return (), False
    return tuple(trace_mod.rebase(raw, offset)), True


def gpu_idle(events: tuple[dict[str, Any], ...], traced_ns: Sequence[int]) -> float | None:
    """The GPU's idle fraction over the traced part of the window; None when the trace holds no kernel."""
    intervals = trace_mod.gpu_intervals(events)
    if not intervals:
        log.warning("the CUDA trace holds no kernels (CUPTI unavailable?); gpu_idle_frac is unknown")
        return None
    return trace_mod.idle_fraction(intervals, (traced_ns[0] / 1e3, traced_ns[1] / 1e3))


def op_rows(key_averages: Any) -> list[OpStat]:
    """torch.profiler's ops (``prof.key_averages()``), without pipeline_opt's own ranges."""
    rows = []
    for e in key_averages or ():
        name = str(e.key)
        if name in RANGE_NAMES or name.startswith(_IGNORED_OP_PREFIXES):
            continue
        cuda_us = getattr(e, "self_device_time_total", None)
        if cuda_us is None:
            cuda_us = getattr(e, "self_cuda_time_total", 0.0)
        rows.append(OpStat(name=name, calls=int(e.count), self_cpu_s=e.self_cpu_time_total / 1e6,
                           self_cuda_s=float(cuda_us) / 1e6))
    return rows


def top_ops(rows: Iterable[OpStat], by_cuda: bool, top_k: int) -> tuple[OpStat, ...]:
    """The ``top_k`` ops by self CUDA time (those with some) or by self CPU time."""
    if by_cuda:
        ranked = sorted((r for r in rows if r.self_cuda_s > 0), key=lambda r: -r.self_cuda_s)
    else:
        ranked = sorted(rows, key=lambda r: -r.self_cpu_s)
    return tuple(ranked[:top_k])


def sync_time(rows: Iterable[OpStat]) -> tuple[float, tuple[str, ...]]:
    """Self CPU seconds in host-device sync / collective ops, and their names (the costliest first)."""
    synced = sorted((r for r in rows if is_sync_op(r.name)), key=lambda r: -r.self_cpu_s)
    return sum(r.self_cpu_s for r in synced), tuple(r.name for r in synced if r.self_cpu_s > 0)


def with_top_alloc_ops(stats: MemoryStats, key_averages: Any) -> MemoryStats:
    """``stats`` naming the :data:`MEMORY_TOP_OPS` ops that allocated most in the traced steps."""
    if not stats.measured or key_averages is None:
        return stats
    rows = []
    for e in key_averages:
        allocated = int(getattr(e, "self_device_memory_usage", getattr(e, "self_cuda_memory_usage", 0)) or 0)
        if allocated > 0:
            rows.append((e.key, allocated))
    rows.sort(key=lambda r: r[1], reverse=True)
    return dataclasses.replace(stats, top_alloc_ops=tuple(rows[:MEMORY_TOP_OPS]))
