"""The speed-of-light: the same step replayed on one batch kept resident on the device.

No loader, no copy: what the step alone can sustain. ``efficiency = throughput / limit``. The
batch container is shallow-copied for each replay, so a step that rewrites ``batch["img"]`` in
place (ultralytics' ``preprocess_batch``) sees the original tensors every time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.autograd.profiler import record_function

from pipeline_opt._core.step import batch_size_of


def _fresh(batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return type(batch)(batch) if type(batch) is not dict else dict(batch)
    if isinstance(batch, list):
        return list(batch)
    return batch


def speed_of_light(model: torch.nn.Module, step_fn: Callable[[torch.nn.Module, Any], Any], batch: Any,
                   device: torch.device, iters: int = 10, warmup: int = 2) -> float:
    """Samples/s of ``step_fn`` replayed ``iters`` times on ``batch`` (already on ``device``)."""
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters={iters!r} must be >= 1 and warmup={warmup!r} >= 0")
    cuda = torch.device(device).type == "cuda"
    with record_function("pipeline_opt::speed_of_light"):
        for _ in range(warmup):
            step_fn(model, _fresh(batch))
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            step_fn(model, _fresh(batch))
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    return iters * batch_size_of(batch) / max(elapsed, 1e-12)
