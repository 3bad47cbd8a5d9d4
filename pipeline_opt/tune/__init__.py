"""Deciding: resource budget, DataLoader cloning, the measured search with rollback.

:func:`pipeline_opt.autotune` is the front door (:mod:`pipeline_opt.front_doors`); ``pipeline_opt.tune.autotune``
is the same function.
"""

from typing import Any

from pipeline_opt.tune.result import Trial, TuneResult

__all__ = ["Trial", "TuneResult", "autotune"]


def __getattr__(name: str) -> Any:
    if name == "autotune":
        from pipeline_opt.front_doors import autotune

        return autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
