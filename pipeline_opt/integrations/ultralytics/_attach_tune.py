"""Attach step 2, apply: tune the train loader on real trainer steps and install the winner.

:func:`tune_train_loader` runs :func:`pipeline_opt.autotune` on the loader as ultralytics built it
(inside DDP the ranks agree on one configuration) and puts the tuned loader in ``trainer.train_loader``
only when its settings differ; :func:`force_slots` is ``shared_slots="force"`` without tuning.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._ddp import inner_model
from pipeline_opt.integrations.ultralytics._decide import FORCE
from pipeline_opt.integrations.ultralytics._options import AttachOptions
from pipeline_opt.integrations.ultralytics._run import Run
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

__all__ = ["force_slots", "install_loader", "tune_train_loader"]

log = get_logger("integrations.ultralytics")

_SLOTS_NOT_TRIED = ("shared slots (reused page-locked worker buffers) were not tried: attach(shared_slots=True) "
                    "measures them, shared_slots='force' uses them")
_SLOTS_WITHOUT_WORKERS = ("shared_slots='force' not applied: the train loader has no worker processes (ultralytics "
                          "uses workers=0 on CPU / MPS; attach(workers=N) overrides it)")


def tune_train_loader(run: Run, opts: AttachOptions, why: str) -> None:
    """Tune ``trainer.train_loader`` (``why``: when, for the record), install the winner, save the result."""
    t = run.trainer
    loader = t.train_loader
    release_workers(loader)  # a retune: stop the running workers so the trials get the CPU
    for note in device_notes(t.device, loader):
        run.note(note)
    log.info("pipeline_opt: tuning the train loader %s (budget %.0f s)", why, opts.tune_budget_s)
    kwargs = dict(opts.tune_kwargs or {})
    measured_slots = opts.shared_slots is True or bool(kwargs.pop("shared_slots", False))
    if t.device.type == "cuda" and not measured_slots and opts.shared_slots != FORCE:
        run.note(_SLOTS_NOT_TRIED)
    base = plain_loader_of(loader)  # the tuner's trials clone the loader as ultralytics built it
    result = tune_loader(base, inner_model(t.model), TrainerStep(t), t.device, opts.tune_budget_s,
                         shared_slots=measured_slots, **kwargs)
    config = dict(result.config)
    if opts.shared_slots == FORCE:
        config = with_forced_slots(run, config)
    changed = config_changed(loader, config)
    if changed:
        install_loader(run, rebuild_loader(base, config, t.device))
    run.loader_setting = config
    name = "tune" if not run.tunes else f"tune-epoch{t.epoch}"
    directory = run.out_dir / name
    result.save(directory)
    run.tunes.append({"when": why, "config": config, "speedup": result.speedup,
                      "noise": result.noise, "applied": changed, "saved": str(directory)})
    log.info("pipeline_opt: %s\n%s", "applied " + json.dumps(config) if changed else
             "kept the loader as built (nothing beat it beyond the noise)", result.table())


def with_forced_slots(run: Run, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with shared slots on (``shared_slots="force"``), or as it is where no worker runs."""
    if int(config.get("num_workers") or 0) < 1:
        run.note(_SLOTS_WITHOUT_WORKERS)
        return config
    return {**config, "shared_slots": True}


def force_slots(run: Run) -> None:
    """``shared_slots="force"`` without tuning: the loader's own settings, delivered through slots."""
    t = run.trainer
    config = with_forced_slots(run, loader_config(t.train_loader))
    if config_changed(t.train_loader, config):
        install_loader(run, rebuild_loader(t.train_loader, config, t.device))
    run.loader_setting = config


def install_loader(run: Run, loader: Any) -> None:
    """``trainer.train_loader = loader``; a replaced shared-slots loader gives its page-locked slots back."""
    t = run.trainer
    old, t.train_loader = t.train_loader, loader
    if old is not loader and delivers_through_slots(old):
        old.close()
    if delivers_through_slots(loader):
        log.info("pipeline_opt: the train loader delivers its images through shared slots (%d workers) on %s",
                 loader.num_workers, t.device)


def reinstall_after_rebuild(run: Run) -> None:
    """The trainer rebuilt its loader (an out-of-memory retry): give it the applied settings again."""
    t = run.trainer
    if run.loader_setting is not None and config_changed(t.train_loader, run.loader_setting):
        install_loader(run, rebuild_loader(t.train_loader, run.loader_setting, t.device))
