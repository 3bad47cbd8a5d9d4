"""The main-process side of the worker profiler: read every worker's file back into results.

:class:`WorkerCollector` owns the temporary directory the worker recorders write to
(:mod:`pipeline_opt.profile.workers`). ``read()`` parses what is there now — a file whose last
line was cut by a dying worker still yields everything before it — so reading never waits on a
worker. ``close()`` takes a last reading, restores anything patched in the main process and
removes the directory; the last reading stays available afterwards.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_opt._core.log import get_logger
from pipeline_opt.profile import workers
from pipeline_opt.profile.report import WorkerStats

log = get_logger("profile.collector")


@dataclass(frozen=True)
class BatchRecord:
    """One batch a worker collated: who made it, when, and its first sample index."""

    worker_id: int
    pid: int
    seq: int  # per-process batch number
    t0_ns: int
    t1_ns: int
    size: int
    first_index: Any


@dataclass(frozen=True)
class WorkerRecord:
    """Everything one process reported (totals from its last line, spans from all lines)."""

    worker_id: int
    pid: int
    start_ns: int
    last_ns: int
    samples: int
    batches: int
    sample_ns: int
    collate_ns: int
    transform_ns: dict[str, int]
    cpu_percent: float
    rss_bytes: int
    errors: tuple[str, ...]
    spans: tuple[tuple, ...]
    unshared_bytes: int = 0  # batch bytes collated into ordinary memory (a worker copies them to send them)

    def stats(self) -> WorkerStats:
        """The :class:`WorkerStats` of this process."""
        n = max(self.samples, 1)
        return WorkerStats(
            worker_id=self.worker_id,
            pid=self.pid,
            samples=self.samples,
            batches=self.batches,
            mean_sample_s=self.sample_ns / n / 1e9 if self.samples else 0.0,
            transform_s={k: v / n / 1e9 for k, v in sorted(self.transform_ns.items(), key=lambda kv: -kv[1])},
            collate_s=self.collate_ns / 1e9,
            busy_s=(self.sample_ns + self.collate_ns) / 1e9,
            cpu_percent=float(self.cpu_percent),
            rss_bytes=int(self.rss_bytes),
        )

    def batch_records(self) -> list[BatchRecord]:
        """The batches this process collated, in order."""
        return [BatchRecord(self.worker_id, self.pid, int(s[1]), int(s[2]), int(s[3]), int(s[4]), s[5])
                for s in self.spans if s[0] == "collate"]


def parse_worker_file(path: Path) -> WorkerRecord | None:
    """Parse one recorder file; ``None`` when it holds no complete line."""
    last: dict[str, Any] | None = None
    spans: list[tuple] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a worker that died while writing it
        spans.extend(tuple(s) for s in record.get("spans", ()))
        last = record
    if last is None:
        return None
    return WorkerRecord(
        worker_id=int(last["worker_id"]), pid=int(last["pid"]), start_ns=int(last["start_ns"]),
        last_ns=int(last["time_ns"]), samples=int(last["samples"]), batches=int(last["batches"]),
        sample_ns=int(last["sample_ns"]), collate_ns=int(last["collate_ns"]),
        transform_ns={str(k): int(v) for k, v in last["transform_ns"].items()},
        cpu_percent=float(last["cpu_percent"]), rss_bytes=int(last["rss_bytes"]),
        errors=tuple(last.get("errors", ())), spans=tuple(spans),
        unshared_bytes=int(last.get("unshared_bytes", 0)),
    )


class WorkerCollector:
    """Owns the directory worker recorders write to, and reads it back."""

    def __init__(self, flush_interval_s: float = 0.2, max_spans: int = 50_000) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pipeline_opt-workers-"))
        self.sink = workers.Sink(str(self.directory), flush_interval_s=flush_interval_s, max_spans=max_spans)
        self._closed = False
        self._last: tuple[WorkerRecord, ...] = ()

    def read(self) -> tuple[WorkerRecord, ...]:
        """Every process's record as of now, sorted by (worker_id, start time)."""
        if self._closed:
            return self._last
        workers.flush_local(self.sink)
        records = [r for p in sorted(self.directory.glob("*.jsonl")) if (r := parse_worker_file(p)) is not None]
        self._last = tuple(sorted(records, key=lambda r: (r.worker_id, r.start_ns)))
        return self._last

    def stats(self) -> tuple[WorkerStats, ...]:
        """One :class:`WorkerStats` per process that fetched samples."""
        return tuple(r.stats() for r in self.read())

    def errors(self) -> tuple[str, ...]:
        """Where data production failed, as recorded by the workers."""
        return tuple(e for r in self.read() for e in r.errors)

    def close(self) -> None:
        """Final reading, restore main-process patches, remove the directory (idempotent)."""
        if self._closed:
            return
        workers.release_local(self.sink)
        self.read()
        self._closed = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> WorkerCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
