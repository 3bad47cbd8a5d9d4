"""One Chrome/Perfetto timeline: the main process and every worker process on one clock.

Pure functions over plain data, so they are testable on recorded traces:

* :func:`clock_offset_us` / :func:`rebase` put torch.profiler's chrome-trace events on the
  ``time.time_ns()`` epoch clock the worker spans use (matched on the ``data_wait`` ranges, else
  the trace's ``baseTimeNanoseconds``);
* :func:`gpu_intervals` / :func:`idle_fraction` turn CUDA kernel / memcpy / memset events into the
  GPU idle fraction of a window (one minus the union of busy time);
* :func:`match_batches` links each batch the main thread received to the worker batch that made it;
* :func:`build_trace` assembles the merged event list: every process its own named track (pid),
  flow arrows ("s" / "f") from each worker's collate to the step that consumed the batch.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEPS_TID = 1  # pipeline_opt's own main-thread spans
LOADER_TID = 2  # the loader's spans when the main process plays the worker
PREPARE_TID = 3  # a DeviceLoader's preparing thread (prepare_in_thread=True): next batch, decode, copy
_FLOW_ID_BASE = 1_000_000_000  # clear of torch.profiler's own flow ids


def clock_offset_us(events: Sequence[dict[str, Any]], our_starts_us: Sequence[float], anchor: str,
                    base_ns: int | None = None) -> float | None:
    """Microseconds to add to the trace's ``ts`` to land on our epoch clock, or None if unknown.

    Our ``anchor`` ranges (recorded with ``record_function``) started at ``our_starts_us``; when the
    trace holds as many of them, the offset is the median difference, else ``baseTimeNanoseconds``.
    """
    theirs = sorted(float(e["ts"]) for e in events if e.get("ph") == "X" and e.get("name") == anchor and "ts" in e)
    ours = sorted(our_starts_us)
    if theirs and len(theirs) == len(ours):
        return float(statistics.median(o - t for o, t in zip(ours, theirs)))
    if base_ns:
        return base_ns / 1e3
    if theirs and ours:
        k = min(len(theirs), len(ours))
        return float(statistics.median(o - t for o, t in zip(ours[:k], theirs[:k])))
    return None


def rebase(events: Iterable[dict[str, Any]], offset_us: float) -> list[dict[str, Any]]:
    """Copies of ``events`` with ``ts`` shifted by ``offset_us``."""
    out = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + offset_us
        out.append(e)
    return out


def gpu_intervals(events: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start_us, end_us) of every GPU kernel, memcpy and memset in ``events``."""
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
            if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and "ts" in e]


def busy_time(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Length of the union of ``intervals`` clipped to ``window``."""
    lo, hi = window
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def idle_fraction(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Share of ``window`` with no GPU activity (0..1)."""
    length = window[1] - window[0]
    if length <= 0:
        raise ValueError(f"window={window!r} must have end > start")
    return min(max(1.0 - busy_time(intervals, window) / length, 0.0), 1.0)


def match_batches(receipts: Sequence[Any], batches: Sequence[Any], num_workers: int) -> list[tuple[Any, Any]]:
    """Pair each received batch with the worker batch that produced it.

    The default DataLoader hands out batches round-robin (batch ``k`` of an epoch comes from
    worker ``k % num_workers``) and each worker's batches arrive in the order it made them, so the
    receipt takes the oldest unmatched batch of that worker. When that batch was finished after the
    receipt (a worker ran dry, ``in_order=False``), the oldest batch of any worker finished before the
    receipt is used instead; a receipt with neither stays unlinked.
    """
    queues: dict[int, deque] = {}
    for b in sorted(batches, key=lambda b: b.t1_ns):
        queues.setdefault(b.worker_id, deque()).append(b)
    pairs = []
    for r in sorted(receipts, key=lambda r: r.t_received_ns):
        wid = r.position % num_workers if num_workers > 0 else -1
        q = queues.get(wid)
        if q and q[0].t1_ns <= r.t_received_ns:
            pairs.append((r, q.popleft()))
            continue
        heads = [q for q in queues.values() if q and q[0].t1_ns <= r.t_received_ns]
        if heads:
            best = min(heads, key=lambda q: q[0].t1_ns)
            pairs.append((r, best.popleft()))
    return pairs


def _meta(pid: int, name: str, sort_index: int, tid: int = 0, kind: str = "process") -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": f"{kind}_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {"ph": "M", "name": f"{kind}_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort_index}},
    ]


def _x(name: str, cat: str, pid: int, tid: int, t0_ns: int, t1_ns: int, args: dict | None = None) -> dict[str, Any]:
    e = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": t0_ns / 1e3,
         "dur": max(t1_ns - t0_ns, 0) / 1e3}
    if args:
        e["args"] = args
    return e


def worker_events(record: Any, main_pid: int) -> list[dict[str, Any]]:
    """Chrome events of one worker record (its own track; the main process's loader track for -1)."""
    if record.worker_id < 0:
        pid, tid = main_pid, LOADER_TID
        out = _meta(pid, "loader (main process, num_workers=0)", LOADER_TID, tid=tid, kind="thread")
    else:
        pid = tid = record.pid
        out = _meta(pid, f"DataLoader worker {record.worker_id} (pid {record.pid})", 10 + record.worker_id)
        out += _meta(pid, f"worker {record.worker_id}", 0, tid=tid, kind="thread")
    for s in record.spans:
        kind = s[0]
        if kind == "sample":
            out.append(_x("sample", "sample", pid, tid, s[2], s[3], {"index": s[1]}))
        elif kind == "samples":
            out.append(_x("samples", "sample", pid, tid, s[2], s[3], {"first_index": s[1], "count": s[4]}))
        elif kind == "transform":
            out.append(_x(str(s[1]), "transform", pid, tid, s[2], s[3]))
        elif kind == "collate":
            out.append(_x("collate", "collate", pid, tid, s[2], s[3],
                          {"batch": s[1], "size": s[4], "first_index": s[5], "worker_id": record.worker_id}))
    return out


def _flow(pairs: Sequence[tuple[Any, Any]], main_pid: int) -> list[dict[str, Any]]:
    out = []
    for n, (r, b) in enumerate(pairs):
        fid = _FLOW_ID_BASE + n
        wpid, wtid = (main_pid, LOADER_TID) if b.worker_id < 0 else (b.pid, b.pid)
        t_start = (b.t0_ns + b.t1_ns) / 2e3
        t_end = max(r.t_received_ns / 1e3 - 0.001, (r.t_request_ns + r.t_received_ns) / 2e3)
        args = {"worker_id": b.worker_id, "batch": b.seq, "first_index": b.first_index, "step": r.step}
        out.append({"ph": "s", "id": fid, "name": "batch", "cat": "batch", "pid": wpid, "tid": wtid,
                    "ts": t_start, "args": args})
        out.append({"ph": "f", "bp": "e", "id": fid, "name": "batch", "cat": "batch", "pid": main_pid,
                    "tid": STEPS_TID, "ts": t_end, "args": args})
    return out


def build_trace(main: Any, records: Sequence[Any], *, main_pid: int, num_workers: int,
                thread_spans: Sequence[tuple[str, int, int]] = ()) -> list[dict[str, Any]]:
    """The merged timeline: main-process spans + torch.profiler events + worker spans + flows, and
    the spans of a DeviceLoader's preparing thread (``(what, t0_ns, t1_ns)``) on a track of its own,
    where the decode of the next batch shows against the step it overlaps."""
    events = _meta(main_pid, f"main process (pid {main_pid})", 0)
    events += _meta(main_pid, "pipeline_opt steps", STEPS_TID, tid=STEPS_TID, kind="thread")
    t0, t1 = main.session_ns
    if t0 and t1:
        events.append(_x("profile session", "session", main_pid, STEPS_TID, t0, t1))
    measured = {s.index for s in main.steps}
    for name, step, a, b in main.spans:
        events.append(_x(name, "step", main_pid, STEPS_TID, a, b, {"step": step, "measured": step in measured}))
    if thread_spans:
        events += _meta(main_pid, "DeviceLoader preparing thread", PREPARE_TID, tid=PREPARE_TID, kind="thread")
        events += [_x(what, "prepare", main_pid, PREPARE_TID, a, b) for what, a, b in thread_spans]
    for e in main.torch_events:
        if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid") == main_pid:
            continue  # ours names the main process
        events.append(e)
    batches = []
    for rec in records:
        events += worker_events(rec, main_pid)
        batches += rec.batch_records()
    events += _flow(match_batches(main.receipts, batches, num_workers), main_pid)
    return events
