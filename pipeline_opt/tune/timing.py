"""The tuner's time arithmetic: how long a trial's windows are, what a trial should cost, how much
of the budget the profiles get. Pure functions of measured numbers (unit-tested without loaders).

A trial's cost is dominated by slow steps when the loader is data-bound (a 0.6 s step turns a
6-step window into 3.6 s), so window lengths follow the measured step time, not a step count:

* a window lasts about ``window_s`` seconds, but at least ``min_steps`` steps and at least one
  batch per worker: workers that started together deliver their batches in bursts of
  ``num_workers``, and a window shorter than one burst measures the burst, not the rate;
* on a short epoch (one that fits ``EPOCH_WINDOW_FACTOR`` windows) a window holds whole epochs:
  the rounds of the workers restart with every epoch (16 batches over 14 workers are a round of
  14 and a round of 2, as slow as two full rounds), and only whole epochs hold them in proportion.
  The epoch restarts themselves are charged to every window in proportion to its steps
  (:func:`pipeline_opt.tune.measure.epoch_charged`), whatever its length;
* a trial discards ``max(warmup, num_workers)`` batches first: the burst that was ready when the
  first batch arrived (each worker decoded its first batch during the start-up); a shared-slots
  trial discards every slot's first batch (:func:`slot_first_use_batches`);
* the model of a candidate's step time is Little's law: ``max(compute_s, batch_s / effective
  workers)``, where ``batch_s`` is one worker's seconds per batch inferred from a measured
  configuration of the same dataset variant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline_opt.loading.slot_collate import DEFAULT_EXTRA_SLOTS

SPAWN_S = 0.3  # fixed cost of starting a worker pool (fork + first imports)
SPAWN_PER_WORKER_S = 0.05
SHUTDOWN_PER_WORKER_S = 0.02
ESTIMATE_MARGIN = 1.15
EPOCH_WINDOW_FACTOR = 4.0  # a window may grow to this many window_s to hold a whole epoch


def window_seconds(budget_s: float) -> float:
    """Target length of one measurement window for a tuning budget of ``budget_s`` seconds.

    About 1/60 of the budget, between 0.25 s and 1.5 s: with 3 windows per trial a 60 s budget
    leaves room for the ~12 trials a search typically needs, a 6 s budget still measures a few.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s={budget_s!r} must be > 0")
    return min(1.5, max(0.25, budget_s / 60.0))


def slot_first_use_batches(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches until every slot of a fresh shared-slots loader has been used once: the pool's size,
    ``num_workers * (prefetch_factor + DEFAULT_EXTRA_SLOTS)`` (each worker takes its slots in turn).

    A slot's first batch costs the worker a new shared-memory segment and the training process its
    mapping and page-locking (``cudaHostRegister``): once per slot, for the loader's lifetime, and
    inside a short trial's windows unless discarded. With large batches and many slots a short
    trial can fall entirely within that first use and read the slots slower than the same loader
    without them, while after a warm-up the same slots read faster.
    """

    workers = max(0, int(num_workers))
    return workers * (int(prefetch_factor or 2) + DEFAULT_EXTRA_SLOTS)


def whole_rounds(steps: int, num_workers: int) -> int:
    """``steps`` rounded up to a whole number of rounds of ``num_workers`` workers (at least one round).

    Workers started together deliver their batches in bursts of one batch each; a window of 10
    steps over 8 workers holds one burst or two depending on where it starts, so such windows of
    one pipeline can read more than 2x apart. A window of whole rounds holds the same number
    of batches from every worker wherever it starts.
    """
    if steps < 1:
        raise ValueError(f"steps={steps!r} must be >= 1")
    workers = max(1, int(num_workers))
    return int(math.ceil(steps / workers) * workers)


def steps_per_window(step_s: float, num_workers: int, *, window_s: float, min_steps: int = 2,
                     max_steps: int = 200, batches_per_epoch: int | None = None) -> int:
    """Steps in one window: ``window_s / step_s``, at least ``min_steps`` and one per worker, and
    a whole number of rounds of the workers (the nearest, within ``max_steps`` where one fits).

    The DataLoader hands batches to its workers in turn, so a window of whole rounds holds the
    same number of batches from every worker; a window that ends inside a burst of ready batches
    reads faster than one that ends just before it (up to ``(rounds + 1) / rounds`` apart).
    Every epoch starts a new round at the first worker, so when an epoch of ``batches_per_epoch``
    fits ``EPOCH_WINDOW_FACTOR * window_s`` (and ``max_steps``) the window is a whole number of
    epochs instead (the nearest, at least one).
    """
    if min_steps < 1 or max_steps < min_steps:
        raise ValueError(f"min_steps={min_steps}, max_steps={max_steps}: need 1 <= min_steps <= max_steps")
    workers = max(0, int(num_workers))
    floor = max(min_steps, workers)
    timed = step_s > 0 and math.isfinite(step_s)
    epoch = int(batches_per_epoch or 0)
    if epoch and epoch <= max_steps and timed and epoch * step_s <= EPOCH_WINDOW_FACTOR * window_s:
        epochs = max(1, round(window_s / (epoch * step_s)))
        return int(min(epochs, max_steps // epoch) * epoch)
    if not timed:
        steps = floor
    else:
        steps = max(floor, round(window_s / step_s))
    if workers > 1:
        steps = max(1, round(steps / workers)) * workers
        if steps < min_steps:
            steps = math.ceil(min_steps / workers) * workers
        if steps > max_steps and max_steps >= workers:
            steps = (max_steps // workers) * workers
    return int(min(max_steps, steps))


def effective_workers(num_workers: int, usable_cpus: float) -> float:
    """Workers that can run at once: no more than the usable cores (1 for the main process)."""
    return 1.0 if num_workers <= 0 else float(min(num_workers, max(1.0, usable_cpus)))


def batch_seconds(step_s: float, num_workers: int, compute_s: float, usable_cpus: float) -> float:
    """One worker's seconds per batch implied by a measured ``step_s`` (an upper bound when compute-bound)."""
    if num_workers <= 0:
        return max(step_s - compute_s, 0.0)
    return step_s * effective_workers(num_workers, usable_cpus)


def predict_step_s(batch_s: float, num_workers: int, compute_s: float, usable_cpus: float) -> float:
    """Little's law: a step waits for the data unless ``num_workers`` deliver faster than the step consumes."""
    if num_workers <= 0:
        return compute_s + batch_s
    return max(compute_s, batch_s / effective_workers(num_workers, usable_cpus))


def restart_estimate(startup_s: float, num_workers: int, persistent: bool, round_wait_s: float = 0.0) -> float:
    """Extra seconds a new epoch costs when a trial saw none begin: a fresh iterator's start-up
    (``startup_s``, from ``iter()`` to the first batch: the workers' start and a whole batch's
    latency), less the workers' start for persistent workers (they only refill the pipeline), less
    ``round_wait_s`` (what a steady round of one batch per worker waits: that round arrives with the
    first batch), and nothing without workers (the main process makes the next batch as it would
    mid-epoch)."""
    if num_workers <= 0 or not startup_s > 0:
        return 0.0
    if persistent:
        startup_s -= SPAWN_S + SPAWN_PER_WORKER_S * num_workers
    return max(0.0, startup_s - max(0.0, round_wait_s))


def trial_seconds(step_s: float, num_workers: int, *, windows: int, steps: int, warmup: int,
                  first_batch_s: float) -> float:
    """Estimated wall seconds of one trial: worker start-up and the first batch, the discarded
    burst, ``windows * steps`` measured steps, shutdown; with a safety margin."""
    startup = (SPAWN_S + SPAWN_PER_WORKER_S * num_workers) if num_workers else 0.0
    burst = max(0, warmup - num_workers) if num_workers else warmup  # the rest of the burst is already there
    measured = windows * steps + burst
    shutdown = SHUTDOWN_PER_WORKER_S * num_workers
    return ESTIMATE_MARGIN * (startup + first_batch_s + measured * step_s + shutdown)


PLAN_TRIALS = 3  # the trials a plan asks room for: the first guess, a repeat, one more move
SHORT_WINDOW_NOISE = 0.05  # windows may be shortened while the baseline's measured noise is below this
MIN_WINDOW_S = 0.25


@dataclass(frozen=True)
class TrialPlan:
    """How many trials the time budget holds, predicted from the baseline before the search starts."""

    budget_s: float
    spent_s: float  # before the search: the baseline's profile and the probe batch
    reserve_s: float  # kept for profiling the winner
    trial_s: float  # estimated seconds of one trial (the first candidate) at ``window_s``
    window_s: float  # the trials' window length (shortened from ``default_window_s`` when needed and quiet)
    default_window_s: float
    trials: int  # trials that fit in what is left
    needed_s: float  # a budget that would hold ``wanted`` trials
    wanted: int
    noise: float  # the baseline's measured noise the window choice went by

    @property
    def text(self) -> str:
        shorter = (f", windows shortened from {self.default_window_s:.2f} s (noise ±{self.noise:.1%})"
                   if self.window_s < self.default_window_s else "")
        return (f"time_budget_s={self.budget_s:g}: {self.spent_s:.1f} s went to measuring the baseline, "
                f"{self.reserve_s:.1f} s are kept for profiling the winner, a trial takes ~{self.trial_s:.1f} s "
                f"(3 windows of ~{self.window_s:.2f} s{shorter}): room for {self.trials} trial(s); "
                f"{self.needed_s:.0f} s would allow {self.wanted}")

    @property
    def warning(self) -> str | None:
        """A sentence for the user when the budget cannot hold the baseline and one candidate, else None."""
        if self.trials >= 1:
            return None
        return (f"time_budget_s={self.budget_s:g} holds the baseline only (measuring it took {self.spent_s:.1f} s, "
                f"one trial needs ~{self.trial_s:.1f} s more); {self.needed_s:.0f} s would allow {self.wanted} "
                "trials: nothing will be tuned unless time_budget_s is raised")


def plan_trials(budget_s: float, spent_s: float, reserve_s: float, trial_s_at, window_s: float,
                noise: float, *, wanted: int = PLAN_TRIALS, min_window_s: float = MIN_WINDOW_S) -> TrialPlan:
    """The plan for the search: trials that fit ``budget_s - spent_s - reserve_s``, each costing
    ``trial_s_at(window_s)`` seconds.

    When fewer than ``wanted`` fit and the baseline's measured ``noise`` is below
    ``SHORT_WINDOW_NOISE``, the windows are shortened (halved, down to ``min_window_s``) to the
    longest that fits ``wanted`` trials, or the shortest: a quiet pipeline is measured well by short
    windows, a noisy one is not, and its trials keep their length. ``needed_s`` rounds up to 10 s."""
    left = max(0.0, budget_s - spent_s - reserve_s)

    def fit(w: float) -> tuple[int, float]:
        cost = max(float(trial_s_at(w)), 1e-3)
        return int(left // cost), cost

    chosen = window_s
    trials, cost = fit(window_s)
    if trials < wanted and noise <= SHORT_WINDOW_NOISE:
        w = window_s
        while w / 2 >= min_window_s - 1e-9 and trials < wanted:
            w /= 2
            trials, cost = fit(w)
            chosen = w
    needed = math.ceil((spent_s + reserve_s + wanted * cost) / 10.0) * 10.0
    return TrialPlan(budget_s=budget_s, spent_s=spent_s, reserve_s=reserve_s, trial_s=cost, window_s=chosen,
                     default_window_s=window_s, trials=trials, needed_s=needed, wanted=wanted, noise=noise)


def profile_steps(remaining_s: float, step_s: float, *, steps: int = 8, min_steps: int = 2) -> int:
    """Steps a final profile can afford in ``remaining_s`` (at most ``steps``, at least ``min_steps``)."""
    if not (step_s > 0 and math.isfinite(step_s)):
        return steps
    fit = int(remaining_s / (3.0 * step_s))  # the profiler's own warm-up and start-up cost about as much again
    return max(min_steps, min(steps, fit))


def final_reserve_s(budget_s: float, baseline_profile_s: float) -> float:
    """Seconds kept for profiling the winner: 10% of the budget, never more than the baseline's profile took."""
    return max(0.0, min(0.1 * budget_s, baseline_profile_s))


@dataclass(frozen=True)
class StepSample:
    """One profiled step: its wall seconds and samples (what :class:`ProfileReport.steps` holds)."""

    step_s: float
    samples: int


def windows_from_steps(steps: Sequence[StepSample], per_window: int) -> tuple[float, ...]:
    """Samples/s of consecutive groups of ``per_window`` profiled steps (a short last group is merged)."""
    per_window = max(1, int(per_window))
    groups = [list(steps[i:i + per_window]) for i in range(0, len(steps), per_window)]
    if len(groups) > 1 and len(groups[-1]) < per_window:
        groups[-2].extend(groups.pop())
    out = []
    for group in groups:
        wall = sum(s.step_s for s in group)
        if wall > 0:
            out.append(sum(s.samples for s in group) / wall)
    return tuple(out)
