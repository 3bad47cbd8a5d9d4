"""Keep the GPU augmentation only where it measurably wins.

Moving RandomHSV / RandomFlip from the workers to the device frees CPU time, but costs device time
in the step: on a CPU-bound host it wins, on a launch-bound one (the default loader already keeps
the GPU fed) it loses. :func:`decide_gpu_augment` measures both, interleaved A B A B, with the
tuner's own machinery (:func:`pipeline_opt.tune.measure.measure_throughput` on a fresh clone of
the loader per trial; :func:`pipeline_opt.tune.search.judge` for the verdict), and keeps the GPU
augmentation only when its pooled median beats the CPU one by more than ``max(noise, 3%)``.
Otherwise the CPU stages are given back and the step is left unwrapped.

:func:`decide_gpu_affine` is the second, optional decision (``gpu_affine=True``): with the GPU
colour/flip kept, RandomPerspective's warp on the device against the workers' own warp, measured
the same way. It frees a large share of the workers' CPU time, so it pays where the workers are
the bottleneck (few cores) and gains little or nothing where they are not.

:class:`AugmentSwitch` is the one place that turns the augmentation on or off: the dataset's CPU
stages and the device-side hook always change together.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import ModelStateGuard
from pipeline_opt.integrations.ultralytics._augment import (
    DisabledStages,
    disable_cpu_augment,
    restore_cpu_augment,
)
from pipeline_opt.integrations.ultralytics._protocol import RANDOM_PERSPECTIVE
from pipeline_opt.loading.dataloader import clone_loader
from pipeline_opt.tune import measure as _measure
from pipeline_opt.tune import timing
from pipeline_opt.tune.ab import MIN_GAIN, interleave, judge, repeat_noise
from pipeline_opt.tune.measure import Measurement, TrialFailed

log = get_logger("integrations.ultralytics")

FORCE = "force"
_WARP_STAGE = RANDOM_PERSPECTIVE.name  # what the warp's move silences (and set_affine(False) restores)


def check_gpu_augment(value: Any, name: str = "gpu_augment") -> None:
    """``gpu_augment`` (or ``gpu_affine``) is ``False``, ``True`` (measure, keep if faster) or ``"force"``."""
    if not (isinstance(value, bool) or value == FORCE):
        raise ValueError(f"{name}={value!r} must be True (measured: kept only if faster), False, "
                         f"or {FORCE!r} (always on, unmeasured)")


class AugmentSwitch:
    """Turns the GPU augmentation on or off: the dataset's CPU stages and ``install(on)`` together.

    Args:
        dataset: the ultralytics training dataset whose CPU stages are silenced / restored.
        install: ``install(True)`` puts the device-side augmentation in the step, ``install(False)``
            takes it out (e.g. sets ``YoloStep.augment`` or ``trainer.preprocess_batch``).
        affine: whether ``RandomPerspective``'s gains move too (now; :meth:`set_affine` changes it).
        augment: the device-side augmentation (a ``DetectionGPUAugment``); needed by
            :meth:`set_affine`, which turns its ``warp_enabled`` on and off.
    """

    def __init__(self, dataset: Any, install: Callable[[bool], None], *, affine: bool = False,
                 augment: Any = None) -> None:
        if not callable(install):
            raise TypeError("install must be a callable taking True / False")
        self.dataset = dataset
        self.install = install
        self.augment = augment
        self.affine = affine
        if augment is not None and hasattr(augment, "warp_enabled"):
            augment.warp_enabled = affine
        self.disabled = DisabledStages(())
        self.active = False
        self.decision: AugmentDecision | None = None  # set by whoever decided (measured or forced)
        self.affine_decision: AugmentDecision | None = None  # the same for the warp (decide_gpu_affine)

    def set(self, on: bool) -> None:
        """Silence the CPU stages and install the hook (``on``), or restore them and remove it."""
        if on:
            more = disable_cpu_augment(self.dataset, affine=self.affine)
            self.disabled = DisabledStages(self.disabled.stages + more.stages)
        elif self.disabled.stages:
            restore_cpu_augment(self.dataset, self.disabled)
            self.disabled = DisabledStages(())
        self.install(on)
        self.active = on

    def set_affine(self, on: bool) -> None:
        """Move ``RandomPerspective``'s warp to the device (``on``) or give it back to the workers.

        The colour/flip part stays as it is; needs the switch's ``augment`` (with ``warp_enabled``).
        """
        if self.augment is None or not hasattr(self.augment, "warp_enabled"):
            raise TypeError("set_affine needs AugmentSwitch(..., augment=<DetectionGPUAugment>) to turn its warp on/off")
        if on and self.active:
            more = disable_cpu_augment(self.dataset, affine=True)
            self.disabled = DisabledStages(self.disabled.stages + more.stages)
        elif not on:
            warp = tuple(s for s in self.disabled.stages if s[0] == _WARP_STAGE)
            if warp:
                restore_cpu_augment(self.dataset, DisabledStages(warp))
            self.disabled = DisabledStages(tuple(s for s in self.disabled.stages if s[0] != _WARP_STAGE))
        self.augment.warp_enabled = on
        self.affine = on

    def reapply(self) -> DisabledStages:
        """After the trainer rebuilt the transforms from its args: silence them again if active."""
        if not self.active:
            return DisabledStages(())
        more = disable_cpu_augment(self.dataset, affine=self.affine)
        self.disabled = DisabledStages(self.disabled.stages + more.stages)
        return more


@dataclass(frozen=True)
class Sides:
    """How a decision names its two sides and its two outcomes in the verdict and the log."""

    subject: str  # the option decided: "gpu_augment" or "gpu_affine"
    off: str
    on: str
    kept: str
    stays: str


COLOUR = Sides("gpu_augment", "CPU", "GPU", "GPU augmentation kept", "the CPU augmentation stays")
WARP = Sides("gpu_affine", "GPU colour/flip", "GPU colour/flip + warp", "GPU warp kept",
             "the workers keep the warp")


@dataclass(frozen=True)
class AugmentDecision:
    """Whether the GPU augmentation was kept, and the evidence (throughputs in samples/s).

    For the warp decision (``subject == "gpu_affine"``) the "cpu" fields hold the GPU colour/flip
    alone (the workers warp) and the "gpu" fields the GPU colour/flip + warp.
    """

    applied: bool
    cpu_throughput: float  # pooled median, CPU HSV / flip as ultralytics built them
    gpu_throughput: float  # pooled median, GPU augmentation
    noise: float
    threshold: float  # max(noise, min_gain)
    verdict: str
    cpu_windows: tuple[float, ...] = ()
    gpu_windows: tuple[float, ...] = ()
    order: tuple[str, ...] = ()  # the trials as run, e.g. ("cpu", "gpu", "cpu", "gpu")
    forced: bool = False
    warmup_s: float = 0.0  # the untimed warm-up steps before the first trial (see decide_gpu_augment)
    window_steps: int = 0  # steps per timed window: ``steps`` rounded up to whole rounds of the workers
    burn_in_windows: tuple[float, ...] = ()  # the discarded first CPU trial's windows (see decide_gpu_augment)
    subject: str = COLOUR.subject

    @property
    def gain(self) -> float:
        """GPU over CPU throughput, minus 1 (0 when the CPU side measured nothing)."""
        return self.gpu_throughput / self.cpu_throughput - 1.0 if self.cpu_throughput > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gain"] = self.gain
        return out

    @classmethod
    def forced_on(cls, subject: str = COLOUR.subject) -> AugmentDecision:
        return cls(applied=True, cpu_throughput=0.0, gpu_throughput=0.0, noise=0.0, threshold=0.0,
                   verdict=f"{subject}={FORCE!r}: applied without measuring", forced=True, subject=subject)

    @classmethod
    def not_tried(cls, subject: str, why: str) -> AugmentDecision:
        """A decision that measured nothing (e.g. the warp, when the colour/flip stayed on the CPU)."""
        return cls(applied=False, cpu_throughput=0.0, gpu_throughput=0.0, noise=0.0, threshold=0.0,
                   verdict=f"{subject} not tried: {why}", subject=subject)


def candidate_switch(dataset: Any, install: Callable[[bool], None], augment: Any, gpu_augment: bool | str,
                     gpu_affine: bool | str) -> AugmentSwitch:
    """The switch of a freshly built GPU augmentation, turned on.

    The colour/flip is on: a candidate until :func:`decide_gpu_augment` measured it, or for good
    with ``gpu_augment="force"``. The warp is on only when forced (``gpu_affine="force"`` or
    ``gpu_augment="force"``); with ``gpu_affine=True`` the workers keep it until
    :func:`decide_gpu_affine` measured it. Forced parts get a forced decision recorded.
    """
    warp_now = bool(gpu_affine) and FORCE in (gpu_augment, gpu_affine)
    switch = AugmentSwitch(dataset, install, affine=warp_now, augment=augment)
    switch.set(True)
    if gpu_augment == FORCE:
        switch.decision = AugmentDecision.forced_on()
    if warp_now:
        switch.affine_decision = AugmentDecision.forced_on(WARP.subject)
    return switch


def _pooled(measurements: list[Measurement]) -> tuple[float, tuple[float, ...]]:
    windows = tuple(w for m in measurements for w in m.windows)
    return (float(statistics.median(windows)) if windows else 0.0), windows


def _noise(cpu: list[Measurement], gpu: list[Measurement]) -> float:
    """As the tuner's search: half the windows' spread, or the spread of repeated medians if larger."""
    spreads = [m.spread for m in cpu + gpu]
    noise = statistics.median(spreads) / 2 if spreads else 0.0
    return max(noise, repeat_noise([m.median for m in cpu]), repeat_noise([m.median for m in gpu]))


def decide_gpu_augment(
    loader: Any,
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module, Any], Any],
    device: torch.device,
    switch: AugmentSwitch,
    *,
    rounds: int = 2,
    windows: int = 3,
    steps: int = 10,
    warmup: int = 2,
    min_gain: float = MIN_GAIN,
    time_budget_s: float = 60.0,
    seed: int = 0,
    measure: Callable[..., Measurement] | None = None,
    warm_up: bool | None = None,
    burn_in: bool | None = None,
    sides: Sides = COLOUR,
) -> AugmentDecision:
    """Measure ``loader`` + ``step_fn`` with the CPU stages and with the GPU augmentation, A B A B.

    First one untimed step per side runs on a batch of a worker-less clone of ``loader``, so that
    the one-off costs of a fresh pipeline (cuDNN autotuning, the augmentation kernel's compilation,
    allocator growth) are paid before the first timed trial: paid inside it, they let that trial's
    workers fill their queue, and its windows then time the queue, not the pipeline (such a first
    trial reads well above the same side's later trials).
    Each trial runs on a fresh clone of ``loader`` (its workers fork the dataset in the state being
    measured) with the same ``seed``; the model is restored bitwise afterwards. ``rounds`` pairs are
    measured (fewer when ``time_budget_s`` runs out; with no complete pair the CPU stages stay).
    Each window holds ``steps`` rounded up to whole rounds of the loader's workers
    (:func:`pipeline_opt.tune.timing.whole_rounds`; ``AugmentDecision.window_steps``): windows that
    cut a round of the workers' bursts of batches read up to 2x apart.
    Then one CPU trial runs as a burn-in, recorded (``AugmentDecision.burn_in_windows``) and left out
    of the verdict: the first trial of a fresh pipeline often reads well above the same side's
    repeat (the warm-up steps do not remove it), and with only two pairs that one trial can decide
    against the GPU augmentation.
    The switch is left in the winning state. ``measure`` replaces
    :func:`~pipeline_opt.tune.measure.measure_throughput` (tests inject numbers through it);
    ``warm_up`` and ``burn_in`` (default: only with the real measurement) run the untimed warm-up
    steps and the burn-in trial. ``sides`` names the two sides in the verdict (:func:`decide_gpu_affine`
    measures its warp through this function with ``switch`` turning the warp on and off).
    """
    for name, value, low in (("rounds", rounds, 1), ("windows", windows, 1), ("steps", steps, 1),
                             ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    if not isinstance(time_budget_s, (int, float)) or time_budget_s <= 0:
        raise ValueError(f"time_budget_s={time_budget_s!r} must be a positive number of seconds")
    warm_up = measure is None if warm_up is None else bool(warm_up)
    burn_in = measure is None if burn_in is None else bool(burn_in)
    measure = measure or _measure.measure_throughput
    window_steps = timing.whole_rounds(steps, _measure.num_workers_of(loader))
    deadline = time.monotonic() + float(time_budget_s)
    runs: dict[str, list[Measurement]] = {"cpu": [], "gpu": []}
    order: list[str] = []
    failure, gpu_broke, side, phase, warm_s = "", False, "cpu", "warm-up step", 0.0
    burn: Measurement | None = None
    with ModelStateGuard(model):
        model.train()
        try:
            if warm_up:
                t0 = time.perf_counter()
                for side in ("cpu", "gpu"):
                    _warm_up_step(loader, model, step_fn, device, switch, side)
                warm_s = time.perf_counter() - t0

            def trial(on_gpu: bool) -> Measurement:
                switch.set(on_gpu)
                trial_loader = clone_loader(loader)
                try:
                    return measure(trial_loader, model, step_fn, device, windows=windows, steps=window_steps,
                                   warmup=warmup, deadline=deadline, seed=seed)
                finally:
                    _close(trial_loader)

            if burn_in:
                side, phase = "cpu", "burn-in trial"
                burn = trial(False)
            phase = "trial"

            def measure_side(name: str) -> None:  # kept as it comes: a later failure keeps the pairs before it
                nonlocal side
                side = name
                runs[name].append(trial(name == "gpu"))
                order.append(name)

            # A B pairs in the same order (CPU, then GPU), until the rounds are done or a pair ends past the deadline
            interleave(("cpu", "gpu"), rounds, measure_side, alternate=False,
                       stop=lambda: len(order) % 2 == 0 and time.monotonic() > deadline)
        except TrialFailed as exc:
            gpu_broke = side == "gpu" and exc.kind != "budget"
            failure = f"the {side} {phase} failed ({exc.kind}): {exc}"
    decision = replace(_verdict(runs, order, failure, min_gain, gpu_broke, sides), warmup_s=round(warm_s, 3),
                       window_steps=window_steps, burn_in_windows=() if burn is None else tuple(burn.windows))
    switch.set(decision.applied)
    log.info("pipeline_opt: %s %s: %s", sides.subject, "kept" if decision.applied else "not used", decision.verdict)
    return decision


class _WarpToggle:
    """``decide_gpu_augment``'s switch for the warp decision: ``set(on)`` is ``switch.set_affine(on)``."""

    def __init__(self, switch: AugmentSwitch) -> None:
        self.switch = switch

    def set(self, on: bool) -> None:
        self.switch.set_affine(on)


def decide_gpu_affine(
    loader: Any,
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module, Any], Any],
    device: torch.device,
    switch: AugmentSwitch,
    **kwargs: Any,
) -> AugmentDecision:
    """With the GPU colour/flip on, measure RandomPerspective's warp on the device against the
    workers' warp (A B A B, as :func:`decide_gpu_augment`, same ``kwargs``); keep the faster.

    The warp moves to the device only when it wins beyond ``max(noise, 3%)``; otherwise the
    workers' ``RandomPerspective`` is restored. Not measured (``applied=False``) when the GPU
    augmentation is off (the warp runs in the same step, after the colour/flip's decision) or
    when the run's affine ranges are all 0.
    """
    if not switch.active:
        return AugmentDecision.not_tried(WARP.subject, "the GPU colour/flip augmentation is not in use")
    warp = getattr(switch.augment, "affine", None)
    if warp is not None and warp.is_identity:
        return AugmentDecision.not_tried(WARP.subject, "the run's RandomPerspective ranges are all 0 (nothing to warp)")
    return decide_gpu_augment(loader, model, step_fn, device, _WarpToggle(switch), sides=WARP, **kwargs)


def _warm_up_step(loader: Any, model: torch.nn.Module, step_fn: Callable[[torch.nn.Module, Any], Any],
                  device: torch.device, switch: AugmentSwitch, side: str) -> None:
    """One untimed step of ``side`` ("cpu" / "gpu") on the first batch of a worker-less clone of
    ``loader`` (no worker start-up; the batch's contents do not matter for a warm-up)."""
    switch.set(side == "gpu")
    warm = clone_loader(loader, num_workers=0)
    try:
        batch = _measure.first_batch(warm)
        _measure.step_once(step_fn, model, batch, device)
    finally:
        _close(warm)


def _close(loader: Any) -> None:
    """Shut a trial's loader clone down, where it has a ``close`` (shared-slot loaders do)."""
    close = getattr(loader, "close", None)
    if callable(close):
        close()


def _verdict(runs: dict[str, list[Measurement]], order: list[str], failure: str, min_gain: float,
             gpu_broke: bool, sides: Sides = COLOUR) -> AugmentDecision:
    pairs = min(len(runs["cpu"]), len(runs["gpu"]))
    cpu, gpu = runs["cpu"][:pairs], runs["gpu"][:pairs]
    cpu_tp, cpu_w = _pooled(cpu)
    gpu_tp, gpu_w = _pooled(gpu)
    noise = _noise(cpu, gpu) if pairs else 0.0
    threshold = max(noise, min_gain)
    if pairs == 0 or cpu_tp <= 0:
        why = failure or "no complete CPU / GPU pair was measured"
        applied, verdict = False, f"{why}; {sides.stays}"
    else:
        judged = judge(gpu_tp, cpu_tp, noise, min_gain)
        applied = judged.accepted and not gpu_broke
        verdict = (f"{sides.on} {gpu_tp:.1f} vs {sides.off} {cpu_tp:.1f} samples/s over {pairs} A B pair(s): "
                   f"{judged.finding}; " + (sides.kept if applied else sides.stays))
        if failure:
            verdict += f"; {failure}"
    return AugmentDecision(applied=applied, cpu_throughput=cpu_tp, gpu_throughput=gpu_tp, noise=noise,
                           threshold=threshold, verdict=verdict, cpu_windows=cpu_w, gpu_windows=gpu_w,
                           order=tuple(order), subject=sides.subject)
