"""Attach step 4, verify: what the integration did and measured, written to ``integration.json``.

The summary holds the options, the loader the trainer uses now, the GPU augmentation's decisions and
whether the CPU stages it replaces are still silenced, every tuning, the shared slots' counts, the
profile, the DDP votes, the validation passes and the CUDA memory per epoch, and the run's notes.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from pipeline_opt.integrations.ultralytics._augment import active_cpu_stages
from pipeline_opt.integrations.ultralytics._options import AttachOptions
from pipeline_opt.integrations.ultralytics._run import SUMMARY_FILE, Run
from pipeline_opt.integrations.ultralytics._tune import delivers_through_slots
from pipeline_opt.loading.dataloader import loader_config
from pipeline_opt.profile.memory import SPIKE

__all__ = ["save_summary", "summary"]


def summary(run: Run, opts: AttachOptions) -> dict[str, Any]:
    """Everything the integration did and measured for ``run``, JSON-serialisable."""
    t = run.trainer
    train_loader = getattr(t, "train_loader", None)  # absent when training stopped before its loader was built
    dataset = getattr(run.plain_loader or train_loader, "dataset", None)
    return {
        "options": asdict(opts),
        "device": str(t.device),
        "train_loader": loader_config(train_loader) if train_loader is not None else None,
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
        "shared_slots": _slots_summary(run, opts),
        "profile": None if run.report is None else {"steps": len(run.report.steps),
                                                    "throughput": run.report.throughput,
                                                    "bottleneck": run.report.bottleneck,
                                                    "saved": str(run.out_dir if run.rank is None
                                                                 else run.root_dir)},
        "ddp": None if run.rank is None else {"rank": run.rank, "world_size": int(t.world_size),
                                              "gpu_augment_votes": run.augment_votes,
                                              "gpu_affine_votes": run.affine_votes},
        "validation": _validation_summary(run),
        "memory": _memory_summary(run),
        "notes": run.notes,
    }


def save_summary(run: Run, opts: AttachOptions) -> None:
    """Write :func:`summary` to ``<out_dir>/integration.json``."""
    run.out_dir.mkdir(parents=True, exist_ok=True)
    (run.out_dir / SUMMARY_FILE).write_text(json.dumps(summary(run, opts), indent=2, default=str))


def _memory_summary(run: Run) -> dict[str, Any]:
    """The largest CUDA step peak of each epoch (outside the profile window), and the epochs whose
    peak stands out from the median epoch's (a spike)."""
    if not run.memory.active:
        return {"measured": False, "note": run.memory.stats().note}
    peaks = dict(sorted(run.epoch_peaks.items()))
    typical = sorted(peaks.values())[len(peaks) // 2] if peaks else 0
    return {"measured": True, "per_epoch_peak_allocated_bytes": peaks,
            "device_total_bytes": run.memory.stats().device_total_bytes,
            "spike_epochs": [e for e, p in peaks.items() if typical and p > SPIKE * typical]}


def _validation_summary(run: Run) -> dict[str, Any]:
    found = run.validation_analysis()
    if found is not None:
        return found.to_dict()
    return {"passes": len(run.validation.passes), "summary": "no training steps after a validation pass yet"
            if run.validation.passes else "no validation pass during training"}


def _slots_summary(run: Run, opts: AttachOptions) -> dict[str, Any]:
    loader = getattr(run.trainer, "train_loader", None)
    in_window = loader is not None and loader is run.profiled_loader
    applied = delivers_through_slots(run.plain_loader if in_window else loader)
    # the counts of the loader training now: in the profile window its clone, which has slots of its own
    counted = applied and delivers_through_slots(loader)
    stats = loader.slot_stats() if counted else None
    received = loader.receive_stats() if counted else None
    return {"requested": opts.shared_slots, "applied": applied,
            "counted": None if not counted else ("profile window" if in_window else "train loader"),
            "stats": None if stats is None else {**asdict(stats), "slotted_frac": stats.slotted_frac},
            "receive": None if received is None else asdict(received)}
