"""The trainer callbacks behind :func:`pipeline_opt.integrations.ultralytics.attach`.

Timeline of one ``YOLO(...).train(...)`` with everything on:

* ``on_pretrain_routine_start``: a new run; optional ``workers`` override of ``trainer.args``.
* ``on_pretrain_routine_end`` (loaders built, not iterated): GPU augmentation wired (CPU HSV /
  flips silenced in the dataset, ``trainer.preprocess_batch`` wrapped), then measured against the
  CPU stages A B A B on real trainer steps and kept only if faster beyond the noise (otherwise
  the CPU stages are restored and ``preprocess_batch`` unwrapped; ``gpu_augment="force"`` skips
  the measurement); the loader tuned on real trainer steps and ``trainer.train_loader`` rebuilt
  with the winner; the profiled clone of the loader (per-worker recorders) installed.
* ``on_train_epoch_start`` / ``on_train_batch_start`` / ``on_train_batch_end`` drive the step
  profiler: data wait is the time from the end of one batch to the start of the next, compute the
  time from batch start to batch end (CUDA synchronised at the boundary when ``sync``). Once the
  window is complete the report is saved to ``<save_dir>/pipeline_opt`` and, at the next epoch
  start, the unprofiled loader goes back in. With ``PERF_BENCH=1`` the run ends there with status 0.
* ``on_train_end`` / ``teardown``: a window cut short by the end of training is reported as far as
  it got; the worker files are removed.

Under ultralytics' DDP launch the same callbacks run in every rank (:mod:`._yolo_ddp`): the
measurements use the model's inner module, the ranks agree on the augmentation and the loader
settings, and rank 0 writes the combined profile of all ranks.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._augment import (
    GpuAugmentedPreprocess,
    active_cpu_stages,
    build_gpu_augment,
)
from pipeline_opt.integrations.ultralytics._ddp import (
    agree_on_augment,
    ddp_rank,
    inner_model,
    overruled,
    write_combined_profile,
)
from pipeline_opt.integrations.ultralytics._decide import (
    FORCE,
    AugmentSwitch,
    candidate_switch,
    check_gpu_augment,
    decide_gpu_affine,
    decide_gpu_augment,
)
from pipeline_opt.integrations.ultralytics._internals import patch, unpatch
from pipeline_opt.integrations.ultralytics._step import TrainerStep
from pipeline_opt.integrations.ultralytics._tune import (
    config_changed,
    delivers_through_slots,
    device_notes,
    plain_loader_of,
    rebuild_loader,
    tune_loader,
)
from pipeline_opt.loading.dataloader import loader_config, release_workers
from pipeline_opt.profile.assemble import build_report
from pipeline_opt.profile.inloop import PERF_BENCH_ENV, PerfBenchComplete, perf_bench_enabled
from pipeline_opt.profile.install import (
    describe_loader,
    install_worker_profiling,
    skip_steps,
)
from pipeline_opt.profile.main_profiler import DEFAULT_TRACE_STEPS, StepProfiler
from pipeline_opt.profile.memory import SPIKE, MemoryMeter
from pipeline_opt.profile.validation import ValidationRecorder

log = get_logger("integrations.ultralytics")

OUTPUT_SUBDIR = "pipeline_opt"
SUMMARY_FILE = "integration.json"


@dataclass(frozen=True)
class AttachOptions:
    """What :func:`attach` does; validated on construction."""

    profile: bool = True
    tune: bool = True
    gpu_augment: bool | str = True  # True: measured, kept only if faster; "force": always on
    gpu_affine: bool | str = False  # True: measured after the colour/flip was kept; "force": always with it
    shared_slots: bool | str = False  # True: a tuning candidate (CUDA); "force": the train loader always uses them
    output_dir: str | None = None
    tune_budget_s: float = 60.0
    steps: int = 30
    warmup: int = 5
    trace_steps: int = DEFAULT_TRACE_STEPS  # torch.profiler steps after the measured window (0: none)
    workers: int | None = None
    retune_epoch: int | None = None
    sync: bool = True
    tune_kwargs: dict[str, Any] | None = None  # extra keyword arguments for pipeline_opt.autotune
    augment_kwargs: dict[str, Any] | None = None  # extra keyword arguments for decide_gpu_augment

    def __post_init__(self) -> None:
        check_gpu_augment(self.gpu_augment)
        check_gpu_augment(self.gpu_affine, name="gpu_affine")
        check_gpu_augment(self.shared_slots, name="shared_slots")
        for name in ("profile", "tune", "sync"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.gpu_affine and not self.gpu_augment:
            raise ValueError(f"gpu_affine={self.gpu_affine!r} needs gpu_augment=True (the affine runs in the GPU "
                             "augmentation)")
        if not isinstance(self.tune_budget_s, (int, float)) or self.tune_budget_s <= 0:
            raise ValueError(f"tune_budget_s={self.tune_budget_s!r} must be a positive number of seconds")
        for name, low in (("steps", 1), ("warmup", 0), ("trace_steps", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        for name in ("workers", "retune_epoch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}={value!r} must be None or an integer >= 0")
        if self.tune_kwargs is not None and not isinstance(self.tune_kwargs, dict):
            raise TypeError(f"tune_kwargs must be a dict of pipeline_opt.autotune arguments, got "
                            f"{type(self.tune_kwargs).__name__}")
        if self.augment_kwargs is not None and not isinstance(self.augment_kwargs, dict):
            raise TypeError(f"augment_kwargs must be a dict of decide_gpu_augment arguments, got "
                            f"{type(self.augment_kwargs).__name__}")
        if self.retune_epoch is not None and not self.tune:
            raise ValueError(f"retune_epoch={self.retune_epoch} needs tune=True")


def _epoch_batch_sizes(loader: Any) -> list[int]:
    """Samples in each batch of one epoch of ``loader`` (the callbacks never see the batch itself)."""
    cfg = loader_config(loader)
    batch = int(cfg["batch_size"] or 1)
    sampler = getattr(loader, "sampler", None)
    samples = len(sampler) if sampler is not None else len(loader) * batch
    full, rest = divmod(samples, batch)
    return [batch] * full + ([rest] if rest and not loader.drop_last else [])


def _sized(n: int) -> torch.Tensor:
    """A zero-byte stand-in with ``n`` rows: what ``StepProfiler.after_data`` counts as the batch size."""
    return torch.empty((n, 0))


class _Run:
    """State of one trainer's run."""

    def __init__(self, trainer: Any, output_dir: str | None, rank: int | None = None, warmup: int = 5) -> None:
        self.trainer = trainer
        self.rank = rank  # the DDP rank, None without DDP
        self.root_dir = Path(output_dir) if output_dir else Path(trainer.save_dir) / OUTPUT_SUBDIR
        self.out_dir = self.root_dir if rank is None else self.root_dir / f"rank_{rank}"
        self.augment_votes: list[bool] | None = None
        self.affine_votes: list[bool] | None = None
        self.notes: list[str] = []
        self.augment: GpuAugmentedPreprocess | None = None  # the wrapper built (installed only while active)
        self.switch: AugmentSwitch | None = None
        self.tunes: list[dict[str, Any]] = []
        self.loader_setting: dict[str, Any] | None = None  # the settings applied to trainer.train_loader
        self.profiler: StepProfiler | None = None
        self.collector: Any = None
        self.plain_loader: Any = None
        self.profiled_loader: Any = None
        self.loader_config: dict[str, Any] = {}
        self.batch_sizes: list[int] = []
        self.position = 0
        self.report: Any = None
        self.validation = ValidationRecorder(warmup_steps=warmup)  # each training step, each validation pass
        self.batch_end: float | None = None
        self.memory = MemoryMeter(getattr(trainer, "device", "cpu"))  # peak per training step outside the window
        self.epoch_peaks: dict[int, int] = {}  # epoch -> the largest step peak (allocated bytes)
        self.batch_size = getattr(trainer, "batch_size", None)  # to notice ultralytics' out-of-memory retry

    @property
    def disabled(self) -> list[dict[str, Any]]:
        """The CPU stages silenced now, with the settings they had."""
        return [] if self.switch is None else self.switch.disabled.to_dict()["stages"]

    @property
    def profiling(self) -> bool:
        return self.profiler is not None and self.report is None and not self.profiler.done


class YoloIntegration:
    """The callbacks one :func:`attach` registers (one instance per attached model)."""

    EVENTS = ("on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_epoch_start",
              "on_train_batch_start", "on_train_batch_end", "on_val_start", "on_val_end", "on_train_end",
              "teardown")

    def __init__(self, options: AttachOptions) -> None:
        self.options = options
        self.run: _Run | None = None

    def callbacks(self) -> dict[str, Any]:
        return {event: getattr(self, event) for event in self.EVENTS}

    def _run_for(self, trainer: Any) -> _Run | None:
        run = self.run
        return run if run is not None and run.trainer is trainer else None

    # -- setup ---------------------------------------------------------------------------------
    def on_pretrain_routine_start(self, trainer: Any) -> None:
        self.run = run = _Run(trainer, self.options.output_dir, ddp_rank(trainer), self.options.warmup)
        if self.options.workers is not None:
            log.info("workers: %s -> %d (attach(workers=...))", trainer.args.workers, self.options.workers)
            trainer.args.workers = self.options.workers
        elif getattr(trainer.device, "type", "cpu") in ("cpu", "mps"):
            run.notes.append(f"ultralytics runs data loading with workers=0 on {trainer.device.type}")

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        if int(getattr(trainer, "world_size", 0) or 0) > 1 and run.rank is None:
            log.warning("pipeline_opt: the trainer has world_size=%s but no torch.distributed process group is "
                        "initialised in this process; running unchanged", trainer.world_size)
            self.run = None
            return
        opts = self.options
        bench = perf_bench_enabled()
        if opts.gpu_augment:
            self._setup_gpu_augment(run)
        if opts.gpu_augment is True:
            self._decide_augment(run)
        if opts.tune and bench:
            run.notes.append(f"{PERF_BENCH_ENV}=1: tuning skipped, the fixed profile measures the loader as configured")
        elif opts.tune:
            self._tune(run, "before the first epoch")
        if opts.shared_slots == FORCE and not (opts.tune and not bench):
            self._force_slots(run)
        if opts.profile or bench:
            self._start_profile(run)
        self._save_summary(run)

    def _setup_gpu_augment(self, run: _Run) -> None:
        t = run.trainer
        opts = self.options
        augment = build_gpu_augment(t.args, affine=bool(opts.gpu_affine), device=t.device)
        run.augment = GpuAugmentedPreprocess(t.preprocess_batch, augment, t.device)
        run.switch = candidate_switch(t.train_loader.dataset, _TrainerInstall(t, run.augment), augment,
                                      opts.gpu_augment, opts.gpu_affine)
        log.info("GPU augmentation on %s: %r", t.device, augment)
        # Both of these rebuild the dataset's transforms from trainer.args: silence the CPU stages again.
        for name in ("_close_dataloader_mosaic", "_build_train_pipeline"):
            original = getattr(t, name, None)
            if callable(original):
                patch(t, name, _AfterRebuild(original, self, run, rebuilt_loader=name == "_build_train_pipeline"))

    def _decide_augment(self, run: _Run) -> None:
        """Measure the GPU augmentation against the CPU stages on trainer steps; keep the faster."""
        t = run.trainer
        log.info("pipeline_opt: measuring the GPU augmentation against the CPU stages (A B A B)")
        decision = decide_gpu_augment(t.train_loader, inner_model(t.model), TrainerStep(t), t.device, run.switch,
                                      **(self.options.augment_kwargs or {}))
        if run.rank is not None:
            everywhere, run.augment_votes = agree_on_augment(decision)
            if decision.applied and not everywhere:
                run.switch.set(False)
                decision = overruled(decision, run.augment_votes)
        run.switch.decision = decision
        run.notes.append(("GPU augmentation kept: " if decision.applied else
                          "GPU augmentation not used (ultralytics' CPU augmentation is as fast or faster): ")
                         + decision.verdict)
        if self.options.gpu_affine is True:
            self._decide_affine(run)

    def _decide_affine(self, run: _Run) -> None:
        """With the GPU colour/flip kept: the warp on the device against the workers' warp."""
        t = run.trainer
        decision = decide_gpu_affine(t.train_loader, inner_model(t.model), TrainerStep(t), t.device, run.switch,
                                     **(self.options.augment_kwargs or {}))
        if run.rank is not None:  # every rank calls this (a collective), whatever it decided
            everywhere, run.affine_votes = agree_on_augment(decision)
            if decision.applied and not everywhere:
                run.switch.set_affine(False)
                decision = overruled(decision, run.affine_votes)
        run.switch.affine_decision = decision
        run.notes.append(("GPU warp kept: " if decision.applied else "GPU warp not used: ") + decision.verdict)

    def after_rebuild(self, run: _Run, rebuilt_loader: bool) -> None:
        """The trainer rebuilt its transforms (close_mosaic) or its whole loader (OOM retry)."""
        t = run.trainer
        run.switch.dataset = t.train_loader.dataset
        run.switch.reapply()
        if not rebuilt_loader:
            return
        log.warning("pipeline_opt: the trainer rebuilt its train loader (batch %s); re-applying the integration",
                    t.batch_size)
        if run.loader_setting is not None and config_changed(t.train_loader, run.loader_setting):
            self._install_loader(run, rebuild_loader(t.train_loader, run.loader_setting, t.device))
        if run.profiler is not None and run.report is None:
            self._close_profiling(run, restore_loader=False)
            run.profiler = None
            self._start_profile(run)

    def _tune(self, run: _Run, why: str) -> None:
        t = run.trainer
        loader = t.train_loader
        if getattr(loader, "iterator", None) is not None:
            loader.reset()  # a retune: stop the running workers so the trials get the CPU
        for note in device_notes(t.device, loader):
            if note not in run.notes:
                run.notes.append(note)
        log.info("pipeline_opt: tuning the train loader %s (budget %.0f s)", why, self.options.tune_budget_s)
        # inside DDP, autotune makes the ranks agree on one configuration (pipeline_opt.distributed_api)
        kwargs = dict(self.options.tune_kwargs or {})
        slots = self.options.shared_slots
        measured_slots = slots is True or bool(kwargs.pop("shared_slots", False))
        note = ("shared slots (reused page-locked worker buffers) were not tried: attach(shared_slots=True) "
                "measures them, shared_slots='force' uses them")
        if t.device.type == "cuda" and not measured_slots and slots != FORCE and note not in run.notes:
            run.notes.append(note)
        base = plain_loader_of(loader)  # the tuner's trials clone the loader as ultralytics built it
        result = tune_loader(base, inner_model(t.model), TrainerStep(t), t.device, self.options.tune_budget_s,
                             shared_slots=measured_slots, **kwargs)
        config = dict(result.config)
        if slots == FORCE:
            config = self._with_forced_slots(run, config)
        changed = config_changed(loader, config)
        if changed:
            self._install_loader(run, rebuild_loader(base, config, t.device))
        run.loader_setting = config
        name = "tune" if not run.tunes else f"tune-epoch{t.epoch}"
        directory = run.out_dir / name
        result.save(directory)
        run.tunes.append({"when": why, "config": config, "speedup": result.speedup,
                          "noise": result.noise, "applied": changed, "saved": str(directory)})
        log.info("pipeline_opt: %s\n%s", "applied " + json.dumps(config) if changed else
                 "kept the loader as built (nothing beat it beyond the noise)", result.table())

    def _with_forced_slots(self, run: _Run, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with shared slots on (``shared_slots="force"``), or as it is where no worker runs."""
        if int(config.get("num_workers") or 0) < 1:
            note = ("shared_slots='force' not applied: the train loader has no worker processes (ultralytics "
                    "uses workers=0 on CPU / MPS; attach(workers=N) overrides it)")
            if note not in run.notes:
                run.notes.append(note)
            return config
        return {**config, "shared_slots": True}

    def _force_slots(self, run: _Run) -> None:
        """``shared_slots="force"`` without tuning: the loader's own settings, delivered through slots."""
        t = run.trainer
        config = self._with_forced_slots(run, loader_config(t.train_loader))
        if config_changed(t.train_loader, config):
            self._install_loader(run, rebuild_loader(t.train_loader, config, t.device))
        run.loader_setting = config

    def _install_loader(self, run: _Run, loader: Any) -> None:
        """``trainer.train_loader = loader``; a replaced shared-slots loader gives its page-locked slots back."""
        t = run.trainer
        old, t.train_loader = t.train_loader, loader
        if old is not loader and delivers_through_slots(old):
            old.close()
        if delivers_through_slots(loader):
            log.info("pipeline_opt: the train loader delivers its images through shared slots (%d workers) on %s",
                     loader.num_workers, t.device)

    # -- profiling -----------------------------------------------------------------------------
    def _start_profile(self, run: _Run) -> None:
        t = run.trainer
        loader = t.train_loader
        run.loader_config = describe_loader(loader)
        run.batch_sizes = _epoch_batch_sizes(loader)
        run.profiled_loader, run.collector = install_worker_profiling(loader)
        run.plain_loader = loader
        t.train_loader = run.profiled_loader
        run.profiler = StepProfiler(t.device, skip_steps(self.options.warmup, run.loader_config), self.options.steps,
                                    trace_steps=self.options.trace_steps)

    def _close_profiling(self, run: _Run, restore_loader: bool) -> None:
        t = run.trainer
        if restore_loader and run.profiled_loader is not None and t.train_loader is run.profiled_loader:
            t.train_loader = run.plain_loader
        if run.profiled_loader is not None:
            close = getattr(run.profiled_loader, "close", None)
            if callable(close):  # InfiniteDataLoader, DeviceLoader
                close()
            else:  # a plain DataLoader (a trainer may use one): stop its workers now
                release_workers(run.profiled_loader)
            run.profiled_loader = None
        if run.collector is not None:
            run.collector.close()

    def on_train_epoch_start(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        if run.validation.in_validation:  # a pass whose end never came (it raised): close it here
            run.validation.validation_end()
        batch = getattr(trainer, "batch_size", None)
        if run.batch_size and batch and batch < run.batch_size:  # ultralytics halves the batch after an OOM
            run.notes.append(f"ultralytics ran out of memory in epoch {trainer.epoch} and retried with batch={batch} "
                             f"(was {run.batch_size}); its rebuilt loader was given the integration again")
            log.warning("pipeline_opt: %s", run.notes[-1])
        run.batch_size = batch
        if run.profiler is not None and not run.profiling:
            self._close_profiling(run, restore_loader=True)  # the window is over: unprofiled loader back
        if self.options.retune_epoch is not None and trainer.epoch == self.options.retune_epoch \
                and trainer.epoch > getattr(trainer, "start_epoch", 0):
            if run.profiling:
                run.notes.append(f"retune at epoch {trainer.epoch} skipped: the profile window was still running")
            else:
                self._tune(run, f"at the start of epoch {trainer.epoch}")
                self._save_summary(run)
        if not run.profiling:
            return
        prof = run.profiler
        prof.abort_data()
        prof.start()
        prof.new_epoch()
        run.position = 0
        prof.before_data()

    def on_train_batch_start(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        if run.batch_end is not None:  # the loop's wait for this batch (and its bookkeeping)
            run.validation.data_wait(time.perf_counter() - run.batch_end)
        if not run.profiling:
            run.memory.begin()  # the profile window measures its own steps' peaks
            return
        sizes = run.batch_sizes
        n = sizes[run.position] if run.position < len(sizes) else (sizes[-1] if sizes else 1)
        run.profiler.after_data(_sized(n))
        run.profiler.before_step()

    def on_train_batch_end(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        run.validation.step_end()
        run.batch_end = time.perf_counter()
        if not run.profiling:
            if run.memory.active:
                run.memory.end()
                peak = run.memory.allocated.pop()  # kept per epoch only: training may run for days
                run.memory.reserved.pop()
                epoch = int(getattr(trainer, "epoch", 0) or 0)
                run.epoch_peaks[epoch] = max(run.epoch_peaks.get(epoch, 0), peak)
            return
        prof = run.profiler
        if self.options.sync and prof.cuda:
            torch.cuda.synchronize(prof.device)
        prof.after_step()
        run.position += 1
        if prof.done:
            self._finish_profile(run)
        elif run.position < len(run.batch_sizes):
            prof.before_data()

    def _finish_profile(self, run: _Run) -> None:
        t = run.trainer
        main = run.profiler.result()
        run.report = build_report(main, run.collector.read(), loader_config=run.loader_config, device=t.device,
                                  model=inner_model(t.model), limit_throughput=None,
                                  dataset=getattr(t, "train_loader", None))
        if run.rank is None:
            run.report.save(run.out_dir)
        else:  # a collective: every rank ends its window at the same step
            write_combined_profile(run.report, run.root_dir, run.rank)
        self._save_summary(run)
        log.info("pipeline_opt: profiled %d training steps: %.1f img/s, data wait %.0f%%, bottleneck %s; "
                 "report in %s", len(run.report.steps), run.report.throughput, 100 * run.report.data_wait_frac,
                 run.report.bottleneck, run.out_dir)
        if perf_bench_enabled():
            self._close_profiling(run, restore_loader=True)
            for loader in (t.train_loader, getattr(t, "test_loader", None)):
                if hasattr(loader, "close"):
                    loader.close()
            log.warning("%s=1: profiled %d steps; report saved to %s; exiting with status 0", PERF_BENCH_ENV,
                        len(run.report.steps), run.out_dir.resolve())
            raise PerfBenchComplete(run.out_dir)

    # -- validation ----------------------------------------------------------------------------
    def on_val_start(self, validator: Any) -> None:
        """The trainer's validation pass begins (the callbacks receive the validator)."""
        run = self.run
        # ultralytics calls on_val_end on rank 0 only (and without DDP): the other ranks mark nothing
        if run is not None and getattr(validator, "training", True) and run.rank in (None, 0):
            run.validation.validation_start()

    def on_val_end(self, validator: Any) -> None:
        run = self.run
        if run is None or run.validation.validation_end() is None:
            return
        run.batch_end = time.perf_counter()
        found = self._validation_analysis(run)
        if found is not None:
            log.info("pipeline_opt: validation: %s", found.summary)

    def _validation_analysis(self, run: _Run) -> Any:
        loader = getattr(run.trainer, "train_loader", None)
        try:
            per_epoch = len(loader) if loader is not None else None
        except TypeError:
            per_epoch = None
        return run.validation.analyse(per_epoch)

    # -- end -----------------------------------------------------------------------------------
    def on_train_end(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        if run.profiling:
            measured = run.profiler.measured_steps
            if measured > 0:
                log.warning("pipeline_opt: training ended after %d of %d profiled steps; reporting those",
                            measured, self.options.steps)
                run.notes.append(f"profile window cut short by the end of training: {measured} of "
                                 f"{self.options.steps} steps")
                self._finish_profile(run)
            else:
                log.warning("pipeline_opt: training ended before the profile window started (%d steps skipped "
                            "first); no profile report. Train longer or lower warmup=", run.profiler.skip)
                run.notes.append("no profile: training ended before the measured window started")
                run.profiler.stop()
        self._save_summary(run)

    def teardown(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is not None and run.collector is not None:
            run.collector.close()

    # -- summary -------------------------------------------------------------------------------
    def summary(self, run: _Run) -> dict[str, Any]:
        t = run.trainer
        dataset = getattr(run.plain_loader or t.train_loader, "dataset", None)
        return {
            "options": asdict(self.options),
            "device": str(t.device),
            "train_loader": loader_config(t.train_loader) if hasattr(t, "train_loader") else None,
            "image_cache": getattr(dataset, "cache", None),  # ultralytics' cache: None, "ram" or "disk"
            "gpu_augment": None if run.switch is None else {
                "applied": run.switch.active,
                "decision": None if run.switch.decision is None else run.switch.decision.to_dict(),
                "augment": repr(run.augment.augment), "batches": run.augment.calls,
                "cpu_stages_disabled": run.disabled,
                "cpu_stages_still_active": active_cpu_stages(dataset, affine=run.switch.affine)
                if dataset is not None else [],
                "affine": {"applied": run.switch.active and run.switch.affine,
                           "decision": None if run.switch.affine_decision is None
                           else run.switch.affine_decision.to_dict()},
            },
            "tuning": run.tunes,
            "shared_slots": self._slots_summary(run),
            "profile": None if run.report is None else {"steps": len(run.report.steps),
                                                        "throughput": run.report.throughput,
                                                        "bottleneck": run.report.bottleneck,
                                                        "saved": str(run.out_dir if run.rank is None
                                                                     else run.root_dir)},
            "ddp": None if run.rank is None else {"rank": run.rank, "world_size": int(t.world_size),
                                                  "gpu_augment_votes": run.augment_votes,
                                                  "gpu_affine_votes": run.affine_votes},
            "validation": self._validation_summary(run),
            "memory": self._memory_summary(run),
            "notes": run.notes,
        }

    def _memory_summary(self, run: _Run) -> dict[str, Any]:
        """The largest CUDA step peak of each epoch (outside the profile window), and the epochs whose
        peak stands out from the median epoch's (a spike)."""
        if not run.memory.active:
            return {"measured": False, "note": run.memory.stats().note}
        peaks = dict(sorted(run.epoch_peaks.items()))
        typical = sorted(peaks.values())[len(peaks) // 2] if peaks else 0
        return {"measured": True, "per_epoch_peak_allocated_bytes": peaks,
                "device_total_bytes": run.memory.stats().device_total_bytes,
                "spike_epochs": [e for e, p in peaks.items() if typical and p > SPIKE * typical]}

    def _validation_summary(self, run: _Run) -> dict[str, Any]:
        found = self._validation_analysis(run)
        if found is not None:
            return found.to_dict()
        return {"passes": len(run.validation.passes), "summary": "no training steps after a validation pass yet"
                if run.validation.passes else "no validation pass during training"}

    def _slots_summary(self, run: _Run) -> dict[str, Any]:
        loader = getattr(run.trainer, "train_loader", None)
        in_window = loader is not None and loader is run.profiled_loader
        applied = delivers_through_slots(run.plain_loader if in_window else loader)
        # the counts of the loader training now: in the profile window its clone, which has slots of its own
        counted = applied and delivers_through_slots(loader)
        stats = loader.slot_stats() if counted else None
        received = loader.receive_stats() if counted else None
        return {"requested": self.options.shared_slots, "applied": applied,
                "counted": None if not counted else ("profile window" if in_window else "train loader"),
                "stats": None if stats is None else {**asdict(stats), "slotted_frac": stats.slotted_frac},
                "receive": None if received is None else asdict(received)}

    def _save_summary(self, run: _Run) -> None:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        (run.out_dir / SUMMARY_FILE).write_text(json.dumps(self.summary(run), indent=2, default=str))


class _TrainerInstall:
    """``AugmentSwitch.install`` for a trainer: wraps ``preprocess_batch`` or puts the original back."""

    def __init__(self, trainer: Any, wrapper: GpuAugmentedPreprocess) -> None:
        self.trainer = trainer
        self.wrapper = wrapper
        self.own = "preprocess_batch" in vars(trainer)  # an instance attribute before we came

    def __call__(self, on: bool) -> None:
        t = self.trainer
        if on:
            patch(t, "preprocess_batch", self.wrapper)
        elif self.own:
            patch(t, "preprocess_batch", self.wrapper.preprocess)
        else:
            unpatch(t, "preprocess_batch")  # the class's method again, exactly as before


class _AfterRebuild:
    """Wraps a trainer method that rebuilds transforms or loaders, then re-applies the integration."""

    def __init__(self, original: Any, integration: YoloIntegration, run: _Run, rebuilt_loader: bool) -> None:
        self.original = original
        self.integration = integration
        self.run = run
        self.rebuilt_loader = rebuilt_loader

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.original(*args, **kwargs)
        self.integration.after_rebuild(self.run, self.rebuilt_loader)
        return out
