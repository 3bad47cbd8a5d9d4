"""The loop of ``po.profile``: :func:`run_loop` drives a :class:`StepProfiler` over a loader and a
training step until its window is done, restarting the loader at epoch ends."""

from __future__ import annotations

import gc
from typing import Any

import torch

from pipeline_opt._core.loader_errors import with_loader_hint
from pipeline_opt._core.progress import progress_bar
from pipeline_opt._core.step import move_to_device
from pipeline_opt.loading.dataloader import release_workers
from pipeline_opt.profile.main_profiler import StepProfiler
from pipeline_opt.profile.main_result import MainResult


def _starts_workers_after_cuda(loader: Any) -> bool:
    """Whether iterating ``loader`` starts worker processes while CUDA is initialised here.

    A forked worker inherits the cyclic garbage of this process; collecting a CUDA event or stream
    there aborts the worker ("CUDA error: initialization error"), so the
    garbage is collected before the workers start.
    """
    workers = getattr(loader, "num_workers", 0) or getattr(getattr(loader, "loader", None), "num_workers", 0)
    return bool(workers) and torch.cuda.is_available() and torch.cuda.is_initialized()


def run_loop(loader: Any, model: torch.nn.Module, step_fn: Any, device: torch.device, profiler: StepProfiler,
             progress: bool = False) -> tuple[MainResult, Any]:
    """Drive ``profiler`` over ``loader`` (restarting it at epoch ends) until its window is done.

    Returns the result and one batch of the measured window already on ``device`` (for the
    speed-of-light replay). Worker processes are shut down before returning, also on errors.
    """
    bar = progress_bar(total=profiler.total, desc="profiling", enabled=progress)
    iterator = None
    replay = None
    fresh = True
    try:
        profiler.start()
        while not profiler.done:
            if iterator is None:
                if _starts_workers_after_cuda(loader):
                    gc.collect()  # CUDA objects in cyclic garbage must not be collected in forked workers
                iterator = _hinted(iter, loader)
                profiler.new_epoch()
                fresh = True
            profiler.before_data()
            try:
                batch = _hinted(next, iterator)
            except StopIteration:
                profiler.abort_data()
                if fresh:
                    raise ValueError("the loader yielded no batch; profile a loader with at least one batch") from None
                iterator = None
                continue
            fresh = False
            profiler.after_data(batch)
            profiler.before_h2d()
            if device.type == "cuda":
                batch = move_to_device(batch, device)
            profiler.after_h2d()
            if replay is None and profiler.measuring:
                replay = batch
            profiler.before_step()
            step_fn(model, batch)
            profiler.after_step()
            bar.update()
        return profiler.result(), replay
    finally:
        profiler.stop()
        bar.close()
        release_workers(loader, iterator)


def _hinted(call, arg):
    """``call(arg)``; a common loader mistake's error is re-raised with its fix (:mod:`pipeline_opt._core.loader_errors`)."""
    try:
        return call(arg)
    except StopIteration:
        raise
    except Exception as exc:
        hinted = with_loader_hint(exc)
        if hinted is None:
            raise
        raise hinted from exc
