"""Attach step 1, decide: wire the GPU augmentation into the trainer and keep it only where it is faster.

:func:`wire_gpu_augment` builds the device augmentation from the trainer's hyperparameters, wraps
``trainer.preprocess_batch`` and silences the CPU stages it replaces; :func:`decide_augment` (and
:func:`decide_affine` for the warp) measures it against ultralytics' CPU stages A B A B on real trainer
steps and gives the CPU stages back unless it wins beyond the noise. Under DDP the ranks agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._augment import GpuAugmentedPreprocess, build_gpu_augment
from pipeline_opt.integrations.ultralytics._ddp import agree_on_augment, inner_model, overruled
from pipeline_opt.integrations.ultralytics._decide import (
    candidate_switch,
    decide_gpu_affine,
    decide_gpu_augment,
)
from pipeline_opt.integrations.ultralytics._internals import REBUILDING_METHODS, patch, unpatch
from pipeline_opt.integrations.ultralytics._options import AttachOptions
from pipeline_opt.integrations.ultralytics._run import Run
from pipeline_opt.integrations.ultralytics._step import TrainerStep

__all__ = ["decide_affine", "decide_augment", "wire_gpu_augment"]

log = get_logger("integrations.ultralytics")


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
    """Wraps a trainer method that rebuilds transforms or loaders, then calls ``after(rebuilt_loader)``."""

    def __init__(self, original: Any, after: Callable[[bool], None], rebuilt_loader: bool) -> None:
        self.original = original
        self.after = after
        self.rebuilt_loader = rebuilt_loader

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.original(*args, **kwargs)
        self.after(self.rebuilt_loader)
        return out


def wire_gpu_augment(run: Run, opts: AttachOptions, after_rebuild: Callable[[bool], None]) -> None:
    """Build the GPU augmentation, install it (CPU stages silenced), and re-apply it whenever the trainer
    rebuilds its transforms or its loader (``after_rebuild(rebuilt_loader)`` then runs)."""
    t = run.trainer
    augment = build_gpu_augment(t.args, affine=bool(opts.gpu_affine), device=t.device)
    run.augment = GpuAugmentedPreprocess(t.preprocess_batch, augment, t.device)
    run.switch = candidate_switch(t.train_loader.dataset, _TrainerInstall(t, run.augment), augment,
                                  opts.gpu_augment, opts.gpu_affine)
    log.info("GPU augmentation on %s: %r", t.device, augment)
    # These rebuild the dataset's transforms (or the loader) from trainer.args: silence the CPU stages again.
    for name, rebuilds_loader in REBUILDING_METHODS:
        original = getattr(t, name, None)
        if callable(original):
            patch(t, name, _AfterRebuild(original, after_rebuild, rebuilt_loader=rebuilds_loader))


def decide_augment(run: Run, opts: AttachOptions) -> None:
    """Measure the GPU augmentation against the CPU stages on trainer steps; keep the faster."""
    t = run.trainer
    log.info("pipeline_opt: measuring the GPU augmentation against the CPU stages (A B A B)")
    decision = decide_gpu_augment(t.train_loader, inner_model(t.model), TrainerStep(t), t.device, run.switch,
                                  **(opts.augment_kwargs or {}))
    if run.rank is not None:
        everywhere, run.augment_votes = agree_on_augment(decision)
        if decision.applied and not everywhere:
            run.switch.set(False)
            decision = overruled(decision, run.augment_votes)
    run.switch.decision = decision
    run.notes.append(("GPU augmentation kept: " if decision.applied else
                      "GPU augmentation not used (ultralytics' CPU augmentation is as fast or faster): ")
                     + decision.verdict)
    if opts.gpu_affine is True:
        decide_affine(run, opts)


def decide_affine(run: Run, opts: AttachOptions) -> None:
    """With the GPU colour/flip kept: the warp on the device against the workers' warp."""
    t = run.trainer
    decision = decide_gpu_affine(t.train_loader, inner_model(t.model), TrainerStep(t), t.device, run.switch,
                                 **(opts.augment_kwargs or {}))
    if run.rank is not None:  # every rank calls this (a collective), whatever it decided
        everywhere, run.affine_votes = agree_on_augment(decision)
        if decision.applied and not everywhere:
            run.switch.set_affine(False)
            decision = overruled(decision, run.affine_votes)
    run.switch.affine_decision = decision
    run.notes.append(("GPU warp kept: " if decision.applied else "GPU warp not used: ") + decision.verdict)
