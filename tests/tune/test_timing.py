"""The tuner's time arithmetic on injected numbers: windows follow the step time, trials stay short."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipeline_opt.tune import timing
from pipeline_opt.tune.ab import clear_win
from pipeline_opt.tune.candidates import LoaderConfig


def test_window_length_follows_the_budget_within_bounds():
    assert timing.window_seconds(84) == pytest.approx(1.4)
    assert timing.window_seconds(6) == 0.25 and timing.window_seconds(3600) == 1.5
    with pytest.raises(ValueError, match="budget_s"):
        timing.window_seconds(0)


def test_slow_steps_get_few_steps_but_one_per_worker():
    # the data-bound baseline of the H200 benchmark: 0.6 s per step, 4 workers
    assert timing.steps_per_window(0.6, 4, window_s=1.4) == 4
    assert timing.steps_per_window(0.6, 0, window_s=1.4) == 2
    assert timing.steps_per_window(0.01, 4, window_s=1.4) == 140
    assert timing.steps_per_window(1e-5, 1, window_s=1.4, max_steps=50) == 50
    assert timing.steps_per_window(float("inf"), 3, window_s=1.0) == 3
    with pytest.raises(ValueError, match="min_steps"):
        timing.steps_per_window(0.1, 1, window_s=1.0, min_steps=0)


def test_windows_hold_whole_rounds_of_the_workers():
    # the YOLO case: 8 workers, 70 ms steps, 0.75 s windows -> 11 steps by time, 8 by rounds
    assert timing.steps_per_window(0.07, 8, window_s=0.75) == 8
    assert timing.steps_per_window(0.07, 8, window_s=1.0) == 16  # 14.3 steps -> 2 rounds
    assert timing.steps_per_window(0.05, 3, window_s=1.0) == 21  # 20 steps -> 7 rounds
    assert timing.steps_per_window(0.01, 8, window_s=1.0, max_steps=60) == 56  # the most whole rounds that fit
    assert timing.steps_per_window(0.01, 80, window_s=1.0, max_steps=60) == 60  # one round does not fit: the cap
    assert timing.steps_per_window(0.5, 2, window_s=1.0, min_steps=3) == 4  # min_steps, rounded up to a round
    for workers in range(2, 17):
        for step_s in (0.005, 0.03, 0.07, 0.2, 0.6):
            steps = timing.steps_per_window(step_s, workers, window_s=1.0)
            assert steps % workers == 0 and steps >= workers


def test_littles_law_prediction_from_a_measured_configuration():
    # 4 workers at 0.6 s per step -> one worker needs 2.4 s per batch; 12 usable cores
    batch_s = timing.batch_seconds(0.6, 4, compute_s=0.07, usable_cpus=12)
    assert batch_s == pytest.approx(2.4)
    assert timing.predict_step_s(batch_s, 12, compute_s=0.07, usable_cpus=12) == pytest.approx(0.2)
    assert timing.predict_step_s(batch_s, 24, compute_s=0.07, usable_cpus=12) == pytest.approx(0.2)  # cores bind
    assert timing.predict_step_s(0.01, 8, compute_s=0.07, usable_cpus=12) == pytest.approx(0.07)  # compute binds
    assert timing.predict_step_s(0.5, 0, compute_s=0.1, usable_cpus=12) == pytest.approx(0.6)  # main process
    assert timing.batch_seconds(0.6, 0, compute_s=0.1, usable_cpus=12) == pytest.approx(0.5)


def test_a_slow_baseline_trial_costs_seconds_not_tens():
    steps = timing.steps_per_window(0.6, 4, window_s=1.4)
    t = timing.trial_seconds(0.6, 4, windows=3, steps=steps, warmup=2, first_batch_s=2.4)
    assert 8 < t < 13  # 2.4 s start-up + 12 steps of 0.6 s, plus margin
    # the 14-worker guess at the predicted 0.2 s step
    steps = timing.steps_per_window(0.2, 14, window_s=1.4)
    assert steps == 14
    assert timing.trial_seconds(0.2, 14, windows=3, steps=steps, warmup=2, first_batch_s=2.8) < 15


def test_final_profile_and_reserve_fit_the_budget():
    assert timing.final_reserve_s(84, 11.0) == pytest.approx(8.4)
    assert timing.final_reserve_s(84, 2.0) == pytest.approx(2.0)
    assert timing.profile_steps(8.0, 0.07) == 8
    assert timing.profile_steps(1.0, 0.1) == 3
    assert timing.profile_steps(-1.0, 0.1) == 2  # over budget: still a minimal profile
    assert timing.profile_steps(5.0, 0.0) == 8


def test_profile_steps_become_windows():
    steps = [timing.StepSample(0.5, 128)] * 9
    assert timing.windows_from_steps(steps, 4) == pytest.approx((256.0, 256.0))  # 4 + 5 steps
    assert timing.windows_from_steps(steps[:3], 4) == pytest.approx((256.0,))
    assert timing.windows_from_steps([timing.StepSample(0.0, 8)], 1) == ()


def test_clear_win_needs_far_more_than_the_threshold():
    assert clear_win(800, 100, noise=0.05)
    assert not clear_win(140, 100, noise=0.0)  # +40% < +50%
    assert not clear_win(180, 100, noise=0.2)  # +80% < 5 x 20%
    assert not clear_win(100, 0, noise=0.0)


def test_runner_predicts_a_worker_increase_from_the_baseline():
    from pipeline_opt.tune.measure import Measurement
    from pipeline_opt.tune.trial import TrialRunner

    runner = TrialRunner(builder=None, model=None, step_fn=None, device=None, initial_step_s=0.6,
                         window_s=1.4, compute_s=0.07, usable_cpus=12)
    base = LoaderConfig(4)
    runner.remember(base, Measurement(windows=(213.0,), steps_per_window=4, batch_size=128, startup_s=0,
                                      elapsed_s=10))
    assert runner.predict_step_s(LoaderConfig(12), 0.6) == pytest.approx(0.2, rel=0.01)
    assert runner.predict_step_s(LoaderConfig(12, decode="draft"), 0.6) == pytest.approx(0.2, rel=0.01)
    slow_guess = timing.trial_seconds(0.6, 12, windows=3, steps=12, warmup=2, first_batch_s=7.2)
    assert runner.estimate_s(LoaderConfig(12), 0.6) < slow_guess / 2


@pytest.mark.parametrize("steps, workers, expected", [(10, 0, 10), (10, 1, 10), (10, 8, 16), (16, 8, 16),
                                                     (1, 8, 8), (10, 12, 12), (25, 12, 36)])
def test_whole_rounds_rounds_up_to_a_multiple_of_the_workers(steps, workers, expected):
    assert timing.whole_rounds(steps, workers) == expected


def test_whole_rounds_rejects_an_empty_window():
    with pytest.raises(ValueError, match="steps=0"):
        timing.whole_rounds(0, 4)


def test_a_shared_slots_trial_discards_every_slots_first_batch_and_is_priced_for_it():
    from pipeline_opt.loading.shared_slots import slot_loader
    from pipeline_opt.tune.trial import TrialRunner

    assert timing.slot_first_use_batches(8, 4) == 48  # 8 workers x (4 prefetched + 2)
    assert timing.slot_first_use_batches(0, None) == 0
    loader = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2, num_workers=3, prefetch_factor=4)
    pool = slot_loader(loader).collate_fn.pool  # the pool the tuner's slot candidates get
    assert timing.slot_first_use_batches(3, 4) == pool.num_workers * pool.slots_per_worker

    runner = TrialRunner(builder=None, model=None, step_fn=None, device=None, initial_step_s=0.08, warmup=2)
    plain, slots = LoaderConfig(8, prefetch_factor=4), LoaderConfig(8, prefetch_factor=4, shared_slots=True)
    assert runner.warmup_for(plain) == 2 and runner.warmup_for(slots) == 48
    assert runner.estimate_s(slots, 0.08) - runner.estimate_s(plain, 0.08) == pytest.approx(
        timing.ESTIMATE_MARGIN * 40 * 0.08, rel=0.01)  # 48 discarded batches instead of the 8 of the burst


def test_a_short_epoch_gets_windows_of_whole_epochs():
    # 16 batches an epoch over 14 workers (a round of 14, then of 2): one epoch per window, not 14 steps
    assert timing.steps_per_window(0.17, 14, window_s=1.0, batches_per_epoch=16) == 16
    assert timing.steps_per_window(0.01, 2, window_s=1.0, batches_per_epoch=4) == 100  # 25 epochs of 4
    assert timing.steps_per_window(0.01, 2, window_s=1.0, batches_per_epoch=4, max_steps=10) == 8
    # an epoch longer than EPOCH_WINDOW_FACTOR windows: whole rounds as before
    assert timing.steps_per_window(0.5, 4, window_s=1.0, batches_per_epoch=16) == 4
    assert timing.restart_estimate(1.0, 4, persistent=False) == 1.0
    assert timing.restart_estimate(1.0, 4, persistent=True) == pytest.approx(1.0 - 0.3 - 0.2)
    assert timing.restart_estimate(1.0, 0, persistent=False) == 0.0
    # the round that arrives with the first batch is not extra: a steady round waits 0.6 s of it
    assert timing.restart_estimate(1.0, 4, persistent=False, round_wait_s=0.6) == pytest.approx(0.4)
    assert timing.restart_estimate(1.0, 4, persistent=True, round_wait_s=0.6) == 0.0


def test_the_plan_counts_the_trials_that_fit_and_names_the_budget_that_would():
    def cost(window_s):  # start-up and skipped batches, then 3 windows
        return 2.0 + 3 * window_s

    plan = timing.plan_trials(60.0, spent_s=10.0, reserve_s=6.0, trial_s_at=cost, window_s=1.0, noise=0.02)
    assert (plan.trials, plan.window_s, plan.trial_s) == (8, 1.0, 5.0) and plan.warning is None
    assert "room for 8 trial(s)" in plan.text and "40 s would allow 3" in plan.text
    tight = timing.plan_trials(20.0, spent_s=12.0, reserve_s=2.0, trial_s_at=cost, window_s=1.0, noise=0.02)
    assert tight.window_s == 0.25 and tight.trials == 2 and "shortened from 1.00 s" in tight.text  # quiet: shorter
    noisy = timing.plan_trials(20.0, spent_s=12.0, reserve_s=2.0, trial_s_at=cost, window_s=1.0, noise=0.2)
    assert noisy.window_s == 1.0 and noisy.trials == 1  # noisy: the windows keep their length
    none = timing.plan_trials(8.0, spent_s=7.0, reserve_s=0.5, trial_s_at=cost, window_s=0.5, noise=0.0)
    assert none.trials == 0 and none.window_s == 0.25 and none.needed_s == 20.0
    assert none.warning.startswith("time_budget_s=8 holds the baseline only") and "20 s would allow 3" in none.warning
