"""The noise estimate uses steady-state windows only: start-up windows never read as noise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader
from tune_fixtures import Fast, tiny_model

from pipeline_opt._core.step import default_step
from pipeline_opt.tune.budget import compute_budget
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.first_guess import profile_measurement
from pipeline_opt.tune.measure import Measurement, measure_throughput
from pipeline_opt.tune.search import Search


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class _Scripted:
    """Hands out the given measurements in order (fake time: 1 s each)."""

    def __init__(self, clock, measurements):
        self.clock, self.queue = clock, list(measurements)

    def estimate_s(self, cfg, step_s):
        return 1.0

    def measure(self, cfg, deadline, step_s):
        self.clock.t += 1.0
        return self.queue.pop(0)


def _m(windows, startup=()):
    return Measurement(windows=tuple(windows), steps_per_window=4, batch_size=8, startup_s=0.1, elapsed_s=1.0,
                       startup_windows=tuple(startup))


def test_steady_spread_leaves_start_up_windows_out():
    m = _m((100.0, 102.0, 705.0), startup=(2,))
    assert m.spread > 5.0  # all windows: (705 - 100) / 102
    assert m.steady_windows == (100.0, 102.0) and m.steady_spread == pytest.approx(0.02 / 1.01, rel=1e-3)
    assert m.median == 102.0  # the throughput still counts every window
    assert _m((100.0, 700.0), startup=(1,)).steady_spread == 0.0  # one steady window: no spread from it


def test_a_synthetic_start_up_window_does_not_become_the_noise():
    clock = _Clock()
    base = _m((100.0, 101.0, 705.0), startup=(2,))  # the third window consumed a queue filled at start-up
    ev = _Scripted(clock, [base, _m((125.0, 126.0, 124.0))])
    s = Search(ev, compute_budget(cpus=64, ram_available_bytes=2**40, user_max=8), deadline=100.0, clock=clock)
    s.start(LoaderConfig(2))
    assert s.noise < 0.02, f"noise {s.noise:.0%} came from a start-up window"
    assert s.trials[0].spread < 0.02 and s.trials[0].startup_windows == (2,)
    assert s.try_change("more workers", num_workers=4)  # +24% is a gain, not noise
    assert "faster" in s.trials[-1].reason and "kept over" in s.trials[-1].reason


def test_without_the_mark_the_same_windows_would_swamp_every_gain():
    clock = _Clock()
    ev = _Scripted(clock, [_m((100.0, 101.0, 705.0)), _m((125.0, 126.0, 124.0))])
    s = Search(ev, compute_budget(cpus=64, ram_available_bytes=2**40, user_max=8), deadline=100.0, clock=clock)
    s.start(LoaderConfig(2))
    assert s.noise > 2.0  # what the user saw as "±605%"
    assert not s.try_change("more workers", num_workers=4)


def test_profile_steps_on_the_prefilled_queue_are_not_a_window():
    # 4 workers, prefetch 2: 8 batches were ready after the start-up; the profile dropped 2 as warm-up,
    # so its first 6 steps ran at the step's own speed (5 ms), the rest waited for data (100 ms)
    steps = [SimpleNamespace(step_s=0.005 if i < 6 else 0.100, samples=8) for i in range(22)]
    report = SimpleNamespace(steps=steps, batch_size=8, compute_time_s=0.005, step_time_s=0.1, data_wait_frac=0.9)
    m = profile_measurement(report, LoaderConfig(num_workers=4), elapsed_s=3.0)
    assert m.windows and m.startup_windows == () and m.spread == pytest.approx(0.0)
    assert m.median == pytest.approx(80.0)
    # too few steps to drop them: the windows stay, marked, and the noise ignores them
    short = SimpleNamespace(**{**report.__dict__, "steps": steps[:9]})
    m = profile_measurement(short, LoaderConfig(num_workers=4), elapsed_s=3.0)
    assert m.startup_windows == (0, 1) and m.steady_spread == 0.0


@pytest.mark.timeout(60)
def test_trial_windows_holding_an_epoch_restart_are_marked():
    # 4 batches an epoch, one worker, windows of 2 steps after a 2-batch start: windows 1 and 3 each
    # open a new epoch (a new worker process), windows 0 and 2 are steady
    loader = DataLoader(Fast(n=16), batch_size=4, num_workers=1)
    m = measure_throughput(loader, tiny_model(), default_step, torch.device("cpu"), windows=4, steps=2, warmup=1)
    assert len(m.windows) == 4 and m.startup_windows == (1, 3)
    assert m.steady_windows == (m.windows[0], m.windows[2])
    persistent = DataLoader(Fast(n=64), batch_size=4, num_workers=1)  # no restart within the trial
    m = measure_throughput(persistent, tiny_model(), default_step, torch.device("cpu"), windows=3, steps=2, warmup=1)
    assert m.startup_windows == ()
