"""The search's evidence: every measurement of each configuration, and what they pool into (a
configuration's pooled median, the reference a candidate must beat, the window spread of a
comparison, the noise of the baseline's repeats). The rules that use them are
:mod:`pipeline_opt.tune.search`'s.
"""

from __future__ import annotations

import statistics

from pipeline_opt.tune.ab import repeat_noise
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.measure import Measurement


class PooledEvidence:
    """The measurements of each :class:`LoaderConfig` (``history``) and the pooled figures read from them;
    :class:`~pipeline_opt.tune.search.Search` decides on these."""

    def __init__(self) -> None:
        self.history: dict[LoaderConfig, list[Measurement]] = {}

    def evidence(self, cfg: LoaderConfig) -> list[Measurement]:
        """The measurements of ``cfg`` that count: its trials; windows of a profile
        (``Measurement.from_profile``) only while no trial of ``cfg`` has been measured.

        A profile is not a trial: a profile's windows usually read above the same loader's trials,
        because the profiler's slower warm-up steps let the workers fill their queue. Pooled with
        the trials, that one reading would set a wide noise and the tuner would then reject every
        candidate as within it."""
        runs = self.history.get(cfg, [])
        trials = [m for m in runs if not m.from_profile]
        return trials or list(runs)

    def median(self, cfg: LoaderConfig) -> float:
        """Pooled median of every window of ``cfg``'s :meth:`evidence`."""
        windows = [w for m in self.evidence(cfg) for w in m.windows]
        return float(statistics.median(windows)) if windows else 0.0

    def reference(self, cfg: LoaderConfig) -> float:
        """What a candidate must beat to replace ``cfg``: its pooled median, or, once ``cfg`` has been
        measured more than once, its slowest trial's median (a pipeline that ran at that speed in one
        trial cannot be counted on for more; a lucky first trial must not block a real gain)."""
        runs = self.evidence(cfg)
        if len(runs) > 1:
            return min(m.median for m in runs)
        return self.median(cfg)

    def disagreement(self, cfg: LoaderConfig) -> float:
        """How far apart ``cfg``'s trials read: (slowest - fastest trial median) / pooled median; 0 with one."""
        runs = self.evidence(cfg)
        pooled = self.median(cfg)
        if len(runs) < 2 or pooled <= 0:
            return 0.0
        medians = [m.median for m in runs]
        return (max(medians) - min(medians)) / pooled

    def window_spread(self, candidate: Measurement, incumbent: LoaderConfig) -> float:
        """Half the relative window spread of ``candidate`` or of ``incumbent``'s trials (their median),
        whichever is larger; steady-state windows only (:attr:`Measurement.steady_spread`)."""
        earlier = [x.steady_spread for x in self.evidence(incumbent)]
        return max(candidate.steady_spread, statistics.median(earlier) if earlier else 0.0) / 2

    def baseline_noise(self, baseline: LoaderConfig | None) -> float:
        """The noise from the baseline's plain trials only. A profile's windows are a few steps each
        (two, for a loader without workers) under a profiler, so their spread is not a trial's and,
        set as the noise, hides real gains (persistent workers' on a short epoch). Until the baseline
        has a trial (0.0), the window spreads of each comparison guard it."""
        noise = 0.0
        base = [m for m in self.evidence(baseline) if not m.from_profile] if baseline is not None else []
        if base:
            noise = statistics.median(m.steady_spread for m in base) / 2
            noise = max(noise, repeat_noise([m.median for m in base]))
        return noise
