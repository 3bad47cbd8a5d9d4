"""Measuring: the main-process step profiler, the per-worker profiler, the trace merge, the diagnosis."""

from pipeline_opt.profile.api import LoopProfiler, profile, profile_loop
from pipeline_opt.profile.batch_size import BatchSizeAdvice, max_batch_size
from pipeline_opt.profile.collector import WorkerCollector
from pipeline_opt.profile.inloop import PerfBenchComplete
from pipeline_opt.profile.install import install_worker_profiling
from pipeline_opt.profile.report import BOTTLENECKS, OpStat, ProfileReport, StepRecord, WorkerStats

__all__ = [
    "BOTTLENECKS",
    "BatchSizeAdvice",
    "LoopProfiler",
    "OpStat",
    "PerfBenchComplete",
    "ProfileReport",
    "StepRecord",
    "WorkerCollector",
    "WorkerStats",
    "install_worker_profiling",
    "max_batch_size",
    "profile",
    "profile_loop",
]
