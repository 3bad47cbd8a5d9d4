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
   wins by far; when the guess is capped by the budget on a data-bound loader, the first guess is
   GPU JPEG decoding (nvJPEG or the random-augmentation replay, in a background thread, with at
   most 4 workers: they only read files) where it is planned, the CPU guess next only if it lost;
   otherwise the capped guess carries the GPU offload and JPEG draft decoding (each cuts
   per-sample CPU), and GPU JPEG decoding is tried after it; on CUDA,
   shared slots (workers reuse page-locked buffers) right away for batches of 16 MB or more;
   hill-climb num_workers; the offload / draft decoding not tried yet; pin_memory, shared slots,
   persistent_workers, prefetch_factor; finally re-check the winner against the baseline (every
   exploring trial leaves the time for that check). Trial windows follow the predicted step time
   (:mod:`pipeline_opt.tune.timing`);
4. build the winning loader from the user's loader (same dataset, sampler, collate, generator ...)
   and profile it briefly (the best report), within the 10% of the budget kept for it.

The model's parameters, buffers, gradients, modes and the RNG states are restored bitwise.

This module orders the work; the argument checks are in :mod:`pipeline_opt.tune.validate`, the
dataset changes and their pixel errors in :mod:`pipeline_opt.tune.vetting`, the first guess in
:mod:`pipeline_opt.tune.first_guess` and the per-knob steps in :mod:`pipeline_opt.tune.steps`.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt._core.loader_errors import with_message
from pipeline_opt._core.log import get_logger
from pipeline_opt._core.progress import progress_bar
from pipeline_opt._core.step import CheckedStep, ModelStateGuard, resolve_device
from pipeline_opt.profile import api as profile_api
from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.tune import timing
from pipeline_opt.tune.ab import MIN_GAIN
from pipeline_opt.tune.budget import probe_batch, probe_budget
from pipeline_opt.tune.build import CandidateBuilder
from pipeline_opt.tune.candidates import LoaderConfig, persistent_for_short_epochs, stale_dataset_hazard
from pipeline_opt.tune.exactness import changes_in, exactness_of
from pipeline_opt.tune.first_guess import (
    PROFILE_WARMUP,
    combined_guess,
    compute_s,
    first_guess,
    gpu_decode_guess,
    guess_reason,
    profile_measurement,
)
from pipeline_opt.tune.result import Trial, TuneResult, trial_spread
from pipeline_opt.tune.search import BaselineFailed, Search
from pipeline_opt.tune.steps import (
    each_lever_on_its_own,
    gpu_decode_name,
    gpu_decode_workers,
    retry_with_persistent_workers,
    tune_dataset_changes,
    tune_flags,
    tune_gpu_decode,
    tune_shared_slots,
)
from pipeline_opt.tune.trial import TrialRunner
from pipeline_opt.tune.validate import BASELINE_KEYS, check_baseline, validate_arguments
from pipeline_opt.tune.vetting import EXACT_REFUSAL, plan_dataset_changes, samples_clause, vetted

log = get_logger("tune")

PROFILE_STEPS = 8  # enough for batch_cpu_s and the step time; the trials measure the rest
PROFILE_TRACE_STEPS = 2
MIN_TRIAL_TIMEOUT_S = 10.0
SLOTS_EARLY_BYTES = 16 << 20  # batches this big try shared slots right after the first guess

Profiler = Callable[..., ProfileReport]

# Names that lived here before the split stay importable from this module (new code imports their
# new homes: first_guess, steps, validate, vetting): the public ones re-exported, the private ones
# under their old names.
__all__ = ["BASELINE_KEYS", "EXACT_REFUSAL", "PROFILE_WARMUP", "Profiler", "TuneRequest", "gpu_decode_workers",
           "persistent_for_short_epochs", "samples_clause", "tune_loader"]
_check_baseline = check_baseline
_first_guess = first_guess
_profile_measurement = profile_measurement
_retry_with_persistent_workers = retry_with_persistent_workers
_tune_flags = tune_flags
_tune_gpu_decode = tune_gpu_decode
_tune_shared_slots = tune_shared_slots
_validate = validate_arguments
_vetted = vetted


@dataclass(frozen=True)
class TuneRequest:
    """One call of :func:`tune_loader`: its checked arguments, with the step, the device and the
    deadline resolved. The tuning reads them and passes them on unchanged."""

    loader: DataLoader
    model: torch.nn.Module
    step_fn: Callable[[torch.nn.Module, Any], Any] | None
    step: CheckedStep  # ``step_fn`` (or the default step), validated on the probe's batch
    device: torch.device
    profiler: Profiler
    t_start: float  # time.monotonic() at the call
    deadline: float  # time.monotonic() by which the call returns
    gpu_transforms: bool = True
    draft_decode: bool = True
    max_workers: int | None = None
    progress: bool = True
    seed: int | None = None
    min_gain: float = MIN_GAIN
    shared_slots: bool = False
    exact: bool = False
    baseline: ProfileReport | None = None

    @property
    def budget_s(self) -> float:
        """The whole call's time budget in seconds."""
        return self.deadline - self.t_start


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
    validate_arguments(loader, model, step_fn, time_budget_s, max_workers, seed, min_gain)
    if not isinstance(exact, bool):
        raise TypeError(f"exact={exact!r} must be True (bit-identical samples only) or False")
    check_baseline(baseline, loader)
    dev = resolve_device(model, device)
    request = TuneRequest(
        loader=loader, model=model, step_fn=step_fn,
        step=CheckedStep(step_fn, dev),  # validated on the probe's batch, before any measurement
        device=dev, profiler=profile_api.profile if profiler is None else profiler,
        t_start=t_start, deadline=t_start + float(time_budget_s), gpu_transforms=gpu_transforms,
        draft_decode=draft_decode, max_workers=max_workers, progress=progress, seed=seed, min_gain=min_gain,
        shared_slots=shared_slots, exact=exact, baseline=baseline)
    bar = progress_bar(None, desc="autotune", enabled=progress)
    try:
        with ModelStateGuard(model):
            return _tune(request, bar)
    finally:
        bar.close()


def _tune(req: TuneRequest, bar) -> TuneResult:
    loader, model, dev = req.loader, req.model, req.device
    baseline_cfg = LoaderConfig.of(loader)
    probe = probe_batch(loader, check=lambda batch: req.step.check(model, batch))
    t0 = time.monotonic()
    baseline_report = req.baseline if req.baseline is not None else \
        _profile(req, loader, "the baseline trial (the loader as given)")
    profile_s = time.monotonic() - t0
    bar.set_postfix(f"baseline {baseline_report.throughput:,.1f} samples/s")

    worker_rss = max((w.rss_bytes for w in baseline_report.workers if w.worker_id >= 0), default=0)
    budget = probe_budget(loader, pin_thread=dev.type == "cuda", worker_rss_bytes=worker_rss or None,
                          user_max=req.max_workers, probe=probe, report=baseline_report)
    for line in budget.reasons:
        log.debug("budget %s", line)

    changes = plan_dataset_changes(loader, dev, gpu_transforms=req.gpu_transforms, draft_decode=req.draft_decode,
                                   exact=req.exact)
    batch_wall = probe.wall_s if probe is not None else baseline_report.batch_cpu_s
    builder = CandidateBuilder(loader, dev, gpu=changes.gpu, draft=changes.draft, nvjpeg=changes.nvjpeg,
                               trial_timeout_s=max(MIN_TRIAL_TIMEOUT_S, 10.0 * batch_wall))
    runner = TrialRunner(builder, model, req.step, dev, initial_step_s=max(baseline_report.step_time_s, 1e-4),
                         window_s=timing.window_seconds(req.budget_s), seed=req.seed,
                         compute_s=compute_s(baseline_report), usable_cpus=budget.usable_cpus)
    reserve = timing.final_reserve_s(req.budget_s, profile_s)  # for profiling the winner at the end
    search = Search(runner, budget, deadline=req.deadline - reserve, min_gain=req.min_gain,
                    on_trial=_trial_logger(bar, req.progress))
    for what, why in changes.held_back:
        search.skip(what, why)
    from_profile = profile_measurement(baseline_report, baseline_cfg, profile_s)
    if from_profile is not None:
        runner.remember(baseline_cfg, from_profile)
    try:
        search.start(baseline_cfg, from_profile)
    except BaselineFailed as exc:
        raise _annotated(exc.__cause__ or exc, "autotune: the baseline trial (the loader as given) failed") from exc

    measured = search.history[baseline_cfg][0].compute_s
    guess_n = first_guess(baseline_report, probe, budget, measured)
    guess, levers = combined_guess(baseline_cfg.with_(num_workers=guess_n), baseline_report, probe, budget,
                                   measured, changes.gpu, changes.draft)
    plan = runner.plan(guess, budget_s=req.budget_s, spent_s=time.monotonic() - req.t_start, reserve_s=reserve,
                       noise=search.noise)  # before any trial: warn at once when the budget holds none
    (log.warning if plan.warning else log.info)("autotune: %s", plan.warning or plan.text)
    reason = guess_reason(baseline_report, probe, budget, measured)
    why = f"Little's law first guess ({reason})"
    if levers:
        why += f", with {' and '.join(levers)} since the workers are capped and each cuts per-sample CPU"
    gpu_guess = gpu_decode_guess(baseline_cfg.with_(num_workers=guess_n), baseline_report, probe, budget, measured,
                                 changes.nvjpeg)
    stale = stale_dataset_hazard(getattr(loader, "dataset", None))
    if stale is not None:
        search.skip("persistent_workers", stale)
    else:
        guess, persistent_why = persistent_for_short_epochs(guess, budget.batches_per_epoch)
        why += persistent_why
        if gpu_guess is not None:
            gpu_guess = persistent_for_short_epochs(gpu_guess, budget.batches_per_epoch)[0]
    if gpu_guess is not None:
        # the workers are capped on a data-bound loader: the GPU decode first, then (if it lost) the CPU guess
        search.calibrate(gpu_guess, f"{gpu_decode_name(changes.nvjpeg)}, in a background thread, with "
                                    f"{gpu_guess.num_workers} workers, as the first guess (Little's law: {reason}; "
                                    "the step waits on data, and more workers cannot feed it)")
        if search.incumbent == gpu_guess:
            search.tune_workers("num_workers after GPU decoding")
        else:
            search.consider(guess, why)
    else:
        search.calibrate(guess, why)
    each_lever_on_its_own(search, levers)
    if stale is None:
        retry_with_persistent_workers(search, guess)
    if search.incumbent.decode != "nvjpeg":
        tune_gpu_decode(search, changes.nvjpeg, changes.nvjpeg_why)  # the largest win on a decode-bound pipeline
    if req.shared_slots and probe is not None and probe.bytes >= SLOTS_EARLY_BYTES:
        # what the slots save grows with the bytes received per second: for big batches, try them
        # before the worker climb (a short budget would otherwise run out before the flags stage)
        tune_shared_slots(search, loader, dev, True)
    search.tune_workers()
    tune_dataset_changes(search, changes.gpu, changes.gpu_why, changes.draft, changes.draft_why)
    tune_flags(search, loader, dev, req.shared_slots, persistent=stale is None)
    search.confirm()
    outcome = search.outcome()
    log.info("autotune: %s", outcome.verdict)
    # the bar's last postfix was the last trial's (often the baseline's confirmation): end on the winner
    bar.set_postfix(f"kept {outcome.best.label()} ({outcome.speedup:.2f}x)" if outcome.best != outcome.baseline
                    else f"kept the loader as given ({outcome.baseline.label()})")

    final = builder.build(outcome.best, trial=False)
    if outcome.best == outcome.baseline:
        best_report = baseline_report
    else:
        n_steps = timing.profile_steps(req.deadline - time.monotonic(), runner.predict_step_s(outcome.best, 0.0))
        best_report = _profile(req, final, f"profiling the tuned loader ({outcome.best.label()})", steps=n_steps)
    config = outcome.best.to_dict()
    pixel_changes = changes_in(config, changes.checks)
    verdict = outcome.verdict
    if outcome.best != outcome.baseline:
        verdict += "; " + samples_clause(exactness_of(config), pixel_changes)
    return TuneResult(
        loader=final, config=config, baseline=baseline_report, best=best_report,
        trials=outcome.trials, speedup=outcome.speedup, noise=outcome.noise,
        tuning_time_s=time.monotonic() - req.t_start, not_tried=outcome.not_tried,
        original_config=outcome.baseline.to_dict(), verdict=verdict,
        budget={**budget.to_dict(), "plan": plan.text}, exactness=exactness_of(config), pixel_changes=pixel_changes,
        pixel_checks=changes.checks, exact=req.exact, baseline_throughput=outcome.baseline_throughput,
        best_throughput=outcome.best_throughput if outcome.best != outcome.baseline else outcome.baseline_throughput,
        cautions=outcome.cautions,
    )


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


def _profile(req: TuneRequest, loader: Any, what: str, steps: int = PROFILE_STEPS) -> ProfileReport:
    """``req.profiler``'s report of ``loader`` under ``req``'s model and step; its error names ``what``."""
    profiler = req.profiler
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
        return profiler(loader, req.model, step_fn=req.step_fn, steps=steps, warmup=PROFILE_WARMUP, device=req.device,
                        **extra)
    except Exception as exc:
        raise _annotated(exc, f"autotune: {what} failed") from exc


def _annotated(exc: BaseException, context: str) -> BaseException:
    """An exception of the same type (when it can be rebuilt from a message) naming ``context``."""
    message = f"{context}: {exc}"
    return with_message(exc, message) or RuntimeError(f"{message} ({type(exc).__name__})")
