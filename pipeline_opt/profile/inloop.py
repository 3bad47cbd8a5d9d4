"""The in-loop profiler: measure the user's own training loop.

    prof = po.profile_loop(loader, model=model)
    for epoch in range(epochs):
        for batch in prof:          # instead of `for batch in loader`
            train_step(batch)
            prof.step()             # end of the step (optional: asking for the next batch also ends it)
    report = prof.report()
    prof.close()                    # or use `with po.profile_loop(...) as prof:`

The loader is not modified: ``prof`` iterates a profiled clone of it (same batches, same order).
After ``warmup`` (and the prefetched batches) ``steps`` steps are measured, then ``trace_steps``
steps are traced by torch.profiler; afterwards the loop runs on with negligible overhead. The skip of prefetched batches is shortened (never below ``warmup``)
when the window would not otherwise fit one epoch of the loader. Given ``output_dir``, the report is
saved there once the window is measured (or at ``close()``, partial, when the loop ends first). With the environment variable ``PERF_BENCH=1``, ``step()`` ends the
process once the window is complete: it saves the report to ``output_dir`` (default
``./pipeline_opt_perf_bench``), logs where, shuts the workers down and raises
:class:`PerfBenchComplete` (a ``SystemExit`` with status 0), so an unchanged training script produces
a standard report and its interpreter exits with status 0. Call ``step()`` from the training loop
itself (the main thread) for it to end the process; ``except Exception`` blocks do not catch it, and a
script that wants to go on catches ``PerfBenchComplete``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import resolve_device
from pipeline_opt.loading.dataloader import release_workers
from pipeline_opt.profile.assemble import build_report
from pipeline_opt.profile.install import (
    describe_loader,
    epoch_trace_steps,
    install_worker_profiling,
    loop_skip_steps,
    skip_steps,
    thread_spans_of,
)
from pipeline_opt.profile.main_profiler import DEFAULT_TRACE_STEPS, StepProfiler, validate_trace_steps
from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.profile.validation import ValidationInterference, ValidationRecorder

log = get_logger("profile.inloop")

PERF_BENCH_ENV = "PERF_BENCH"
DEFAULT_BENCH_DIR = "pipeline_opt_perf_bench"


class PerfBenchComplete(SystemExit):
    """``PERF_BENCH=1``: the fixed profile is measured and saved; raised to end the training script
    with status 0 (the library itself never exits the process). ``report_dir`` is where it was saved."""

    def __init__(self, report_dir: Path) -> None:
        super().__init__(0)
        self.report_dir = report_dir


def perf_bench_enabled() -> bool:
    """True when ``PERF_BENCH=1`` is set."""
    return os.environ.get(PERF_BENCH_ENV, "").strip() == "1"


class LoopProfiler:
    """Iterate it instead of the loader; call :meth:`step` after each training step."""

    def __init__(self, loader: Any, model: torch.nn.Module | None = None, steps: int = 30, warmup: int = 5,
                 device: torch.device | str | None = None, output_dir: str | os.PathLike | None = None,
                 worker_profiling: bool = True, record_shapes: bool = False,
                 tensorboard_dir: str | os.PathLike | None = None,
                 trace_steps: int | None = DEFAULT_TRACE_STEPS) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps={steps!r} must be an integer >= 1")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
        validate_trace_steps(trace_steps)
        if model is not None:
            self.device = resolve_device(model, device)
        elif device is not None:
            self.device = torch.device(device)
        else:
            self.device = torch.device("cpu")
        self._explicit_device = model is not None or device is not None
        self.model = model
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.config = describe_loader(loader)
        n_batches = _epoch_length(loader)
        trace_steps = steps if trace_steps is None else trace_steps
        skip = loop_skip_steps(warmup, steps, self.config, n_batches, trace_steps)
        if skip < skip_steps(warmup, self.config):
            log.info("the loader has %d batches per epoch: skipping %d steps instead of %d so that the %d measured "
                     "steps fit one epoch (some of them may take batches pre-filled by the workers)",
                     n_batches, skip, skip_steps(warmup, self.config), steps)
        trace_steps = epoch_trace_steps(trace_steps, skip, steps, n_batches)
        self._profiler = StepProfiler(self.device, skip, steps,
                                      record_shapes=record_shapes, tensorboard_dir=tensorboard_dir,
                                      trace_steps=trace_steps)
        self._loader, self._collector = install_worker_profiling(loader, enabled=worker_profiling)
        self._batches: Any = None
        self._in_step = False
        self._report: ProfileReport | None = None
        self._closed = False
        self._saved: Path | None = None  # where the report was saved (output_dir), once
        self._warned_device = False
        self._epoch_batches = n_batches
        self._validation = ValidationRecorder(warmup_steps=max(warmup, 1))

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def loader(self) -> Any:
        """The profiled clone being iterated."""
        return self._loader

    def __iter__(self):
        if self._closed:
            raise RuntimeError("this LoopProfiler is closed; create a new one with po.profile_loop(loader)")
        prof = self._profiler
        prof.start()
        prof.new_epoch()
        self._batches = iterator = iter(self._loader)
        while True:
            if self._in_step:
                self.step()
            prof.before_data()
            waited = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                prof.abort_data()
                return
            self._validation.data_wait(time.perf_counter() - waited)
            prof.after_data(batch)
            prof.before_step()
            self._in_step = True
            yield batch

    def step(self) -> None:
        """Mark the end of the current training step."""
        if not self._in_step:
            return
        self._in_step = False
        self._validation.step_end()
        if not self._explicit_device and not self._warned_device and torch.cuda.is_initialized():
            self._warned_device = True
            log.warning("CUDA is in use but profile_loop got neither model= nor device=: step times are host "
                        "clocks without CUDA synchronisation; pass model=... or device='cuda'")
        was_done = self._profiler.done
        self._profiler.after_step()
        if not was_done and self._profiler.done:
            if perf_bench_enabled():
                self._bench_exit()
            elif self.output_dir is not None:
                self._save(self.output_dir)

    @contextlib.contextmanager
    def validation(self) -> Iterator[None]:
        """Mark a validation pass: ``with prof.validation(): validate(model)``.

        The training steps after each pass are compared with the steady ones
        (:meth:`validation_report`, and the ``validation`` section of :meth:`report`); the pass's
        main-thread CPU hotspots are recorded with ``cProfile`` (a few percent slower while it runs).
        """
        if self._in_step:
            self.step()  # the training step before the pass ends here
        self._validation.validation_start()
        try:
            yield
        finally:
            self._validation.validation_end()

    def validation_report(self) -> ValidationInterference | None:
        """The steps after the validation passes against the steady steps (None before a pass has
        training steps after it)."""
        return self._validation.analyse(self._epoch_batches)

    def report(self) -> ProfileReport:
        """The report of the measured window (ends the measurement if it is still running), with the
        validation passes marked so far (:meth:`validation`)."""
        if self._report is None:
            main = self._profiler.result()
            if len(main.steps) < self._profiler.steps:
                log.warning("the loop ended after %d of the %d measured steps (the first %d steps are skipped): "
                            "the report covers a partial window; run more steps or pass a smaller steps=/warmup=",
                            len(main.steps), self._profiler.steps, self._profiler.skip)
            records = self._collector.read()
            self._report = build_report(main, records, loader_config=self.config, device=self.device,
                                        model=self.model, limit_throughput=None,
                                        dataset=self._loader, thread_spans=thread_spans_of(self._loader))
        validation = self.validation_report()
        if validation is not None:
            return dataclasses.replace(self._report, validation=validation)
        return self._report

    def close(self) -> None:
        """Stop measuring, shut down the clone's workers and remove the worker files (idempotent)."""
        if self._closed:
            return
        if self.output_dir is not None and self._saved is None and self._profiler.measured_steps:
            self._save(self.output_dir)  # the loop ended before the window did: the partial report
        self._profiler.stop()
        release_workers(self._loader, self._batches)
        self._batches = None
        self._collector.close()
        self._closed = True

    def _bench_exit(self) -> None:
        directory = self.output_dir if self.output_dir is not None else Path.cwd() / DEFAULT_BENCH_DIR
        report = self._save(directory)
        self.close()
        log.warning("%s=1: profiled %d steps (%.1f samples/s, bottleneck %s); report saved to %s; exiting with "
                    "status 0", PERF_BENCH_ENV, len(report.steps), report.throughput, report.bottleneck,
                    directory.resolve())
        raise PerfBenchComplete(directory)

    def _save(self, directory: Path) -> ProfileReport:
        report = self.report()
        report.save(directory)
        self._saved = directory
        log.info("profile_loop: report of %d steps saved to %s", len(report.steps), directory.resolve())
        return report

    def __enter__(self) -> LoopProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _epoch_length(loader: Any) -> int | None:
    """Batches per epoch, or None for a loader without ``len`` (an IterableDataset without one)."""
    try:
        return len(loader)
    except TypeError:
        return None


def profile_loop(loader: Any, model: torch.nn.Module | None = None, steps: int = 30, warmup: int = 5,
                 device: torch.device | str | None = None, output_dir: str | os.PathLike | None = None,
                 **kwargs: Any) -> LoopProfiler:
    """A :class:`LoopProfiler` over ``loader`` (see the module docstring; honours ``PERF_BENCH=1``).

    ``model`` (or ``device``) tells it where the step runs, so CUDA time is synchronised;
    ``output_dir`` gets the report (report.json, summary.txt, trace.json, report.html) once the
    window is measured; extra
    keyword arguments: ``worker_profiling``, ``record_shapes``, ``tensorboard_dir``, ``trace_steps`` (see
    :func:`pipeline_opt.profile`).
    """
    return LoopProfiler(loader, model=model, steps=steps, warmup=warmup, device=device,
                        output_dir=output_dir, **kwargs)
