"""Steady-state measurement: windows, worker shutdown, failures instead of hangs."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info
from tune_fixtures import Fast, SlowIO, slow_worker_start, tiny_model

from pipeline_opt._core.step import default_step
from pipeline_opt.tune.measure import (
    TrialFailed,
    WindowTiming,
    classify_loader_error,
    epoch_charged,
    live_children,
    measure_throughput,
    restart_extra,
)

CPU = torch.device("cpu")


class KillsItself(Fast):
    def __getitem__(self, index):
        if get_worker_info() is not None and index == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class Hangs(Fast):
    def __getitem__(self, index):
        if get_worker_info() is not None and index == 5:
            time.sleep(60)
        return super().__getitem__(index)


def _step_raises(model, batch):
    raise RuntimeError("loss is NaN")


@pytest.mark.parametrize("persistent", [False, True])
def test_windows_over_several_epochs_and_no_worker_left(persistent):
    before = live_children()
    loader = DataLoader(SlowIO(n=32, latency_s=0.002), batch_size=4, num_workers=2,
                        persistent_workers=persistent)
    m = measure_throughput(loader, tiny_model(), default_step, CPU, windows=3, steps=6, warmup=1)
    assert len(m.windows) == 3 and all(w > 0 for w in m.windows)  # 4 skipped + 18 steps > 8 batches/epoch
    assert m.batch_size == 4 and m.median > 0 and m.spread >= 0
    assert live_children() - before == set()


@pytest.mark.timeout(60)
def test_killed_worker_fails_the_trial():
    loader = DataLoader(KillsItself(), batch_size=4, num_workers=2)
    with pytest.raises(TrialFailed) as info:
        measure_throughput(loader, tiny_model(), default_step, CPU, windows=2, steps=4)
    assert info.value.kind == "worker_died" and "died" in str(info.value)


@pytest.mark.timeout(60)
def test_hung_worker_fails_the_trial_within_the_loader_timeout():
    before = live_children()
    loader = DataLoader(Hangs(), batch_size=4, num_workers=2, timeout=2)
    t0 = time.monotonic()
    with pytest.raises(TrialFailed) as info:
        measure_throughput(loader, tiny_model(), default_step, CPU, windows=2, steps=4)
    assert info.value.kind == "timeout" and time.monotonic() - t0 < 20
    assert live_children() - before == set()


def test_step_failure_is_named():
    with pytest.raises(TrialFailed, match="step_fn raised RuntimeError: loss is NaN") as info:
        measure_throughput(DataLoader(Fast(), batch_size=4), tiny_model(), _step_raises, CPU)
    assert info.value.kind == "step"


def test_deadline_ends_the_trial_after_a_window():
    loader = DataLoader(SlowIO(n=64, latency_s=0.005), batch_size=4)
    t0 = time.monotonic()
    m = measure_throughput(loader, tiny_model(), default_step, CPU, windows=500, steps=3, warmup=0,
                           deadline=time.monotonic() + 1.5)
    assert 1 <= len(m.windows) < 500 and time.monotonic() - t0 < 10
    with pytest.raises(TrialFailed) as info:
        measure_throughput(loader, tiny_model(), default_step, CPU, deadline=time.monotonic() - 1)
    assert info.value.kind == "budget"


@pytest.mark.parametrize(("exc", "kind"), [
    (RuntimeError("DataLoader worker (pid 123) exited unexpectedly"), "worker_died"),
    (RuntimeError("DataLoader worker (pid(s) 9) exited unexpectedly ... killed by signal: Killed."), "worker_died"),
    (RuntimeError("DataLoader timed out after 5 seconds"), "timeout"),
    # a worker killed while its batch's handle was being received: the socket breaks first
    (ConnectionResetError(104, "Connection reset by peer"), "worker_died"),
    (EOFError(), "worker_died"),
    # the same types raised by the dataset inside a worker are the data's fault
    (EOFError("Caught EOFError in DataLoader worker process 0.\nOriginal Traceback ..."), "data"),
    (ValueError("bad sample"), "data"),
])
def test_classify_loader_error(exc, kind):
    assert classify_loader_error(exc) == kind


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine a second one makes a tiny step cost 1-150 ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.timeout(60)
def test_a_short_epochs_worker_start_up_is_counted_in_every_window(one_torch_thread):
    # 4 batches an epoch, 0.3 s to start a worker: a window of 2 steps misses the restart in two of
    # three windows, and the median of raw windows would read persistent workers as no faster
    def run(persistent):
        loader = DataLoader(Fast(n=16), batch_size=4, num_workers=1, worker_init_fn=slow_worker_start,
                            persistent_workers=persistent)
        return measure_throughput(loader, tiny_model(), default_step, CPU, windows=3, steps=2, warmup=1)

    fresh, kept = run(False), run(True)
    assert fresh.batches_per_epoch == 4 and fresh.restarts_seen >= 1 and fresh.restart_s >= 0.25
    assert kept.restart_s < 0.15, "persistent workers only refill the pipeline"
    assert kept.median > 1.5 * fresh.median, (kept.windows, fresh.windows)
    assert fresh.spread < 0.5, "every window pays the same share of the restarts"


def test_restart_extra_is_the_first_rounds_wait_beyond_a_steady_rounds():
    # 4 workers in lockstep: a steady round waits 0.4 s then 0, 0, 0 (mean 0.1 s a step); a new
    # epoch's round waits 0.5 s (0.1 s of start-up, then the same batch) then 0, 0, 0
    assert restart_extra([0.5, 0.0, 0.0, 0.0], 0.1) == pytest.approx(0.1)
    assert restart_extra([0.5], 0.1) == pytest.approx(0.4)  # one worker: the whole wait beyond a step's
    assert restart_extra([0.0, 0.0], 0.1) == 0.0  # never negative


@pytest.mark.timeout(90)
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_in_lockstep_on_a_short_epoch_read_what_the_loop_gets(persistent, one_torch_thread):
    # 4 workers take 0.1 s a batch together, so batches arrive in bursts of 4 (a 0.1 s wait, then
    # three of none); 16 batches an epoch, windows of one round. Charging each epoch start its first
    # batch's whole wait as extra (the steady median wait is 0) read 0.81-0.85x the plain loop.
    def loader():
        return DataLoader(SlowIO(n=64, latency_s=0.025), batch_size=4, num_workers=4,
                          persistent_workers=persistent)

    def plain_loop() -> float:
        model, plain, samples = tiny_model(), loader(), 0
        for _ in plain:  # the first epoch: start-up, as the trial's discarded warm-up
            pass
        t0 = time.perf_counter()
        for _ in range(5):
            for batch in plain:
                default_step(model, batch)
                samples += batch[0].shape[0]
        return samples / (time.perf_counter() - t0)

    # the plain loop before and after the trial: a 2-core machine drifts by more than the 10% asserted
    before = plain_loop()
    m = measure_throughput(loader(), tiny_model(), default_step, CPU, windows=4, steps=4, warmup=1)
    after = plain_loop()
    assert m.restarts_seen >= 1
    loops = (before, after)
    assert 0.9 * min(loops) < m.median < 1.1 * max(loops), (m.median, loops, m.windows, m.restart_s)


def test_epoch_charged_moves_each_windows_restarts_into_proportion():
    windows = [WindowTiming(seconds=0.2, samples=8, steps=2),
               WindowTiming(seconds=0.5, samples=8, steps=2, restart_extra_s=(0.3,)),
               WindowTiming(seconds=0.2, samples=8, steps=2)]
    # 2 steps of a 4-batch epoch carry half a restart: 0.2 + 0.15 s per window, all alike
    assert epoch_charged(windows, 4, 0.3) == pytest.approx((8 / 0.35,) * 3)
    assert epoch_charged(windows, None, 0.3) == pytest.approx((40.0, 16.0, 40.0))  # no length: as measured


class _Infinite(DataLoader):  # a framework's loader: one iterator kept over a repeating sampler
    iterator = None


def test_an_infinite_loader_runs_on_without_restarts():
    from pipeline_opt.loading.dataloader import LoaderKind, continuous, register_loader_kind

    register_loader_kind(LoaderKind("test-infinite", lambda dl: type(dl) is _Infinite,
                                    lambda dl: dl.batch_sampler, "iterator"))
    assert continuous(_Infinite(Fast(), batch_size=4)) and not continuous(DataLoader(Fast(), batch_size=4))


def test_a_worker_death_reported_while_the_workers_shut_down_does_not_escape():
    from pipeline_opt.loading.dataloader import shutdown_iterator as _shutdown

    class Iterator:  # torch's SIGCHLD handler fires inside _shutdown_workers' join
        def __init__(self, message):
            self.message = message

        def _shutdown_workers(self):
            raise RuntimeError(self.message)

    _shutdown(Iterator("DataLoader worker (pid 28975) is killed by signal: Killed."))
    with pytest.raises(RuntimeError, match="something else"):
        _shutdown(Iterator("something else"))
