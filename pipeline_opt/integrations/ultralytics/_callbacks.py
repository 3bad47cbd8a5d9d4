"""The trainer callbacks behind :func:`pipeline_opt.integrations.ultralytics.attach`: the attach steps, in order.

One ``YOLO(...).train(...)`` with everything on, read top to bottom in :class:`YoloIntegration`:

* ``on_pretrain_routine_start``: a new :class:`~._run.Run`; optional ``workers`` override of ``trainer.args``.
* ``on_pretrain_routine_end`` (loaders built, not iterated), the four steps:

  1. **decide** (:mod:`._attach_augment`): the GPU augmentation is wired (CPU HSV / flips silenced in the
     dataset, ``trainer.preprocess_batch`` wrapped) and measured against the CPU stages A B A B on real
     trainer steps, kept only if faster beyond the noise (``gpu_augment="force"`` skips the measurement);
  2. **apply** (:mod:`._attach_tune`): the loader tuned on real trainer steps and ``trainer.train_loader``
     rebuilt with the winner;
  3. **profile** (:mod:`._attach_profile`): the profiled clone of the loader installed; the batch callbacks
     then drive the step profiler and, once the window is complete, the report is saved to
     ``<save_dir>/pipeline_opt`` and at the next epoch start the unprofiled loader goes back in
     (``PERF_BENCH=1`` ends the run there with status 0);
  4. **verify** (:mod:`._attach_summary`): ``integration.json`` says what was decided, applied and measured,
     rewritten after each step that changes it.

* ``on_train_epoch_start``: an optional retune (``retune_epoch``); ``on_val_start`` / ``on_val_end``: validation
  passes, for the steps after them; ``on_train_end`` / ``teardown``: a window cut short by the end of training
  is reported as far as it got; the worker files are removed.

Under ultralytics' DDP launch the same callbacks run in every rank (:mod:`._ddp`): the measurements use the
model's inner module, the ranks agree on the augmentation and the loader settings, and rank 0 writes the
combined profile of all ranks.
"""

from __future__ import annotations

import functools
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._attach_augment import decide_augment, wire_gpu_augment
from pipeline_opt.integrations.ultralytics._attach_profile import (
    after_batch,
    before_batch,
    close_window,
    end_of_training,
    new_epoch,
    restart_window,
    start_window,
    validation_end,
)
from pipeline_opt.integrations.ultralytics._attach_summary import save_summary, summary
from pipeline_opt.integrations.ultralytics._attach_tune import (
    force_slots,
    reinstall_after_rebuild,
    tune_train_loader,
)
from pipeline_opt.integrations.ultralytics._ddp import ddp_rank
from pipeline_opt.integrations.ultralytics._decide import FORCE
from pipeline_opt.integrations.ultralytics._options import AttachOptions
from pipeline_opt.integrations.ultralytics._run import OUTPUT_SUBDIR, SUMMARY_FILE, Run
from pipeline_opt.profile.inloop import PERF_BENCH_ENV, perf_bench_enabled

__all__ = ["OUTPUT_SUBDIR", "SUMMARY_FILE", "AttachOptions", "Run", "YoloIntegration"]

log = get_logger("integrations.ultralytics")


class YoloIntegration:
    """The callbacks one :func:`attach` registers (one instance per attached model)."""

    EVENTS = ("on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_epoch_start",
              "on_train_batch_start", "on_train_batch_end", "on_val_start", "on_val_end", "on_train_end",
              "teardown")

    def __init__(self, options: AttachOptions) -> None:
        self.options = options
        self.run: Run | None = None

    def callbacks(self) -> dict[str, Any]:
        return {event: getattr(self, event) for event in self.EVENTS}

    def _run_for(self, trainer: Any) -> Run | None:
        run = self.run
        return run if run is not None and run.trainer is trainer else None

    # -- before training -----------------------------------------------------------------------
    def on_pretrain_routine_start(self, trainer: Any) -> None:
        self.run = run = Run(trainer, self.options.output_dir, ddp_rank(trainer), self.options.warmup)
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
        # 1. decide: the GPU augmentation, kept only where it measures faster
        if opts.gpu_augment:
            wire_gpu_augment(run, opts, functools.partial(self.after_rebuild, run))
        if opts.gpu_augment is True:
            decide_augment(run, opts)
        # 2. apply: the tuned train loader
        if opts.tune and bench:
            run.notes.append(f"{PERF_BENCH_ENV}=1: tuning skipped, the fixed profile measures the loader as configured")
        elif opts.tune:
            tune_train_loader(run, opts, "before the first epoch")
        if opts.shared_slots == FORCE and not (opts.tune and not bench):
            force_slots(run)
        # 3. profile: the measured window on the first epoch's steps
        if opts.profile or bench:
            start_window(run, opts)
        # 4. verify: what was decided and applied
        save_summary(run, opts)

    def after_rebuild(self, run: Run, rebuilt_loader: bool) -> None:
        """The trainer rebuilt its transforms (close_mosaic) or its whole loader (OOM retry): re-apply."""
        t = run.trainer
        run.switch.dataset = t.train_loader.dataset
        run.switch.reapply()
        if not rebuilt_loader:
            return
        log.warning("pipeline_opt: the trainer rebuilt its train loader (batch %s); re-applying the integration",
                    t.batch_size)
        reinstall_after_rebuild(run)
        restart_window(run, self.options)

    # -- training ------------------------------------------------------------------------------
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
            close_window(run, restore_loader=True)  # the window is over: unprofiled loader back
        opts = self.options
        if opts.retune_epoch is not None and trainer.epoch == opts.retune_epoch \
                and trainer.epoch > getattr(trainer, "start_epoch", 0):
            if run.profiling:
                run.notes.append(f"retune at epoch {trainer.epoch} skipped: the profile window was still running")
            else:
                tune_train_loader(run, opts, f"at the start of epoch {trainer.epoch}")
                save_summary(run, opts)
        if run.profiling:
            new_epoch(run)

    def on_train_batch_start(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is not None:
            before_batch(run)

    def on_train_batch_end(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is not None:
            after_batch(run, self.options)

    # -- validation ----------------------------------------------------------------------------
    def on_val_start(self, validator: Any) -> None:
        """The trainer's validation pass begins (the callbacks receive the validator)."""
        run = self.run
        # ultralytics calls on_val_end on rank 0 only (and without DDP): the other ranks mark nothing
        if run is not None and getattr(validator, "training", True) and run.rank in (None, 0):
            run.validation.validation_start()

    def on_val_end(self, validator: Any) -> None:
        run = self.run
        if run is not None and run.validation.validation_end() is not None:
            validation_end(run)

    # -- end -----------------------------------------------------------------------------------
    def on_train_end(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is None:
            return
        end_of_training(run, self.options)
        save_summary(run, self.options)

    def teardown(self, trainer: Any) -> None:
        run = self._run_for(trainer)
        if run is not None and run.collector is not None:
            run.collector.close()

    def summary(self, run: Run) -> dict[str, Any]:
        """What the integration did and measured for ``run`` (``integration.json``)."""
        return summary(run, self.options)
