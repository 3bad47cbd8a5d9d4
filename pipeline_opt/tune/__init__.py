"""Deciding: resource budget, DataLoader cloning, the measured search with rollback."""

from pipeline_opt.tune.api import autotune
from pipeline_opt.tune.result import Trial, TuneResult

__all__ = ["Trial", "TuneResult", "autotune"]
