"""The measured search: baseline, noise, a modelled first guess, local moves, rollback.

The search never builds or iterates a loader itself: it asks an :class:`Evaluator` to measure a
:class:`LoaderConfig` (and to estimate how long that takes), so the decision logic is tested with
injected numbers. The rules:

* The baseline (the loader as given) is measured first; a baseline that fails is the user's
  pipeline failing, and the error propagates.
* Noise is measured, not assumed, on steady-state windows only (a window holding a worker
  start-up or an epoch's restart, ``Measurement.startup_windows``, or a profile's steps on the queue
  its workers filled during their start-up, is left out: one such window read ±605% "noise" and
  made every gain look like noise): the half-spread of the baseline's repeat windows, and the
  relative difference between repeated measurements of the baseline (the baseline and the first
  guess are measured interleaved, A B A B). The larger is the noise. Windows of the baseline's
  profile stand in for a baseline trial's median only until one is measured (:meth:`Search.evidence`);
  they never set the noise (a profile's windows are a few steps under a profiler). Repeats of a candidate feed
  its pooled median, not the noise: a candidate's slow first run (worker start-up) must not make
  every later gain look like noise.
* A candidate is accepted only when its median beats the incumbent's reference (its pooled median;
  its slowest trial's median once it has been measured more than once) by more than
  ``max(noise, min_gain, window spread)``, the window spread being half the relative spread of the
  candidate's windows or of the incumbent's, whichever is larger: after a change of regime (say
  from CPU-bound decoding to GPU decoding) the baseline's noise no longer describes the pipeline,
  and a gain smaller than the candidate's own jitter is not a gain. Otherwise the incumbent stays
  (rollback), with one exception, the tie rule: a candidate that only has fewer workers than a
  tuner-chosen incumbent and measures at least the incumbent's pooled median replaces it (equal
  speed, fewer processes competing with the training process); and the shared-slots tie rule: a
  candidate that only turns shared slots on (tried only when asked for) and measures no more than
  ``min_gain`` below the incumbent's pooled median replaces it, the loader as given included, and
  survives the final checks while its pooled median is no more than ``min_gain`` below the
  baseline's (equal speed within the minimum gain, a fraction of the workers' system time and page
  faults, and in longer interleaved comparisons slots do not lose). A failed candidate (raised,
  worker died, hung) is recorded and rolled back; the search continues.
* The resource budget caps the workers the tuner may add; a candidate with no more workers than the
  loader as given (which has run with them) answers only to the shared-memory check, so flag changes
  are tried on a user's configuration even when it is over the cap.
* Before returning, the winner and the baseline are measured once more; unless the winner's pooled
  median still beats the baseline's beyond the (updated) noise, the search falls back along the
  incumbents it kept, latest first, to the first that holds up against the baseline by the same
  pooled rules (a gain beyond the noise, or the shared-slots tie), and to the baseline when none
  does: a winner reached by two chained tie rules (shared slots, then fewer workers) that fails
  the check must not also undo the step that held on its own.
* A *clear* win (a gain over the baseline above ``max(CLEAR_GAIN, 5 x threshold)``, e.g. 8x for a
  data-bound loader) skips the baseline's repeats and the final re-check: no plausible noise flips
  it, and on a slow baseline those repeats would cost a large share of the budget. The winner is
  measured a second time, though: every later candidate is compared with it, and one lucky first
  trial reading well above the pipeline's later windows would make the tuner reject candidates
  that are faster than the incumbent really is. For the same reason a final winner known from one
  trial is measured once more before the speedup is claimed: it won on its best trial among many.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from pipeline_opt._core.log import get_logger
from pipeline_opt.tune.ab import MIN_GAIN, _pct, accept, clear_win, judge, noise_text
from pipeline_opt.tune.budget import ResourceBudget
from pipeline_opt.tune.candidates import LoaderConfig, worker_neighbours, workers_to_keep_up
from pipeline_opt.tune.evidence import PooledEvidence
from pipeline_opt.tune.measure import Measurement, TrialFailed
from pipeline_opt.tune.result import Trial
from pipeline_opt.tune.search_outcome import (
    SLOTS_TIE_REASON,
    BaselineFailed,
    Evaluator,
    SearchOutcome,
    adds_shared_slots,
)

__all__ = ["SLOTS_TIE_REASON", "BaselineFailed", "Evaluator", "Search", "SearchOutcome", "adds_shared_slots"]

log = get_logger("tune.search")


class Search(PooledEvidence):
    """Stateful search over :class:`LoaderConfig` s; see the module docstring for the rules."""

    def __init__(
        self,
        evaluator: Evaluator,
        budget: ResourceBudget,
        *,
        deadline: float,
        min_gain: float = MIN_GAIN,
        clock: Callable[[], float] = time.monotonic,
        on_trial: Callable[[Trial], None] | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.budget = budget
        self.deadline = deadline
        self.min_gain = min_gain
        self.clock = clock
        self.on_trial = on_trial
        super().__init__()  # self.history: the measurements of each configuration
        self.failed: dict[LoaderConfig, str] = {}
        self.trials: list[Trial] = []
        self.not_tried: list[str] = []
        self.noise = 0.0
        self.baseline: LoaderConfig | None = None
        self.incumbent: LoaderConfig | None = None
        self.kept: list[LoaderConfig] = []  # every incumbent, in the order the search made them so
        self.out_of_time = False  # no time left for exploring (the final confirmation has its own reserve)
        self.confirming = False

    def _update_noise(self) -> None:
        """The noise of the baseline's trials so far (:meth:`baseline_noise`)."""
        self.noise = self.baseline_noise(self.baseline)

    def _record(self, cfg: LoaderConfig, m: Measurement | None, accepted: bool, reason: str, status: str = "ok",
                elapsed: float = 0.0) -> None:
        trial = Trial(config=cfg.to_dict(), throughput=0.0 if m is None else m.median,
                      spread=0.0 if m is None else m.steady_spread, accepted=accepted, reason=reason, status=status,
                      windows=() if m is None else m.windows, elapsed_s=elapsed if m is None else m.elapsed_s,
                      startup_windows=() if m is None else m.outlier_windows)
        self.trials.append(trial)
        if self.on_trial is not None:
            self.on_trial(trial)

    def _step_s(self) -> float:
        runs = self.history.get(self.incumbent, [])
        return runs[-1].step_s if runs else 0.0

    def remaining_s(self) -> float:
        return self.deadline - self.clock()

    def confirm_reserve_s(self) -> float:
        """Seconds an exploring trial must leave for :meth:`confirm`: one trial of the baseline and one of
        the incumbent, while the incumbent is not the baseline. Without it the search spent the whole
        budget on candidates and the claimed speedup rested on the baseline's profile and the winner's
        single best trial."""
        if self.confirming or self.incumbent is None or self.incumbent == self.baseline:
            return 0.0
        step = self._step_s()
        return self.evaluator.estimate_s(self.baseline, step) + self.evaluator.estimate_s(self.incumbent, step)

    def _run(self, cfg: LoaderConfig, why: str, force: bool = False) -> Measurement | None:
        """Measure ``cfg`` once; None (recorded) when it failed or does not fit the time left.

        ``force`` (the first baseline) measures even when the budget is spent: it gets at least
        twice its estimated time. Outside :meth:`confirm` a trial must also leave
        :meth:`confirm_reserve_s`.
        """
        estimate = self.evaluator.estimate_s(cfg, self._step_s())
        deadline = max(self.deadline, self.clock() + 2 * estimate) if force else self.deadline
        if not force and self.out_of_time and not self.confirming:
            self.not_tried.append(f"{cfg.label()} ({why}): the time budget ran out")
            return None
        keep = 0.0 if force else self.confirm_reserve_s()
        if not force and estimate + keep > self.remaining_s():
            if not self.confirming:
                self.out_of_time = True
            kept = f", {keep:.1f} s of them kept for the final confirmation" if keep else ""
            self.not_tried.append(f"{cfg.label()} ({why}): needs ~{estimate:.1f} s, "
                                  f"{max(0.0, self.remaining_s()):.1f} s left{kept}")
            return None
        t0 = self.clock()
        try:
            m = self.evaluator.measure(cfg, deadline, self._step_s())
        except TrialFailed as exc:
            if cfg == self.baseline and not self.history.get(cfg):
                raise BaselineFailed(f"the baseline trial ({cfg.label()}) failed: {exc}") from exc
            if exc.kind == "budget":
                self.out_of_time = True
                self.not_tried.append(f"{cfg.label()} ({why}): {exc}")
                return None
            self.failed[cfg] = str(exc)
            back = "" if self.incumbent is None else f"; rolled back to {self.incumbent.label()}"
            self._record(cfg, None, False, f"{why}: failed, {exc}{back}", status="failed", elapsed=self.clock() - t0)
            return None
        if not m.windows:
            self.failed[cfg] = "no window measured"
            self._record(cfg, None, False, f"{why}: no window could be measured", status="failed",
                         elapsed=self.clock() - t0)
            return None
        self.history.setdefault(cfg, []).append(m)
        return m

    # ------------------------------------------------------------------ moves

    def start(self, baseline: LoaderConfig, measured: Measurement | None = None) -> None:
        """Measure the loader as given; it is the first incumbent.

        ``measured`` (e.g. windows of the baseline's profile) is used instead of a new trial.
        """
        self.baseline = baseline
        self._make_incumbent(baseline)
        if measured is not None and measured.windows:
            self.history.setdefault(baseline, []).append(measured)
            m, why = measured, "baseline: the loader as given (windows of its profile)"
        else:
            m, why = self._run(baseline, "baseline", force=True), "baseline: the loader as given"
        if m is None:
            raise BaselineFailed(f"the baseline trial ({baseline.label()}) measured no window")
        self._update_noise()
        self._record(baseline, m, True, why)

    def fits(self, cfg: LoaderConfig) -> tuple[bool, str]:
        """The resource budget's verdict on ``cfg``: ``(True, "")`` or ``(False, why)``.

        The worker cap keeps the tuner from *adding* workers; it does not forbid the loader as
        given's own count, which has run already. So a candidate with no more workers than the
        baseline answers only to the shared-memory check: a flag change (shared slots, pinning,
        prefetch) on a user's 8-worker loader is still tried on an 8-core machine whose cap is 6:
        refusing it there would leave out a change that can pay on exactly such a machine."""
        if self.baseline is not None and 0 < cfg.num_workers <= self.baseline.num_workers:
            return self.budget.shm_allows(cfg.num_workers, cfg.prefetch_factor)
        return self.budget.allows(cfg.num_workers, cfg.prefetch_factor)

    def consider(self, cfg: LoaderConfig, why: str) -> bool:
        """Measure ``cfg`` unless already seen or over budget; make it the incumbent if it wins."""
        if cfg in self.history or cfg in self.failed:
            return False
        fits, reason = self.fits(cfg)
        if not fits:
            self.not_tried.append(f"{cfg.label()} ({why}): {reason}")
            return False
        incumbent = self.incumbent
        m = self._run(cfg, why)
        if m is None:
            return False
        j = judge(m.median, self.reference(incumbent), self.noise, self.min_gain,
                  spread=self.window_spread(m, incumbent))
        ok, verdict = j.accepted, j.finding
        if not ok and self._ties_with_fewer_workers(cfg, m, incumbent):
            ok = True
            verdict += (f", but not slower ({m.median:,.1f}/s against {self.median(incumbent):,.1f}/s pooled) "
                        f"with fewer workers ({cfg.num_workers} < {incumbent.num_workers})")
        elif not ok and (lever := self._unproven_lever(cfg, m, incumbent)):
            ok = True
            verdict += (f", so {lever} has no evidence ({self.median(incumbent):,.1f}/s with it pooled, "
                        f"{m.median:,.1f}/s without): dropped")
        elif not ok and adds_shared_slots(cfg, incumbent) and self._slots_tie(m.median, self.median(incumbent)):
            ok = True
            verdict += (f", but not slower beyond the {self.min_gain:.0%} minimum ({m.median:,.1f}/s against "
                        f"{self.median(incumbent):,.1f}/s pooled) through shared slots ({SLOTS_TIE_REASON})")
        if ok:
            tail = f"kept over {incumbent.label()}"
        else:
            tail = f"not kept ({incumbent.label()} stays)" if j.decision == "not kept" \
                else f"rolled back to {incumbent.label()}"
        self._record(cfg, m, ok, f"{why}: {verdict}: {tail}")
        if ok:
            self._make_incumbent(cfg)
        return ok

    def _make_incumbent(self, cfg: LoaderConfig) -> None:
        self.incumbent = cfg
        if cfg in self.kept:
            self.kept.remove(cfg)
        self.kept.append(cfg)

    def _ties_with_fewer_workers(self, cfg: LoaderConfig, m: Measurement, incumbent: LoaderConfig) -> bool:
        """The tie rule: a candidate that differs from a tuner-chosen incumbent only by fewer workers
        and whose median is not below the incumbent's pooled median wins the tie. Within the noise,
        fewer workers leave more cores to the training process, which can make the smaller count
        faster by margins the tuner's short windows cannot resolve. The loader as given is never
        replaced on a tie."""
        return (incumbent != self.baseline and cfg.num_workers < incumbent.num_workers
                and cfg == incumbent.with_(num_workers=cfg.num_workers)
                and m.median >= self.median(incumbent))

    def _outlier_warning(self, cfg: LoaderConfig, who: str) -> str:
        """A flag for a claim that pools trials which disagree beyond twice the noise (one of them an
        outlier the budget left no time to re-measure), or ''."""
        apart = self.disagreement(cfg)
        if apart <= 2 * max(self.noise, self.min_gain):
            return ""
        medians = sorted(m.median for m in self.evidence(cfg))
        return (f"{who}'s {len(medians)} trials read {medians[0]:,.1f} to {medians[-1]:,.1f}/s, {apart:.0%} apart "
                f"(more than twice the noise): the claim pools them and may not hold")

    def _unproven_lever(self, cfg: LoaderConfig, m: Measurement, incumbent: LoaderConfig) -> str:
        """The rule for a change that rode in with others (the first guess's dataset changes): ``cfg`` is
        the incumbent without one pixel-changing lever (device transforms, draft decoding); the lever
        stays only if the incumbent beats ``cfg`` beyond the noise. Its name when it does not, else ''."""
        if incumbent == self.baseline:
            return ""
        if incumbent.gpu_transforms and cfg == incumbent.with_(gpu_transforms=()):
            lever = f"{'+'.join(incumbent.gpu_transforms)} on the device"
        elif incumbent.decode == "draft" and cfg == incumbent.with_(decode="pil"):
            lever = "JPEG draft decoding"
        else:
            return ""
        return "" if judge(self.median(incumbent), m.median, self.noise, self.min_gain).accepted else lever

    def _slots_tie_with_baseline(self, cfg: LoaderConfig | None = None) -> bool:
        """The shared-slots tie rule against the loader as given: ``cfg`` (the incumbent by default)
        only adds shared slots to it and its pooled median is no more than ``min_gain`` below the
        baseline's."""
        cfg = self.incumbent if cfg is None else cfg
        return (adds_shared_slots(cfg, self.baseline)
                and self._slots_tie(self.median(cfg), self.median(self.baseline)))

    def _holds_against_baseline(self, cfg: LoaderConfig) -> bool:
        """Whether ``cfg`` may be returned instead of the baseline: its pooled median beats the
        baseline's beyond the noise, or it ties on the shared-slots rule."""
        ok, _ = accept(self.median(cfg), self.median(self.baseline), self.noise, self.min_gain)
        return ok or self._slots_tie_with_baseline(cfg)

    def _fall_back(self, loser: LoaderConfig, verdict: str, check: str) -> None:
        """``loser`` failed ``check`` against the baseline: the incumbent becomes the latest earlier
        incumbent that still holds up against the baseline (:meth:`_holds_against_baseline`), else
        the baseline. When the tuner kept shared slots on a tie, then fewer workers on a second tie,
        and the latter fails the final check, falling straight to the baseline would also undo the
        slots, which held up on their own."""
        earlier = [c for c in reversed(self.kept) if c not in (loser, self.baseline)]
        target = next((c for c in earlier if self._holds_against_baseline(c)), self.baseline)
        self.incumbent = target
        if target == self.baseline:
            tail = "returning the original settings"
        else:
            gain = self.median(target) / max(self.median(self.baseline), 1e-12) - 1.0
            tail = (f"falling back to {target.label()}, kept earlier and still holding up against the baseline "
                    f"({_pct(gain)} pooled)")
        self._record(loser, None, False, f"{check}: {verdict}; {tail}", status="skipped")

    def _slots_tie(self, slots_median: float, reference_median: float) -> bool:
        """Shared slots tie when they measure no more than ``min_gain`` below the reference: in longer
        interleaved comparisons slots beat the same loader without them, while the tuner's short
        windows can read them slightly below and would roll them back."""
        return slots_median >= (1.0 - self.min_gain) * reference_median

    def _repeat(self, cfg: LoaderConfig, why: str) -> bool:
        m = self._run(cfg, why)
        if m is None:
            return False
        self._update_noise()
        if cfg == self.baseline:
            now = f"noise now ±{self.noise:.1%}" if self.noise > 0 else "noise not measured yet"
        else:  # a candidate's repeats feed its pooled median, not the noise (module docstring)
            now = f"pooled median now {self.median(cfg):,.1f}/s over {len(self.evidence(cfg))} trials"
        self._record(cfg, m, cfg == self.incumbent, f"{why}: {now}")
        return True

    def calibrate(self, guess: LoaderConfig, why: str) -> None:
        """Baseline vs the first guess, interleaved A B A B; decides on pooled medians."""
        base = self.baseline
        if guess == base or not self.fits(guess)[0]:
            self._repeat(base, "repeat of the baseline (noise estimate)")
            return
        self.consider(guess, why)
        if guess not in self.history:
            return
        if clear_win(self.median(guess), self.median(base), self.noise, self.min_gain):
            self.skip("A B A B repeats of the baseline",
                      f"the first guess measured {self.median(guess):,.1f}/s against the baseline's "
                      f"{self.median(base):,.1f}/s so far "
                      f"({_pct(self.median(guess) / max(self.median(base), 1e-12) - 1.0)}), far beyond any noise")
            if self.incumbent == guess:  # every later candidate is compared with it: one trial is too few
                self._repeat(guess, f"repeat of {guess.label()} (the incumbent every later candidate is "
                                    "compared with)")
            return
        if not (self._repeat(base, "repeat of the baseline (A B A B noise estimate)")
                and self._repeat(guess, f"repeat of {guess.label()} (A B A B noise estimate)")):
            return
        j = judge(self.median(guess), self.median(base), self.noise, self.min_gain)
        ok = j.accepted
        if ok != (self.incumbent == guess):
            self._make_incumbent(guess if ok else base)
            if not ok:  # rejected on the pooled evidence: no later fall-back may bring it back
                self.kept.remove(guess)
            self._record(guess, None, ok, f"pooled A B A B decision against the baseline: {j.sentence}; "
                         f"incumbent is now {self.incumbent.label()}", status="skipped")

    def tune_workers(self, why: str = "num_workers") -> None:
        """Hill-climb num_workers from the incumbent within the budget: to Little's law's count while
        the incumbent is still data-bound, then doubling, halving, quarter steps (in whole epoch rounds,
        :func:`pipeline_opt.tune.candidates.worker_neighbours`)."""
        while not self.out_of_time:
            inc = self.incumbent
            if inc.num_workers == 0:
                moves = [1]
            else:
                runs = self.evidence(inc)
                need = workers_to_keep_up(runs[-1], inc.num_workers) if runs else None
                moves = worker_neighbours(inc.num_workers, self.budget.max_workers, need=need,
                                          batches_per_epoch=self.budget.batches_per_epoch)
            for w in moves:
                cand = inc.with_(num_workers=w)
                if cand not in self.history and cand not in self.failed \
                        and self.consider(cand, f"{why} {inc.num_workers} -> {w}"):
                    break
            else:
                return

    def try_change(self, why: str, **changes: object) -> bool:
        """Measure the incumbent with ``changes`` applied."""
        return self.consider(self.incumbent.with_(**changes), why)

    def skip(self, what: str, reason: str) -> None:
        """Note a candidate that is not tried, and why."""
        self.not_tried.append(f"{what}: {reason}")

    def confirm(self) -> None:
        """Re-measure the winner and the baseline; keep the winner only if it still beats the baseline."""
        if self.incumbent == self.baseline:
            return
        if self.remaining_s() <= 0:
            self.not_tried.append("final confirmation against the baseline: the time budget ran out")
            return
        self.confirming = True
        try:
            self._confirm()
        finally:
            self.confirming = False

    def _confirm(self) -> None:
        if clear_win(self.median(self.incumbent), self.median(self.baseline), self.noise, self.min_gain):
            if all(m.from_profile for m in self.history.get(self.baseline, [])):
                # the claimed speedup's denominator: the profile measured the baseline with a profiler
                # in every worker, which slows CPU-bound workers, so the claim would overstate the gain
                self._repeat(self.baseline, "the baseline measured without the profiler, as the claimed "
                                            "speedup's denominator")
            if len(self.evidence(self.incumbent)) < 2:
                # the numerator: the winner won on its best trial among many, and a single trial of it
                # overstates what it delivers (the winner's curse); a second trial is pooled with it
                self._repeat(self.incumbent, "the winner measured once more, so that the claimed speedup "
                                             "pools two of its trials, not the one that won")
            # judged again after those repeats (an unprofiled baseline can read far above its profile), and
            # said with the medians the claimed speedup is computed from (one source)
            best, base = self.median(self.incumbent), self.median(self.baseline)
            if clear_win(best, base, self.noise, self.min_gain):
                self.skip("final confirmation against the baseline", f"{self.incumbent.label()} is "
                          f"{best / max(base, 1e-12):.2f}x the baseline ({best:,.1f} vs {base:,.1f}/s, the claimed "
                          "speedup's pooled medians), far beyond any noise")
                return
            # no longer a clear win: the final check below decides
        if not (self._repeat(self.baseline, "final check: the baseline again")
                and self._repeat(self.incumbent, f"final check: {self.incumbent.label()} again")):
            return
        fresh_best, fresh_base = self.history[self.incumbent][-1].median, self.history[self.baseline][-1].median
        j = judge(self.median(self.incumbent), self.median(self.baseline), self.noise, self.min_gain)
        ok, verdict = j.accepted, j.finding
        if not ok and self._slots_tie_with_baseline():
            return
        if ok and fresh_best <= fresh_base:
            ok, verdict = False, f"the re-measured winner ({fresh_best:,.1f}/s) is not faster than the baseline " \
                f"({fresh_base:,.1f}/s)"
        if not ok:
            self._fall_back(self.incumbent, verdict, "final check against the baseline")

    def outcome(self) -> SearchOutcome:
        """The decision. A winner whose pooled gain over the baseline no longer beats the (final)
        noise, e.g. because a later baseline repeat raised it, is not returned."""
        if self.incumbent != self.baseline:
            j = judge(self.median(self.incumbent), self.median(self.baseline), self.noise, self.min_gain)
            ok, verdict = j.accepted, j.finding
            if not ok and not self._slots_tie_with_baseline():
                self._fall_back(self.incumbent, verdict, "pooled against the baseline")
        best, base = self.incumbent, self.baseline
        out = SearchOutcome(best=best, baseline=base, best_throughput=self.median(best),
                            baseline_throughput=self.median(base), noise=self.noise, trials=tuple(self.trials),
                            not_tried=tuple(self.not_tried), verdict="")
        if best == base:
            verdict = "nothing beat the loader as given beyond the noise; the original settings are returned"
        else:
            verdict = (f"{best.label()} is {out.speedup:.2f}x the baseline ({base.label()}), "
                       f"{noise_text(self.noise)}")
            if self._slots_tie_with_baseline() and not accept(self.median(best), self.median(base), self.noise,
                                                              self.min_gain)[0]:
                verdict += f": not slower, kept on the shared-slots tie rule ({SLOTS_TIE_REASON})"
        # the winner only: the baseline's trials set the noise, so their disagreement is in it already
        cautions = () if best == base else tuple(c for c in (self._outlier_warning(best, "the winner"),) if c)
        return dataclasses.replace(out, verdict=verdict + "".join(f"; {c}" for c in cautions), cautions=cautions)
