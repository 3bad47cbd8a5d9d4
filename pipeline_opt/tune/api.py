"""Front door of the tuner (placeholder until the tuner lands)."""

from __future__ import annotations


def autotune(loader, model, step_fn=None, device=None, time_budget_s=60, gpu_transforms=True, **kwargs):
    """Tune ``loader`` for ``model``; returns a TuneResult."""
    raise NotImplementedError("tuner not built yet")
