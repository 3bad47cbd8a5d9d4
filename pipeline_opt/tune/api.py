"""Front door of the tuner: :func:`autotune`.

The order of work (see :mod:`pipeline_opt.tune.search` for the acceptance rules):

1. profile the loader as given, briefly (the baseline report, the per-batch worker cost and step
   time); its steady-state steps are the baseline's first measurement;
2. compute the resource budget (CPU affinity, local ranks, RAM, /dev/shm, batches per epoch);
   plan the dataset changes and classify what each does to the samples
   (:mod:`pipeline_opt.tune.exactness`): a different JPEG decoder (draft, nvJPEG) is measured on a
   few of the user's images first and offered only within the documented error bounds; with
   ``exact=True`` only bit-identical changes are planned;
3. the Little's-law guess, interleaved with the baseline (A B A B) to measure the noise unless it
   wins by far; when the guess is capped by the budget on a data-bound loader it carries the GPU
   offload and JPEG draft decoding too (each cuts per-sample CPU); then GPU JPEG decoding
   (nvJPEG, in a background thread, with at most 4 workers: they only read files); on CUDA,
   shared slots (workers reuse page-locked buffers) right away for batches of 16 MB or more;
   hill-climb num_workers; the offload / draft decoding not tried yet; pin_memory, shared slots,
   persistent_workers, prefetch_factor; finally re-check the winner against the baseline (every
   exploring trial leaves the time for that check). Trial windows follow the predicted step time
   (:mod:`pipeline_opt.tune.timing`);
4. build the winning loader from the user's loader (same dataset, sampler, collate, generator ...)
   and profile it briefly (the best report), within the 10% of the budget kept for it.

The model's parameters, buffers, gradients, modes and the RNG states are restored bitwise.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.progress import progress_bar
from pipeline_opt._core.step import CheckedStep, ModelStateGuard, resolve_device
from pipeline_opt.loading.random_plan import RandomGpuPlan, plan_random_gpu_pipeline
from pipeline_opt.profile import api as profile_api
from pipeline_opt.profile.install import describe_loader
from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.tune import timing
from pipeline_opt.tune.ab import MIN_GAIN
from pipeline_opt.tune.budget import ResourceBudget, probe_batch, probe_budget
from pipeline_opt.tune.build import CandidateBuilder
from pipeline_opt.tune.candidates import (
    LoaderConfig,
    epoch_workers,
    littles_law_workers,
    persistent_for_short_epochs,
    stale_dataset_hazard,
    workers_to_keep_up,
)
from pipeline_opt.tune.exactness import (
    REPLAY_NAME,
    PixelChange,
    changes_in,
    exactness_of,
    measure_draft,
    measure_nvjpeg,
    measure_offload,
    measure_random_replay,
)
from pipeline_opt.tune.gpu_decode import NVJPEG_WORKERS, plan_nvjpeg_decode
from pipeline_opt.tune.measure import Measurement
from pipeline_opt.tune.offload import plan_draft_decode, plan_gpu_offload
from pipeline_opt.tune.result import Trial, TuneResult, trial_spread
from pipeline_opt.tune.search import BaselineFailed, Search
from pipeline_opt.tune.trial import TrialRunner

log = get_logger("tune")

PROFILE_STEPS = 8  # enough for batch_cpu_s and the step time; the trials measure the rest
PROFILE_WARMUP = 2
PROFILE_TRACE_STEPS = 2
MIN_TRIAL_TIMEOUT_S = 10.0
SLOTS_EARLY_BYTES = 16 << 20  # batches this big try shared slots right after the first guess

Profiler = Callable[..., ProfileReport]


def tune_loader(
    loader: DataLoader,
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
    device: torch.device | str | None = None,
    time_budget_s: float = 60,
    gpu_transforms: bool = True,
    draft_decode: bool = True,
    max_workers: int | None = None,
    progress: bool = True,
    seed: int | None = None,
    *,
    min_gain: float = MIN_GAIN,
    profiler: Profiler | None = None,
    shared_slots: bool = False,
    exact: bool = False,
    baseline: ProfileReport | None = None,
) -> TuneResult:
    """Find a faster configuration of ``loader`` for training ``model``, verified by measurement, in
    this process (:func:`pipeline_opt.autotune` is the front door: inside torchrun it makes the ranks
    agree through :func:`pipeline_opt.distributed_api.autotune_distributed`, which calls this).

    Args:
        loader: the DataLoader as the training loop uses it (ultralytics' InfiniteDataLoader too).
        model: the model the loader feeds; its state is restored bitwise afterwards.
        step_fn: ``step_fn(model, batch)``, the training step without the optimizer; by default a
            forward + backward on the batch's images.
        device: where the model runs (default: the model's device).
        time_budget_s: wall-clock budget for the whole call (a trial in flight may overrun it by
            its last window plus worker shutdown).
        gpu_transforms: try moving tensor transforms (normalize / resize / dtype) to the device, and
            (on CUDA, for ImageFolder-like JPEG datasets) decoding the JPEGs there with nvJPEG.
        draft_decode: try JPEG draft decoding for ImageFolder-like JPEG datasets with a Resize.
        max_workers: an upper bound on num_workers on top of the measured resource budget.
        progress: log one line per trial (and draw a bar on a terminal).
        seed: seed the global RNGs at the start of every trial so candidates see the same random
            draws (restored afterwards); None leaves them running.
        min_gain: the smallest relative gain a change must show (on top of the measured noise).
        profiler: the profiler producing the baseline / best reports (default :func:`pipeline_opt.profile`).
        shared_slots: (opt-in) on CUDA, with workers, try delivering the image tensors through reused,
            page-locked shared-memory slots (:mod:`pipeline_opt.loading.shared_slots`) instead of a fresh
            segment per batch; ``result.loader`` is then a ``DeviceLoader`` yielding device batches.
            Kept when they measure no more than ``min_gain`` below the configuration without
            them (a tie goes to the slots: they cut the workers' system time and page faults),
            rolled back when slower than that.
        exact: allow only changes that keep every sample bit-for-bit identical (workers, pinning,
            prefetch, persistence, shared slots, ToFloat / Normalize / CenterCrop on the device).
            Off (the default), the tuner may also change pixels within stated bounds: Resize on the
            device (within 1/255 of PIL bilinear) and another JPEG decoder (draft decoding, nvJPEG),
            the latter only after measuring its error on a few of your images and only when it stays
            within :data:`pipeline_opt.tune.exactness.DECODE_MEAN_ERROR` / ``DECODE_MAX_ERROR``.
            Whatever changes pixels is named in ``result.pixel_changes`` with its measured error.
        baseline: a :func:`pipeline_opt.profile` report of this same loader and step, used as the
            baseline's profile instead of measuring it again: the report and the tuning then start
            from one measurement and one diagnosis.

    Returns:
        A :class:`TuneResult`; ``result.loader`` yields the same samples in the same order as
        ``loader``: bit-for-bit when ``result.exactness == "bitwise"`` (always with ``exact=True``),
        otherwise within the errors listed in ``result.pixel_changes``.
    """
    t_start = time.monotonic()
    _validate(loader, model, step_fn, time_budget_s, max_workers, seed, min_gain)
    if not isinstance(exact, bool):
        raise TypeError(f"exact={exact!r} must be True (bit-identical samples only) or False")
    _check_baseline(baseline, loader)
    dev = resolve_device(model, device)
    step = CheckedStep(step_fn, dev)  # validated on the probe's batch, before any measurement
    if profiler is None:
        profiler = profile_api.profile
    deadline = t_start + float(time_budget_s)
    bar = progress_bar(None, desc="autotune", enabled=progress)
    try:
        with ModelStateGuard(model):
            return _tune(loader, model, step_fn, step, dev, deadline, t_start, bar, profiler,
                         gpu_transforms=gpu_transforms, draft_decode=draft_decode, max_workers=max_workers,
                         progress=progress, seed=seed, min_gain=min_gain, shared_slots=shared_slots, exact=exact,
                         baseline=baseline)
    finally:
        bar.close()


def _tune(loader, model, step_fn, step, dev, deadline, t_start, bar, profiler, *, gpu_transforms, draft_decode,
          max_workers, progress, seed, min_gain, shared_slots, exact=False, baseline=None) -> TuneResult:
    baseline_cfg = LoaderConfig.of(loader)
    budget_s = deadline - t_start
    probe = probe_batch(loader, check=lambda batch: step.check(model, batch))
    t0 = time.monotonic()
    baseline_report = baseline if baseline is not None else \
        _profile(profiler, loader, model, step_fn, dev, "the baseline trial (the loader as given)")
    profile_s = time.monotonic() - t0
    bar.set_postfix(f"baseline {baseline_report.throughput:,.1f} samples/s")

    worker_rss = max((w.rss_bytes for w in baseline_report.workers if w.worker_id >= 0), default=0)
    budget = probe_budget(loader, pin_thread=dev.type == "cuda", worker_rss_bytes=worker_rss or None,
                          user_max=max_workers, probe=probe, report=baseline_report)
    for line in budget.reasons:
        log.debug("budget %s", line)

    gpu_plan, gpu_why = (None, f"device is {dev.type}: nothing to offload to") if dev.type != "cuda" \
        else (None, "disabled (gpu_transforms=False)") if not gpu_transforms \
        else plan_gpu_offload(loader.dataset, exact=exact)
    held_back = [("gpu_transforms Resize", gpu_why)] if gpu_plan is not None and gpu_why else []
    draft_plan, draft_why = (None, "disabled (draft_decode=False)") if not draft_decode \
        else plan_draft_decode(loader.dataset)
    nvjpeg_plan, nvjpeg_why = (None, f"device is {dev.type}: nvJPEG decodes on CUDA devices only") \
        if dev.type != "cuda" else (None, "disabled (gpu_transforms=False)") if not gpu_transforms \
        else plan_nvjpeg_decode(loader)
    # what each change does to the samples: decoders measured on the user's images before any trial
    checks: list[PixelChange] = []
    if exact:
        draft_plan, draft_why = (None, EXACT_REFUSAL.format("JPEG draft decoding decodes at a reduced DCT scale")) \
            if draft_plan is not None else (None, draft_why)
        nvjpeg_plan, nvjpeg_why = (None, EXACT_REFUSAL.format("nvJPEG is a different JPEG decoder")) \
            if nvjpeg_plan is not None else (None, nvjpeg_why)
    else:
        draft_plan, draft_why = _vetted(draft_plan, draft_why, lambda: measure_draft(loader.dataset, draft_plan),
                                        checks)
        nvjpeg_plan, nvjpeg_why = _vetted(nvjpeg_plan, nvjpeg_why,
                                          lambda: measure_nvjpeg(loader.dataset, nvjpeg_plan, dev), checks)
        if nvjpeg_plan is None and dev.type == "cuda" and gpu_transforms:
            # a random training Compose: the workers draw its parameters, the device decodes and replays
            replay_plan, replay_why = plan_random_gpu_pipeline(loader)
            if replay_plan is not None:
                nvjpeg_plan, nvjpeg_why = _vetted(replay_plan, replay_why,
                                                  lambda: measure_random_replay(replay_plan, dev), checks)
            else:
                nvjpeg_why = f"{nvjpeg_why}; random-augmentation replay: {replay_why}"
    if gpu_plan is not None:
        offload_change = measure_offload(loader.dataset, gpu_plan, dev)
        if offload_change is not None:
            checks.append(offload_change)
    batch_wall = probe.wall_s if probe is not None else baseline_report.batch_cpu_s
    builder = CandidateBuilder(loader, dev, gpu=gpu_plan, draft=draft_plan, nvjpeg=nvjpeg_plan,
                               trial_timeout_s=max(MIN_TRIAL_TIMEOUT_S, 10.0 * batch_wall))
    runner = TrialRunner(builder, model, step, dev, initial_step_s=max(baseline_report.step_time_s, 1e-4),
                         window_s=timing.window_seconds(budget_s), seed=seed,
                         compute_s=_compute_s(baseline_report), usable_cpus=budget.usable_cpus)
    reserve = timing.final_reserve_s(budget_s, profile_s)  # for profiling the winner at the end
    search = Search(runner, budget, deadline=deadline - reserve, min_gain=min_gain,
                    on_trial=_trial_logger(bar, progress))
    for what, why in held_back:
        search.skip(what, why)
    from_profile = _profile_measurement(baseline_report, baseline_cfg, profile_s)
    if from_profile is not None:
        runner.remember(baseline_cfg, from_profile)
    try:
        search.start(baseline_cfg, from_profile)
    except BaselineFailed as exc:
        raise _annotated(exc.__cause__ or exc, "autotune: the baseline trial (the loader as given) failed") from exc

    measured = search.history[baseline_cfg][0].compute_s
    guess_n = _first_guess(baseline_report, probe, budget, measured)
    guess, levers = _combined_guess(baseline_cfg.with_(num_workers=guess_n), baseline_report, probe, budget,
                                    measured, gpu_plan, draft_plan)
    plan = runner.plan(guess, budget_s=budget_s, spent_s=time.monotonic() - t_start, reserve_s=reserve,
                       noise=search.noise)  # before any trial: warn at once when the budget holds none
    (log.warning if plan.warning else log.info)("autotune: %s", plan.warning or plan.text)
    why = f"Little's law first guess ({_guess_reason(baseline_report, probe, budget, measured)})"
    if levers:
        why += f", with {' and '.join(levers)} since the workers are capped and each cuts per-sample CPU"
    stale = stale_dataset_hazard(getattr(loader, "dataset", None))
    if stale is not None:
        search.skip("persistent_workers", stale)
    else:
        guess, persistent_why = persistent_for_short_epochs(guess, budget.batches_per_epoch)
        why += persistent_why
    search.calibrate(guess, why)
    if stale is None:
        _retry_with_persistent_workers(search, guess)
    _tune_gpu_decode(search, nvjpeg_plan, nvjpeg_why)  # the largest win on a decode-bound pipeline
    if shared_slots and probe is not None and probe.bytes >= SLOTS_EARLY_BYTES:
        # what the slots save grows with the bytes received per second: for big batches, try them
        # before the worker climb (a short budget would otherwise run out before the flags stage)
        _tune_shared_slots(search, loader, dev, True)
    search.tune_workers()
    _tune_dataset_changes(search, gpu_plan, gpu_why, draft_plan, draft_why)
    _tune_flags(search, loader, dev, shared_slots, persistent=stale is None)
    search.confirm()
    outcome = search.outcome()
    log.info("autotune: %s", outcome.verdict)

    final = builder.build(outcome.best, trial=False)
    if outcome.best == outcome.baseline:
        best_report = baseline_report
    else:
        steps = timing.profile_steps(deadline - time.monotonic(), runner.predict_step_s(outcome.best, 0.0))
        best_report = _profile(profiler, final, model, step_fn, dev,
                               f"profiling the tuned loader ({outcome.best.label()})", steps=steps)
    config = outcome.best.to_dict()
    pixel_changes = changes_in(config, checks)
    verdict = outcome.verdict
    if outcome.best != outcome.baseline:
        verdict += "; " + samples_clause(exactness_of(config), pixel_changes)
    return TuneResult(
        loader=final, config=config, baseline=baseline_report, best=best_report,
        trials=outcome.trials, speedup=outcome.speedup, noise=outcome.noise, tuning_time_s=time.monotonic() - t_start,
        not_tried=outcome.not_tried, original_config=outcome.baseline.to_dict(), verdict=verdict,
        budget={**budget.to_dict(), "plan": plan.text}, exactness=exactness_of(config), pixel_changes=pixel_changes,
        pixel_checks=tuple(checks), exact=exact, baseline_throughput=outcome.baseline_throughput,
        best_throughput=outcome.best_throughput if outcome.best != outcome.baseline else outcome.baseline_throughput,
    )


EXACT_REFUSAL = "exact=True allows only bit-identical changes, and {} (the pixels differ)"


def _vetted(plan, why: str, measure: Callable[[], PixelChange], checks: list[PixelChange]):
    """``(plan, why)`` of a decode candidate once its error on the user's images is known: the plan
    when the error is within the bounds, else ``(None, the measured reason)``. The measurement is
    kept in ``checks`` either way (``TuneResult.pixel_checks``)."""
    if plan is None:
        return None, why
    try:
        change = measure()
    except Exception as exc:
        log.debug("measuring a decode change failed", exc_info=True)
        return None, f"its error could not be measured on your images ({type(exc).__name__}: {exc}): not offered"
    checks.append(change)
    if not change.allowed:
        log.info("autotune: %s refused: %s", change.name, change.note)
        return None, change.note
    log.debug("autotune: %s", change.describe())
    return plan, ""


def samples_clause(exactness: str, changes: tuple[PixelChange, ...]) -> str:
    """A clause for the verdict: whether the tuned loader's samples are bit-for-bit the original ones."""
    if exactness == "bitwise":
        return "samples bit-for-bit identical to the loader as given"
    named = "; ".join(f"{c.name}: {c.error_text()}" for c in changes) or f"{exactness} changes"
    if changes and all(c.identical_where_measured for c in changes):
        return (f"samples identical on every image checked but not guaranteed bit-for-bit ({named}; "
                "exact=True guarantees it)")
    return f"samples NOT bit-for-bit identical ({named})"


def _compute_s(report: ProfileReport) -> float:
    return report.compute_time_s or max(report.step_time_s * (1.0 - report.data_wait_frac), 0.0)


def _profile_measurement(report: ProfileReport, cfg: LoaderConfig, elapsed_s: float,
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
                       compute_s=_compute_s(report), from_profile=True, startup_windows=startup)


def _combined_guess(guess: LoaderConfig, report: ProfileReport, probe, budget: ResourceBudget, measured: float,
                    gpu_plan, draft_plan) -> tuple[LoaderConfig, list[str]]:
    """The first guess, with the dataset changes when the workers Little's law wants do not fit the budget."""
    batch_s, step_s = _guess_inputs(report, probe, measured)
    capped = littles_law_workers(batch_s, step_s) > budget.max_workers
    data_bound = report.bottleneck == "data" or report.data_wait_frac > 0.5
    if not (capped and data_bound):
        return guess, []
    levers = []
    if gpu_plan is not None:
        guess, levers = guess.with_(gpu_transforms=gpu_plan.names), [f"{'+'.join(gpu_plan.names)} on the device"]
    if draft_plan is not None:
        guess, levers = guess.with_(decode="draft"), [*levers, "JPEG draft decoding"]
    return guess, levers


def _retry_with_persistent_workers(search: Search, guess: LoaderConfig) -> None:
    """Workers that lost to the loader as given may have lost to their start-up at every epoch
    (which is out of proportion on a machine whose cores are busy): the same workers started once
    are tried before the search climbs from no workers, where a single worker cannot win."""
    if search.incumbent.num_workers or not guess.num_workers or guess.persistent_workers:
        return
    if search.consider(guess.with_(persistent_workers=True),
                       f"{guess.label()} lost to the loader as given: the same workers started once (persistent), "
                       "not at every epoch"):
        search.tune_workers("num_workers with persistent workers")


def _tune_gpu_decode(search: Search, plan, why_not: str) -> None:
    if plan is None:
        search.skip("nvjpeg decode", why_not)
        return
    inc = search.incumbent
    what = REPLAY_NAME if isinstance(plan, RandomGpuPlan) else "JPEG decoding on the GPU (nvJPEG)"
    # torchvision's nvJPEG call returns only once the batch is decoded: from the training loop it
    # waits between two steps; from a thread of its own it runs while the step does, which won
    # beyond the noise at every worker count of the committed classification grids, so the
    # candidate decodes in the thread (one trial, not two). Pinned memory makes the decoder's
    # host-to-device copies faster at any worker count.
    light = gpu_decode_workers(inc.num_workers, search.budget.max_workers)
    change = dict(decode="nvjpeg", gpu_transforms=(), pin_memory=True, decode_thread=True)
    if search.try_change(f"{what}, in a background thread overlapping the step, with {light} workers (they "
                         "only read files)", num_workers=light, **change):
        search.tune_workers("num_workers after GPU decoding")
        return
    # lost with few workers: where reading the files is what starves the step (a slow disk, a network
    # file system), the same decode with the incumbent's workers may still win
    runs = search.evidence(inc.with_(num_workers=light, **change))
    need = workers_to_keep_up(runs[-1], light) if runs else None
    if need is not None and inc.num_workers > light and search.try_change(
            f"{what}, in a background thread, with the incumbent's {inc.num_workers} workers ({light} left the step "
            f"waiting on data: Little's law asks for {need})", num_workers=inc.num_workers, **change):
        search.tune_workers("num_workers after GPU decoding")


def gpu_decode_workers(incumbent_workers: int, max_workers: int) -> int:
    """The workers the GPU-decode candidate starts with: at most :data:`NVJPEG_WORKERS`.

    With the decode on the GPU a worker reads files (and, for a random Compose, draws parameters),
    so the count that fed a CPU decode is far more than it needs, and the extra processes compete
    with the training process and the decoding thread for the cores. In the committed 16-core
    classification grids the GPU decode in a thread read the same at 2 to 8 workers and slowest
    at 16 in three of four runs; the tuner then climbs from this count
    (:meth:`~pipeline_opt.tune.search.Search.tune_workers`), to Little's law's count when the
    step still waits on data."""
    light = max(1, min(NVJPEG_WORKERS, max_workers))
    return min(incumbent_workers, light) if incumbent_workers > 0 else light


def _tune_flags(search: Search, loader: DataLoader, dev: torch.device, shared_slots: bool = True,
                persistent: bool = True) -> None:
    inc = search.incumbent
    if dev.type == "cuda":
        search.try_change(f"pin_memory -> {not inc.pin_memory}", pin_memory=not inc.pin_memory)
    else:
        search.skip("pin_memory", f"device is {dev.type}: pinned memory only speeds up copies to an accelerator")
    _tune_shared_slots(search, loader, dev, shared_slots)
    if search.incumbent.num_workers == 0:
        search.skip("persistent_workers, prefetch_factor", "the best configuration has no workers")
        return
    if persistent and not search.incumbent.persistent_workers:
        # clone_loader keeps a persistent clone's epoch order equal to the original's
        if search.try_change("persistent_workers -> True", persistent_workers=True):
            search.tune_workers("num_workers with persistent workers")  # restarts no longer price the workers
    pf = search.incumbent.prefetch_factor or 2
    if not search.try_change(f"prefetch_factor {pf} -> {2 * pf}", prefetch_factor=2 * pf) and pf > 1:
        search.try_change(f"prefetch_factor {pf} -> {pf // 2}", prefetch_factor=pf // 2)


def _tune_shared_slots(search: Search, loader: DataLoader, dev: torch.device, enabled: bool) -> None:
    inc = search.incumbent
    why = None if enabled else "disabled (shared_slots=False)"
    if why is None and dev.type != "cuda":
        why = f"device is {dev.type}: the slots save the pinning and mapping of batches copied to an accelerator"
    elif why is None and inc.num_workers == 0:
        why = "the best configuration has no workers (batches are made in the training process)"
    elif why is None and inc.decode == "nvjpeg":
        why = "nvJPEG batches are encoded bytes, small to send"
    elif why is None and not isinstance(loader, DataLoader):
        why = f"the loader is a {type(loader).__name__}, not a DataLoader"
    if why is None and inc.shared_slots:
        return  # tried already (and kept)
    if why is not None:
        if not any(line.startswith("shared_slots:") for line in search.not_tried):
            search.skip("shared_slots", why)
        return
    search.try_change("image tensors through reused, page-locked shared-memory slots", shared_slots=True)


def _tune_dataset_changes(search: Search, gpu_plan, gpu_why: str, draft_plan, draft_why: str) -> None:
    """The offload and draft decoding not already in the incumbent (GPU decoding replaces both)."""
    if search.incumbent.decode == "nvjpeg":
        search.skip("gpu_transforms, draft_decode", "the GPU decodes, resizes and normalises already (nvjpeg)")
        return
    if gpu_plan is None:
        search.skip("gpu_transforms", gpu_why)
    elif not search.incumbent.gpu_transforms and \
            search.try_change(f"move {'+'.join(gpu_plan.names)} to the device", gpu_transforms=gpu_plan.names):
        search.tune_workers("num_workers after the offload")
    if draft_plan is None:
        search.skip("draft_decode", draft_why)
    elif search.incumbent.decode == "pil" and search.try_change("JPEG draft decoding", decode="draft"):
        search.tune_workers("num_workers after draft decoding")


def _guess_inputs(report: ProfileReport, probe, measured_compute_s: float) -> tuple[float, float]:
    """(worker seconds per batch, step seconds): the profile's, the probe's and the measured step's."""
    batch_s = report.batch_cpu_s or (probe.wall_s if probe is not None else 0.0)
    profiled = report.compute_time_s or max(report.step_time_s * (1.0 - report.data_wait_frac), 0.0)
    candidates = [s for s in (profiled, measured_compute_s) if s > 0]  # the profiler's own overhead inflates
    return batch_s, (min(candidates) if candidates else 1e-4)


def _first_guess(report: ProfileReport, probe, budget: ResourceBudget, measured_compute_s: float) -> int:
    batch_s, step_s = _guess_inputs(report, probe, measured_compute_s)
    return epoch_workers(max(1, min(budget.max_workers, littles_law_workers(batch_s, step_s))),
                         budget.batches_per_epoch)


def _guess_reason(report: ProfileReport, probe, budget: ResourceBudget, measured_compute_s: float) -> str:
    batch_s, step_s = _guess_inputs(report, probe, measured_compute_s)
    need = littles_law_workers(batch_s, step_s)
    capped = f", capped at {budget.max_workers} by the {budget.binding} budget" if need > budget.max_workers else ""
    return f"{batch_s * 1e3:.1f} ms of worker time per batch / {step_s * 1e3:.1f} ms per step -> {need}{capped}"


def _trial_logger(bar, progress: bool) -> Callable[[Trial], None]:
    count = [0]

    def on_trial(trial: Trial) -> None:
        count[0] += 1
        cfg = LoaderConfig.from_dict(trial.config)
        what = f"{trial.throughput:,.1f} samples/s {trial_spread(dataclasses.asdict(trial))}" \
            if trial.status == "ok" else trial.status
        line = f"trial {count[0]}: {cfg.label()}: {what}, {'accepted' if trial.accepted else 'not kept'} - {trial.reason}"
        (log.info if progress else log.debug)("%s", line)
        bar.update(1)
        bar.set_postfix(f"{cfg.label()} {what}")

    return on_trial


def _profile(profiler: Profiler, loader: Any, model, step_fn, dev, what: str,
             steps: int = PROFILE_STEPS) -> ProfileReport:
    extra = {}
    try:
        params = inspect.signature(profiler).parameters
        if "limit" in params:
            extra["limit"] = False  # the device-resident replay costs seconds the search needs more
        if "trace_steps" in params:
            extra["trace_steps"] = PROFILE_TRACE_STEPS  # op tables only; each traced step costs search time
    except (TypeError, ValueError):
        pass
    try:
        return profiler(loader, model, step_fn=step_fn, steps=steps, warmup=PROFILE_WARMUP, device=dev,
                        **extra)
    except Exception as exc:
        raise _annotated(exc, f"autotune: {what} failed") from exc


def _annotated(exc: BaseException, context: str) -> BaseException:
    """An exception of the same type (when it can be rebuilt from a message) naming ``context``."""
    message = f"{context}: {exc}"
    try:
        new = type(exc)(message)
        if str(new) == message:
            return new
    except Exception:
        pass
    return RuntimeError(f"{message} ({type(exc).__name__})")


BASELINE_KEYS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def _check_baseline(baseline: Any, loader: DataLoader) -> None:
    """A ``baseline=`` report must be a profile of this loader as it is now."""
    if baseline is None:
        return
    if not isinstance(baseline, ProfileReport):
        raise TypeError(f"baseline must be the ProfileReport that po.profile returned for this loader, got "
                        f"{type(baseline).__name__}")

    now = describe_loader(loader)
    differ = [f"{k}={baseline.loader_config.get(k)!r} in the report, {now.get(k)!r} now" for k in BASELINE_KEYS
              if baseline.loader_config.get(k) != now.get(k)]
    if differ:
        raise ValueError(f"baseline= is a profile of another loader ({'; '.join(differ)}): profile this loader "
                         "with po.profile(loader, model) or leave baseline out")


def _validate(loader, model, step_fn, time_budget_s, max_workers, seed, min_gain) -> None:
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"autotune needs a torch.utils.data.DataLoader, got {type(loader).__name__}; pass the DataLoader "
            "your training loop iterates (for a DeviceLoader, its .loader)"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"autotune needs the model as a torch.nn.Module, got {type(model).__name__}; "
                        "pass the nn.Module that the training step runs")
    if step_fn is not None and not callable(step_fn):
        raise TypeError(f"step_fn must be callable as step_fn(model, batch), got {type(step_fn).__name__}")
    if isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float)) \
            or not math.isfinite(time_budget_s) or time_budget_s <= 0:
        raise ValueError(f"time_budget_s={time_budget_s!r} must be a finite number of seconds > 0 (e.g. 60)")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                    or max_workers < 1):
        raise ValueError(f"max_workers={max_workers!r} must be an integer >= 1 or None (no extra bound)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed={seed!r} must be an int or None")
    if not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
        raise ValueError(f"min_gain={min_gain!r} must be a fraction in [0, 1), e.g. 0.03")
    try:
        n = len(loader)
    except TypeError:
        return
    if n == 0:
        raise ValueError(f"the loader yields no batches (empty dataset of {type(loader.dataset).__name__} or "
                         "sampler); give autotune a loader with at least one batch")
