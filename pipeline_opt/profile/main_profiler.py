"""The main-process step profiler: data wait, host-to-device copy and compute of every step.

:class:`StepProfiler` is driven by hooks (``before_data`` / ``after_data`` / ``before_h2d`` /
``after_h2d`` / ``before_step`` / ``after_step``) so that :func:`run_loop` (``po.profile``) and the
in-loop profiler share it. It runs ``torch.profiler`` with a wait / warmup / active schedule whose
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
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, schedule

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.progress import progress_bar
from pipeline_opt._core.sched import thread_sched
from pipeline_opt._core.step import batch_size_of, move_to_device
from pipeline_opt.loading.dataloader import release_workers
from pipeline_opt.profile import trace as trace_mod
from pipeline_opt.profile.diagnosis import is_sync_op
from pipeline_opt.profile.memory import MemoryMeter
from pipeline_opt.profile.report import OpStat, StepRecord

log = get_logger("profile.main")

RANGE_NAMES = ("data_wait", "h2d", "step")
# Kineto's lowest severity above USDT: nothing of its own on stderr. Without it, every profile on a
# machine with no GPU ends with "ERROR: ... gpuGetDeviceCount failed with code 35" (Kineto asks the
# CUDA runtime for devices even when only CPU activities are recorded) and two start/stop lines.
KINETO_QUIET_LEVEL = "6"
DEFAULT_TRACE_STEPS: int | None = 10  # torch.profiler records the last 10 measured steps
MEMORY_TOP_OPS = 5  # ops named as the largest allocators in the memory section
_IGNORED_OP_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)", "pipeline_opt::")


@dataclass(frozen=True)
class BatchReceipt:
    """One batch the main thread took from the loader."""

    step: int  # loop step (0-based, skipped steps included)
    epoch: int
    position: int  # batch number within its epoch
    t_request_ns: int
    t_received_ns: int


@dataclass(frozen=True)
class MainResult:
    """What the main process measured."""

    steps: tuple[StepRecord, ...]
    window_s: float
    samples: int
    throughput: float
    receipts: tuple[BatchReceipt, ...]
    spans: tuple[tuple[str, int, int, int], ...]  # (name, step, t0_ns, t1_ns) on the main thread
    session_ns: tuple[int, int]
    window_ns: tuple[int, int]
    traced_steps: int  # measured steps torch.profiler recorded (the last ones of the window)
    traced_ns: tuple[int, int]  # the traced part of the window (0, 0 when nothing was traced)
    torch_events: tuple[dict[str, Any], ...]  # torch.profiler chrome events on the epoch-µs clock
    top_cpu_ops: tuple[OpStat, ...]
    top_cuda_ops: tuple[OpStat, ...]
    sync_s: float  # self CPU seconds in host-device sync / collective ops over the window
    sync_ops: tuple[str, ...]
    gpu_idle_frac: float | None
    cpu_s: float = 0.0  # CPU seconds of this process (every thread, no worker process) over the window
    memory: Any = None  # MemoryStats: CUDA peak memory per measured step (not measured on CPU)
    data_cpu_s: float = 0.0  # CPU seconds of this process (all threads) inside next(loader) over the window
    # seconds the training thread was runnable but waited for a core over the window; None: not measurable
    runqueue_s: float | None = None
    # seconds the training thread itself ran on a CPU over the window (its share of cpu_s); None: not measurable
    thread_cpu_s: float | None = None


@dataclass
class _Step:
    index: int
    t_request: int = 0
    t_received: int = 0
    t_h2d_end: int = 0
    t_step0: int = 0
    t_end: int = 0
    samples: int = 0
    events: list[Any] = field(default_factory=list)  # CUDA events: [before h2d, before step, after step]


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
        self._cur: _Step | None = None
        self._measured: list[_Step] = []
        self._traced_list: list[_Step] = []
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
        self._cur = _Step(self.index, t_request=time.time_ns())
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
        steps = self._step_records()
        window_s = max((self._window[1] - self._window[0]) / 1e9, 0.0) if self._window[0] else 0.0
        samples = sum(s.samples for s in steps)
        events, offset_ok = self._torch_events()
        sync_s, sync_ops = self._sync_time()
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
            top_cpu_ops=self._top_ops(by_cuda=False),
            top_cuda_ops=self._top_ops(by_cuda=True) if self.cuda else (),
            sync_s=sync_s,
            sync_ops=sync_ops,
            gpu_idle_frac=self._gpu_idle(events) if self.cuda and offset_ok else None,
            cpu_s=max(self._cpu[1] - self._cpu[0], 0.0) if self._window[0] else 0.0,
            data_cpu_s=self._data_cpu,
            runqueue_s=self._runqueue_s(),
            thread_cpu_s=self._thread_cpu_s(),
            memory=self._memory_stats(),
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

    def _memory_stats(self) -> Any:
        stats = self.memory.stats()
        if not stats.measured or self._key_averages is None:
            return stats
        rows = []
        for e in self._key_averages:
            allocated = int(getattr(e, "self_device_memory_usage", getattr(e, "self_cuda_memory_usage", 0)) or 0)
            if allocated > 0:
                rows.append((e.key, allocated))
        rows.sort(key=lambda r: r[1], reverse=True)
        return dataclasses.replace(stats, top_alloc_ops=tuple(rows[:MEMORY_TOP_OPS]))

    def _step_records(self) -> tuple[StepRecord, ...]:
        out = []
        epoch_of = {r.step: r.epoch for r in self._receipts}
        for k, s in enumerate(self._measured):
            nxt = self._measured[k + 1].t_request if k + 1 < len(self._measured) else self._window[1]
            if self.cuda and len(s.events) == 3:
                h2d = s.events[0].elapsed_time(s.events[1]) / 1e3
                compute = s.events[1].elapsed_time(s.events[2]) / 1e3
            else:
                h2d = (s.t_h2d_end - s.t_received) / 1e9 if s.t_h2d_end else 0.0
                compute = (s.t_end - s.t_step0) / 1e9
            out.append(StepRecord(
                index=s.index,
                data_wait_s=(s.t_received - s.t_request) / 1e9,
                h2d_s=h2d,
                compute_s=compute,
                step_s=max(nxt - s.t_request, 0) / 1e9,
                samples=s.samples,
                launch_s=(s.t_end - s.t_step0) / 1e9,
                epoch=epoch_of.get(s.index, 0),
            ))
        return tuple(out)

    def _torch_events(self) -> tuple[tuple[dict[str, Any], ...], bool]:
        if not self._trace:
            return (), False
        raw = self._trace.get("traceEvents", [])
        ours = [s.t_request / 1e3 for s in self._traced_list]
        offset = trace_mod.clock_offset_us(raw, ours, "data_wait", self._trace.get("baseTimeNanoseconds"))
        if offset is None:
            return (), False
        return tuple(trace_mod.rebase(raw, offset)), True

    def _gpu_idle(self, events: tuple[dict[str, Any], ...]) -> float | None:
        intervals = trace_mod.gpu_intervals(events)
        if not intervals:
            log.warning("the CUDA trace holds no kernels (CUPTI unavailable?); gpu_idle_frac is unknown")
            return None
        return trace_mod.idle_fraction(intervals, (self._traced[0] / 1e3, self._traced[1] / 1e3))

    def _op_rows(self) -> list[OpStat]:
        rows = []
        for e in self._key_averages or ():
            name = str(e.key)
            if name in RANGE_NAMES or name.startswith(_IGNORED_OP_PREFIXES):
                continue
            cuda_us = getattr(e, "self_device_time_total", None)
            if cuda_us is None:
                cuda_us = getattr(e, "self_cuda_time_total", 0.0)
            rows.append(OpStat(name=name, calls=int(e.count), self_cpu_s=e.self_cpu_time_total / 1e6,
                               self_cuda_s=float(cuda_us) / 1e6))
        return rows

    def _top_ops(self, by_cuda: bool) -> tuple[OpStat, ...]:
        rows = self._op_rows()
        if by_cuda:
            rows = [r for r in rows if r.self_cuda_s > 0]
            rows.sort(key=lambda r: -r.self_cuda_s)
        else:
            rows.sort(key=lambda r: -r.self_cpu_s)
        return tuple(rows[: self.top_k])

    def _sync_time(self) -> tuple[float, tuple[str, ...]]:
        rows = [r for r in self._op_rows() if is_sync_op(r.name)]
        rows.sort(key=lambda r: -r.self_cpu_s)
        return sum(r.self_cpu_s for r in rows), tuple(r.name for r in rows if r.self_cpu_s > 0)


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
                iterator = iter(loader)
                profiler.new_epoch()
                fresh = True
            profiler.before_data()
            try:
                batch = next(iterator)
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


def median(values: list[float]) -> float:
    """Median of ``values`` (0.0 when empty)."""
    return float(statistics.median(values)) if values else 0.0
