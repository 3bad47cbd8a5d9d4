"""A/B measurement: arms measured in interleaved rounds, judged against the noise of their repeats.

The one primitive behind every "is B faster than A" in pipeline_opt and its benchmarks:

* :func:`interleave` measures arms in rounds, each arm once per round (the order alternating
  A B, B A unless told otherwise), so a drift of the machine (thermal, another process, a cache
  filling) lands on every arm alike. The ultralytics augmentation decision and the benchmark
  harness use it; the tuner's search runs its A B A B repeats adaptively through the same judge.
* :func:`judge` says how a candidate median compares with a reference median against
  ``max(noise, min_gain, spread)``, in words; :func:`repeat_noise` is the noise of repeated
  medians of one arm; :func:`clear_win` is a gain that no plausible noise can flip.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)

MIN_GAIN = 0.03
CLEAR_GAIN = 0.5  # a gain of +50% or more (and 5x the threshold) is decided without repeats


def _pct(x: float, signed: bool = True) -> str:
    """A relative change as a percentage: one decimal below 10% (``+4.2%``), whole percents above (``+35%``)."""
    sign = "+" if signed else ""
    return f"{x:{sign}.1%}" if abs(x) < 0.1 else f"{x:{sign}.0%}"


@dataclass(frozen=True)
class Judgement:
    """A candidate median against a reference median: the relative gain, the threshold it had to
    beat, and the finding in plain words (without the decision, so a caller may add a tie rule)."""

    accepted: bool
    gain: float  # candidate / reference - 1
    threshold: float  # max(noise, min_gain, spread)
    finding: str  # e.g. "42% slower (noise ±12%)", "+4.0% is inside the measured noise ±12%"

    @property
    def decision(self) -> str:
        """``kept``; ``rolled back`` for a loss beyond the threshold; ``not kept`` for a change inside it."""
        if self.accepted:
            return "kept"
        return "rolled back" if self.gain < -self.threshold else "not kept"

    @property
    def sentence(self) -> str:
        return f"{self.finding}: {self.decision}"


def noise_text(noise: float, digits: int | None = None) -> str:
    """``noise ±12%`` (``digits`` decimals, or as :func:`judge` writes percentages), or ``noise not
    measured`` for 0.0: the baseline had no plain trial to measure it on, and ±0% would claim a
    certainty nothing measured."""
    if noise <= 0:
        return "noise not measured"
    return f"noise ±{_pct(noise, False)}" if digits is None else f"noise ±{100 * noise:.{digits}f}%"


def judge(candidate: float, incumbent: float, noise: float, min_gain: float = MIN_GAIN,
          spread: float = 0.0) -> Judgement:
    """How ``candidate`` (median samples/s) compares with ``incumbent``, in words a user can act on.

    A gain counts only beyond ``max(noise, min_gain, spread)``; the sentence names which of the
    three set that threshold, so "inside the measured noise" is said only of changes that are.
    """
    if incumbent <= 0:
        return Judgement(candidate > 0, 0.0, 0.0, "the incumbent measured no throughput")
    gain = candidate / incumbent - 1.0
    threshold = max(noise, min_gain, spread)
    context = noise_text(noise) + (f", window spread ±{_pct(spread, False)}" if spread > noise else "")
    if gain > threshold:
        return Judgement(True, gain, threshold, f"{_pct(gain)} faster ({context})")
    if gain < -threshold:
        return Judgement(False, gain, threshold, f"{_pct(-gain, False)} slower ({context})")
    if threshold == noise and noise > 0:
        inside = f"inside the measured noise ±{_pct(noise, False)}"
    elif threshold == spread and spread > 0:
        inside = f"inside the trials' own window spread ±{_pct(spread, False)} ({noise_text(noise)})"
    else:
        inside = f"inside the {_pct(min_gain, False)} minimum gain ({noise_text(noise)})"
    return Judgement(False, gain, threshold, f"{_pct(gain)} is {inside}")


def accept(candidate: float, incumbent: float, noise: float, min_gain: float = MIN_GAIN,
           spread: float = 0.0) -> tuple[bool, str]:
    """Whether a candidate median beats the incumbent median beyond the noise; and the sentence why,
    ending in the decision: ``"+35% faster (noise ±12%): kept"``, ``"42% slower (noise ±12%): rolled
    back"``, ``"+4.0% is inside the measured noise ±12%: not kept"``.

    ``spread`` is the half relative spread of the two trials' windows (0 when not considered).
    """
    j = judge(candidate, incumbent, noise, min_gain, spread)
    return j.accepted, j.sentence


def clear_win(candidate: float, incumbent: float, noise: float, min_gain: float = MIN_GAIN) -> bool:
    """Whether ``candidate`` beats ``incumbent`` by so much that repeating either cannot change the verdict."""
    if incumbent <= 0 or candidate <= 0:
        return False
    return candidate / incumbent - 1.0 > max(CLEAR_GAIN, 5.0 * max(noise, min_gain))


def repeat_noise(medians: list[float]) -> float:
    """Relative spread (max - min) / mean of repeated medians of one configuration."""
    if len(medians) < 2:
        return 0.0
    mean = statistics.fmean(medians)
    return 0.0 if mean <= 0 else (max(medians) - min(medians)) / mean


def interleave(arms: Sequence[K], rounds: int, measure: Callable[[K], Any], *, alternate: bool = True,
               stop: Callable[[], bool] | None = None,
               on_error: Callable[[K, Exception], bool] | None = None) -> tuple[dict[K, list[Any]], tuple[K, ...]]:
    """Measure every arm once per round, for ``rounds`` rounds; returns each arm's results in order
    and the order the measurements ran in.

    ``alternate``: odd rounds run the arms in reverse (A B, B A, A B...). ``stop()`` is asked
    before every measurement after the first round (the first round always runs, so every arm gets
    a result); when it answers True, what was measured is returned. ``on_error(arm, exc)`` is
    called when ``measure`` raises an ``Exception``: True drops that arm from the later rounds and
    goes on; False (or no ``on_error``) re-raises.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1")
    results: dict[K, list[Any]] = {arm: [] for arm in arms}
    dropped: set[K] = set()
    order: list[K] = []
    for r in range(rounds):
        for arm in (list(reversed(arms)) if alternate and r % 2 else list(arms)):
            if arm in dropped:
                continue
            if r > 0 and stop is not None and stop():
                return results, tuple(order)
            order.append(arm)
            try:
                results[arm].append(measure(arm))
            except Exception as exc:
                if on_error is None or not on_error(arm, exc):
                    raise
                dropped.add(arm)
    return results, tuple(order)
