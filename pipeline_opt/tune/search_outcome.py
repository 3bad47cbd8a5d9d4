"""The search's terms: what it asks of an :class:`Evaluator`, what it decides (:class:`SearchOutcome`),
the error of a baseline that cannot be measured (:class:`BaselineFailed`), and the shared-slots tie
rule's test (:func:`adds_shared_slots`). The rules themselves are :mod:`pipeline_opt.tune.search`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.measure import Measurement
from pipeline_opt.tune.result import Trial


class Evaluator(Protocol):
    """Measures candidates for the search."""

    def measure(self, cfg: LoaderConfig, deadline: float, step_s: float) -> Measurement: ...

    def estimate_s(self, cfg: LoaderConfig, step_s: float) -> float: ...


SLOTS_TIE_REASON = ("asked for, and they cut the workers' system time and page faults per batch "
                    "several-fold")


def adds_shared_slots(cfg: LoaderConfig, ref: LoaderConfig) -> bool:
    """Whether ``cfg`` is ``ref`` with shared slots turned on and nothing else changed."""
    return cfg.shared_slots and not ref.shared_slots and cfg == ref.with_(shared_slots=True)


@dataclass(frozen=True)
class SearchOutcome:
    """What the search decided, and the evidence."""

    best: LoaderConfig
    baseline: LoaderConfig
    best_throughput: float  # pooled median samples/s
    baseline_throughput: float
    noise: float
    trials: tuple[Trial, ...]
    not_tried: tuple[str, ...]
    verdict: str  # one sentence: what won, or that nothing did
    cautions: tuple[str, ...] = ()  # what weakens the claim (trials of one configuration that disagree)

    @property
    def speedup(self) -> float:
        """The one speedup figure of a tuning run: the pooled median throughput of ``best`` over the
        baseline's, every window of their trials (interleaved, the final check's included); exactly
        1.0 when the loader as given is returned."""
        if self.best == self.baseline:
            return 1.0
        return self.best_throughput / max(self.baseline_throughput, 1e-12)


class BaselineFailed(Exception):
    """The loader as given could not be measured (the cause is chained)."""
