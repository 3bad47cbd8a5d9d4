"""Front door of the profiler: ``po.profile(loader, model)`` and ``po.profile_loop(loader)``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import CheckedStep, ModelStateGuard, resolve_device
from pipeline_opt.profile.assemble import build_report
from pipeline_opt.profile.inloop import LoopProfiler, _epoch_length, profile_loop
from pipeline_opt.profile.install import (
    describe_loader,
    epoch_trace_steps,
    install_worker_profiling,
    skip_steps,
    thread_spans_of,
)
from pipeline_opt.profile.limit import speed_of_light
from pipeline_opt.profile.main_loop import run_loop
from pipeline_opt.profile.main_profiler import DEFAULT_TRACE_STEPS, StepProfiler, validate_trace_steps
from pipeline_opt.profile.report import ProfileReport

__all__ = ["LoopProfiler", "profile", "profile_loop"]

log = get_logger("profile")

_LIMIT_ITERS = 10


def _validate(steps: Any, warmup: Any, model: Any, step_fn: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if step_fn is not None and not callable(step_fn):
        raise TypeError(f"step_fn must be callable as step_fn(model, batch), got {type(step_fn).__name__}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")


def profile(
    loader: Any,
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
    steps: int = 30,
    warmup: int = 5,
    device: torch.device | str | None = None,
    worker_profiling: bool = True,
    limit: bool = True,
    record_shapes: bool = False,
    tensorboard_dir: str | os.PathLike | None = None,
    progress: bool = False,
    trace_steps: int | None = DEFAULT_TRACE_STEPS,
) -> ProfileReport:
    """Profile ``loader`` feeding ``model`` and diagnose the bottleneck.

    Args:
        loader: a ``torch.utils.data.DataLoader`` (ultralytics' ``InfiniteDataLoader`` included) or a
            ``DeviceLoader`` wrapping one. It is not modified and not iterated: a clone with the
            worker-profiling proxies is.
        model: the model; its parameters, buffers, gradients, modes and the RNG states are restored
            bitwise afterwards (the optimizer is never called by the default step).
        step_fn: ``step_fn(model, batch)``, the training step; default: forward + backward on the
            batch's images (:func:`pipeline_opt._core.step.default_step`). On CUDA the batch's tensors are
            moved to the device (``non_blocking``) before the step. A step_fn that returns the loss
            without calling backward gets ``loss.backward()`` run after it. The first step is a check
            (:func:`pipeline_opt._core.step.validate_step`): a model on the meta device, images of another
            dtype or device than the model, or a step that neither runs backward nor returns a loss
            raise an error naming the value and the fix.
        steps: measured steps; warmup: steps left out first (at least ``num_workers *
            prefetch_factor`` are, since those batches were pre-filled).
        device: where the step runs (default: the model's device).
        worker_profiling: time samples / transforms / collate inside the worker processes.
        limit: also replay one device-resident batch through the step (``limit_throughput``).
        record_shapes: passed to torch.profiler (costly; off for routine checks).
        tensorboard_dir: also write torch.profiler's TensorBoard trace there.
        progress: draw a progress bar on a terminal.
        trace_steps: steps torch.profiler records after the measured window, for the op tables, the CUDA trace and the GPU idle fraction. Tracing costs per
            op (a sizeable share of a GPU-bound step), so the throughput, step times and
            data wait come from the untraced window. None: as many as ``steps``; 0: no
            torch.profiler. Shortened to stay within the window's epoch when the loader has a length.

    Returns:
        A :class:`ProfileReport`; ``report.save(dir)`` writes report.json, summary.txt, trace.json
        (main process and every worker on one clock) and report.html.
    """
    _validate(steps, warmup, model, step_fn)
    validate_trace_steps(trace_steps)
    dev = resolve_device(model, device)
    step = CheckedStep(step_fn, dev)  # the first step, before the measured window, validates it (clear errors)
    config = describe_loader(loader)
    skip = skip_steps(warmup, config)
    trace_steps = steps if trace_steps is None else trace_steps
    trace_steps = epoch_trace_steps(trace_steps, skip, steps, _epoch_length(loader))
    profiled, collector = install_worker_profiling(loader, enabled=worker_profiling)
    try:
        with ModelStateGuard(model):
            profiler = StepProfiler(dev, skip, steps, record_shapes=record_shapes, tensorboard_dir=tensorboard_dir,
                                    trace_steps=trace_steps)
            main, replay = run_loop(profiled, model, step, dev, profiler, progress=progress)
            limit_tp = None
            if limit and replay is not None:
                limit_tp = speed_of_light(model, step, replay, dev, iters=max(3, min(_LIMIT_ITERS, steps)))
            del replay
        collector.close()
        report = build_report(main, collector.read(), loader_config=config, device=dev, model=model,
                              limit_throughput=limit_tp, dataset=loader, thread_spans=thread_spans_of(profiled))
    finally:
        collector.close()
    log.info("profiled %d steps: %.1f samples/s, bottleneck %s", len(report.steps), report.throughput,
             report.bottleneck)
    return report
