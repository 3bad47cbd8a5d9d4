"""The main-process step profiler: data wait, host-to-device copy and compute of every step.

:class:`StepProfiler` is driven by hooks (``before_data`` / ``after_data`` / ``before_h2d`` /
``after_h2d`` / ``before_step`` / ``after_step``) so that
:func:`~pipeline_opt.profile.main_loop.run_loop` (``po.profile``) and the in-loop profiler share it. It runs ``torch.profiler`` with a wait / warmup / active schedule whose
active part follows the measured window: ``skip`` steps left out, ``steps`` measured steps (timed,
not traced), then one profiler warm-up step (it absorbs torch.profiler's start-up stall, which
would otherwise show as GPU idle time) and ``trace_steps`` traced steps (10 by default; None: as
many as ``steps``) for the op tables, the CUDA trace and the GPU idle fraction, with
``record_function`` ranges ``data_wait``, ``h2d`` and ``step``. torch.profiler's per-op records cost
a GPU-bound step a sizeable share of its time, so the reported throughput, step
times and data wait come from the untraced window only; ``trace_steps=0`` runs without
torch.profiler (no op tables, no CUDA trace, no GPU idle fraction). With ``tensorboard_dir`` the window's trace is also written there in the layout of
``torch.profiler.tensorboard_trace_handler`` (``<host>_<pid>.<ns>.pt.trace.json``).

Timing on CUDA never reads a host clock around asynchronous GPU work: the device is synchronised
at the two ends of the measured window (throughput = samples / synchronised wall time), and the
per-step ``h2d_s`` / ``compute_s`` are CUDA-event intervals read after the final synchronisation.
No synchronisation happens inside the window, so the CPU may run ahead of the GPU as it does in
training. ``data_wait_s`` is host time blocked in ``next(loader)`` (pure host work) and ``launch_s``
is the host time spent issuing the step. On CPU every interval is host time.

The window also records the CPU seconds of the training process (every thread: the main thread's
step, the pin-memory thread, torch's intra-op pool) and of the main thread inside ``next(loader)``:
the tuner's CPU budget reserves for the training process what it measurably uses, not a fixed
core per thread (:mod:`pipeline_opt.tune.budget`).

What the window's marks and torch.profiler's output turn into (step records, op tables, GPU idle
time) is :mod:`pipeline_opt.profile.main_analysis`; the result types are
:mod:`pipeline_opt.profile.main_result`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, schedule

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.sched import thread_sched
from pipeline_opt._core.step import batch_size_of
from pipeline_opt.profile.main_analysis import (
    MEMORY_TOP_OPS,
    RANGE_NAMES,
    StepMarks,
    gpu_idle,
    op_rows,
    step_records,
    sync_time,
    top_ops,
    torch_events,
    with_top_alloc_ops,
)
from pipeline_opt.profile.main_result import BatchReceipt, MainResult, median
from pipeline_opt.profile.memory import MemoryMeter

# BatchReceipt, MainResult and median (main_result), RANGE_NAMES and MEMORY_TOP_OPS (main_analysis) lived
# here and stay importable from here; run_loop is in main_loop, which imports this module
__all__ = ["DEFAULT_TRACE_STEPS", "KINETO_QUIET_LEVEL", "MEMORY_TOP_OPS", "RANGE_NAMES", "BatchReceipt", "MainResult",
           "StepProfiler", "median", "quiet_kineto_without_gpu", "validate_trace_steps"]

log = get_logger("profile.main")

# Kineto's lowest severity above USDT: nothing of its own on stderr. Without it, every profile on a
# machine with no GPU ends with "ERROR: ... gpuGetDeviceCount failed with code 35" (Kineto asks the
# CUDA runtime for devices even when only CPU activities are recorded) and two start/stop lines.
KINETO_QUIET_LEVEL = "6"
DEFAULT_TRACE_STEPS: int | None = 10  # torch.profiler records the last 10 measured steps


class StepProfiler:
    """Times steps on the main thread and drives torch.profiler over the measured window."""

    def __init__(self, device: torch.device | str, skip: int, steps: int, *, record_shapes: bool = False,
                 tensorboard_dir: str | os.PathLike | None = None, top_k: int = 10,
                 trace_steps: int | None = DEFAULT_TRACE_STEPS) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} must be an integer >= 1")
        if not isinstance(skip, int) or skip < 0:
            raise ValueError(f"skip={skip!r} must be an integer >= 0")
        validate_trace_steps(trace_steps)
        self.trace_steps = steps if trace_steps is None else trace_steps
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.skip, self.steps, self.top_k = skip, steps, top_k
        self.record_shapes = record_shapes
        self.tensorboard_dir = None if tensorboard_dir is None else str(tensorboard_dir)
        self.index = 0
        self._epoch, self._position = -1, 0
        self._prof: torch.profiler.profile | None = None
        self._range: Any = None
        self._cur: StepMarks | None = None
        self._measured: list[StepMarks] = []
        self._traced_list: list[StepMarks] = []
        self._receipts: list[BatchReceipt] = []
        self._spans: list[tuple[str, int, int, int]] = []
        self._session = [0, 0]
        self._window = [0, 0]
        self._traced = [0, 0]
        self._trace: dict[str, Any] | None = None
        self._key_averages: Any = None
        self._stopped = False
        self._cpu = [0.0, 0.0]  # process CPU seconds at the window's start and end
        self._sched: list[tuple[float, float] | None] = [None, None]  # the training thread's, same points
        # process CPU seconds inside next(loader), measured steps only: with num_workers=0 the batch is made
        # here, by the main thread and torch's intra-op threads (ToTensor, Normalize), and all of it is data work
        self._data_cpu = 0.0
        self._data_cpu0 = 0.0
        self.memory = MemoryMeter(self.device)  # per-step peaks: allocator counters, no synchronisation

    # -- state -----------------------------------------------------------------------------
    @property
    def window_end(self) -> int:
        """Loop index one past the last measured step."""
        return self.skip + self.steps

    @property
    def total(self) -> int:
        """Loop steps the session runs: skipped, measured, then (when tracing) warm-up and traced."""
        return self.window_end + (1 + self.trace_steps if self.trace_steps else 0)

    @property
    def done(self) -> bool:
        """True once the measured window is complete (or the profiler was stopped)."""
        return self._stopped or self.index >= self.total

    @property
    def measuring(self) -> bool:
        """True during the measured (timed, untraced) window."""
        return not self.done and self.skip <= self.index < self.window_end

    @property
    def measured_steps(self) -> int:
        """Steps of the measured window completed so far."""
        return len(self._measured)

    @property
    def trace_start(self) -> int:
        """Loop index of the first step torch.profiler records (after its warm-up step)."""
        return self.window_end + 1

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _open(self, name: str) -> None:
        self._range = record_function(name)
        self._range.__enter__()

    def _close(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def _event(self) -> None:
        if self.cuda and self.measuring and self._cur is not None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._cur.events.append(ev)

    # -- hooks -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the session (and torch.profiler, idle until the window's warm-up step)."""
        if self._prof is not None or self._stopped:
            return
        self._session[0] = time.time_ns()
        if self.trace_steps == 0:
            return
        quiet_kineto_without_gpu()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        sched = schedule(wait=self.window_end, warmup=1, active=self.trace_steps, repeat=1)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=sched,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.cuda,  # the ops that allocate most (traced steps only, after the window)
        )
        self._prof.start()

    def new_epoch(self) -> None:
        """The loader was (re)started: batch positions count from 0 again."""
        self._epoch += 1
        self._position = 0

    def before_data(self) -> None:
        if self.done:
            return
        if self.index == self.skip:
            self._sync()
            self._window[0] = time.time_ns()
            self._cpu[0] = time.process_time()
            self._sched[0] = thread_sched()
        if self.index == self.trace_start and self.trace_steps:
            self._sync()  # work queued before the trace began is not in it: drain it, or it reads as idle
            self._traced[0] = time.time_ns()
        self._cur = StepMarks(self.index, t_request=time.time_ns())
        if self.skip <= self.index < self.window_end:
            self.memory.begin()
        self._data_cpu0 = time.process_time()
        self._open("data_wait")

    def abort_data(self) -> None:
        """The loader ended instead of yielding (end of an epoch)."""
        if self.done or self._cur is None:
            return
        self._close()
        if self.index == self.skip:
            self._window[0] = 0
        if self.index == self.trace_start:
            self._traced[0] = 0
        self._cur = None

    def after_data(self, batch: Any) -> None:
        if self.done or self._cur is None:
            return
        self._close()
        cur = self._cur
        cur.t_received = time.time_ns()
        if self.skip <= cur.index < self.window_end:
            self._data_cpu += time.process_time() - self._data_cpu0
        cur.samples = batch_size_of(batch)
        self._receipts.append(BatchReceipt(cur.index, self._epoch, self._position, cur.t_request, cur.t_received))
        self._position += 1
        self._spans.append(("data_wait", cur.index, cur.t_request, cur.t_received))

    def before_h2d(self) -> None:
        if self.done or self._cur is None:
            return
        self._event()
        self._open("h2d")

    def after_h2d(self) -> None:
        if self.done or self._cur is None:
            return
        self._close()
        self._cur.t_h2d_end = time.time_ns()
        self._spans.append(("h2d", self._cur.index, self._cur.t_received, self._cur.t_h2d_end))

    def before_step(self) -> None:
        if self.done or self._cur is None:
            return
        if not self._cur.events:
            self._event()  # no h2d phase: the step starts where the copy would have
        self._event()
        self._cur.t_step0 = time.time_ns()
        self._open("step")

    def after_step(self) -> None:
        if self.done or self._cur is None:
            return
        self._close()
        cur = self._cur
        self._event()
        cur.t_end = time.time_ns()
        self._spans.append(("compute", cur.index, cur.t_step0, cur.t_end))
        if self.skip <= self.index < self.window_end:
            self._measured.append(cur)
            self.memory.end()
        elif self.index >= self.trace_start:
            self._traced_list.append(cur)
        if self.index == self.window_end - 1:
            self._sync()
            self._window[1] = time.time_ns()
            self._cpu[1] = time.process_time()
            self._sched[1] = thread_sched()
        if self.trace_steps and self.index == self.total - 1:
            self._sync()  # before prof.step() ends the trace: the traced steps' kernels must have run
            self._traced[1] = time.time_ns()
        self._cur = None
        self.index += 1
        if self._prof is not None:
            self._prof.step()
        if self.index >= self.total:
            self.stop()

    def stop(self) -> None:
        """End the session now; a partial window is reported as measured so far."""
        if self._stopped:
            return
        self._close()
        if self._window[0] and not self._window[1]:
            self._sync()
            self._window[1] = time.time_ns()
            self._cpu[1] = time.process_time()
            self._sched[1] = thread_sched()
        if self._traced[0] and not self._traced[1]:
            self._sync()
            self._traced[1] = time.time_ns()
        self._stopped = True
        if self._prof is not None:
            self._prof.stop()
        self._session[1] = time.time_ns()

    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        fd, path = tempfile.mkstemp(suffix=".json", prefix="pipeline_opt-trace-")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)  # a kineto trace can be saved once: read it, then copy it
            self._trace = json.loads(Path(path).read_text())
            if self.tensorboard_dir is not None:
                self._write_tensorboard(path)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("could not read torch.profiler's trace (%s); the timeline holds pipeline_opt spans only", exc)
        finally:
            Path(path).unlink(missing_ok=True)
        self._key_averages = prof.key_averages()

    def _write_tensorboard(self, trace_path: str) -> None:
        """Copy the trace into ``tensorboard_dir`` under the name ``tensorboard_trace_handler`` uses."""
        directory = Path(self.tensorboard_dir)
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}.pt.trace.json"
        shutil.copyfile(trace_path, directory / name)
        log.info("TensorBoard trace written to %s", directory / name)

    # -- results ---------------------------------------------------------------------------
    def result(self) -> MainResult:
        """The measurements (stops the session if still running)."""
        self.stop()
        steps = step_records(self._measured, self._receipts, self._window[1], self.cuda)
        window_s = max((self._window[1] - self._window[0]) / 1e9, 0.0) if self._window[0] else 0.0
        samples = sum(s.samples for s in steps)
        events, offset_ok = torch_events(self._trace, self._traced_list)
        ops = op_rows(self._key_averages)
        sync_s, sync_ops = sync_time(ops)
        return MainResult(
            steps=steps,
            window_s=window_s,
            samples=samples,
            throughput=samples / window_s if window_s > 0 else 0.0,
            receipts=tuple(self._receipts),
            spans=tuple(self._spans),
            session_ns=(self._session[0], self._session[1]),
            window_ns=(self._window[0], self._window[1]),
            traced_steps=len(self._traced_list) if self._trace is not None else 0,
            traced_ns=(self._traced[0], self._traced[1]),
            torch_events=events,
            top_cpu_ops=top_ops(ops, by_cuda=False, top_k=self.top_k),
            top_cuda_ops=top_ops(ops, by_cuda=True, top_k=self.top_k) if self.cuda else (),
            sync_s=sync_s,
            sync_ops=sync_ops,
            gpu_idle_frac=gpu_idle(events, self._traced) if self.cuda and offset_ok else None,
            cpu_s=max(self._cpu[1] - self._cpu[0], 0.0) if self._window[0] else 0.0,
            data_cpu_s=self._data_cpu,
            runqueue_s=self._runqueue_s(),
            thread_cpu_s=self._thread_cpu_s(),
            memory=with_top_alloc_ops(self.memory.stats(), self._key_averages),
        )

    def _runqueue_s(self) -> float | None:
        start, end = self._sched
        if not self._window[0] or start is None or end is None:
            return None
        return max(0.0, end[1] - start[1])

    def _thread_cpu_s(self) -> float | None:
        start, end = self._sched
        if not self._window[0] or start is None or end is None:
            return None
        return max(0.0, end[0] - start[0])


def quiet_kineto_without_gpu() -> None:
    """On a machine without CUDA, keep Kineto's own log lines off stderr (see ``KINETO_QUIET_LEVEL``).

    Kineto reads ``KINETO_LOG_LEVEL`` once, when the process's first profiler starts, so it is set
    before that; a value the user set is kept, and CUDA machines keep Kineto's messages (there they
    can name a real problem, e.g. CUPTI missing).
    """
    if "KINETO_LOG_LEVEL" in os.environ or torch.cuda.is_available():
        return
    os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET_LEVEL


def validate_trace_steps(trace_steps: object) -> None:
    """Raise ValueError unless ``trace_steps`` is None or an integer >= 0."""
    if trace_steps is not None and (isinstance(trace_steps, bool) or not isinstance(trace_steps, int)
                                    or trace_steps < 0):
        raise ValueError(f"trace_steps={trace_steps!r} must be None (trace every measured step) or an integer >= 0 "
                         "(0 = no torch.profiler)")


