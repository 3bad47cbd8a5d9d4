"""Attach step 3, profile: the measured window on the trainer's own steps, from its batch callbacks.

:func:`start_window` installs the profiled clone of the train loader (a recorder per worker) and a
step profiler; the batch callbacks call :func:`before_batch` / :func:`after_batch`, where the data wait
is the time from one batch's end to the next one's start and the step the time from batch start to
batch end (CUDA synchronised at the boundary when ``sync``). :func:`finish_window` builds and saves the
report (under DDP, rank 0 writes the ranks' combined profile); outside the window each step's CUDA
memory peak is kept per epoch. With ``PERF_BENCH=1`` the run ends once the report is saved.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._attach_summary import save_summary
from pipeline_opt.integrations.ultralytics._ddp import inner_model, write_combined_profile
from pipeline_opt.integrations.ultralytics._options import AttachOptions
from pipeline_opt.integrations.ultralytics._run import Run, epoch_batch_sizes, sized
from pipeline_opt.loading.dataloader import release_workers
from pipeline_opt.profile.assemble import build_report
from pipeline_opt.profile.inloop import PERF_BENCH_ENV, PerfBenchComplete, perf_bench_enabled
from pipeline_opt.profile.install import describe_loader, install_worker_profiling, skip_steps
from pipeline_opt.profile.main_profiler import StepProfiler

__all__ = ["after_batch", "before_batch", "close_window", "finish_window", "new_epoch", "start_window"]

log = get_logger("integrations.ultralytics")


def start_window(run: Run, opts: AttachOptions) -> None:
    """Put the profiled clone of the train loader in the trainer and start the step profiler."""
    t = run.trainer
    loader = t.train_loader
    run.loader_config = describe_loader(loader)
    run.batch_sizes = epoch_batch_sizes(loader)
    run.profiled_loader, run.collector = install_worker_profiling(loader)
    run.plain_loader = loader
    t.train_loader = run.profiled_loader
    run.profiler = StepProfiler(t.device, skip_steps(opts.warmup, run.loader_config), opts.steps,
                                trace_steps=opts.trace_steps)


def close_window(run: Run, restore_loader: bool) -> None:
    """Stop the profiled clone's workers and recorders (``restore_loader``: the plain loader goes back)."""
    t = run.trainer
    if restore_loader and run.profiled_loader is not None and t.train_loader is run.profiled_loader:
        t.train_loader = run.plain_loader
    if run.profiled_loader is not None:
        close = getattr(run.profiled_loader, "close", None)
        if callable(close):  # a framework's loader, a DeviceLoader
            close()
        else:  # a plain DataLoader (a trainer may use one): stop its workers now
            release_workers(run.profiled_loader)
        run.profiled_loader = None
    if run.collector is not None:
        run.collector.close()


def restart_window(run: Run, opts: AttachOptions) -> None:
    """The trainer rebuilt its loader during the window: profile the new one from the start."""
    if run.profiler is not None and run.report is None:
        close_window(run, restore_loader=False)
        run.profiler = None
        start_window(run, opts)


def new_epoch(run: Run) -> None:
    """An epoch starts inside the window: its first wait for data is measured from here."""
    prof = run.profiler
    prof.abort_data()
    prof.start()
    prof.new_epoch()
    run.position = 0
    prof.before_data()


def before_batch(run: Run) -> None:
    """A batch arrived (the trainer's batch start): the wait for it ends, its step begins."""
    if run.batch_end is not None:  # the loop's wait for this batch (and its bookkeeping)
        run.validation.data_wait(time.perf_counter() - run.batch_end)
    if not run.profiling:
        run.memory.begin()  # the profile window measures its own steps' peaks
        return
    sizes = run.batch_sizes
    n = sizes[run.position] if run.position < len(sizes) else (sizes[-1] if sizes else 1)
    run.profiler.after_data(sized(n))
    run.profiler.before_step()


def after_batch(run: Run, opts: AttachOptions) -> None:
    """A step ended (the trainer's batch end): timed in the window, its memory peak kept outside it."""
    run.validation.step_end()
    run.batch_end = time.perf_counter()
    if not run.profiling:
        if run.memory.active:
            run.memory.end()
            peak = run.memory.allocated.pop()  # kept per epoch only: training may run for days
            run.memory.reserved.pop()
            epoch = int(getattr(run.trainer, "epoch", 0) or 0)
            run.epoch_peaks[epoch] = max(run.epoch_peaks.get(epoch, 0), peak)
        return
    prof = run.profiler
    if opts.sync and prof.cuda:
        torch.cuda.synchronize(prof.device)
    prof.after_step()
    run.position += 1
    if prof.done:
        finish_window(run, opts)
    elif run.position < len(run.batch_sizes):
        prof.before_data()


def finish_window(run: Run, opts: AttachOptions) -> None:
    """Build the report of the window and save it; with ``PERF_BENCH=1``, end the run."""
    t = run.trainer
    main = run.profiler.result()
    run.report = build_report(main, run.collector.read(), loader_config=run.loader_config, device=t.device,
                              model=inner_model(t.model), limit_throughput=None,
                              dataset=getattr(t, "train_loader", None))
    if run.rank is None:
        run.report.save(run.out_dir)
    else:  # a collective: every rank ends its window at the same step
        write_combined_profile(run.report, run.root_dir, run.rank)
    save_summary(run, opts)
    log.info("pipeline_opt: profiled %d training steps: %.1f img/s, data wait %.0f%%, bottleneck %s; "
             "report in %s", len(run.report.steps), run.report.throughput, 100 * run.report.data_wait_frac,
             run.report.bottleneck, run.out_dir)
    if perf_bench_enabled():
        close_window(run, restore_loader=True)
        for loader in (t.train_loader, getattr(t, "test_loader", None)):
            if hasattr(loader, "close"):
                loader.close()
        log.warning("%s=1: profiled %d steps; report saved to %s; exiting with status 0", PERF_BENCH_ENV,
                    len(run.report.steps), run.out_dir.resolve())
        raise PerfBenchComplete(run.out_dir)


def end_of_training(run: Run, opts: AttachOptions) -> None:
    """Training ended: a window cut short is reported as far as it got."""
    if not run.profiling:
        return
    measured = run.profiler.measured_steps
    if measured > 0:
        log.warning("pipeline_opt: training ended after %d of %d profiled steps; reporting those",
                    measured, opts.steps)
        run.notes.append(f"profile window cut short by the end of training: {measured} of {opts.steps} steps")
        finish_window(run, opts)
    else:
        log.warning("pipeline_opt: training ended before the profile window started (%d steps skipped "
                    "first); no profile report. Train longer or lower warmup=", run.profiler.skip)
        run.notes.append("no profile: training ended before the measured window started")
        run.profiler.stop()


def validation_end(run: Run) -> Any:
    """A validation pass ended: the next wait for data is measured from here; what it did to the steps."""
    run.batch_end = time.perf_counter()
    found = run.validation_analysis()
    if found is not None:
        log.info("pipeline_opt: validation: %s", found.summary)
    return found
