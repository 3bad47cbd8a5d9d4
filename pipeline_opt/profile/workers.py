"""The worker side of the profiler: one recorder per process that fetches samples.

Installed without the user changing their dataset, by three picklable module-level proxies that
the profiled loader clone carries into every worker (fork and spawn alike):

* :class:`ProfiledDataset` / :class:`ProfiledBatchedDataset` / :class:`ProfiledIterableDataset`
  time ``__getitem__`` (``__getitems__``, ``__iter__``) and, on first use in a process, wrap the
  dataset's transforms (:mod:`pipeline_opt.profile.timed_transforms`);
* :class:`ProfiledCollate` times the collate function and closes a batch record;
* :class:`ProfiledWorkerInit` starts the recorder as soon as the worker starts, then calls the
  user's own ``worker_init_fn``.

Spans use ``time.time_ns()`` (one clock for every process of the host, so they merge with the main
process's). Each recorder appends JSON lines to its own file in the collector's directory: cumulative
totals plus the spans recorded since the previous line. It writes at most every
``flush_interval_s``, on the first batch, on an error and when the worker exits (through
``multiprocessing.util.Finalize``, which worker processes run on a normal exit). A worker that dies
loses at most its last interval and cannot block or corrupt the other workers' files.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from pipeline_opt.profile import timed_transforms


class DataPipelineError(RuntimeError):
    """A sample could not be produced; the message says which one and where, the cause is chained."""


MAIN_WORKER_ID = -1  # worker_id of the main process when it plays the worker (num_workers=0)
_MAX_BATCH_DEPTH = 4  # nesting looked into for tensors when measuring a collated batch


@dataclass(frozen=True)
class Sink:
    """Where a process's recorder writes, carried (pickled) into every worker."""

    directory: str
    flush_interval_s: float = 0.2
    max_spans: int = 50_000  # per process; totals keep counting beyond it

    def __post_init__(self) -> None:
        if self.flush_interval_s < 0:
            raise ValueError(f"flush_interval_s={self.flush_interval_s!r} must be >= 0")
        if self.max_spans < 0:
            raise ValueError(f"max_spans={self.max_spans!r} must be >= 0")


class Recorder:
    """What one process did: totals, spans, errors; written to ``<directory>/<worker>-<pid>.jsonl``."""

    def __init__(self, sink: Sink, worker_id: int) -> None:
        self.sink = sink
        self.worker_id = worker_id
        self.pid = os.getpid()
        label = "main" if worker_id == MAIN_WORKER_ID else f"worker{worker_id}"
        self.path = Path(sink.directory) / f"{label}-{self.pid}.jsonl"
        self._proc = psutil.Process()
        self.start_ns = time.time_ns()
        self._cpu0 = self._process_cpu_s()
        self.samples = 0
        self.batches = 0
        self.sample_ns = 0
        self.collate_ns = 0
        self.unshared_bytes = 0  # batch tensor bytes collated into ordinary memory (copied again to be sent)
        self.loader_cpu_ns = 0  # thread CPU inside fetch + collate (the main process's loader share)
        self.transform_ns: dict[str, int] = {}
        self._spans: list[list] = []
        self._n_spans = 0
        self._pending: list[Any] = []  # sample indices fetched since the last collate
        self._stream_index = 0
        self._errors: list[str] = []
        self._last_flush_ns = 0
        self._instrumented = False
        self.patches: list[timed_transforms.Patch] = []
        if worker_id != MAIN_WORKER_ID:
            mp_util.Finalize(None, self.flush, exitpriority=100)

    # -- recording -------------------------------------------------------------------------
    def instrument(self, dataset: Any) -> None:
        """Wrap the dataset's transforms once per process."""
        if not self._instrumented:
            self._instrumented = True
            self.patches = timed_transforms.instrument(dataset, self.transform)

    def _span(self, record: list) -> None:
        if self._n_spans < self.sink.max_spans:
            self._spans.append(record)
            self._n_spans += 1

    def transform(self, name: str, t0: int, t1: int) -> None:
        self.transform_ns[name] = self.transform_ns.get(name, 0) + (t1 - t0)
        self._span(["transform", name, t0, t1])

    def next_stream_index(self) -> int:
        """Running sample number of an IterableDataset in this process."""
        self._stream_index += 1
        return self._stream_index - 1

    def sample(self, index: Any, t0: int, t1: int, cpu_ns: int, count: int = 1) -> None:
        self.samples += count
        self.sample_ns += t1 - t0
        self.loader_cpu_ns += cpu_ns
        if count == 1:
            self._pending.append(index)
            self._span(["sample", _plain_index(index), t0, t1])
        else:
            self._pending.extend(index)
            self._span(["samples", _plain_index(index[0]) if index else None, t0, t1, count])

    def collate(self, t0: int, t1: int, cpu_ns: int, size: int) -> None:
        first = _plain_index(self._pending[0]) if self._pending else None
        self._pending = []
        self.collate_ns += t1 - t0
        self.loader_cpu_ns += cpu_ns
        self._spans.append(["collate", self.batches, t0, t1, size, first])  # always kept: flow arrows
        self.batches += 1
        if self.batches == 1 or t1 - self._last_flush_ns >= self.sink.flush_interval_s * 1e9:
            self.flush()

    def failed(self, where: str, exc: BaseException) -> DataPipelineError | None:
        """Record an exception raised while producing data and annotate it with where it happened.

        In a worker process the original exception travels on (torch re-raises it in the main
        process with the worker's traceback and this note). In the main process (num_workers=0)
        the returned :class:`DataPipelineError` names the place in its message; the caller raises
        it ``from`` the original, so the original traceback is kept.
        """
        where_text = f"{where} raised {type(exc).__name__} in " + (
            "the main process" if self.worker_id == MAIN_WORKER_ID else f"DataLoader worker {self.worker_id}"
        ) + f" (pid {self.pid})"
        self._errors.append(f"{where_text}: {exc}")
        if hasattr(exc, "add_note"):
            exc.add_note(f"pipeline_opt profiler: {where_text}")
        self.flush()
        if self.worker_id == MAIN_WORKER_ID:
            return DataPipelineError(f"{where_text}: {exc}")
        return None

    # -- transport -------------------------------------------------------------------------
    def _process_cpu_s(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    def totals(self) -> dict[str, Any]:
        now = time.time_ns()
        wall_s = max((now - self.start_ns) / 1e9, 1e-9)
        if self.worker_id == MAIN_WORKER_ID:
            cpu_percent = 100.0 * self.loader_cpu_ns / 1e9 / wall_s
        else:
            cpu_percent = 100.0 * (self._process_cpu_s() - self._cpu0) / wall_s
        try:
            rss = int(self._proc.memory_info().rss)
        except psutil.Error:
            rss = 0
        return {
            "worker_id": self.worker_id, "pid": self.pid, "start_ns": self.start_ns, "time_ns": now,
            "samples": self.samples, "batches": self.batches, "sample_ns": self.sample_ns,
            "collate_ns": self.collate_ns, "unshared_bytes": self.unshared_bytes,
            "transform_ns": dict(self.transform_ns),
            "cpu_percent": cpu_percent, "rss_bytes": rss, "errors": list(self._errors),
        }

    def flush(self) -> None:
        """Append the totals and the spans not yet written as one JSON line (never raises)."""
        try:
            record = self.totals()
            record["spans"] = self._spans
            line = json.dumps(record) + "\n"
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
            self._spans = []
            self._last_flush_ns = record["time_ns"]
        except (OSError, TypeError, ValueError, psutil.Error):
            pass  # the collector's directory is gone (profile finished) or the disk is full


def _plain_index(index: Any) -> Any:
    if isinstance(index, (int, float, str)) or index is None:
        return index
    try:
        return int(index)
    except (TypeError, ValueError):
        return str(index)


_RECORDERS: dict[tuple[int, str], Recorder] = {}


def recorder_for(sink: Sink) -> Recorder:
    """This process's recorder for ``sink`` (created on first use; worker id from get_worker_info)."""
    key = (os.getpid(), sink.directory)
    rec = _RECORDERS.get(key)
    if rec is None:
        for stale in [k for k in _RECORDERS if k[0] != key[0]]:  # inherited through fork
            del _RECORDERS[stale]
        info = get_worker_info()
        rec = Recorder(sink, MAIN_WORKER_ID if info is None else int(info.id))
        _RECORDERS[key] = rec
    return rec


def release_local(sink: Sink) -> None:
    """Flush and drop the main process's recorder for ``sink``, restoring the transforms it wrapped."""
    rec = _RECORDERS.pop((os.getpid(), sink.directory), None)
    if rec is not None:
        rec.flush()
        timed_transforms.restore(rec.patches)


def flush_local(sink: Sink) -> None:
    """Flush the main process's recorder for ``sink`` (num_workers=0), if it exists."""
    rec = _RECORDERS.get((os.getpid(), sink.directory))
    if rec is not None:
        rec.flush()


# -- proxies (module level: picklable for the spawn start method) -----------------------------
class ProfiledDataset(Dataset):
    """Map-style dataset proxy timing ``__getitem__``; other attributes read through to the dataset."""

    def __init__(self, dataset: Any, sink: Sink) -> None:
        self.dataset = dataset
        self.sink = sink

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        rec = recorder_for(self.sink)
        rec.instrument(self.dataset)
        t0, c0 = time.time_ns(), time.thread_time_ns()
        try:
            item = self.dataset[index]
        except Exception as exc:
            wrapped = rec.failed(f"dataset[{index!r}]", exc)
            if wrapped is None:
                raise
            raise wrapped from exc
        rec.sample(index, t0, time.time_ns(), time.thread_time_ns() - c0)
        return item

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "sink"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r})"


class ProfiledBatchedDataset(ProfiledDataset):
    """The proxy for datasets that define ``__getitems__`` (batched fetching)."""

    def __getitems__(self, indices: list) -> Any:
        rec = recorder_for(self.sink)
        rec.instrument(self.dataset)
        t0, c0 = time.time_ns(), time.thread_time_ns()
        try:
            items = self.dataset.__getitems__(indices)
        except Exception as exc:
            wrapped = rec.failed(f"dataset.__getitems__({list(indices)!r})", exc)
            if wrapped is None:
                raise
            raise wrapped from exc
        rec.sample(list(indices), t0, time.time_ns(), time.thread_time_ns() - c0, count=len(indices))
        return items


class ProfiledIterableDataset(IterableDataset):
    """IterableDataset proxy timing each ``next()``; samples are numbered per process."""

    def __init__(self, dataset: Any, sink: Sink) -> None:
        self.dataset = dataset
        self.sink = sink

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        rec = recorder_for(self.sink)
        rec.instrument(self.dataset)
        it = iter(self.dataset)
        while True:
            index = rec.next_stream_index()
            t0, c0 = time.time_ns(), time.thread_time_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            except Exception as exc:
                wrapped = rec.failed(f"sample #{index} of the iterable dataset", exc)
                if wrapped is None:
                    raise
                raise wrapped from exc
            rec.sample(index, t0, time.time_ns(), time.thread_time_ns() - c0)
            yield item

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "sink"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def profiled_dataset(dataset: Any, sink: Sink) -> Dataset:
    """The right proxy for ``dataset`` (iterable, batched map-style or map-style)."""
    if isinstance(dataset, IterableDataset):
        return ProfiledIterableDataset(dataset, sink)
    if getattr(dataset, "__getitems__", None):
        return ProfiledBatchedDataset(dataset, sink)
    return ProfiledDataset(dataset, sink)


class ProfiledCollate:
    """Collate proxy: times the user's collate function and closes the batch record."""

    def __init__(self, collate_fn: Any, sink: Sink) -> None:
        self.collate_fn = collate_fn
        self.sink = sink

    def __call__(self, samples: Any) -> Any:
        rec = recorder_for(self.sink)
        t0, c0 = time.time_ns(), time.thread_time_ns()
        try:
            out = self.collate_fn(samples)
        except Exception as exc:
            rec.failed("collate_fn", exc)
            raise
        size = len(samples) if hasattr(samples, "__len__") else 1
        rec.collate(t0, time.time_ns(), time.thread_time_ns() - c0, size)
        if rec.worker_id != MAIN_WORKER_ID:
            rec.unshared_bytes += unshared_bytes(out)
        return out


def unshared_bytes(batch: Any) -> int:
    """Bytes of the CPU tensor storages in ``batch`` (nested dicts / lists / tuples, each storage
    once) that are not in shared memory: a worker's DataLoader copies each of them into shared
    memory to send the batch."""
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> int:
        if isinstance(node, torch.Tensor):
            if node.device.type != "cpu" or node.is_shared():
                return 0
            storage = node.untyped_storage()
            if storage.data_ptr() in seen:
                return 0
            seen.add(storage.data_ptr())
            return storage.nbytes()
        if depth > _MAX_BATCH_DEPTH:
            return 0
        if isinstance(node, Mapping):
            return sum(visit(v, depth + 1) for v in node.values())
        if isinstance(node, (list, tuple)):
            return sum(visit(v, depth + 1) for v in node)
        return 0

    return visit(batch, 0)


class ProfiledWorkerInit:
    """``worker_init_fn`` that starts this worker's recorder, then calls the user's own."""

    def __init__(self, user_fn: Any, sink: Sink) -> None:
        self.user_fn = user_fn
        self.sink = sink

    def __call__(self, worker_id: int) -> None:
        recorder_for(self.sink)
        if self.user_fn is not None:
            self.user_fn(worker_id)
