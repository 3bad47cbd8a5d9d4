"""Install the worker profiler on a loader clone, and shut loader iterators down cleanly.

:func:`install_worker_profiling` is the reusable entry point (``po.profile``, the in-loop profiler
and the ultralytics integration use it): it never touches the user's loader; it returns a clone
(:func:`pipeline_opt.loading.dataloader.clone_loader`) whose dataset, collate function and
``worker_init_fn`` are the profiling proxies, and the :class:`WorkerCollector` that reads the
results. A ``DeviceLoader`` (anything with a DataLoader under ``.loader``) is re-wrapped around the
profiled clone with the same device, transforms and shared slots (the clone's workers get slots of
their own: what is profiled is the path that trains).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt.loading.dataloader import clone_loader, loader_config
from pipeline_opt.loading.device_loader import DeviceLoader
from pipeline_opt.loading.slot_collate import SlotCollate, with_own_pool
from pipeline_opt.profile import workers
from pipeline_opt.profile.collector import WorkerCollector


def unwrap_loader(loader: Any) -> tuple[DataLoader, Callable[[DataLoader], Any]]:
    """The DataLoader under ``loader`` and a function re-wrapping a clone of it the same way."""
    if isinstance(loader, DataLoader):
        return loader, lambda clone: clone
    inner = getattr(loader, "loader", None)
    if isinstance(inner, DataLoader):
        return inner, lambda clone: _rewrap(loader, clone)
    raise TypeError(
        f"expected a torch.utils.data.DataLoader (or a DeviceLoader wrapping one), got {type(loader).__name__}; "
        "pass the DataLoader that feeds the model"
    )


def _rewrap(outer: Any, clone: DataLoader) -> Any:
    """A wrapper like ``outer`` (same device / transform) around ``clone``."""
    if type(outer) is DeviceLoader:
        params = inspect.signature(DeviceLoader).parameters
        if params:  # every constructor argument the wrapper exposes as an attribute (device, transform...)
            kwargs = {k: getattr(outer, k) for k in list(params)[1:] if hasattr(outer, k)}
            try:
                return DeviceLoader(clone, **kwargs)
            except TypeError:
                pass
    wrapped = copy.copy(outer)
    wrapped.loader = clone
    return wrapped


def _own_slots(loader: DataLoader) -> Any:
    """``loader``'s collate function; a shared-slots one with a pool of its own, so the profiled
    clone's workers deliver through slots as the original's do without sharing theirs."""
    collate = loader.collate_fn
    if isinstance(collate, SlotCollate):
        return with_own_pool(collate, loader.multiprocessing_context)
    return collate


def install_worker_profiling(
    loader: Any, *, enabled: bool = True, flush_interval_s: float = 0.2
) -> tuple[Any, WorkerCollector]:
    """Return ``(profiled_loader, collector)``; ``loader`` itself is left untouched.

    With ``enabled=False`` the clone carries no proxies (same batches, no worker measurement) and
    the collector stays empty. Iterate ``profiled_loader`` exactly like the original; call
    ``collector.stats()`` for per-worker results and ``collector.close()`` when done.
    """
    inner, rewrap = unwrap_loader(loader)
    collector = WorkerCollector(flush_interval_s=flush_interval_s)
    if not enabled:
        return rewrap(clone_loader(inner)), collector
    sink = collector.sink
    clone = clone_loader(
        inner,
        dataset=workers.profiled_dataset(inner.dataset, sink),
        collate_fn=workers.ProfiledCollate(_own_slots(inner), sink),
        worker_init_fn=workers.ProfiledWorkerInit(inner.worker_init_fn, sink),
    )
    return rewrap(clone), collector


def thread_spans_of(loader: Any) -> tuple[tuple[str, int, int], ...]:
    """The preparing thread's spans of a profiled ``DeviceLoader(prepare_in_thread=True)`` (see
    :meth:`~pipeline_opt.loading.device_loader.DeviceLoader.thread_spans`); empty for any other loader."""
    spans = getattr(type(loader), "thread_spans", None)
    return spans(loader) if callable(spans) else ()


def skip_steps(warmup: int, config: dict[str, Any]) -> int:
    """Steps left out of the measurement: the warm-up, and at least the batches pre-filled by the
    workers before the first step (``num_workers * prefetch_factor``)."""
    prefilled = (config.get("num_workers") or 0) * (config.get("prefetch_factor") or 0)
    return max(warmup, prefilled)


def loop_skip_steps(warmup: int, steps: int, config: dict[str, Any], n_batches: int | None,
                    trace_steps: int = 0) -> int:
    """:func:`skip_steps` for a loop the profiler does not drive (it may run a single epoch).

    When ``skip_steps + steps`` (+ the profiler's warm-up step and one traced step when
    ``trace_steps``) exceeds the ``n_batches`` of one epoch, the pre-filled part of the skip is shortened so that the window (and a trace) still
    fit the first epoch (each new epoch pre-fills the queue again, so crossing into it gains
    nothing); it never goes below ``warmup``, the caller's explicit choice. ``n_batches=None`` (a
    loader without ``len``) keeps :func:`skip_steps`.
    """
    skip = skip_steps(warmup, config)
    need = steps + (2 if trace_steps else 0)
    if n_batches is None or skip + need <= n_batches:
        return skip
    return max(warmup, n_batches - need)


def epoch_trace_steps(trace_steps: int, skip: int, steps: int, n_batches: int | None) -> int:
    """``trace_steps`` shortened so that the traced steps stay in the epoch of the measured window: a
    new epoch restarts the workers (or pre-fills their queues again), which is not what the trace
    should show. When no batch of that epoch is left, the trace runs into the next epoch instead
    (a trace is better than none); a loader without ``len`` keeps ``trace_steps``.
    """
    if not trace_steps or n_batches is None:
        return trace_steps
    room = n_batches - (skip + steps) - 1  # the profiler's warm-up step comes first
    return min(trace_steps, room) if room >= 1 else trace_steps


def describe_loader(loader: Any) -> dict[str, Any]:
    """``loader_config`` plus the start method and the wrapper type (for the report)."""
    inner, _ = unwrap_loader(loader)
    config = loader_config(inner)
    ctx = inner.multiprocessing_context
    if inner.num_workers > 0:
        name = ctx.get_start_method() if ctx is not None else torch.multiprocessing.get_start_method()
        config["start_method"] = name
    if inner is not loader:
        config["wrapper"] = type(loader).__name__
    return config
