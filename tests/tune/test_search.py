"""The search's decisions on injected numbers: acceptance, noise, rollback, budget, time."""

from __future__ import annotations

import re

import pytest

from pipeline_opt.tune.ab import accept, repeat_noise
from pipeline_opt.tune.budget import compute_budget
from pipeline_opt.tune.candidates import (
    LoaderConfig,
    littles_law_workers,
    worker_neighbours,
)
from pipeline_opt.tune.measure import Measurement, TrialFailed
from pipeline_opt.tune.search import BaselineFailed, Search


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeEvaluator:
    """Throughput from a function of the config; each trial costs ``cost_s`` of fake time."""

    def __init__(self, clock, rate, cost_s=1.0, fail=None, jitter=()):
        self.clock, self.rate, self.cost_s, self.fail = clock, rate, cost_s, fail or {}
        self.jitter, self.calls = list(jitter), []

    def estimate_s(self, cfg, step_s):
        return self.cost_s

    def measure(self, cfg, deadline, step_s):
        self.calls.append(cfg)
        self.clock.t += self.cost_s
        if cfg.num_workers in self.fail:
            raise TrialFailed(*self.fail[cfg.num_workers])
        r = self.rate(cfg) * (1 + (self.jitter.pop(0) if self.jitter else 0.0))
        return Measurement(windows=(0.98 * r, r, 1.02 * r), steps_per_window=5, batch_size=8, startup_s=0.1,
                           elapsed_s=self.cost_s)


def _budget(max_workers=8):
    return compute_budget(cpus=64, ram_available_bytes=2**40, user_max=max_workers)


def _search(rate, deadline=100.0, max_workers=8, **kw):
    clock = Clock()
    ev = FakeEvaluator(clock, rate, **kw)
    return Search(ev, _budget(max_workers), deadline=deadline, clock=clock), ev


def _io_bound(cfg):  # saturates at 6 workers, then slowly degrades
    w = cfg.num_workers
    return 100.0 * min(w, 6) - 5.0 * max(0, w - 6) if w else 50.0


def test_accept_rule():
    assert accept(112, 100, noise=0.10)[0]
    assert not accept(108, 100, noise=0.10)[0]
    assert not accept(102, 100, noise=0.0, min_gain=0.03)[0]  # the minimum gain applies with no noise
    ok, why = accept(130, 100, noise=0.2)
    assert ok and why == "+30% faster (noise ±20%): kept"


def test_reasons_say_what_happened_in_plain_words():
    # a clear loss beyond the threshold is a loss, not "within the threshold"
    ok, why = accept(58.3, 100, noise=0.12)
    assert not ok and why == "42% slower (noise ±12%): rolled back"
    assert "within" not in why and "threshold" not in why
    # a gain inside the measured noise
    ok, why = accept(104, 100, noise=0.12)
    assert not ok and why == "+4.0% is inside the measured noise ±12%: not kept"
    # a loss inside the noise is not called a rollback of a real loss
    ok, why = accept(97, 100, noise=0.12)
    assert not ok and why.endswith("is inside the measured noise ±12%: not kept") and why.startswith("-3.0%")
    # the minimum gain, and the trials' own window spread, are named when they set the bar
    ok, why = accept(102, 100, noise=0.0, min_gain=0.03)
    assert not ok and "inside the 3.0% minimum gain" in why and why.endswith(": not kept")
    ok, why = accept(110, 100, noise=0.05, spread=0.15)
    assert not ok and "inside the trials' own window spread ±15%" in why
    ok, why = accept(50, 100, noise=0.05, spread=0.15)
    assert not ok and why == "50% slower (noise ±5.0%, window spread ±15%): rolled back"


def test_judgement_separates_the_finding_from_the_decision():
    from pipeline_opt.tune.ab import clear_win, judge

    j = judge(58.3, 100, noise=0.12)
    assert (j.accepted, j.decision, j.finding) == (False, "rolled back", "42% slower (noise ±12%)")
    assert j.gain == pytest.approx(-0.417) and j.threshold == pytest.approx(0.12)
    assert judge(135, 100, noise=0.12).sentence == "+35% faster (noise ±12%): kept"
    assert not clear_win(58.3, 100, noise=0.12) and clear_win(900, 100, noise=0.12)


def test_repeat_noise():
    assert repeat_noise([100.0]) == 0.0
    assert repeat_noise([90.0, 110.0]) == pytest.approx(0.2)


def test_littles_law_and_neighbours():
    assert littles_law_workers(batch_s=0.080, step_s=0.010) == 8 + 2
    assert littles_law_workers(batch_s=0.0, step_s=0.010) == 1
    assert worker_neighbours(4, cap=16) == [8, 2, 5, 3]
    assert worker_neighbours(4, cap=4) == [2, 3]
    assert worker_neighbours(1, cap=8) == [2]


def test_loader_config_normalises_worker_only_settings():
    cfg = LoaderConfig(num_workers=0, persistent_workers=True, prefetch_factor=4)
    assert (cfg.persistent_workers, cfg.prefetch_factor) == (False, None)
    assert cfg.with_(num_workers=3).prefetch_factor == 2
    with pytest.raises(ValueError, match="num_workers"):
        LoaderConfig(num_workers=-1)


def test_hill_climb_finds_the_knee_and_never_exceeds_the_budget():
    s, ev = _search(_io_bound, max_workers=8)
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(3), "guess")
    s.tune_workers()
    out = s.outcome()
    assert out.best.num_workers == 6
    assert max(c.num_workers for c in ev.calls) <= 8
    assert out.trials[0].reason.startswith("baseline") and all(t.reason for t in out.trials)
    assert out.best_throughput == pytest.approx(600.0)


def test_guess_over_the_budget_is_not_measured():
    s, ev = _search(_io_bound, max_workers=2)
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(5), "guess")
    assert all(c.num_workers <= 2 for c in ev.calls)


def test_failed_candidate_is_rolled_back_and_the_search_continues():
    s, ev = _search(_io_bound, fail={6: ("worker_died", "a worker died: killed by signal: Killed")})
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(3), "guess")
    s.tune_workers()
    out = s.outcome()
    failed = [t for t in out.trials if t.status == "failed"]
    assert [t.config["num_workers"] for t in failed] == [6]
    assert "rolled back to" in failed[0].reason and "killed by signal" in failed[0].reason
    assert out.best.num_workers in (5, 7, 8)  # the next best around the failed 6


def test_nothing_wins_returns_the_baseline():
    s, _ = _search(lambda cfg: 100.0)  # every configuration equally fast
    s.start(LoaderConfig(2))
    s.calibrate(LoaderConfig(4), "guess")
    s.tune_workers()
    s.confirm()
    out = s.outcome()
    assert out.best == out.baseline == LoaderConfig(2) and "nothing beat" in out.verdict
    assert not any(t.accepted for t in out.trials[1:] if t.config != LoaderConfig(2).to_dict())


def test_a_tie_with_fewer_workers_replaces_a_tuned_incumbent():
    # a plateau from 4 workers on: the tuner's first guess (8) wins clearly over the baseline, then
    # 4 workers measure the same and win the tie; 5 (more than 4) and 3, 2 (slower) do not
    s, ev = _search(lambda cfg: 600.0 if cfg.num_workers >= 4 else 150.0 * max(cfg.num_workers, 1 / 3))
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(8), "guess")
    s.tune_workers()
    out = s.outcome()
    assert out.best == LoaderConfig(4)
    tie = next(t for t in out.trials if t.config["num_workers"] == 4)
    assert tie.accepted and "fewer workers (4 < 8)" in tie.reason and "is inside the" in tie.reason
    assert "kept over workers=8" in tie.reason
    assert not next(t for t in out.trials if t.config["num_workers"] == 5).accepted


def test_a_slower_candidate_with_fewer_workers_does_not_win_the_tie():
    s, _ = _search(lambda cfg: {0: 50.0, 8: 600.0}.get(cfg.num_workers, 590.0))  # fewer workers: -1.7%, in the noise
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(8), "guess")
    s.tune_workers()
    assert s.outcome().best == LoaderConfig(8)


def test_noise_from_interleaved_repeats_blocks_a_small_gain():
    # baseline repeats differ by ~20%: a real +10% gain is within that noise and is rejected
    s, _ = _search(lambda cfg: 110.0 if cfg.num_workers == 4 else 100.0, jitter=[0.0, 0.0, 0.2, 0.0])
    s.start(LoaderConfig(2))
    s.calibrate(LoaderConfig(4), "guess")
    assert s.noise == pytest.approx(0.2 / 1.1, rel=1e-3)
    assert s.incumbent == LoaderConfig(2)


def test_final_check_rolls_back_a_winner_that_no_longer_wins():
    state = {"n": 0}

    def rate(cfg):  # workers=4 wins once (by less than a clear win), then turns out slower than the baseline
        if cfg.num_workers == 4:
            state["n"] += 1
            return 140.0 if state["n"] == 1 else 60.0
        return 100.0

    s, _ = _search(rate)
    s.start(LoaderConfig(2))
    s.consider(LoaderConfig(4), "move")
    assert s.incumbent == LoaderConfig(4)
    s.confirm()
    assert s.outcome().best == LoaderConfig(2)


def test_time_budget_stops_the_search_and_lists_what_was_not_tried():
    s, ev = _search(_io_bound, deadline=3.5, cost_s=1.0)
    s.start(LoaderConfig(0))
    s.calibrate(LoaderConfig(3), "guess")
    s.tune_workers()
    s.try_change("prefetch", prefetch_factor=4)
    # after the guess won, 1.5 s are left: each exploring trial (1 s) must also leave 2 s for the
    # final confirmation (one trial of the baseline, one of the winner), so none runs
    assert ev.calls == [LoaderConfig(0), LoaderConfig(3)]
    assert any("prefetch" in x for x in s.not_tried)
    assert any("kept for the final confirmation" in x for x in s.not_tried)
    s.confirm()  # the time kept: the clear winner, known from one trial, is measured again
    assert ev.calls == [LoaderConfig(0), LoaderConfig(3), LoaderConfig(3)]
    out = s.outcome()
    assert out.best == LoaderConfig(3) and out.not_tried


def test_the_final_confirmation_runs_after_the_exploration_ran_out_of_time():
    # the H100 runs: the candidates spent the budget, and the claim never got its plain baseline
    base, cand = LoaderConfig(4), LoaderConfig(15)
    s, ev = _search(lambda c: 2000.0 if c.num_workers == 15 else 350.0, deadline=4.5, max_workers=16)
    profiled = Measurement(windows=(256.0,), steps_per_window=8, batch_size=128, startup_s=0.0, elapsed_s=5.0,
                           from_profile=True)
    s.start(base, profiled)
    s.calibrate(cand, "guess")  # clear win: the guess twice (2 s)
    s.tune_workers()  # each neighbour (1 s) fits only by eating into the 2 s kept: all refused
    assert s.out_of_time and ev.calls == [cand, cand]
    s.confirm()
    assert ev.calls == [cand, cand, base]  # the baseline measured plainly for the claim
    assert s.outcome().speedup == pytest.approx(2000.0 / 350.0, rel=0.03)


def test_a_failing_baseline_raises():
    s, _ = _search(_io_bound, fail={0: ("data", "the loader raised ValueError: corrupt")})
    with pytest.raises(BaselineFailed, match="baseline"):
        s.start(LoaderConfig(0))


def test_the_baseline_is_measured_even_past_the_deadline():
    s, ev = _search(_io_bound, deadline=-5.0)
    s.start(LoaderConfig(0))
    assert ev.calls == [LoaderConfig(0)]


def test_a_clear_win_skips_the_repeats_and_a_profiled_baseline_is_not_measured_again():
    s, ev = _search(lambda cfg: 800.0 if cfg.num_workers == 8 else 100.0)
    profiled = Measurement(windows=(99.0, 101.0), steps_per_window=4, batch_size=8, startup_s=0.0, elapsed_s=5.0)
    s.start(LoaderConfig(2), profiled)
    s.calibrate(LoaderConfig(8), "guess")
    s.confirm()
    # the baseline is not measured again; the winner is, once, as the reference of later comparisons
    assert ev.calls == [LoaderConfig(8), LoaderConfig(8)]
    assert s.outcome().best == LoaderConfig(8)
    assert any("A B A B" in x and "beyond any noise" in x for x in s.not_tried)
    assert "the incumbent every later candidate is compared with" in s.trials[-1].reason


def test_a_lucky_first_trial_of_a_clear_winner_does_not_block_a_real_gain():
    # the first guess's first trial reads 2,800/s; it really runs at 2,000/s; the candidate at 2,300/s
    # is a real +15% that the single lucky trial (-18%) would have rejected
    def rate(cfg):
        return {2: 100.0, 8: 2000.0}.get(cfg.num_workers, 2300.0)

    s, ev = _search(rate, jitter=[0.0, 0.4])  # baseline exact, the guess's first trial +40%
    s.start(LoaderConfig(2))
    s.calibrate(LoaderConfig(8), "guess")
    assert s.incumbent == LoaderConfig(8)
    assert s.try_change("nvjpeg", num_workers=6)
    assert s.incumbent == LoaderConfig(6)
    assert "kept over workers=8" in s.trials[-1].reason


def test_a_gain_within_the_candidates_own_window_spread_is_rolled_back():
    # the baseline is steady (noise ~2%); the candidate is 6% faster but its windows jitter by ±15%
    class Jittery(FakeEvaluator):
        def measure(self, cfg, deadline, step_s):
            m = super().measure(cfg, deadline, step_s)
            if cfg.prefetch_factor == 1:
                r = m.median
                return Measurement(windows=(0.85 * r, r, 1.15 * r), steps_per_window=5, batch_size=8,
                                   startup_s=0.1, elapsed_s=self.cost_s)
            return m

    clock = Clock()
    ev = Jittery(clock, lambda cfg: 106.0 if cfg.prefetch_factor in (1, 4) else 100.0)
    s = Search(ev, _budget(), deadline=100.0, clock=clock)
    s.start(LoaderConfig(4))
    assert not s.try_change("prefetch 2 -> 1", prefetch_factor=1)
    assert "inside the trials' own window spread ±15%" in s.trials[-1].reason
    assert s.trials[-1].reason.endswith("not kept (workers=4 prefetch=2 stays)")
    assert s.try_change("prefetch 2 -> 4", prefetch_factor=4)  # the same gain with steady windows is kept
    assert s.incumbent == LoaderConfig(4, prefetch_factor=4)


def test_shared_slots_config_is_pinned_round_trips_and_needs_workers():
    cfg = LoaderConfig(num_workers=4, shared_slots=True)
    assert cfg.pin_memory and "shared-slots" in cfg.label() and "pinned" not in cfg.label()
    assert LoaderConfig.from_dict(cfg.to_dict()) == cfg
    assert LoaderConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "shared_slots"}) \
        == cfg.with_(shared_slots=False)  # a tune.json written before the field existed
    assert not LoaderConfig(num_workers=0, shared_slots=True).shared_slots


def _flags_search(rate):
    import torch

    from pipeline_opt.tune.steps import tune_flags

    s, ev = _search(rate)
    s.start(LoaderConfig(4, prefetch_factor=2))
    tune_flags(s, _dataloader(), torch.device("cuda"))
    return s.outcome(), ev


def _dataloader():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2, num_workers=4)


def test_the_tuner_keeps_shared_slots_when_they_win_or_tie_and_not_when_slower():
    out, ev = _flags_search(lambda c: 130.0 if c.shared_slots else 100.0)
    assert out.best.shared_slots and any(c.shared_slots for c in ev.calls)
    out, _ = _flags_search(lambda c: 101.0 if c.shared_slots else 100.0)
    assert out.best.shared_slots  # within the minimum gain but not slower: the tie rule keeps them
    assert "shared-slots tie rule" in out.verdict
    slots = next(t for t in out.trials if t.config["shared_slots"])
    assert slots.accepted and "is inside the" in slots.reason and "through shared slots" in slots.reason
    out, _ = _flags_search(lambda c: 98.0 if c.shared_slots else 100.0)
    assert out.best.shared_slots  # 2% slower: within the 3% minimum gain either way, still a tie
    out, _ = _flags_search(lambda c: 96.0 if c.shared_slots else 100.0)
    assert not out.best.shared_slots  # 4% slower (within the noise, but beyond the minimum): rolled back


def test_a_slots_tie_survives_the_final_check_only_while_not_slower_than_the_baseline():
    base, slots = LoaderConfig(4), LoaderConfig(4, shared_slots=True)
    s, _ = _search(lambda c: 102.0 if c.shared_slots else 100.0)
    s.start(base)
    assert s.consider(slots, "slots") and s.incumbent == slots
    s.confirm()
    assert s.outcome().best == slots  # +2%, under the 3% minimum: a tie, and slots win it

    state = {"n": 0}

    def rate(cfg):  # the slots tie once, then measure slower in the final check
        if cfg.shared_slots:
            state["n"] += 1
            return 102.0 if state["n"] == 1 else 90.0
        return 100.0

    s, _ = _search(rate)
    s.start(base)
    assert s.consider(slots, "slots")
    s.confirm()
    assert s.outcome().best == base


def _two_tie_search(base_rates):
    """Slots tie with the 8-worker baseline, then 6 workers tie with the slots, then measure slower
    in the final check (the chain seen on the H200 at 8 cores)."""
    base_seq, six = list(base_rates), {"n": 0}

    def rate(cfg):
        if not cfg.shared_slots:
            return base_seq.pop(0) if len(base_seq) > 1 else base_seq[0]
        if cfg.num_workers == 8:
            return 101.0
        six["n"] += 1
        return 102.0 if six["n"] == 1 else 90.0

    s, _ = _search(rate)
    s.start(LoaderConfig(8))
    assert s.consider(LoaderConfig(8, shared_slots=True), "slots")
    assert s.consider(LoaderConfig(6, shared_slots=True), "num_workers 8 -> 6")  # the fewer-workers tie
    s.confirm()
    return s, s.outcome()


def test_a_winner_failing_the_final_check_falls_back_to_the_earlier_step_that_still_holds():
    s, out = _two_tie_search([100.0])
    assert out.best == LoaderConfig(8, shared_slots=True)
    fell = [t for t in out.trials if t.status == "skipped" and "final check" in t.reason]
    assert len(fell) == 1 and "falling back to workers=8" in fell[0].reason and re.search(r"\+1\.\d% pooled", fell[0].reason)
    assert "shared-slots tie rule" in out.verdict


def test_the_fall_back_ends_at_the_baseline_when_no_earlier_step_holds():
    s, out = _two_tie_search([100.0, 112.0])  # the baseline re-measures 12% faster: the slots no longer tie
    assert out.best == LoaderConfig(8)
    assert any("returning the original settings" in t.reason for t in out.trials)


def test_a_guess_rejected_on_pooled_evidence_is_not_a_fall_back_target():
    seen = {"n": 0}

    def rate(cfg):  # the guess reads +10% once, then -10%: pooled, no gain
        if cfg.num_workers == 8:
            seen["n"] += 1
            return 110.0 if seen["n"] == 1 else 90.0
        return 100.0

    s, _ = _search(rate)
    s.start(LoaderConfig(4))
    s.calibrate(LoaderConfig(8), "first guess")
    assert s.incumbent == LoaderConfig(4) and LoaderConfig(8) not in s.kept


def test_the_slots_tie_rule_needs_slots_to_be_the_only_change():
    s, _ = _search(lambda c: 100.0)
    s.start(LoaderConfig(4))
    assert not s.consider(LoaderConfig(6, shared_slots=True), "more workers and slots")  # two changes: no tie
    assert s.incumbent == LoaderConfig(4)


def test_shared_slots_are_not_tried_off_cuda_or_without_workers():
    import torch

    from pipeline_opt.tune.steps import tune_shared_slots

    for dev, cfg, words in ((torch.device("cpu"), LoaderConfig(4), "device is cpu"),
                            (torch.device("cuda"), LoaderConfig(0), "no workers"),
                            (torch.device("cuda"), LoaderConfig(4, decode="nvjpeg"), "nvJPEG")):
        s, ev = _search(lambda c: 100.0)
        s.start(cfg)
        tune_shared_slots(s, _dataloader(), dev, enabled=True)
        assert not any(c.shared_slots for c in ev.calls)
        assert any(words in line for line in s.not_tried), s.not_tried
    s, ev = _search(lambda c: 100.0)
    s.start(LoaderConfig(4))
    tune_shared_slots(s, _dataloader(), torch.device("cuda"), enabled=False)
    assert any("shared_slots=False" in line for line in s.not_tried)


def test_flag_changes_keep_the_given_worker_count_when_the_cap_is_below_it():
    import torch

    from pipeline_opt.tune.steps import tune_flags

    # an 8-worker loader on a machine whose worker cap is 6 (the H200 at 8 cores): the cap stops the
    # tuner from adding workers, not from changing a flag of the configuration the user runs
    s, ev = _search(lambda c: 130.0 if c.shared_slots else 100.0, max_workers=6)
    s.start(LoaderConfig(8, prefetch_factor=4))
    tune_flags(s, _dataloader(), torch.device("cuda"))
    assert LoaderConfig(8, prefetch_factor=4, shared_slots=True) in ev.calls
    assert s.outcome().best.shared_slots and s.outcome().best.num_workers == 8
    assert not s.consider(LoaderConfig(10, prefetch_factor=4), "more workers")  # adding stays capped
    assert any("num_workers=10 is over the budget of 6" in line for line in s.not_tried), s.not_tried


def test_the_given_worker_count_still_answers_to_the_shared_memory_check():
    budget = compute_budget(cpus=64, ram_available_bytes=2**40, user_max=6, shm_free_bytes=100 << 20,
                            bytes_per_batch=10 << 20)
    clock = Clock()
    s = Search(FakeEvaluator(clock, lambda c: 100.0), budget, deadline=100.0, clock=clock)
    s.start(LoaderConfig(8, prefetch_factor=2))
    ok, why = s.fits(LoaderConfig(8, prefetch_factor=4))
    assert not ok and "/dev/shm" in why


def test_builder_makes_a_slot_device_loader():
    import torch

    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.tune.build import CandidateBuilder

    built = CandidateBuilder(_dataloader(), torch.device("cpu")).build(LoaderConfig(2, shared_slots=True))
    assert isinstance(built, DeviceLoader) and built.reuses_buffers
    assert built.loader.num_workers == 2 and not built.loader.pin_memory
    assert len(list(built)) == 4
    with pytest.raises(ValueError, match="shared_slots"):
        CandidateBuilder(_dataloader(), torch.device("cpu"), nvjpeg=object()).build(
            LoaderConfig(2, decode="nvjpeg", shared_slots=True))


def test_a_profile_reading_above_the_trials_neither_sets_the_noise_nor_the_baseline():
    # the H200 8-core trace: the baseline's profile read 703/s, its trials ~440/s; a candidate at
    # +15% over the trials must be kept, not lost inside a ±45% "noise" made of the profile's bias
    base, cand = LoaderConfig(8), LoaderConfig(6)
    s, ev = _search(lambda c: 506.0 if c == cand else 440.0)
    profiled = Measurement(windows=(703.0,), steps_per_window=8, batch_size=64, startup_s=0.0, elapsed_s=5.0,
                           from_profile=True)
    s.start(base, profiled)
    assert s.median(base) == 703.0 and s.evidence(base) == [profiled]  # no trial yet: the profile stands in
    s.calibrate(cand, "guess")
    assert s.noise < 0.05  # the trials' own spread and repeats, not (703 - 440) / mean
    assert s.median(base) == pytest.approx(440.0) and all(not m.from_profile for m in s.evidence(base))
    assert s.history[base][0] is profiled  # still recorded, only not counted
    s.confirm()
    assert s.outcome().best == cand
    assert s.trials[0].reason.endswith("(windows of its profile)")


def test_a_measurement_from_a_trial_is_not_marked_as_a_profile():
    m = Measurement(windows=(1.0,), steps_per_window=1, batch_size=1, startup_s=0.0, elapsed_s=0.0)
    assert not m.from_profile


# ---------------------------------------------------------------- a data-bound pipeline gets its workers

EPOCH, BATCH, BATCH_S, START_S, STEP_S = 16, 128, 2.4, 0.5, 0.035  # 16 batches an epoch, 2.4 s a batch


def _decode_bound(cfg):
    """img/s of a 16-batch epoch whose batches take one worker 2.4 s and the step 35 ms: an epoch
    is ceil(16 / workers) rounds of 2.4 s, plus the workers' start unless persistent."""
    w = cfg.num_workers
    if w == 0:
        return BATCH / (BATCH_S + STEP_S)
    rounds = -(-EPOCH // w)
    return EPOCH * BATCH / (rounds * BATCH_S + (0.0 if cfg.persistent_workers else START_S) + STEP_S)


class ComputeEvaluator(FakeEvaluator):
    def measure(self, cfg, deadline, step_s):
        m = super().measure(cfg, deadline, step_s)
        return Measurement(windows=m.windows, steps_per_window=EPOCH, batch_size=BATCH, startup_s=m.startup_s,
                           elapsed_s=m.elapsed_s, compute_s=STEP_S)


def _tune_decode_bound(main_cpu_s):
    from types import SimpleNamespace

    import torch

    from pipeline_opt.tune.candidates import persistent_for_short_epochs
    from pipeline_opt.tune.first_guess import first_guess
    from pipeline_opt.tune.steps import retry_with_persistent_workers, tune_flags

    budget = compute_budget(cpus=16, pin_thread=True, main_cpu_s=main_cpu_s, worker_cpu_s=BATCH_S, pin_cpu_s=0.015,
                            ram_available_bytes=2**37, ram_per_worker_bytes=2**30, batches_per_epoch=EPOCH)
    clock = Clock()
    ev = ComputeEvaluator(clock, _decode_bound, cost_s=5.0)
    s = Search(ev, budget, deadline=600.0, clock=clock)
    base = LoaderConfig(4, pin_memory=True)
    s.start(base, ev.measure(base, 0, 0))
    report = SimpleNamespace(batch_cpu_s=BATCH_S, compute_time_s=STEP_S, step_time_s=0.6, data_wait_frac=0.94)
    guess = first_guess(report, None, budget, STEP_S)
    first, why = persistent_for_short_epochs(base.with_(num_workers=guess), budget.batches_per_epoch)
    s.calibrate(first, "Little's law first guess" + why)
    retry_with_persistent_workers(s, first)
    s.tune_workers()
    tune_flags(s, None, torch.device("cuda"), shared_slots=False)
    s.confirm()
    return budget, guess, s.outcome(), ev


def test_a_decode_bound_short_epoch_reaches_every_core_and_keeps_persistent_workers():
    budget, guess, out, ev = _tune_decode_bound(main_cpu_s=0.035)
    assert budget.max_workers == 16 and guess == 16  # Little's law (69 workers) capped by the measured budget
    assert out.best == LoaderConfig(16, pin_memory=True, persistent_workers=True), out.verdict
    assert out.best_throughput / out.baseline_throughput > 3.5
    assert len(ev.calls) <= 9, [c.label() for c in ev.calls]


def test_with_the_fixed_reserve_the_same_pipeline_takes_the_fewest_workers_of_two_rounds():
    # 16 - main - pin = 14 workers make 16 batches in two rounds, as 8 do: Little's law rounds to 8
    budget, guess, out, _ = _tune_decode_bound(main_cpu_s=None)
    assert (budget.max_workers, guess) == (14, 8)
    assert out.best.num_workers == 8 and out.best.persistent_workers


def test_worker_moves_follow_littles_law_and_whole_epoch_rounds():
    from pipeline_opt.tune.candidates import epoch_workers, workers_to_keep_up

    assert [epoch_workers(w, 16) for w in (16, 14, 9, 8, 7, 6, 5, 4)] == [16, 8, 8, 8, 6, 6, 4, 4]
    assert epoch_workers(5, None) == 5
    # a data-bound incumbent jumps to what Little's law asks for (capped), before doubling
    m = Measurement(windows=(213.0,), steps_per_window=4, batch_size=128, startup_s=0, elapsed_s=1, compute_s=0.035)
    assert workers_to_keep_up(m, 4) == littles_law_workers(0.6 * 4, 0.035)
    assert worker_neighbours(4, cap=16, need=87) == [16, 8, 2, 5, 3]
    assert worker_neighbours(16, cap=16, batches_per_epoch=16) == [8]
    assert worker_neighbours(8, cap=16, batches_per_epoch=16) == [16, 4, 6]
    not_bound = Measurement(windows=(3600.0,), steps_per_window=4, batch_size=128, startup_s=0, elapsed_s=1,
                            compute_s=0.035)
    assert workers_to_keep_up(not_bound, 4) is None


def test_a_short_epochs_first_guess_is_persistent_and_says_why():
    from pipeline_opt.tune.candidates import persistent_for_short_epochs

    guess, why = persistent_for_short_epochs(LoaderConfig(8), 16)
    assert guess == LoaderConfig(8, persistent_workers=True) and "16 batches an epoch" in why and "at most 2" in why
    assert persistent_for_short_epochs(LoaderConfig(8), 1000) == (LoaderConfig(8), "")  # 125 batches a worker
    assert persistent_for_short_epochs(LoaderConfig(8), None) == (LoaderConfig(8), "")  # no length: unknown
    assert persistent_for_short_epochs(LoaderConfig(0), 4) == (LoaderConfig(0), "")


def test_workers_that_lose_to_their_restarts_are_tried_persistent_before_the_climb_from_none():
    # a long epoch, but every worker start costs 30 s (a slow dataset init on busy cores): the first
    # guess, restarted each epoch, is slower than no workers; the same workers started once are 4x
    from pipeline_opt.tune.steps import retry_with_persistent_workers

    def rate(cfg):
        if cfg.num_workers == 0:
            return 100.0
        return 400.0 if cfg.persistent_workers else 60.0

    s, ev = _search(rate)
    base = LoaderConfig(0)
    s.start(base, ev.measure(base, 0, 0))
    guess = LoaderConfig(8)
    s.calibrate(guess, "Little's law first guess")
    assert s.incumbent == base
    retry_with_persistent_workers(s, guess)
    assert s.incumbent.persistent_workers and s.incumbent.num_workers >= 1
    kept = [t for t in s.trials if t.accepted and t.config["persistent_workers"]]
    assert kept and "started once (persistent)" in kept[0].reason


def test_a_clear_win_over_a_profiled_baseline_remeasures_the_baseline_for_the_claim():
    # the H100 training-pipeline run: the baseline's profile (a profiler in every CPU-bound worker)
    # read 256/s where the plain loader read ~350/s, and a clear win skipped the final check, so the
    # claimed speedup was 8.9x where 5.1x was delivered
    base, cand = LoaderConfig(4), LoaderConfig(15)
    s, ev = _search(lambda c: 2000.0 if c == cand else 350.0, max_workers=16)
    profiled = Measurement(windows=(256.0,), steps_per_window=8, batch_size=128, startup_s=0.0, elapsed_s=5.0,
                           from_profile=True)
    s.start(base, profiled)
    s.calibrate(cand, "guess")
    assert base not in ev.calls  # the clear win skipped the A B A B repeats of the baseline
    s.confirm()
    assert ev.calls.count(base) == 1  # measured once, plainly, for the claim
    out = s.outcome()
    assert out.best == cand and out.speedup == pytest.approx(2000.0 / 350.0, rel=0.03)
    assert any("without the profiler" in t.reason for t in s.trials)


def test_a_clear_win_over_a_baseline_already_measured_plainly_costs_no_extra_trial():
    base, cand = LoaderConfig(4), LoaderConfig(15)
    s, ev = _search(lambda c: 2000.0 if c == cand else 350.0, max_workers=16)
    s.start(base)
    s.calibrate(cand, "guess")
    calls = list(ev.calls)
    s.confirm()
    assert ev.calls == calls and s.outcome().speedup == pytest.approx(2000.0 / 350.0, rel=0.03)


def test_a_clear_winner_known_from_one_trial_is_measured_again_before_the_claim():
    # the H100 classification runs: the final winner had one trial, the best of many, and the claim
    # (12.9x) stood 18% above what the loader delivered (10.9x); a second trial is pooled with it
    base, guess, winner = LoaderConfig(4), LoaderConfig(15), LoaderConfig(14)
    rates = {base: 250.0, guess: 2000.0, winner: 2700.0}
    s, ev = _search(lambda c: rates[c], max_workers=16, jitter=[0.0, 0.0, 0.0, 0.15, -0.05])
    s.start(base)
    s.calibrate(guess, "guess")  # a clear win: the guess is measured twice, the baseline's repeats skipped
    assert s.try_change("fewer workers", num_workers=14)  # one lucky trial: +15%
    s.confirm()
    assert ev.calls[-1] == winner and ev.calls.count(winner) == 2
    assert "pools two of its trials" in s.trials[-1].reason and "pooled median now" in s.trials[-1].reason
    out = s.outcome()
    assert out.best == winner
    # the pooled windows of the two trials, not the lucky one alone (2700 * 1.15 / 250 = 12.4x)
    assert out.speedup < 2700.0 * 1.15 / 250.0 * 0.97


def test_a_noisy_profile_of_the_baseline_does_not_set_the_noise():
    # the CPU demo: the 0-worker baseline's profile (windows of two steps under a profiler) read
    # ±36%, the noise became ±18%, and persistent workers' +12% was rejected as noise
    base, guess = LoaderConfig(0), LoaderConfig(2, prefetch_factor=2)
    persistent = guess.with_(persistent_workers=True)
    rates = {base: 135.0, guess: 300.0, persistent: 338.0}
    s, ev = _search(lambda c: rates[c], max_workers=2)
    profiled = Measurement(windows=(95.0, 135.0, 150.0), steps_per_window=2, batch_size=8, startup_s=0.0,
                           elapsed_s=2.0, from_profile=True)
    s.start(base, profiled)
    assert s.noise == 0.0  # no plain trial of the baseline yet
    s.calibrate(guess, "guess")  # a clear win: the guess twice
    assert s.incumbent == guess and base not in ev.calls
    assert s.try_change("persistent_workers -> True", persistent_workers=True)
    assert s.incumbent == persistent
    s.confirm()
    assert ev.calls.count(base) == 1 and s.noise < 0.05  # the plain baseline trial sets the noise
    assert s.outcome().best == persistent


def test_the_names_moved_out_of_the_api_and_the_search_stay_importable_from_there():
    from pipeline_opt.tune import (
        api,
        candidates,
        first_guess,
        search,
        search_outcome,
        steps,
        validate,
        vetting,
    )

    assert api._tune_flags is steps.tune_flags and api._tune_shared_slots is steps.tune_shared_slots
    assert api._tune_gpu_decode is steps.tune_gpu_decode and api.gpu_decode_workers is steps.gpu_decode_workers
    assert api._retry_with_persistent_workers is steps.retry_with_persistent_workers
    assert api._first_guess is first_guess.first_guess
    assert api._profile_measurement is first_guess.profile_measurement
    assert api.samples_clause is vetting.samples_clause and api.EXACT_REFUSAL is vetting.EXACT_REFUSAL
    assert api._check_baseline is validate.check_baseline and api.BASELINE_KEYS is validate.BASELINE_KEYS
    assert api.persistent_for_short_epochs is candidates.persistent_for_short_epochs
    for name in ("BaselineFailed", "Evaluator", "SearchOutcome", "SLOTS_TIE_REASON", "adds_shared_slots"):
        assert getattr(search, name) is getattr(search_outcome, name)


def test_the_final_confirmations_figure_is_the_claimed_speedup():
    """The H100 timm run: the profiled baseline read 203/s, its unprofiled trial 296/s; the winner 874 then 842/s.
    The not-tried line said +330% while the claim was 2.90x: one trial on each side of a figure the claim did not
    use. The line is now written from the medians the claim divides."""
    s, ev = _search(lambda cfg: 858.0 if cfg.num_workers == 8 else 296.0, jitter=[0.0185, -0.0185])
    profiled = Measurement(windows=(203.0,), steps_per_window=4, batch_size=8, startup_s=0.0, elapsed_s=5.0,
                           from_profile=True)
    s.start(LoaderConfig(2), profiled)
    s.calibrate(LoaderConfig(8), "guess")
    s.confirm()
    out = s.outcome()
    (line,) = [x for x in s.not_tried if x.startswith("final confirmation against the baseline")]
    assert f"{out.speedup:.2f}x the baseline" in line, (line, out.speedup)
    assert f"{out.best_throughput:,.1f} vs {out.baseline_throughput:,.1f}/s" in line
    (guess_line,) = [x for x in s.not_tried if x.startswith("A B A B")]
    assert "against the baseline's 203.0/s so far" in guess_line  # says which measurement it is


@pytest.mark.parametrize("lever, helps", [("gpu", False), ("gpu", True), ("draft", False), ("draft", True)])
def test_a_change_that_rode_in_the_first_guess_stays_only_with_evidence_of_its_own(lever, helps):
    """The first guess bundled more workers with a dataset change (the workers were capped); the change is
    then measured on its own: without evidence it is dropped, not kept because the bundle won."""
    from pipeline_opt.tune.steps import each_lever_on_its_own

    change = {"gpu_transforms": ("Normalize",)} if lever == "gpu" else {"decode": "draft"}

    def rate(cfg):
        if cfg.num_workers == 2:
            return 100.0
        with_lever = cfg.gpu_transforms or cfg.decode == "draft"
        return 400.0 * (1.5 if helps and with_lever else 1.0)

    s, ev = _search(rate)
    s.start(LoaderConfig(2))
    guess = LoaderConfig(8).with_(**change)
    s.calibrate(guess, "guess")
    assert s.incumbent == guess
    each_lever_on_its_own(s, ["the change"])
    if helps:
        assert s.incumbent == guess
    else:
        assert s.incumbent == LoaderConfig(8)
        assert "has no evidence" in s.trials[-1].reason and "dropped" in s.trials[-1].reason


def test_a_claim_pooling_trials_that_disagree_beyond_the_noise_is_flagged():
    """An outlier trial of the winner (one read 40% low) is not silently averaged into the claim."""
    s, ev = _search(lambda cfg: 800.0 if cfg.num_workers == 8 else 100.0, jitter=[0.0, 0.0, -0.4])
    s.start(LoaderConfig(2))
    s.calibrate(LoaderConfig(8), "guess")  # a clear win: the winner is measured once more (its outlier)
    out = s.outcome()
    assert out.best == LoaderConfig(8)
    assert "the winner's 2 trials read 480.0 to 800.0/s" in out.verdict and "may not hold" in out.verdict
    assert out.cautions and out.cautions[0].startswith("the winner's 2 trials")
    steady, _ = _search(lambda cfg: 800.0 if cfg.num_workers == 8 else 100.0)
    steady.start(LoaderConfig(2))
    steady.calibrate(LoaderConfig(8), "guess")
    assert "may not hold" not in steady.outcome().verdict and not steady.outcome().cautions


def test_a_clear_win_that_the_repeats_shrink_gets_the_final_check():
    """The profile read the baseline at 100/s, its unprofiled trial at 360/s; the winner runs at 400/s. The
    first guess's clear win is judged again after the repeats, and the final A/B check runs."""
    s, ev = _search(lambda cfg: 400.0 if cfg.num_workers == 8 else 360.0)
    profiled = Measurement(windows=(100.0,), steps_per_window=4, batch_size=8, startup_s=0.0, elapsed_s=5.0,
                           from_profile=True)
    s.start(LoaderConfig(2), profiled)
    s.calibrate(LoaderConfig(8), "guess")
    s.confirm()
    assert not any(x.startswith("final confirmation against the baseline") and "far beyond" in x for x in s.not_tried)
    assert any(t.reason.startswith("final check") for t in s.trials), [t.reason for t in s.trials]
