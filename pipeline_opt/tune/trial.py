"""The search's evaluator: build a candidate's loader and measure it in steady state."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline_opt.tune import timing
from pipeline_opt.tune.build import CandidateBuilder
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.measure import Measurement, batches_per_epoch, measure_throughput


@dataclass
class TrialRunner:
    """Implements :class:`pipeline_opt.tune.search.Evaluator` on real loaders.

    Each trial discards ``max(warmup, num_workers)`` batches (a shared-slots candidate: every slot's
    first batch, :func:`pipeline_opt.tune.timing.slot_first_use_batches`), then runs ``windows`` windows of about
    ``window_s`` seconds (at least ``min_steps`` steps and one step per worker), sized from the
    candidate's *predicted* step time (:mod:`pipeline_opt.tune.timing`): Little's law applied to the
    measured configuration closest to the candidate, so a slow baseline does not make every trial
    long and a worker increase is not priced at the baseline's speed.
    """

    builder: CandidateBuilder
    model: torch.nn.Module
    step_fn: Callable[[torch.nn.Module, Any], Any]
    device: torch.device
    initial_step_s: float
    windows: int = 3
    window_s: float = 1.0
    warmup: int = 2
    min_steps: int = 2
    max_steps: int = 200
    seed: int | None = None
    compute_s: float = 0.0  # the step's own seconds (the floor of every prediction)
    usable_cpus: float = 1.0
    measured: dict[LoaderConfig, float] = field(default_factory=dict)  # median step seconds by config

    def remember(self, cfg: LoaderConfig, m: Measurement) -> None:
        """Record a measurement made elsewhere (the baseline's profile) for later predictions."""
        if m.median > 0:
            self.measured[cfg] = m.step_s

    def predict_step_s(self, cfg: LoaderConfig, step_s: float) -> float:
        """The step time ``cfg`` should reach, from the closest measured configuration."""
        same = [c for c in self.measured if c.variant() == cfg.variant()]
        refs = same or list(self.measured)
        if not refs:
            s = step_s if step_s > 0 and math.isfinite(step_s) else self.initial_step_s
            return max(s, 1e-6)
        ref = min(refs, key=lambda c: abs(c.num_workers - cfg.num_workers))
        batch_s = timing.batch_seconds(self.measured[ref], ref.num_workers, self.compute_s, self.usable_cpus)
        return max(1e-6, timing.predict_step_s(batch_s, cfg.num_workers, self.compute_s, self.usable_cpus))

    def steps_for(self, cfg: LoaderConfig, step_s: float) -> int:
        return timing.steps_per_window(self.predict_step_s(cfg, step_s), cfg.num_workers, window_s=self.window_s,
                                       min_steps=self.min_steps, max_steps=self.max_steps,
                                       batches_per_epoch=self.batches_per_epoch)

    @property
    def batches_per_epoch(self) -> int | None:
        """Batches per epoch of the user's loader (every candidate keeps its sampler and batch size)."""
        loader = getattr(self.builder, "loader", None)
        return None if loader is None else batches_per_epoch(loader)

    def warmup_for(self, cfg: LoaderConfig) -> int:
        """Batches ``cfg``'s trial discards on top of the workers' first burst (see the class docstring)."""
        if cfg.shared_slots and cfg.num_workers:
            return max(self.warmup, timing.slot_first_use_batches(cfg.num_workers, cfg.prefetch_factor))
        return self.warmup

    def measure(self, cfg: LoaderConfig, deadline: float, step_s: float) -> Measurement:
        with warnings.catch_warnings():  # the measured budget, not torch's core-count rule, bounds the workers
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = self.builder.build(cfg, trial=True)
        m = measure_throughput(loader, self.model, self.step_fn, self.device, windows=self.windows,
                               steps=self.steps_for(cfg, step_s), warmup=self.warmup_for(cfg), deadline=deadline,
                               seed=self.seed)
        self.remember(cfg, m)
        return m

    def plan(self, first: LoaderConfig, *, budget_s: float, spent_s: float, reserve_s: float,
             noise: float) -> timing.TrialPlan:
        """Predict how many trials of about ``first``'s cost fit the budget
        (:func:`pipeline_opt.tune.timing.plan_trials`) and adopt the plan's window length."""

        def trial_s_at(window_s: float) -> float:
            kept, self.window_s = self.window_s, window_s
            try:
                return self.estimate_s(first, 0.0)
            finally:
                self.window_s = kept

        plan = timing.plan_trials(budget_s, spent_s, reserve_s, trial_s_at, self.window_s, noise)
        self.window_s = plan.window_s
        return plan

    def estimate_s(self, cfg: LoaderConfig, step_s: float) -> float:
        """Seconds a trial of ``cfg`` should take (:func:`pipeline_opt.tune.timing.trial_seconds`)."""
        pred = self.predict_step_s(cfg, step_s)
        first = pred * timing.effective_workers(cfg.num_workers, self.usable_cpus)
        return timing.trial_seconds(pred, cfg.num_workers, windows=self.windows, steps=self.steps_for(cfg, step_s),
                                    warmup=self.warmup_for(cfg), first_batch_s=first)
