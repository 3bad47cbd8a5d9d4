"""Does validation slow training down? The training steps right after a validation pass, measured.

A validation pass at an epoch's end (NMS and mAP on the CPU, a validation loader's workers, the
training loader's workers started again for the next epoch) can leave the next training steps slower
than the steady ones. :class:`ValidationRecorder` keeps, at almost no cost, the host time of every
training step (from the end of the previous step, or of the validation pass, to the end of this
one, so the wait for the first batch of the next epoch counts) and the part of it spent waiting for
data, and marks each validation pass, whose main-thread CPU hotspots it records with :mod:`cProfile`.
:meth:`ValidationRecorder.analyse` compares the steps after each pass with the steady steps and
recommends from what it measured.

Used by :class:`pipeline_opt.profile.inloop.LoopProfiler` (``with prof.validation(): ...``) and by the
ultralytics integration (the trainer's ``on_val_start`` / ``on_val_end``).
"""

from __future__ import annotations

import cProfile
import math
import pstats
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

AFTER_STEPS = 5  # steps after a pass compared with the steady ones
SLOW = 1.25  # a step this much slower than the steady median counts as slowed by validation
TARGET_SHARE = 0.05  # validate so that it costs at most this share of the training time
MAX_EVERY = 20  # the longest validation interval advised, in epochs; beyond it a subset is advised
# built-ins whose self time is waiting (for a worker's batch, a lock, a timer), not the pass's own CPU work
_WAITING = ("<method 'poll' of 'select.poll' objects>", "<built-in method select.select>",
            "<method 'acquire' of '_thread.lock' objects>", "<built-in method time.sleep>",
            "<method 'poll' of 'select.epoll' objects>", "<method 'wait' of '_thread.lock' objects>")
TOP_HOTSPOTS = 5


@dataclass(frozen=True)
class ValidationPass:
    """One validation pass: where it ran (the training steps before it), how long, and its hotspots."""

    after_step: int  # training steps completed before it
    seconds: float
    cpu_seconds: float  # CPU time of the whole process during the pass (all threads)
    hotspots: tuple[tuple[str, float], ...]  # (function, self seconds) on the thread that marked it


@dataclass(frozen=True)
class ValidationInterference:
    """What the steps after validation cost, measured against the steady steps."""

    passes: tuple[ValidationPass, ...]
    steady_step_s: float  # median step, without the steps right after a pass and the warm-up
    after_step_s: tuple[float, ...]  # k-th step after a pass (median over passes), k = 1..
    after_data_s: tuple[float, ...]  # the data wait within those steps
    slowed_steps: int  # steps after a pass slower than SLOW x steady, counted from the first
    extra_s_per_pass: float  # seconds those steps took beyond the steady step
    hotspot: str | None  # the validation pass's top function by self time
    steps_per_epoch: int | None
    recommendations: tuple[str, ...] = ()
    summary: str = ""
    steady_steps: int = 0  # the training steps the steady step is the median of (the whole loop, not the window)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def slowdown(self) -> float:
        """The slowed steps' mean time as a multiple of the steady step (1.0: no slowdown)."""
        if not self.slowed_steps or self.steady_step_s <= 0:
            return 1.0
        return statistics.fmean(self.after_step_s[:self.slowed_steps]) / self.steady_step_s


@dataclass
class ValidationRecorder:
    """Step times and validation marks of a training loop (one per loop; not thread-safe)."""

    warmup_steps: int = 3
    profile_cpu: bool = True
    steps: list[tuple[float, float]] = field(default_factory=list)  # (step seconds, data-wait seconds)
    passes: list[ValidationPass] = field(default_factory=list)
    _last_end: float | None = None
    _data_s: float = 0.0
    _val_start: float | None = None
    _val_cpu: float = 0.0
    _profiler: Any = None

    @property
    def in_validation(self) -> bool:
        """Whether a pass was started and not ended."""
        return self._val_start is not None

    def data_wait(self, seconds: float) -> None:
        """The current step waited ``seconds`` for its batch."""
        self._data_s += max(0.0, float(seconds))

    def step_end(self, now: float | None = None) -> None:
        """A training step ended (the first call only starts the clock)."""
        now = time.perf_counter() if now is None else now
        if self._val_start is not None:  # a step inside a validation pass: not a training step
            return
        if self._last_end is not None:
            self.steps.append((now - self._last_end, self._data_s))
        self._last_end, self._data_s = now, 0.0

    def validation_start(self) -> None:
        """A validation pass begins (training steps stop being counted until :meth:`validation_end`)."""
        if self._val_start is not None:
            return
        self._val_cpu = time.process_time()
        if self.profile_cpu:
            self._profiler = cProfile.Profile()
            try:
                self._profiler.enable()
            except ValueError:  # another profiler is active on this thread: time it without hotspots
                self._profiler = None
        self._val_start = time.perf_counter()

    def validation_end(self) -> ValidationPass | None:
        """The pass ends; the next training step is timed from now."""
        if self._val_start is None:
            return None
        now = time.perf_counter()
        hotspots: tuple[tuple[str, float], ...] = ()
        if self._profiler is not None:
            self._profiler.disable()
            hotspots = _top_functions(self._profiler)
            self._profiler = None
        done = ValidationPass(after_step=len(self.steps), seconds=now - self._val_start,
                              cpu_seconds=time.process_time() - self._val_cpu, hotspots=hotspots)
        self.passes.append(done)
        self._val_start = None
        self._last_end, self._data_s = now, 0.0
        return done

    def analyse(self, steps_per_epoch: int | None = None) -> ValidationInterference | None:
        """The steps after each pass against the steady steps; None before a pass has training steps
        after it and steady steps to compare with."""
        return analyse(self.steps, self.passes, warmup_steps=self.warmup_steps, steps_per_epoch=steps_per_epoch)


def analyse(steps: list[tuple[float, float]], passes: list[ValidationPass], *, warmup_steps: int = 3,
            steps_per_epoch: int | None = None, after: int = AFTER_STEPS) -> ValidationInterference | None:
    """See :meth:`ValidationRecorder.analyse` (``steps``: (seconds, data-wait seconds) per training step)."""
    followed = [p for p in passes if p.after_step < len(steps)]
    if not followed:
        return None
    near = {p.after_step + k for p in followed for k in range(after)}
    steady = [s for i, (s, _) in enumerate(steps) if i >= warmup_steps and i not in near]
    if len(steady) < 3:
        return None
    steady_s = statistics.median(steady)
    after_s, after_data = [], []
    for k in range(after):
        at = [steps[p.after_step + k] for p in followed if p.after_step + k < len(steps)]
        if not at:
            break
        after_s.append(statistics.median(s for s, _ in at))
        after_data.append(statistics.median(d for _, d in at))
    slowed = 0
    while slowed < len(after_s) and after_s[slowed] > SLOW * steady_s:
        slowed += 1
    extra = sum(max(0.0, s - steady_s) for s in after_s[:slowed])
    hotspot = _main_hotspot(followed)
    result = ValidationInterference(
        passes=tuple(passes), steady_step_s=steady_s, after_step_s=tuple(after_s), after_data_s=tuple(after_data),
        slowed_steps=slowed, extra_s_per_pass=extra, hotspot=hotspot, steps_per_epoch=steps_per_epoch,
        steady_steps=len(steady))
    return _with_words(result)


def _with_words(r: ValidationInterference) -> ValidationInterference:
    from dataclasses import replace

    val_s = statistics.median(p.seconds for p in r.passes)
    ms = 1e3
    if r.slowed_steps:
        summary = (f"the {r.slowed_steps} step{'s' if r.slowed_steps > 1 else ''} after validation took "
                   f"{r.slowdown:.1f}x the steady step ({r.steady_step_s * ms:.0f} ms, the median of "
                   f"{r.steady_steps} training steps away from validation): "
                   f"{r.extra_s_per_pass:.2f} s lost per pass, on top of the pass itself ({val_s:.2f} s)")
    else:
        summary = (f"the steps after validation ran at the steady pace ({r.steady_step_s * ms:.0f} ms, the median "
                   f"of {r.steady_steps} training steps away from validation; first "
                   f"{r.after_step_s[0] * ms:.0f} ms); the pass itself took {val_s:.2f} s")
    if r.hotspot:
        summary += f"; validation's CPU hotspot: {r.hotspot}"
    recs = []
    cost = val_s + r.extra_s_per_pass
    if r.steps_per_epoch and r.steady_step_s > 0:
        epoch_s = r.steps_per_epoch * r.steady_step_s
        every = max(1, math.ceil(cost / (TARGET_SHARE * epoch_s)))
        share = cost / (epoch_s + cost)
        if every > MAX_EVERY:
            recs.append(f"validation and its after-effect take {cost / epoch_s:.1f}x an epoch's training time "
                        f"({share:.0%} of each epoch's time): validating every {MAX_EVERY} epochs still costs "
                        f"{cost / (MAX_EVERY * epoch_s + cost):.0%}; validate on a subset of the validation set "
                        f"(about 1/{every} of it keeps each pass under {TARGET_SHARE:.0%})")
        elif every > 1:
            recs.append(f"validation and its after-effect cost {share:.0%} of each epoch's time: validating every "
                        f"{every} epochs keeps it under {TARGET_SHARE:.0%}")
    if r.slowed_steps and r.after_data_s and r.after_data_s[0] > 0.5 * max(r.after_step_s[0] - r.steady_step_s, 0):
        recs.append(f"most of the first step after validation ({r.after_data_s[0] * ms:.0f} ms) is waiting for data: "
                    "the training loader's workers start again after each pass; persistent_workers=True keeps them")
    cpu_bound = [p for p in r.passes if p.seconds > 0 and p.cpu_seconds / p.seconds >= 0.8]
    if r.slowed_steps and cpu_bound and r.hotspot:
        recs.append(f"validation is CPU-bound ({r.hotspot} leads): run it in a separate process or on another "
                    "device so the training process's threads are not held up")
    if r.slowed_steps and any(p.cpu_seconds > 1.5 * p.seconds for p in r.passes):
        recs.append("validation used several cores at once: give it fewer CPU threads "
                    "(torch.set_num_threads around it) so the training workers keep theirs")
    return replace(r, recommendations=tuple(recs), summary=summary)


def _main_hotspot(passes: list[ValidationPass]) -> str | None:
    totals: dict[str, float] = {}
    for p in passes:
        for name, seconds in p.hotspots:
            if name not in _WAITING:  # waiting for a batch or a lock is not the pass's CPU work
                totals[name] = totals.get(name, 0.0) + seconds
    if not totals:
        return None
    name, seconds = max(totals.items(), key=lambda kv: kv[1])
    return f"{name} ({seconds / len(passes):.2f} s self time per pass)"


def _top_functions(profiler: cProfile.Profile) -> tuple[tuple[str, float], ...]:
    stats = pstats.Stats(profiler).stats  # {(file, line, function): (cc, nc, tottime, cumtime, callers)}
    rows = []
    for (filename, _line, function), (_cc, _nc, tottime, _cum, _callers) in stats.items():
        if function in ("<module>", "disable") or function.startswith("<method 'disable'") or function in _WAITING:
            continue
        where = filename.rsplit("/", 1)[-1]
        rows.append((function if filename == "~" else f"{function} ({where})", float(tottime)))
    rows.sort(key=lambda r: r[1], reverse=True)
    return tuple(rows[:TOP_HOTSPOTS])
