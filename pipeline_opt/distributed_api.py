"""Profile and tune inside a torchrun / DDP job: every rank measures, the ranks agree, rank 0 reports.

    report = profile_distributed(loader, ddp_model, out_dir="runs/prof")   # on every rank
    result = autotune_distributed(loader, ddp_model, out_dir="runs/tune")  # on every rank
    for batch in result.loader: ...                                        # same config everywhere

Both are collectives over the existing default process group (no extra rendezvous) and must be
called on every rank. If any rank fails, every rank raises (none is left waiting in a collective).
Only rank 0 writes ``out_dir``: ``distributed.json`` (world, per-rank summaries, rank imbalance,
sync diagnosis, agreed configuration), ``rank_N/report.json`` for every rank, one merged
``trace.json`` (every rank's main process and workers) and ``summary.txt``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline_opt._core.distributed import (
    DistInfo,
    _group_active,
    all_gather,
    choose_config,
    config_key,
    coordinating,
    detect_sync_bound,
    dist_info,
    gather_reports,
    merge_rank_traces,
    rank_imbalance,
    scores_from_trials,
)
from pipeline_opt._core.log import get_logger
from pipeline_opt.loading import DeviceLoader
from pipeline_opt.loading.dataloader import TUNABLE, clone_loader
from pipeline_opt.profile import profile
from pipeline_opt.tune.api import tune_loader

log = get_logger("distributed")


@dataclass(frozen=True)
class DistributedProfile:
    """What :func:`profile_distributed` returns on each rank (``ranks`` etc. only on rank 0)."""

    report: Any  # this rank's ProfileReport
    info: DistInfo
    ranks: tuple[dict[str, Any], ...] | None = None  # every rank's report dict (rank 0 only)
    imbalance: dict[str, Any] | None = None
    sync_bound: bool | None = None
    sync_evidence: tuple[str, ...] = ()
    directory: Path | None = None


@dataclass(frozen=True)
class DistributedTuneResult:
    """What :func:`autotune_distributed` returns on each rank. ``loader`` uses the agreed ``config``."""

    loader: Any = field(repr=False, compare=False)
    config: dict[str, Any] = field(default_factory=dict)
    local: Any = None  # this rank's TuneResult (its own best may differ from ``config``)
    info: DistInfo | None = None
    reason: str = ""  # why this configuration was agreed
    ranks: tuple[dict[str, Any], ...] | None = None  # every rank's tune dict (rank 0 only)
    directory: Path | None = None


def _all_ranks_ok(error: BaseException | None) -> None:
    """Raise on every rank if any rank failed, so no rank waits forever in the next collective."""
    if not _group_active():
        if error is not None:
            raise error
        return
    statuses = all_gather(None if error is None else f"{type(error).__name__}: {error}")
    failed = {r: s for r, s in enumerate(statuses) if s is not None}
    if failed:
        detail = "; ".join(f"rank {r}: {s}" for r, s in failed.items())
        raise RuntimeError(f"distributed run failed on {len(failed)} rank(s): {detail}") from error


def _unwrap_ddp(model: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _rank_payload(info: DistInfo, report: Any) -> dict[str, Any]:
    return {"rank": info.rank, "local_rank": info.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
            "report": report.to_dict(), "trace_events": list(getattr(report, "trace_events", ()))}


def _sync_of(report: Mapping[str, Any]) -> tuple[bool, tuple[str, ...]]:
    ops: dict[str, Any] = {}
    for op in list(report.get("top_cpu_ops") or ()) + list(report.get("top_cuda_ops") or ()):
        ops.setdefault(op["name"], op)  # an op listed in both tables counts once
    steps = max(1, len(report.get("steps") or ()))
    return detect_sync_bound(ops.values(), float(report.get("step_time_s") or 0.0), steps=steps)


def write_combined_report(directory: str | Path, payloads: list[dict[str, Any]], extra: Mapping[str, Any] | None = None
                          ) -> tuple[Path, dict[str, Any], bool, tuple[str, ...]]:
    """Write every rank's payload as one report directory; returns (dir, imbalance, sync_bound, evidence)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    reports = [p["report"] for p in payloads]
    imbalance = rank_imbalance(reports)
    per_rank_sync = [_sync_of(r) for r in reports]
    sync_bound = any(b for b, _ in per_rank_sync)
    evidence = tuple(f"rank {i}: {e}" for i, (_, ev) in enumerate(per_rank_sync) for e in ev)
    for p in payloads:
        rd = d / f"rank_{p['rank']}"
        rd.mkdir(exist_ok=True)
        (rd / "report.json").write_text(json.dumps(p["report"], indent=2))
    trace = merge_rank_traces([p["trace_events"] for p in payloads], ranks=[p["rank"] for p in payloads])
    (d / "trace.json").write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
    summary = {
        "world_size": len(payloads),
        "ranks": [{k: p[k] for k in ("rank", "local_rank", "host", "pid")} | {
            "throughput": p["report"].get("throughput"), "step_time_s": p["report"].get("step_time_s"),
            "data_wait_frac": p["report"].get("data_wait_frac"), "bottleneck": p["report"].get("bottleneck"),
            "loader_config": p["report"].get("loader_config"), "report": f"rank_{p['rank']}/report.json"}
            for p in payloads],
        "imbalance": imbalance,
        "sync": {"bound": sync_bound, "evidence": list(evidence)},
        **dict(extra or {}),
    }
    (d / "distributed.json").write_text(json.dumps(summary, indent=2, default=str))
    lines = [f"{len(payloads)} ranks; {imbalance['message']}",
             f"sync-bound: {'yes' if sync_bound else 'no'}"]
    lines += [f"  rank {r['rank']} ({r['host']} pid {r['pid']}): {r['throughput'] or 0:.1f} samples/s, "
              f"data wait {r['data_wait_frac'] or 0:.0%}, bottleneck {r['bottleneck']}" for r in summary["ranks"]]
    if extra and "config" in extra:
        lines.append(f"agreed configuration: {extra['config']} ({extra.get('reason', '')})")
    (d / "summary.txt").write_text("\n".join(lines) + "\n")
    log.info("wrote the combined report of %d ranks to %s", len(payloads), d)
    return d, imbalance, sync_bound, evidence


def profile_distributed(loader: Any, model: Any, step_fn: Any = None, *, out_dir: str | Path | None = None,
                        **profile_kwargs: Any) -> DistributedProfile:
    """Run :func:`pipeline_opt.profile` on every rank and combine the reports on rank 0.

    The DDP model is profiled as it is, so the gradient all-reduce is part of each measured step:
    that is what makes the sync diagnosis possible. Every rank must run the same number of steps
    (``steps`` / ``warmup`` equal on all ranks), as in training. ``profile_kwargs`` go to
    ``po.profile``; ``out_dir`` (rank 0 only writes it) receives the combined report.
    """

    info = dist_info()
    report, error = None, None
    try:
        report = profile(loader, model, step_fn=step_fn, **profile_kwargs)
    except Exception as exc:  # every rank must learn about it before anyone raises
        error = exc
    _all_ranks_ok(error)
    payloads = gather_reports(_rank_payload(info, report))
    if payloads is None:
        return DistributedProfile(report=report, info=info)
    imbalance, sync_bound, evidence, directory = rank_imbalance([p["report"] for p in payloads]), None, (), None
    if out_dir is not None:
        directory, imbalance, sync_bound, evidence = write_combined_report(out_dir, payloads)
    else:
        per_rank = [_sync_of(p["report"]) for p in payloads]
        sync_bound = any(b for b, _ in per_rank)
        evidence = tuple(f"rank {i}: {e}" for i, (_, ev) in enumerate(per_rank) for e in ev)
    return DistributedProfile(report=report, info=info, ranks=tuple(p["report"] for p in payloads),
                              imbalance=imbalance, sync_bound=sync_bound, sync_evidence=evidence, directory=directory)


def _rebuild_loader(original: Any, result: Any, config: Mapping[str, Any]) -> Any:
    """This rank's loader for the agreed ``config`` (its own tuned loader when the config is its own)."""
    if config_key(config) == config_key(result.config):
        return result.loader
    from torch.utils.data import DataLoader

    base = original if isinstance(original, DataLoader) else getattr(original, "loader", None)
    if not isinstance(base, DataLoader):
        raise TypeError(f"cannot rebuild a loader of type {type(original).__name__}; pass a torch DataLoader")
    overrides = {k: config[k] for k in TUNABLE if config.get(k) is not None}
    if overrides.get("num_workers", base.num_workers) == 0:
        overrides.pop("persistent_workers", None)
        overrides.pop("prefetch_factor", None)
    own_gpu = list(result.config.get("gpu_transforms") or [])
    agreed_gpu = list(config.get("gpu_transforms") or [])
    if config.get("shared_slots") and overrides.get("num_workers", base.num_workers) > 0:

        transform = getattr(result.loader, "transform", None) if own_gpu == agreed_gpu else None
        return DeviceLoader.through_slots(base, getattr(result.loader, "device", None), transform=transform,
                                          **overrides)
    new = clone_loader(base, **overrides)
    if own_gpu == agreed_gpu and not isinstance(result.loader, DataLoader) and hasattr(result.loader, "loader"):
        import copy

        wrapped = copy.copy(result.loader)  # same device transform, new DataLoader underneath
        wrapped.loader = new
        wrapped._receiver = None  # the new DataLoader delivers the ordinary way
        return wrapped
    if agreed_gpu and agreed_gpu != own_gpu:
        log.warning("rank %d: the agreed GPU transforms %s differ from this rank's %s; using the agreed loader "
                    "settings without GPU transforms", dist_info().rank, agreed_gpu, own_gpu)
    return new


def autotune_distributed(loader: Any, model: Any, step_fn: Any = None, *, out_dir: str | Path | None = None,
                         isolate_ranks: bool = True, **autotune_kwargs: Any) -> DistributedTuneResult:
    """Run :func:`pipeline_opt.autotune` on every rank, agree on one configuration, rebuild every loader.

    Each rank tunes its own loader (the tuner divides the CPU, RAM and /dev/shm budget by the local
    world size). With ``isolate_ranks`` (default) a DDP model is tuned through ``model.module``:
    trials are time-budgeted, so ranks run different numbers of steps and DDP's gradient all-reduce
    would deadlock; without the all-reduce each rank also measures only its own pipeline. Then the
    ranks agree on the configuration with the best worst-rank throughput (:func:`agree_on_config`
    semantics), every rank's loader is rebuilt with it, and rank 0 writes the combined report.
    """

    info = dist_info()
    tuned_model = _unwrap_ddp(model) if isolate_ranks else model
    result, error = None, None
    try:
        with coordinating():
            result = tune_loader(loader, tuned_model, step_fn=step_fn, **autotune_kwargs)
    except Exception as exc:
        error = exc
    _all_ranks_ok(error)
    scores = scores_from_trials(result.trials)
    scores.setdefault(config_key(result.config), float(result.best.throughput))
    proposals = all_gather((dict(result.config), scores))
    config, reason = choose_config(proposals)
    new_loader = _rebuild_loader(loader, result, config)
    payload = _rank_payload(info, result.best) | {"tune": result.to_dict()}
    payloads = gather_reports(payload)
    if payloads is None:
        return DistributedTuneResult(loader=new_loader, config=config, local=result, info=info, reason=reason)
    directory = None
    if out_dir is not None:
        extra = {"config": config, "reason": reason,
                 "proposals": [{"rank": r, "config": c, "scores": s} for r, (c, s) in enumerate(proposals)],
                 "tunes": [p["tune"] for p in payloads]}
        directory = write_combined_report(out_dir, payloads, extra)[0]
        for p in payloads:
            (directory / f"rank_{p['rank']}" / "tune.json").write_text(json.dumps(p["tune"], indent=2))
    return DistributedTuneResult(loader=new_loader, config=config, local=result, info=info, reason=reason,
                                 ranks=tuple(p["tune"] for p in payloads), directory=directory)
