"""Steady-state, end-to-end throughput of one candidate loader feeding the user's training step.

A trial starts the loader's workers, discards the first ``max(warmup, num_workers)`` batches (the
start-up, and the burst of one batch per worker that was ready when the first one arrived), then
times ``windows`` windows of ``steps`` training steps each, synchronising the device at every
window boundary. Epochs are chained, so a short dataset pays its worker restarts like a real
training run does, and every window pays them in proportion to its steps (:func:`epoch_charged`):
an epoch start's extra wait (worker start-up unless persistent, then refilling the empty pipeline:
:func:`restart_extra`) is taken out of the window it fell in and ``steps / batches_per_epoch``
restarts are charged to every window instead. Without that, on a 4-batch epoch two of three short
windows miss the restart and their median hides it: persistent workers could never win, and a
candidate with fewer workers (shorter windows of whole worker rounds) read faster than one with more.
Every trial ends with its worker processes shut down; a worker that died or
hung (the trial loader carries a DataLoader ``timeout``) fails the trial with a
:class:`TrialFailed` instead of hanging the tuner. A window that still holds a restart's
refill is marked (``Measurement.startup_windows``) and left out of the noise estimate. The caller
protects the model's state (:class:`pipeline_opt._core.step.ModelStateGuard`); nothing here touches an
optimizer.
"""

from __future__ import annotations

import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import batch_size_of, move_to_device
from pipeline_opt.loading.dataloader import (
    batches_per_epoch,
    continuous,
    num_workers_of,
    persistent_of,
    release_workers,
)
from pipeline_opt.tune import timing

log = get_logger("tune.measure")

CHILD_GRACE_S = 5.0  # how long finished workers get to exit before they are killed


@dataclass(frozen=True)
class Measurement:
    """Throughput (samples/s) of each repeat window of one trial."""

    windows: tuple[float, ...]
    steps_per_window: int
    batch_size: int
    startup_s: float  # from creating the iterator to the first batch
    elapsed_s: float  # the whole trial, shutdown included
    compute_s: float = 0.0  # median synchronised seconds inside step_fn, over the discarded warm-up steps
    from_profile: bool = False  # windows of a profile's steps, not of a trial (see Search.evidence)
    startup_windows: tuple[int, ...] = ()  # indices of windows holding a worker (re)start: not steady state
    batches_per_epoch: int | None = None  # None: the loader has no length (no restart charged)
    restart_s: float = 0.0  # extra seconds a new epoch cost (measured, or estimated from the start-up)
    restarts_seen: int = 0  # epoch starts inside the trial that measured restart_s

    @property
    def outlier_windows(self) -> tuple[int, ...]:
        """:attr:`startup_windows`, unless every window holds a restart (windows of whole short epochs,
        each charged the same restart): then they are alike, and none is left out of the noise. A
        profile's windows on the queue its workers pre-filled stay out (they are not alike)."""
        alike = not self.from_profile and len(set(self.startup_windows)) >= len(self.windows)
        return () if alike else self.startup_windows

    @property
    def steady_windows(self) -> tuple[float, ...]:
        """The windows without a worker (re)start in them: what the noise is measured on. When every
        window holds one (windows of whole short epochs, each charged the same restart), they are alike
        and all of them are steady."""
        skip = set(self.outlier_windows)
        return tuple(w for i, w in enumerate(self.windows) if i not in skip)

    @property
    def steady_spread(self) -> float:
        """(max - min) / median of :attr:`steady_windows`; 0 with fewer than two of them."""
        w = self.steady_windows
        if len(w) < 2:
            return 0.0
        m = float(statistics.median(w))
        return 0.0 if m <= 0 else (max(w) - min(w)) / m

    @property
    def median(self) -> float:
        return float(statistics.median(self.windows)) if self.windows else 0.0

    @property
    def spread(self) -> float:
        """(max - min) / median of the windows; 0 for a single window."""
        m = self.median
        return 0.0 if m <= 0 or len(self.windows) < 2 else (max(self.windows) - min(self.windows)) / m

    @property
    def step_s(self) -> float:
        """Median seconds per step."""
        return self.batch_size / self.median if self.median > 0 else float("inf")


class TrialFailed(Exception):
    """A candidate could not be measured. ``kind``: worker_died | timeout | data | step | budget."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def classify_loader_error(exc: BaseException) -> str:
    """``worker_died`` / ``timeout`` for the DataLoader's own failures, ``data`` for the dataset's.

    A worker killed while the main process receives its batch (the shared-memory handle travels
    over a socket) surfaces as ``ConnectionResetError`` / ``EOFError`` / ``BrokenPipeError`` in
    the main process, before torch's own "exited unexpectedly" check: that is a dead worker too.
    The same types raised by the dataset inside a worker come back re-raised with "Caught ... in
    DataLoader worker process" in their message, and stay ``data``."""
    text = str(exc)
    if "timed out" in text and "DataLoader" in text:
        return "timeout"
    if _torch_names_a_dead_worker(text):
        return "worker_died"
    if isinstance(exc, (ConnectionError, EOFError)) and "in DataLoader worker process" not in text:
        return "worker_died"
    return "data"


def _torch_names_a_dead_worker(text: str) -> bool:
    """Whether ``text`` is torch's own message for a DataLoader worker that exited or was killed."""
    return "DataLoader worker" in text and ("exited unexpectedly" in text or "killed by signal" in text)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so a host clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BatchStream:
    """Batches of ``loader`` without end: epochs are chained; :meth:`close` shuts the workers down."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._it: Iterator | None = None
        self.epochs = 0
        self.since_start = 0  # batches taken from the current iterator (its workers' start-up first)

    def _new_iterator(self) -> Iterator:
        with warnings.catch_warnings():  # the budget, not torch's core-count rule, bounds the workers here
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            return iter(self.loader)

    def __next__(self) -> Any:
        if self._it is None:
            self._it = self._new_iterator()
            self.since_start = 0
        try:
            batch = next(self._it)
            self.since_start += 1
            return batch
        except StopIteration:
            self.epochs += 1
            self._it = self._new_iterator()
            self.since_start = 1
            try:
                return next(self._it)
            except StopIteration:
                raise ValueError("the loader yields no batches (empty dataset or sampler); "
                                 "give autotune a loader with at least one batch") from None

    def close(self) -> None:
        """Shut every worker of this stream down (persistent ones included)."""
        it, self._it = self._it, None
        release_workers(self.loader, it)
        del it


@dataclass(frozen=True)
class WindowTiming:
    """One measured window: wall seconds, samples, and the extra seconds of the epoch starts in it."""

    seconds: float
    samples: int
    steps: int
    restart_extra_s: tuple[float, ...] = ()  # per epoch start: its wait beyond a normal step's


def epoch_charged(windows: list[WindowTiming], batches_per_epoch: int | None,
                  restart_s: float) -> tuple[float, ...]:
    """Samples/s of each window with epoch restarts charged in proportion to its steps.

    A window's own restarts (``restart_extra_s``) are taken out and ``steps / batches_per_epoch``
    restarts of ``restart_s`` each are added, so every window of a trial, whatever its length and
    wherever it starts, pays the restarts a long run pays per batch. ``batches_per_epoch=None``
    (a loader without a length) leaves the windows as measured."""
    out = []
    for w in windows:
        seconds = w.seconds
        if batches_per_epoch:
            seconds = seconds - sum(w.restart_extra_s) + w.steps * restart_s / batches_per_epoch
        out.append(w.samples / max(seconds, 1e-9))
    return tuple(out)


def live_children() -> set[int]:
    """Pids of this process's live child processes (zombies and multiprocessing's shared,
    long-lived resource tracker excluded)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                out.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return out


def reap_new_children(before: set[int], grace_s: float = CHILD_GRACE_S) -> list[int]:
    """Wait for children started since ``before`` to exit; kill the ones still alive. Returns those killed."""
    deadline = time.monotonic() + grace_s
    while True:
        extra = live_children() - before
        if not extra:
            return []
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    killed = []
    for pid in sorted(extra):
        try:
            psutil.Process(pid).kill()
            killed.append(pid)
        except psutil.NoSuchProcess:
            continue
    if killed:
        log.warning("killed %d worker process(es) that outlived their trial: %s", len(killed), killed)
    return killed


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def measure_throughput(
    loader: Any,
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module, Any], Any],
    device: torch.device,
    *,
    windows: int = 3,
    steps: int = 10,
    warmup: int = 2,
    deadline: float | None = None,
    seed: int | None = None,
) -> Measurement:
    """Median-able throughput windows of ``loader`` + ``step_fn`` in steady state.

    ``deadline`` (``time.monotonic()`` seconds) ends the trial early: after at least one window
    the windows measured so far are returned; before that a ``TrialFailed("budget")`` is raised.
    """
    if windows < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"windows={windows}, steps={steps} must be >= 1 and warmup={warmup} >= 0")
    if seed is not None:
        _seed_everything(seed)
    workers = num_workers_of(loader)
    epoch = batches_per_epoch(loader)
    skip = max(warmup, workers)  # each worker's first batch was decoded during the start-up
    before = live_children()
    stream = BatchStream(loader)
    t_start = time.perf_counter()
    results: list[WindowTiming] = []
    waits: list[float] = []  # data waits of the measured steps outside an epoch's first round
    restart_waits: list[tuple[int, list[float]]] = []  # per epoch start: (window index, -1 in the
    # warm-up; the waits of its first round of batches, one per worker)
    round_size = max(1, workers)
    batch_size = 0
    startup = 0.0
    computes: list[float] = []
    startup_windows: list[int] = []
    try:
        for i in range(skip + 1):
            batch, wait, new_epoch = _timed_next(stream)
            if i == 0:
                startup = time.perf_counter() - t_start
            elif new_epoch:
                restart_waits.append((-1, [wait]))
            elif restart_waits and stream.since_start <= round_size:
                restart_waits[-1][1].append(wait)
            synchronize(device)
            c0 = time.perf_counter()
            _step(step_fn, model, batch, device)
            synchronize(device)
            if i > 0:  # the first step pays one-off costs (allocator, cuDNN autotune)
                computes.append(time.perf_counter() - c0)
            _check_deadline(deadline, results)
        for k in range(windows):
            t0, samples, restarted = time.perf_counter(), 0, False
            for _ in range(steps):
                batch, wait, new_epoch = _timed_next(stream)
                # a new epoch's first skip + 1 batches carry its workers' start-up, as the first epoch's did
                restarted |= workers > 0 and stream.since_start <= skip + 1
                if new_epoch:
                    restart_waits.append((k, [wait]))
                elif restart_waits and stream.since_start <= round_size:
                    restart_waits[-1][1].append(wait)  # the rest of the restart's first round
                else:
                    waits.append(wait)
                _step(step_fn, model, batch, device)
                samples += batch_size_of(batch)
                _check_deadline(deadline, results)
            synchronize(device)
            results.append(WindowTiming(seconds=time.perf_counter() - t0, samples=samples, steps=steps))
            if restarted:
                startup_windows.append(len(results) - 1)
            batch_size = max(batch_size, samples // steps)
            if deadline is not None and time.monotonic() > deadline:
                break
    except _OutOfTime:
        pass
    finally:
        stream.close()
        killed = reap_new_children(before)
    if killed and not results:
        raise TrialFailed("worker_died", f"{len(killed)} worker(s) did not exit and were killed")
    normal = statistics.fmean(waits) if waits else 0.0
    extra = [(k, restart_extra(first_round, normal)) for k, first_round in restart_waits]
    if extra:
        restart = statistics.fmean(x for _, x in extra)
    elif continuous(loader):
        restart = 0.0
    else:
        restart = timing.restart_estimate(startup, workers, persistent_of(loader), normal * round_size)
    timed = [WindowTiming(w.seconds, w.samples, w.steps, tuple(x for j, x in extra if j == k))
             for k, w in enumerate(results)]
    return Measurement(windows=epoch_charged(timed, epoch, restart), steps_per_window=steps,
                       batch_size=batch_size, startup_s=startup, elapsed_s=time.perf_counter() - t_start,
                       compute_s=float(statistics.median(computes)) if computes else 0.0,
                       batches_per_epoch=epoch, restart_s=restart, restarts_seen=len(extra),
                       startup_windows=tuple(startup_windows))


def restart_extra(first_round_waits: list[float], steady_wait_s: float) -> float:
    """Extra seconds an epoch start cost: the waits of its first round of batches (one per worker:
    the first waits for the start-up and a whole batch, the rest of the round arrive with it) less
    the same number of steady steps' mean wait. Workers started together deliver in bursts, a long
    wait then several none, so the first batch's wait alone, or a median steady wait of zero, would
    charge a whole round's wait to every epoch as if it were extra."""
    return max(0.0, sum(first_round_waits) - len(first_round_waits) * steady_wait_s)


def _timed_next(stream: BatchStream) -> tuple[Any, float, bool]:
    """The next batch, the seconds waited for it, and whether it began a new epoch."""
    epochs, t0 = stream.epochs, time.perf_counter()
    batch = _next(stream)
    return batch, time.perf_counter() - t0, stream.epochs != epochs


class _OutOfTime(Exception):
    pass


def _check_deadline(deadline: float | None, results: list[float]) -> None:
    if deadline is not None and time.monotonic() > deadline:
        if results:
            raise _OutOfTime
        raise TrialFailed("budget", "the time budget ran out before the first measured window")


def first_batch(loader: Any) -> Any:
    """The first batch of ``loader``, its workers (if any) shut down afterwards; a failing loader
    raises :class:`TrialFailed` as in a trial."""
    stream = BatchStream(loader)
    try:
        return _next(stream)
    finally:
        stream.close()


def step_once(step_fn: Callable, model: torch.nn.Module, batch: Any, device: torch.device) -> None:
    """One device-synchronised step of ``step_fn`` on ``batch`` (moved to a CUDA device first), its
    errors classified as in a trial (:class:`TrialFailed`)."""
    _step(step_fn, model, batch, device)
    synchronize(device)


def _next(stream: BatchStream) -> Any:
    try:
        return next(stream)
    except ValueError as exc:
        if "yields no batches" in str(exc):
            raise
        raise TrialFailed("data", f"the loader raised {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        kind = classify_loader_error(exc)
        what = {"timeout": "a worker hung (DataLoader timed out)", "worker_died": "a worker died",
                "data": "the loader raised"}[kind]
        raise TrialFailed(kind, f"{what}: {type(exc).__name__}: {_first_line(exc)}") from exc


def _step(step_fn: Callable, model: torch.nn.Module, batch: Any, device: torch.device) -> None:
    if device.type == "cuda":  # as po.profile does: the batch's tensors go to the device before the step
        batch = move_to_device(batch, device)
    try:
        step_fn(model, batch)
    except Exception as exc:
        if _torch_names_a_dead_worker(str(exc)):  # torch's SIGCHLD handler raises wherever we are
            raise TrialFailed("worker_died", f"a worker died: {type(exc).__name__}: {_first_line(exc)}") from exc
        raise TrialFailed("step", f"step_fn raised {type(exc).__name__}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    """The message's first line, plus its last one when that differs (the worker's original error)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
