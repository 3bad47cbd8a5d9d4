"""Deciding: resource budget, the measured search with rollback, the tuned loader's result.

:func:`pipeline_opt.autotune` is the front door (:mod:`pipeline_opt.front_doors`, a layer above this one).
"""

import sys
import warnings
from typing import Any

from pipeline_opt.tune.result import Trial, TuneResult

__all__ = ["Trial", "TuneResult"]


def __getattr__(name: str) -> Any:
    """``pipeline_opt.tune.autotune``, deprecated: the front door is ``pipeline_opt.autotune`` (taken from the
    loaded front door; this package does not import the layer above it)."""
    front_doors = sys.modules.get("pipeline_opt.front_doors")
    if name == "autotune" and front_doors is not None:
        warnings.warn("pipeline_opt.tune.autotune is deprecated; use pipeline_opt.autotune", DeprecationWarning,
                      stacklevel=2)
        return front_doors.autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
