"""Front door of the profiler (placeholder until the profiler lands)."""

from __future__ import annotations


def profile(loader, model, step_fn=None, steps=30, warmup=5, device=None, **kwargs):
    """Profile ``loader`` feeding ``model``; returns a ProfileReport."""
    raise NotImplementedError("profiler not built yet")


class LoopProfiler:
    """In-loop profiler (placeholder)."""


def profile_loop(loader, **kwargs):
    raise NotImplementedError("profiler not built yet")
