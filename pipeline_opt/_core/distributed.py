"""torch.distributed helpers for the profiler and the tuner (DDP / torchrun jobs).

Everything here works without a process group too (a single process is a world of one), so the
profiler and the tuner can call it unconditionally:

* :func:`dist_info` / :func:`local_world_size` / :func:`is_main_process`: where this process
  stands (from the initialised default process group, else the torchrun environment variables);
  :func:`local_share` divides a host-wide budget (CPUs, RAM, /dev/shm) among the local ranks.
* :func:`agree_on_config`: every rank adopts the same loader configuration — the one with the best
  *worst-rank* throughput among those all ranks measured, else rank 0's choice. A collective over
  the existing default process group (no new rendezvous).
* :func:`gather_reports`: every rank's report dict on rank 0.
* :func:`merge_rank_traces`: one Chrome/Perfetto trace holding every rank's main process and
  workers, pids kept distinct, process names prefixed ``rank N``.
* :func:`rank_imbalance`: the slowest rank's data wait against the median rank.
* :func:`detect_sync_bound`: is the step dominated by collectives or host syncs?

Collectives (:func:`agree_on_config`, :func:`gather_reports`) must be called by every rank of the
default group, in the same order. With the NCCL backend, object collectives run on
``torch.cuda.current_device()``: call ``torch.cuda.set_device(local_rank)`` first, as DDP requires.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline_opt._core.log import get_logger

log = get_logger("distributed")

# Substrings (lower case) of profiler op / kernel names that are collective communication.
COMM_PATTERNS = (
    "nccl", "gloo", "c10d::", "processgroup", "all_reduce", "allreduce", "all_gather", "allgather",
    "reduce_scatter", "reducescatter", "broadcast", "barrier", "alltoall", "all_to_all",
)
# Ops that block the host until the device (or a peer) has caught up.
HOST_SYNC_PATTERNS = (
    "cudastreamsynchronize", "cudadevicesynchronize", "cudaeventsynchronize", "aten::item",
    "aten::_local_scalar_dense", "memcpy dtoh",
)
HOST_SYNC_NAMES = ("cudamemcpy",)  # exact (cudaMemcpyAsync does not block)
_NOT_COMM = ("broadcast_tensors", "broadcast_to", "broadcast_shapes", "broadcast_in_dim")
SYNC_BOUND_FRAC = 0.25  # collectives + host syncs above this share of the step: "sync"
IMBALANCE_FRAC = 0.10  # slowest rank waits this share of a step longer than the median rank


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in a (possibly absent) distributed job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str | None  # None when no process group is initialised
    initialized: bool

    @property
    def is_distributed(self) -> bool:
        """True when more than one rank takes part."""
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer; fix or unset it") from None


def _initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return dist.is_available() and dist.is_initialized()


def dist_info() -> DistInfo:
    """This process's rank, world size, local rank and local world size (not a collective).

    From the initialised default process group when there is one, else from the torchrun
    variables RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (a world of one when unset).
    When a process group exists but LOCAL_WORLD_SIZE is unset (``mp.spawn`` without torchrun),
    every rank is assumed to share this host: dividing the CPU budget by too many ranks costs a
    little speed, dividing by too few oversubscribes the cores.
    """
    if _initialized():
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        local_world = _env_int("LOCAL_WORLD_SIZE", world)
        local_rank = _env_int("LOCAL_RANK", rank % max(local_world, 1))
        return DistInfo(rank, world, local_rank, local_world, backend, True)
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    local_rank = _env_int("LOCAL_RANK", rank % max(local_world, 1))
    if world < 1 or not 0 <= rank < world or local_world < 1 or not 0 <= local_rank < local_world:
        raise ValueError(
            f"inconsistent distributed environment RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local_rank} "
            f"LOCAL_WORLD_SIZE={local_world}; launch with torchrun or unset these variables"
        )
    return DistInfo(rank, world, local_rank, local_world, None, False)


def local_world_size() -> int:
    """How many ranks share this host's CPUs, RAM and /dev/shm (1 outside a distributed job)."""
    return dist_info().local_world_size


def local_share(total: int | float) -> int | float:
    """This rank's share of a host-wide budget: ``total // local ranks`` for counts (at least 1
    when ``total >= 1``), ``total / local ranks`` for sizes (floats). Use it for CPUs, RAM, /dev/shm."""
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total < 0:
        raise ValueError(f"total={total!r} must be a non-negative number (a CPU count or a size in bytes)")
    n = local_world_size()
    if isinstance(total, int):
        return max(1, total // n) if total >= 1 else 0
    return total / n


def is_main_process() -> bool:
    """True on global rank 0 (and in a non-distributed process)."""
    return dist_info().rank == 0


_COORDINATING: contextvars.ContextVar[bool] = contextvars.ContextVar("pipeline_opt_coordinating", default=False)


@contextlib.contextmanager
def coordinating():
    """Mark the ranks as already agreeing (so po.autotune inside does not coordinate again)."""
    token = _COORDINATING.set(True)
    try:
        yield
    finally:
        _COORDINATING.reset(token)


def should_coordinate() -> bool:
    """True inside an initialised multi-rank process group, unless the ranks are already agreeing."""
    return not _COORDINATING.get() and _group_active()


def _group_active() -> bool:
    return _initialized() and dist_info().world_size > 1


# ------------------------------------------------------------------ agreeing on one configuration


def config_key(config: Mapping[str, Any]) -> str:
    """A canonical string for a configuration dict (sorted keys, JSON), used to key scores."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    try:
        return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(f"config {dict(config)!r} must hold JSON values only (numbers, bools, strings, lists)") from exc


def scores_from_trials(trials: Iterable[Any]) -> dict[str, float]:
    """``{config_key(trial.config): best throughput}`` over the successful trials of a TuneResult."""
    scores: dict[str, float] = {}
    for t in trials:
        if getattr(t, "status", "ok") != "ok" or not getattr(t, "throughput", 0.0) > 0:
            continue
        key = config_key(t.config)
        scores[key] = max(scores.get(key, 0.0), float(t.throughput))
    return scores


def choose_config(proposals: Sequence[tuple[Mapping[str, Any], Mapping[str, float] | None]]) -> tuple[dict, str]:
    """Pick one configuration from every rank's ``(config, scores)`` (index = rank); pure, deterministic.

    When every rank chose the same configuration, that one wins (each rank's tuner already
    decided it beyond its noise; the raw scores of the others are within it). Otherwise the
    candidates are the configs every rank has a score for; the winner has the highest worst-rank
    throughput (ties broken by the canonical key). Without such a candidate, rank 0's config wins.
    Returns ``(config, why)``.
    """
    if not proposals:
        raise ValueError("choose_config needs at least one proposal (one per rank)")
    keys = {config_key(config) for config, _ in proposals}
    if len(keys) == 1:
        return dict(proposals[0][0]), f"every rank chose it ({len(proposals)} ranks)"
    per_rank: list[dict[str, float]] = []
    for config, scores in proposals:
        s = {str(k): float(v) for k, v in (scores or {}).items()}
        per_rank.append(s)
        config_key(config)  # validates
    common = set(per_rank[0]).intersection(*per_rank[1:])
    common = {k for k in common if all(math.isfinite(r[k]) and r[k] > 0 for r in per_rank)}
    if common:
        best = max(sorted(common), key=lambda k: min(r[k] for r in per_rank))
        worst = min(r[best] for r in per_rank)
        return json.loads(best), f"best worst-rank throughput ({worst:.1f} samples/s) over {len(per_rank)} ranks"
    return dict(proposals[0][0]), "rank 0's choice (no configuration was measured on every rank)"


def agree_on_config(config: Mapping[str, Any], scores: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Make every rank adopt the same configuration; returns it (a new dict).

    ``config`` is this rank's choice, ``scores`` maps :func:`config_key` of each configuration this
    rank measured to its throughput (:func:`scores_from_trials` builds it). A collective
    (``all_gather_object`` over the default group): call it on every rank. Outside a distributed job
    it returns ``dict(config)``.
    """
    config_key(config)
    if scores is not None and not isinstance(scores, Mapping):
        raise TypeError(f"scores must be a dict {{config_key: throughput}} or None, got {type(scores).__name__}")
    if not _group_active():
        return dict(config)
    chosen, why = choose_config(all_gather((dict(config), dict(scores or {}))))
    if dist_info().rank == 0:
        log.info("ranks agreed on %s: %s", chosen, why)
    return chosen


def all_gather(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj`` on every rank (index = rank); ``[obj]`` outside a job. A collective."""
    if not _group_active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------ gathering reports


def gather_reports(report_dict: Any) -> list[Any] | None:
    """Every rank's ``report_dict`` on rank 0 (a list indexed by rank), ``None`` on other ranks.

    A collective (``gather_object`` to rank 0): call it on every rank. Outside a distributed job it
    returns ``[report_dict]``. The objects must be picklable.
    """
    if not _group_active():
        return [report_dict]
    import torch.distributed as dist

    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(report_dict, out, dst=0)
    return out


# ------------------------------------------------------------------ merged trace


def _remap_flow_id(value: Any, rank: int) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (rank << 40) | value
    if isinstance(value, str):
        return f"rank{rank}:{value}"
    return value


def _distinct_pid(pid: Any, rank: int, used: set[Any]) -> Any:
    """``pid`` itself, or a rank-specific replacement when another rank already used it."""
    if pid not in used:
        return pid
    if isinstance(pid, int) and not isinstance(pid, bool):
        new: Any = rank * 10_000_000 + pid
        while new in used:
            new += 1
        return new
    return f"rank {rank} {pid}"  # kineto's string pids ("Spans", device lanes)


def merge_rank_traces(traces: Sequence[Sequence[Mapping[str, Any]]], ranks: Sequence[int] | None = None
                      ) -> list[dict[str, Any]]:
    """Merge each rank's trace events (index = rank) into one list of Chrome trace events.

    Every process keeps its own pid unless an earlier rank used the same pid (other hosts, device
    lanes, kineto's string pids), in which case the later rank's pid becomes ``rank * 10_000_000 +
    pid`` (``"rank N <pid>"`` for string pids). Process names are prefixed with
    ``rank N`` (a name is added where a rank's trace had none) and processes sort by rank; flow-event
    ids are made rank-unique so arrows never join two ranks. Events are copied, never mutated.
    """
    if isinstance(traces, (str, bytes)) or not isinstance(traces, Sequence):
        raise TypeError(f"traces must be a list (one list of trace events per rank), got {type(traces).__name__}")
    ranks = list(range(len(traces))) if ranks is None else list(ranks)
    if len(ranks) != len(traces):
        raise ValueError(f"ranks has {len(ranks)} entries for {len(traces)} traces; give one rank per trace")
    merged: list[dict[str, Any]] = []
    used_pids: set[Any] = set()
    for rank, events in zip(ranks, traces):
        if isinstance(events, Mapping):  # a whole {"traceEvents": [...]} trace
            events = events.get("traceEvents", [])
        pids = {e.get("pid") for e in events if "pid" in e}
        pid_map = {p: _distinct_pid(p, rank, used_pids) for p in pids}
        used_pids.update(pid_map.values())
        named: set[Any] = set()
        for e in events:
            ev = dict(e)
            if "pid" in ev:
                ev["pid"] = pid_map[ev["pid"]]
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                args = dict(ev.get("args") or {})
                args["name"] = f"rank {rank} {args.get('name', '')}".rstrip()
                ev["args"] = args
                named.add(ev.get("pid"))
            elif ev.get("ph") == "M" and ev.get("name") == "process_sort_index":
                ev["args"] = {**(ev.get("args") or {}), "sort_index": rank * 1000 + int((ev.get("args") or {})
                                                                                        .get("sort_index", 0))}
            if ev.get("ph") in ("s", "t", "f") or "bind_id" in ev:
                for key in ("id", "bind_id"):
                    if key in ev:
                        ev[key] = _remap_flow_id(ev[key], rank)
            merged.append(ev)
        for orig, pid in sorted(pid_map.items(), key=lambda kv: str(kv[1])):
            if pid not in named:
                label = f"pid {orig}" if isinstance(orig, int) else (str(orig) or "(no pid)")
                merged.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                               "args": {"name": f"rank {rank} {label}"}})
        for pid in sorted(pid_map.values(), key=str):
            merged.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": f"rank {rank}"}})
    return merged


# ------------------------------------------------------------------ diagnosis across ranks


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _data_wait_s(report: Any) -> float:
    steps = _get(report, "steps") or ()
    waits = [float(_get(s, "data_wait_s", 0.0)) for s in steps]
    if waits:
        return statistics.median(waits)
    return float(_get(report, "data_wait_frac", 0.0) or 0.0) * float(_get(report, "step_time_s", 0.0) or 0.0)


def rank_imbalance(reports: Sequence[Any], threshold: float = IMBALANCE_FRAC) -> dict[str, Any]:
    """Compare each rank's data wait (median seconds per step) with the median rank's.

    ``reports`` are ProfileReports or their ``to_dict()`` (index = rank). In DDP every rank waits
    for the slowest at each all-reduce, so one rank starved of data slows all of them. Returns
    ``per_rank`` rows, ``slowest_rank``, ``slowest_data_wait_s``, ``median_data_wait_s``,
    ``excess_frac`` (extra wait of the slowest rank as a share of the median step time),
    ``imbalanced`` (``excess_frac >= threshold``) and a ``message``.
    """
    if not reports:
        raise ValueError("rank_imbalance needs at least one report (one per rank)")
    rows = []
    for rank, rep in enumerate(reports):
        rows.append({"rank": rank, "data_wait_s": _data_wait_s(rep),
                     "data_wait_frac": float(_get(rep, "data_wait_frac", 0.0) or 0.0),
                     "step_time_s": float(_get(rep, "step_time_s", 0.0) or 0.0),
                     "throughput": float(_get(rep, "throughput", 0.0) or 0.0)})
    waits = [r["data_wait_s"] for r in rows]
    slowest = max(range(len(rows)), key=lambda i: (waits[i], -i))
    median_wait = statistics.median(waits)
    median_step = statistics.median(r["step_time_s"] for r in rows)
    excess = waits[slowest] - median_wait
    excess_frac = excess / median_step if median_step > 0 else 0.0
    imbalanced = len(rows) > 1 and excess_frac >= threshold
    if imbalanced:
        message = (f"rank {slowest} waits {waits[slowest] * 1e3:.1f} ms per step for data against a median of "
                   f"{median_wait * 1e3:.1f} ms ({excess_frac:.0%} of a step); every rank waits for it at the "
                   f"all-reduce: give rank {slowest} more workers or check its storage / CPU affinity")
    else:
        message = f"ranks are balanced (slowest rank {slowest} waits {excess * 1e3:.1f} ms more than the median)"
    return {"per_rank": rows, "slowest_rank": slowest, "slowest_data_wait_s": waits[slowest],
            "median_data_wait_s": median_wait, "excess_frac": excess_frac, "imbalanced": imbalanced,
            "message": message}


def _op_kind(name: str) -> str | None:
    low = name.lower()
    if any(p in low for p in COMM_PATTERNS) and not any(p in low for p in _NOT_COMM):
        return "comm"
    if low in HOST_SYNC_NAMES or any(p in low for p in HOST_SYNC_PATTERNS):
        return "sync"
    return None


def detect_sync_bound(top_ops: Iterable[Any], step_time_s: float, steps: int = 1,
                      threshold: float = SYNC_BOUND_FRAC) -> tuple[bool, tuple[str, ...]]:
    """Is the step dominated by collective communication or host-device syncs?

    ``top_ops`` are OpStats (or dicts with ``name``, ``self_cpu_s``, ``self_cuda_s``) totalled over
    ``steps`` profiled steps; ``step_time_s`` is the median step time. Communication (NCCL/Gloo
    kernels and ops, ``c10d::``, ProcessGroup, all_reduce / broadcast / barrier ...) and host syncs
    (``cudaStreamSynchronize``, ``aten::item`` / ``_local_scalar_dense``, DtoH memcpy) are summed
    per step — CPU and CUDA columns separately, taking the larger, so an op and the kernel it
    launched are not counted twice — and the step is sync-bound when they reach ``threshold`` of it.
    Returns ``(sync_bound, evidence)``; evidence names the biggest ops.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer (the number of profiled steps)")
    if not step_time_s or step_time_s <= 0 or not math.isfinite(step_time_s):
        return False, ("no step time measured; cannot judge synchronisation",)
    rows = []
    for op in top_ops:
        name = str(_get(op, "name", ""))
        kind = _op_kind(name)
        if kind:
            cpu = float(_get(op, "self_cpu_s", 0.0) or 0.0)
            cuda = float(_get(op, "self_cuda_s", 0.0) or 0.0)
            rows.append((name, kind, cpu, cuda))
    if not rows:
        return False, ("no communication or host-sync ops among the profiled ops",)
    cpu_total = sum(r[2] for r in rows)
    kernel_cuda = [r[3] for r in rows if r[2] == 0.0 and r[3] > 0]  # device-only rows: the kernels
    cuda_total = sum(kernel_cuda) if kernel_cuda else sum(r[3] for r in rows)
    per_step = max(cpu_total, cuda_total) / steps
    frac = per_step / step_time_s
    rows.sort(key=lambda r: -max(r[2], r[3]))
    evidence = [f"collectives and host syncs take {per_step * 1e3:.1f} ms of a {step_time_s * 1e3:.1f} ms step "
                f"({frac:.0%}; sync-bound above {threshold:.0%})"]
    for name, kind, cpu, cuda in rows[:3]:
        what = "communication" if kind == "comm" else "host sync"
        evidence.append(f"{what} op {name}: {max(cpu, cuda) / steps * 1e3:.2f} ms per step")
    return frac >= threshold, tuple(evidence)
