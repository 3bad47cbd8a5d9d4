"""``attach`` for ultralytics' trainer (see :mod:`pipeline_opt.integrations.ultralytics`)."""

from __future__ import annotations

import os
import warnings
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._callbacks import AttachOptions, YoloIntegration
from pipeline_opt.integrations.ultralytics._internals import support_problem

log = get_logger("integrations.ultralytics")


def attach(
    model: Any,
    profile: bool = True,
    tune: bool = True,
    gpu_augment: bool | str = True,
    output_dir: str | os.PathLike | None = None,
    tune_budget_s: float = 60.0,
    steps: int = 30,
    *,
    warmup: int = 5,
    workers: int | None = None,
    gpu_affine: bool | str = False,
    retune_epoch: int | None = None,
    sync: bool = True,
    tune_kwargs: dict[str, Any] | None = None,
    augment_kwargs: dict[str, Any] | None = None,
    trace_steps: int = 10,
    shared_slots: bool | str = False,
) -> YoloIntegration:
    """Attach pipeline_opt to an ``ultralytics.YOLO`` model through its training callbacks.

    Args:
        model: an ``ultralytics.YOLO`` (anything with ``add_callback(event, fn)``).
        profile: profile ``steps`` training steps after ``warmup`` (and the batches the workers
            pre-filled): data wait vs compute per batch, per-worker transform costs (Mosaic,
            RandomPerspective, RandomHSV, RandomFlip, ...), one merged trace.
        tune: before the first epoch, measure candidate workers / pin_memory / prefetch_factor on
            real trainer steps (forward, loss, backward with the trainer's AMP; never the optimizer;
            the model restored bitwise) and rebuild ``trainer.train_loader`` with the winner.
        gpu_augment: consider silencing the dataset's CPU RandomHSV / RandomFlip and applying them
            on the device in ``preprocess_batch`` with the run's own hyperparameters.
            ``True``: both are measured on real trainer steps, interleaved A B A B, before tuning;
            the GPU augmentation is kept only when its median gain beats ``max(noise, 3%)``,
            otherwise the CPU stages stay and ``preprocess_batch`` is left unwrapped (the verdict,
            both throughputs and the noise are logged and saved in ``integration.json``).
            ``"force"``: applied without measuring. ``False``: never.
        gpu_affine: RandomPerspective's warp on the device too (the workers then only crop the
            Mosaic canvas). ``True``: once the colour/flip is kept, colour/flip alone and colour/flip
            + warp are measured the same way and the warp moves only if it wins; ``"force"`` (or
            ``gpu_augment="force"``): with the GPU augmentation, unmeasured. It pays where the
            workers are the bottleneck (few cores); off by default, since its decision takes as
            long as the colour one.
        output_dir: where to save (default ``<trainer.save_dir>/pipeline_opt``).
        tune_budget_s: tuning time budget in seconds.
        steps, warmup: the profile window; trace_steps: training steps torch.profiler records after
            it (op tables, CUDA trace, GPU idle; 0: none); the window's numbers are untraced.
        workers: overrides ``trainer.args.workers`` at ``on_pretrain_routine_start``.
        retune_epoch: tune again at the start of that epoch (the model's state is restored after).
        sync: synchronise CUDA at every batch boundary of the profile window, so per-batch host
            times hold the GPU work (ultralytics' loop syncs every step anyway to log losses).
        shared_slots: deliver the train loader's images through shared slots: each worker writes
            its batches into a few reused shared-memory buffers that the training process maps and
            page-locks once (:mod:`pipeline_opt.loading.shared_slots`), instead of a fresh segment mapped,
            faulted in and pin-copied per batch; ``trainer.train_loader`` then becomes a
            :class:`~pipeline_opt.transforms.DeviceLoader` over the tuned ``InfiniteDataLoader``
            that hands the trainer its batches on the device, with the same samples in the same
            order. ``True``: a tuning candidate on CUDA, kept only if it wins; ``"force"``: used
            whatever the tuner chose (with workers; also without ``tune``). ``False``: never.
        tune_kwargs: further arguments for :func:`pipeline_opt.autotune` (``max_workers``,
            ``min_gain``, ``seed``, ``profiler``, ...; ``shared_slots=True`` there is
            ``shared_slots=True`` here).
        augment_kwargs: further arguments for the GPU augmentation's measured decision (``rounds``,
            ``windows``, ``steps``, ``warmup``, ``min_gain``, ``time_budget_s``, ``measure``); the
            warp's decision takes the same.

    Versions: the integration patches a few ultralytics internals (one module,
    ``_internals.py``) and is tested on ``ultralytics>=8.3,<8.5`` (:data:`TESTED_RANGE`). On any
    other version, or one lacking a patched attribute, ``attach`` warns with the version and only
    profiles: no tuning, no GPU augmentation, no shared slots, the workers untouched.

    Multi-GPU: with ultralytics' own DDP launch (``device="0,1"``) the callbacks travel to every
    rank (ultralytics pickles them with cloudpickle, part of the ``yolo`` extra); each rank measures
    its own pipeline on the model's inner module, the ranks agree on the GPU augmentation (kept
    only if it won on every rank) and the loader settings, and rank 0 writes the combined profile
    of all ranks to ``output_dir`` (each rank's ``integration.json`` and tuning under ``rank_<N>/``).

    Returns:
        The :class:`YoloIntegration` whose callbacks were added (its ``run`` holds the state of
        the current training run).
    """
    if not callable(getattr(model, "add_callback", None)):
        raise TypeError(f"attach() needs an ultralytics YOLO model (with add_callback), got {type(model).__name__}")
    problem = support_problem()
    if problem is not None:
        warnings.warn(f"pipeline_opt.attach: {problem}; profiling only", RuntimeWarning, stacklevel=2)
        log.warning("pipeline_opt.attach: %s; profiling only", problem)
        tune, gpu_augment, gpu_affine, shared_slots, retune_epoch = False, False, False, False, None
    options = AttachOptions(profile=profile, tune=tune, gpu_augment=gpu_augment,
                            output_dir=None if output_dir is None else os.fspath(output_dir),
                            tune_budget_s=tune_budget_s, steps=steps, warmup=warmup, workers=workers,
                            gpu_affine=gpu_affine, retune_epoch=retune_epoch, sync=sync,
                            tune_kwargs=tune_kwargs, augment_kwargs=augment_kwargs, trace_steps=trace_steps,
                            shared_slots=shared_slots)
    integration = YoloIntegration(options)
    for event, fn in integration.callbacks().items():
        model.add_callback(event, fn)
    return integration
