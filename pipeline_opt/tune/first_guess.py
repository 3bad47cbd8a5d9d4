"""The tuner's first guess, from the baseline's profile: Little's law's worker count, the dataset
changes it carries when that count does not fit the budget, and the profile's steps as the
baseline's first measurement."""

from __future__ import annotations

from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.tune import timing
from pipeline_opt.tune.budget import ResourceBudget
from pipeline_opt.tune.candidates import LoaderConfig, epoch_workers, littles_law_workers
from pipeline_opt.tune.gpu_decode import GPU_DECODE_CHANGE, gpu_decode_workers
from pipeline_opt.tune.measure import Measurement

PROFILE_WARMUP = 2  # steps the baseline's profile discards


def compute_s(report: ProfileReport) -> float:
    """The profiled step's compute seconds: its synchronised compute time, else the step less its data wait."""
    return report.compute_time_s or max(report.step_time_s * (1.0 - report.data_wait_frac), 0.0)


def profile_measurement(report: ProfileReport, cfg: LoaderConfig, elapsed_s: float,
                        warmup: int = PROFILE_WARMUP) -> Measurement | None:
    """The baseline profile's steady-state steps as trial windows (one batch per worker at least), or None.

    The profile discards only ``warmup`` steps, but its workers filled up to ``num_workers *
    prefetch_factor`` batches during their start-up: steps on that queue run at the step's own speed,
    and a window of them read many times the steady rate (the noise it made read ±605%). Those steps
    are dropped when enough steps remain for a window; otherwise their windows are kept for the
    throughput but marked as start-up windows, which the noise estimate leaves out.
    """
    steps = [timing.StepSample(s.step_s, s.samples) for s in report.steps if s.step_s > 0 and s.samples > 0]
    per_window = max(2, cfg.num_workers)
    if len(steps) < per_window:
        return None
    prefilled = max(0, cfg.num_workers * (cfg.prefetch_factor or 2) - warmup) if cfg.num_workers else 0
    startup: tuple[int, ...] = ()
    if len(steps) - prefilled >= per_window:
        windows = timing.windows_from_steps(steps[prefilled:], per_window)
    else:
        windows = timing.windows_from_steps(steps, per_window)
        startup = tuple(i for i in range(len(windows)) if i * per_window < prefilled)
    if not windows:
        return None
    return Measurement(windows=windows, steps_per_window=per_window,
                       batch_size=report.batch_size or steps[0].samples, startup_s=0.0, elapsed_s=elapsed_s,
                       compute_s=compute_s(report), from_profile=True, startup_windows=startup)


def guess_inputs(report: ProfileReport, probe, measured_compute_s: float) -> tuple[float, float]:
    """(worker seconds per batch, step seconds): the profile's, the probe's and the measured step's."""
    batch_s = report.batch_cpu_s or (probe.wall_s if probe is not None else 0.0)
    profiled = report.compute_time_s or max(report.step_time_s * (1.0 - report.data_wait_frac), 0.0)
    candidates = [s for s in (profiled, measured_compute_s) if s > 0]  # the profiler's own overhead inflates
    return batch_s, (min(candidates) if candidates else 1e-4)


def first_guess(report: ProfileReport, probe, budget: ResourceBudget, measured_compute_s: float) -> int:
    """Little's law's worker count, within the budget, in whole epoch rounds."""
    batch_s, step_s = guess_inputs(report, probe, measured_compute_s)
    return epoch_workers(max(1, min(budget.max_workers, littles_law_workers(batch_s, step_s))),
                         budget.batches_per_epoch)


def guess_reason(report: ProfileReport, probe, budget: ResourceBudget, measured_compute_s: float) -> str:
    """The numbers behind :func:`first_guess`, for the trial's reason."""
    batch_s, step_s = guess_inputs(report, probe, measured_compute_s)
    need = littles_law_workers(batch_s, step_s)
    capped = f", capped at {budget.max_workers} by the {budget.binding} budget" if need > budget.max_workers else ""
    return f"{batch_s * 1e3:.1f} ms of worker time per batch / {step_s * 1e3:.1f} ms per step -> {need}{capped}"


def capped_on_data(report: ProfileReport, probe, budget: ResourceBudget, measured: float) -> bool:
    """Whether the loader as given waits on data and the workers Little's law wants do not fit the budget:
    then more workers alone cannot feed the step, and what cuts per-sample CPU is worth trying first."""
    batch_s, step_s = guess_inputs(report, probe, measured)
    capped = littles_law_workers(batch_s, step_s) > budget.max_workers
    return capped and (report.bottleneck == "data" or report.data_wait_frac > 0.5)


def gpu_decode_guess(guess: LoaderConfig, report: ProfileReport, probe, budget: ResourceBudget, measured: float,
                     decode_plan) -> LoaderConfig | None:
    """The first guess as the GPU-decode candidate (``decode_plan``: nvJPEG or the random-augmentation
    replay), when there is a plan and the workers are capped on a data-bound loader, else None.

    The GPU decode takes nearly all of a sample's CPU work off the workers, which is what a capped
    guess lacks; tried first, it is measured even when the budget holds only a few trials (the
    CPU guess is tried next if it loses)."""
    if decode_plan is None or not capped_on_data(report, probe, budget, measured):
        return None
    return guess.with_(num_workers=gpu_decode_workers(guess.num_workers, budget.max_workers), **GPU_DECODE_CHANGE)


def combined_guess(guess: LoaderConfig, report: ProfileReport, probe, budget: ResourceBudget, measured: float,
                   gpu_plan, draft_plan) -> tuple[LoaderConfig, list[str]]:
    """The first guess, with the dataset changes when the workers Little's law wants do not fit the budget."""
    if not capped_on_data(report, probe, budget, measured):
        return guess, []
    levers = []
    if gpu_plan is not None:
        guess, levers = guess.with_(gpu_transforms=gpu_plan.names), [f"{'+'.join(gpu_plan.names)} on the device"]
    if draft_plan is not None:
        guess, levers = guess.with_(decode="draft"), [*levers, "JPEG draft decoding"]
    return guess, levers
