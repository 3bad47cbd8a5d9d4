"""pipeline_opt: find out why a PyTorch training job leaves its GPU idle, and fix the data side.

    import pipeline_opt as po
    report = po.profile(loader, model)          # where the time goes, and the bottleneck
    result = po.autotune(loader, model)         # a faster loader you can trust
    for batch in result.loader: ...
"""

from pipeline_opt import datasets, integrations, report, transforms
from pipeline_opt._core.log import enable_console_logging, get_logger
from pipeline_opt._version import __version__
from pipeline_opt.front_doors import autotune
from pipeline_opt.loading import DeviceLoader
from pipeline_opt.profile import (
    BatchSizeAdvice,
    LoopProfiler,
    OpStat,
    PerfBenchComplete,
    ProfileReport,
    StepRecord,
    WorkerStats,
    max_batch_size,
    profile,
    profile_loop,
)
from pipeline_opt.transforms import split_transforms
from pipeline_opt.tune import Trial, TuneResult

__all__ = [
    "BatchSizeAdvice",
    "DeviceLoader",
    "LoopProfiler",
    "OpStat",
    "PerfBenchComplete",
    "ProfileReport",
    "StepRecord",
    "Trial",
    "TuneResult",
    "WorkerStats",
    "__version__",
    "autotune",
    "datasets",
    "enable_console_logging",
    "get_logger",
    "integrations",
    "max_batch_size",
    "profile",
    "profile_loop",
    "report",
    "split_transforms",
    "transforms",
]
