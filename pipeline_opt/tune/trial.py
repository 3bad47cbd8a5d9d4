"""The search's evaluator: build a candidate's loader and measure it in steady state."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline_opt.tune.build import CandidateBuilder
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.measure import Measurement, measure_throughput

DEFAULT_STARTUP_S = 0.5  # assumed cost of starting a trial's workers before any was measured


@dataclass
class TrialRunner:
    """Implements :class:`pipeline_opt.tune.search.Evaluator` on real loaders.

    Each trial runs ``windows`` windows of about ``window_s`` seconds (at least ``min_steps``
    steps), after discarding ``max(warmup, num_workers * prefetch_factor)`` batches.
    """

    builder: CandidateBuilder
    model: torch.nn.Module
    step_fn: Callable[[torch.nn.Module, Any], Any]
    device: torch.device
    initial_step_s: float
    windows: int = 3
    window_s: float = 1.0
    warmup: int = 2
    min_steps: int = 6
    max_steps: int = 200
    seed: int | None = None
    startup_s: dict[int, float] = field(default_factory=dict)  # measured start-up by worker count

    def steps_for(self, step_s: float) -> int:
        step_s = step_s if step_s > 0 and math.isfinite(step_s) else self.initial_step_s
        if step_s <= 0:
            return self.min_steps
        return int(min(self.max_steps, max(self.min_steps, round(self.window_s / step_s))))

    def measure(self, cfg: LoaderConfig, deadline: float, step_s: float) -> Measurement:
        with warnings.catch_warnings():  # the measured budget, not torch's core-count rule, bounds the workers
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = self.builder.build(cfg, trial=True)
        m = measure_throughput(loader, self.model, self.step_fn, self.device, windows=self.windows,
                               steps=self.steps_for(step_s), warmup=self.warmup, deadline=deadline,
                               seed=self.seed)
        self.startup_s[cfg.num_workers] = m.startup_s
        return m

    def _startup_estimate(self, workers: int) -> float:
        if workers in self.startup_s:
            return self.startup_s[workers]
        known = [(w, s) for w, s in self.startup_s.items() if w > 0]
        if not known:
            return DEFAULT_STARTUP_S if workers else 0.0
        per_worker = max(s / w for w, s in known)
        return per_worker * workers

    def estimate_s(self, cfg: LoaderConfig, step_s: float) -> float:
        """Seconds a trial of ``cfg`` should take, from the incumbent's step time."""
        step_s = step_s if step_s > 0 and math.isfinite(step_s) else self.initial_step_s
        skip = max(self.warmup, cfg.num_workers * (cfg.prefetch_factor or 0))
        steps = skip + self.windows * self.steps_for(step_s)
        return self._startup_estimate(cfg.num_workers) + 1.2 * steps * step_s
