"""Tuning an ultralytics train loader: run the tuner on real steps, rebuild the InfiniteDataLoader.

The search itself is :func:`pipeline_opt.autotune` (baseline, noise from repeated windows, A B A B
calibration, rollback). This module only decides what it may change for an ultralytics loader
(workers, pin_memory, prefetch_factor, and on request shared slots; no torchvision GPU offload: the
GPU augmentation is handled by the integration), protects the model around it, and turns the
winning settings into a new ``InfiniteDataLoader`` over the same dataset, sampler, collate function
and generator. With shared slots that loader's workers write the images into reused page-locked
buffers and a :class:`~pipeline_opt.transforms.DeviceLoader` hands the trainer its batches on the
device; it forwards everything the trainer reads of its loader (``len``, ``dataset``, ``sampler``,
``num_workers``, ``reset()``, ``close()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import ModelStateGuard
from pipeline_opt.front_doors import autotune
from pipeline_opt.loading import DeviceLoader
from pipeline_opt.loading.dataloader import clone_loader, loader_config
from pipeline_opt.loading.slot_collate import slot_collate_of

log = get_logger("integrations.ultralytics")

TUNED_KEYS = ("num_workers", "pin_memory", "prefetch_factor")


def delivers_through_slots(loader: Any) -> bool:
    """Whether ``loader`` hands out its batches through shared slots (a ``DeviceLoader`` reusing buffers)."""
    return bool(getattr(loader, "reuses_buffers", False))


def plain_loader_of(loader: Any) -> Any:
    """The trainer's loader without shared slots: ``loader`` itself, or for a shared-slots
    ``DeviceLoader`` a clone of the loader under it with its own collate function back (pinned
    on CUDA, as the slots were). Never iterated here: it starts no workers."""
    if not delivers_through_slots(loader):
        return loader

    inner = loader.loader
    return clone_loader(inner, collate_fn=slot_collate_of(inner).collate_fn,
                        pin_memory=getattr(loader.device, "type", "cpu") == "cuda")


def device_notes(device: torch.device, loader: Any) -> list[str]:
    """What limits the search on this device, said plainly (kept in the saved integration summary)."""
    notes = []
    if device.type != "cuda":
        notes.append(
            f"device is {device.type}: ultralytics loads data in the training process there (it forced "
            f"workers=0; this loader has {loader_config(loader)['num_workers']}) and pin_memory has no effect "
            "without CUDA, so only worker counts can be tried; expect little to gain"
        )
    return notes


def tune_loader(loader: Any, model: torch.nn.Module, step_fn: Callable[[torch.nn.Module, Any], Any],
                device: torch.device, time_budget_s: float, **autotune_kwargs: Any) -> Any:
    """:func:`pipeline_opt.autotune` on ``loader`` with ``step_fn``; the model is restored bitwise after."""

    if not isinstance(time_budget_s, (int, float)) or time_budget_s <= 0:
        raise ValueError(f"time_budget_s={time_budget_s!r} must be a positive number of seconds")
    for note in device_notes(device, loader):
        log.info("tuning: %s", note)
    autotune_kwargs.setdefault("gpu_transforms", False)  # the integration moves the augmentation itself
    autotune_kwargs.setdefault("seed", 0)  # every candidate sees the same Mosaic / augmentation draws
    with ModelStateGuard(model):
        model.train()  # the detection loss needs training mode; the guard restores the mode
        return autotune(loader, model, step_fn=step_fn, device=device, time_budget_s=float(time_budget_s),
                        **autotune_kwargs)


def tuned_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The ``clone_loader`` overrides for a tuner config (InfiniteDataLoader is persistent by itself)."""
    missing = [k for k in ("num_workers", "pin_memory") if k not in config]
    if missing:
        raise ValueError(f"tuner config {config!r} lacks {missing}")
    out: dict[str, Any] = {"num_workers": int(config["num_workers"]), "pin_memory": bool(config["pin_memory"])}
    if out["num_workers"] > 0 and config.get("prefetch_factor") is not None:
        out["prefetch_factor"] = int(config["prefetch_factor"])
    return out


def wants_slots(config: dict[str, Any]) -> bool:
    """Whether ``config`` asks for shared slots (they need worker processes)."""
    return bool(config.get("shared_slots")) and int(config.get("num_workers") or 0) > 0


def rebuild_loader(loader: Any, config: dict[str, Any], device: torch.device | str | None = None) -> Any:
    """A new loader of ``loader``'s class (an ``InfiniteDataLoader`` stays one) with the tuned settings.

    With ``config["shared_slots"]`` (and workers) the new loader's workers deliver through shared
    slots and it comes wrapped in a :class:`~pipeline_opt.transforms.DeviceLoader` on ``device``
    (batches arrive there). ``loader`` may itself be such a wrapper: its plain loader is the base.
    The new loader starts its own workers when first iterated; the caller closes the old one.
    """
    base = plain_loader_of(loader)
    overrides = tuned_overrides(config)
    if not wants_slots(config):
        return clone_loader(base, **overrides)
    if device is None:
        raise ValueError("shared_slots=True needs the device the batches go to; pass device=")

    return DeviceLoader.through_slots(base, device, **overrides)


def config_changed(loader: Any, config: dict[str, Any]) -> bool:
    """Whether ``config`` differs from ``loader``'s current settings in a tuned key or in shared slots."""
    current = loader_config(loader)
    wanted = tuned_overrides(config)
    slots = wants_slots(config)
    if slots != delivers_through_slots(loader):
        return True
    keys = [k for k in TUNED_KEYS if not (slots and k == "pin_memory")]  # slots are page-locked, not pinned
    return any(current.get(k) != wanted.get(k, current.get(k)) for k in keys)
