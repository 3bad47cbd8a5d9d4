"""The integration inside ultralytics' own DDP launch (``model.train(device="0,1")``).

ultralytics runs multi-GPU training by writing a script that rebuilds the trainer in
``torch.distributed.run`` subprocesses, one per GPU, with the callbacks pickled along
(cloudpickle): the :class:`~pipeline_opt.integrations.ultralytics._callbacks.YoloIntegration` of
:func:`attach` arrives in every rank with its options and fires there after ultralytics has
initialised the process group and wrapped the model in ``DistributedDataParallel``. Per rank:

* measurements (the GPU-augmentation decision, the loader trials) run the model's inner module,
  not the DDP wrapper: they are time-budgeted, so the ranks run different numbers of steps, and a
  DDP backward would wait for the other ranks' gradients (a deadlock); each rank measures its own
  pipeline, which is what is tuned;
* the ranks agree: the GPU augmentation stays on only where it won on every rank (the DDP step
  waits for the slowest rank), the loader settings are :func:`pipeline_opt.autotune`'s agreement
  (best worst-rank throughput), so every rank trains with the same pipeline;
* the profile window runs on the real DDP steps (the gradient all-reduce is part of them) and ends
  at the same step on every rank; rank 0 writes the combined report (every rank's profile, one
  merged trace, rank imbalance, the sync diagnosis) to ``<save_dir>/pipeline_opt``; every rank
  writes its own ``integration.json`` and tuning result under ``rank_<N>/``.

The CPU budget of each rank's trials is divided by ``LOCAL_WORLD_SIZE`` (:mod:`pipeline_opt.tune.budget`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from pipeline_opt._core.distributed import _group_active, all_gather, dist_info, gather_reports
from pipeline_opt._core.log import get_logger
from pipeline_opt.distributed_api import _rank_payload, write_combined_report

log = get_logger("integrations.ultralytics")


def ddp_rank(trainer: Any) -> int | None:
    """This process's rank when ``trainer`` trains with DDP in an initialised process group, else None."""
    if int(getattr(trainer, "world_size", 0) or 0) <= 1 or not _group_active():
        return None
    return dist_info().rank


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module a ``DistributedDataParallel`` wraps (``model`` itself otherwise)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def agree_on_augment(decision: Any) -> tuple[bool, list[bool]]:
    """Every rank's ``decision.applied``; the GPU augmentation stays only if it won on every rank.

    A collective: call it on every rank. Returns (applied everywhere, the votes by rank).
    """
    votes = [bool(v) for v in all_gather(bool(decision.applied))]
    return all(votes), votes


def overruled(decision: Any, votes: list[bool]) -> Any:
    """``decision`` turned off because other ranks measured the CPU stages as fast or faster."""
    losers = [r for r, v in enumerate(votes) if not v]
    return dataclasses.replace(decision, applied=False, verdict=(
        f"{decision.verdict}; not used: on rank(s) {losers} the CPU stages were as fast or faster, and the "
        "DDP step waits for the slowest rank"))


def write_combined_profile(report: Any, root: Path, rank: int) -> Path | None:
    """Gather every rank's profile on rank 0 and write the combined report under ``root``.

    A collective: call it on every rank at the same step. Rank 0 also saves its own full report to
    ``root/rank_0``; it returns the directory there and None on the other ranks.
    """

    payloads = gather_reports(_rank_payload(dist_info(), report))
    if payloads is None:
        return None
    report.save(root / f"rank_{rank}")
    directory, imbalance, sync_bound, _ = write_combined_report(root, payloads)
    log.info("pipeline_opt: combined profile of %d ranks in %s (%s; sync-bound: %s)", len(payloads), directory,
             imbalance.get("message"), "yes" if sync_bound else "no")
    return directory
