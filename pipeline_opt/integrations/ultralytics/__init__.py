"""pipeline_opt for ultralytics YOLO: profile, tune and GPU-augment ``YOLO(...).train(...)``.

    from pipeline_opt.integrations.ultralytics import attach, prepare_offline_env
    prepare_offline_env()                 # before `import ultralytics` on a machine without network
    from ultralytics import YOLO

    model = YOLO("yolo11n.yaml")
    attach(model)                         # profile + tune + GPU augmentation where it measures faster
    model.train(data="data.yaml", epochs=100, imgsz=640, batch=64)
    # -> <save_dir>/pipeline_opt/: report.json, trace.json, report.html, tune/, integration.json

``PERF_BENCH=1`` with the integration attached runs the fixed short profile (``steps``, default
30, after the warm-up), saves the report and ends the process with status 0.

Trainer-free (benchmarks): :func:`build_yolo_pipeline` builds the dataset, InfiniteDataLoader,
DetectionModel and its loss step as the trainer would; :func:`profile_yolo` / :func:`tune_yolo`
run ``po.profile`` / ``po.autotune`` on it (:func:`tune_yolo` first measures the GPU augmentation
against the CPU stages, :func:`decide_yolo_augment`). ``pipeline-opt yolo`` is :func:`cli_main`.

Public: the names in ``__all__``. The underscore modules are internals; every touch of ultralytics'
own internals is in ``_internals.py``, gated on the tested version range.

ultralytics is imported only when a function needs it (the ``yolo`` extra).
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below load on first use: importing a private module stays cheap
    from pipeline_opt.integrations.ultralytics._attach import attach
    from pipeline_opt.integrations.ultralytics._callbacks import YoloIntegration
    from pipeline_opt.integrations.ultralytics._cli import cli_main
    from pipeline_opt.integrations.ultralytics._env import prepare_offline_env
    from pipeline_opt.integrations.ultralytics._internals import TESTED_RANGE
    from pipeline_opt.integrations.ultralytics._options import AttachOptions
    from pipeline_opt.integrations.ultralytics._pipeline import (
        YoloPipeline,
        YoloTuneResult,
        build_yolo_pipeline,
        decide_yolo_augment,
        profile_yolo,
        tune_yolo,
    )

_PUBLIC = {
    "TESTED_RANGE": "_internals", "AttachOptions": "_options", "YoloIntegration": "_callbacks",
    "YoloPipeline": "_pipeline", "YoloTuneResult": "_pipeline", "attach": "_attach",
    "build_yolo_pipeline": "_pipeline", "cli_main": "_cli", "decide_yolo_augment": "_pipeline",
    "prepare_offline_env": "_env", "profile_yolo": "_pipeline", "tune_yolo": "_pipeline",
}
__all__ = [
    "TESTED_RANGE",
    "AttachOptions",
    "YoloIntegration",
    "YoloPipeline",
    "YoloTuneResult",
    "attach",
    "build_yolo_pipeline",
    "cli_main",
    "decide_yolo_augment",
    "prepare_offline_env",
    "profile_yolo",
    "tune_yolo",
]

# Names this module exported before its internals became private: still importable, with a warning.
_PRIVATE = {
    "AugmentDecision": "_decide", "AugmentSwitch": "_decide", "decide_gpu_affine": "_decide",
    "decide_gpu_augment": "_decide", "DisabledStages": "_augment", "GpuAugmentedPreprocess": "_augment",
    "active_cpu_stages": "_augment", "disable_cpu_augment": "_augment", "restore_cpu_augment": "_augment",
    "TrainerStep": "_step", "YoloStep": "_step",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None and name in _PRIVATE:
        module = _PRIVATE[name]
        warnings.warn(f"pipeline_opt.integrations.ultralytics.{name} is internal and will be removed from this "
                      f"module; use attach() or the trainer-free functions", DeprecationWarning, stacklevel=2)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name in _PUBLIC:
        globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
