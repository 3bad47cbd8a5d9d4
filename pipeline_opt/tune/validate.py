"""The tuner's argument checks: :func:`validate_arguments` and :func:`check_baseline`.

Each raises before any measurement, with a message that says what to pass instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt.profile.install import describe_loader
from pipeline_opt.profile.report import ProfileReport

BASELINE_KEYS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def check_baseline(baseline: Any, loader: DataLoader) -> None:
    """A ``baseline=`` report must be a profile of this loader as it is now."""
    if baseline is None:
        return
    if not isinstance(baseline, ProfileReport):
        raise TypeError(f"baseline must be the ProfileReport that po.profile returned for this loader, got "
                        f"{type(baseline).__name__}")

    now = describe_loader(loader)
    differ = [f"{k}={baseline.loader_config.get(k)!r} in the report, {now.get(k)!r} now" for k in BASELINE_KEYS
              if baseline.loader_config.get(k) != now.get(k)]
    if differ:
        raise ValueError(f"baseline= is a profile of another loader ({'; '.join(differ)}): profile this loader "
                         "with po.profile(loader, model) or leave baseline out")


def validate_arguments(loader, model, step_fn, time_budget_s, max_workers, seed, min_gain) -> None:
    """Raise TypeError / ValueError on an argument :func:`~pipeline_opt.tune.api.tune_loader` cannot use."""
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"autotune needs a torch.utils.data.DataLoader, got {type(loader).__name__}; pass the DataLoader "
            "your training loop iterates (for a DeviceLoader, its .loader)"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"autotune needs the model as a torch.nn.Module, got {type(model).__name__}; "
                        "pass the nn.Module that the training step runs")
    if step_fn is not None and not callable(step_fn):
        raise TypeError(f"step_fn must be callable as step_fn(model, batch), got {type(step_fn).__name__}")
    if isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float)) \
            or not math.isfinite(time_budget_s) or time_budget_s <= 0:
        raise ValueError(f"time_budget_s={time_budget_s!r} must be a finite number of seconds > 0 (e.g. 60)")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                    or max_workers < 1):
        raise ValueError(f"max_workers={max_workers!r} must be an integer >= 1 or None (no extra bound)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed={seed!r} must be an int or None")
    if not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
        raise ValueError(f"min_gain={min_gain!r} must be a fraction in [0, 1), e.g. 0.03")
    try:
        n = len(loader)
    except TypeError:
        return
    if n == 0:
        raise ValueError(f"the loader yields no batches (empty dataset of {type(loader.dataset).__name__} or "
                         "sampler); give autotune a loader with at least one batch")
