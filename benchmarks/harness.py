"""The one harness every benchmark uses.

Measuring
    :class:`Candidate` is a named configuration: a factory for an (effectively infinite) iterable of
    batches and the step that consumes one batch. :meth:`Candidate.window` measures one steady-state
    window: it first runs ``discard`` batches through the step (``num_workers * prefetch_factor`` by
    default: those were pre-filled into the queue while the consumer was not pulling), synchronises
    the device, times at least ``min_steps`` steps and ``min_seconds`` (at most ``max_seconds``), and
    synchronises again inside the timed region. :func:`interleave` measures several candidates in
    rounds, alternating the order (A B C, C B A, ...) so that slow drifts of a noisy machine hit every
    candidate alike; iterators stay alive between rounds, so each window discards the refilled queue
    again.

Reporting
    :class:`Row` is one result line (``ok`` / ``skipped`` / ``failed`` / ``missing``) with the median,
    min, max and inter-quartile range of its windows. :func:`write_result` writes one JSON per
    benchmark with the hardware, library versions, git commit and date (:func:`environment`).
    :func:`format_table` prints rows as a small text table.

Run folders
    Every run's results go to one folder ``benchmarks/results/<YYYYMMDD>-<commit7>-<bench>-<gpu>[-suffix]``
    (:func:`run_folder_name`): the UTC date, the commit's first 7 hex digits, which benchmark(s) it
    holds (:func:`bench_tag`, with ``-<n>cores`` when the process may use fewer cores than the machine
    has) and the GPU (:func:`gpu_tag`: ``h100``, ``h200``, ... or ``cpu``). A suffix (``-a``, ``-run2``)
    only tells apart two runs that would otherwise share a name.

Helpers
    dataset generation with timing (:func:`image_folder`, :func:`yolo_dataset`), device timing of a
    callable (:func:`time_callable`), a :class:`Deadline`, the
    shared command line (:func:`common_parser`) and optional imports that report what is missing
    (:func:`optional`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import importlib
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks")

# --------------------------------------------------------------------------------------------------
# environment


def usable_cores() -> int:
    """Cores this process may run on (CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def git_commit() -> str:
    """``$PO_COMMIT`` if set (the device copy may lack ``.git``), else ``git rev-parse HEAD``."""
    env = os.environ.get("PO_COMMIT")
    if env:
        return env.strip()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(dist: str, module: str | None = None) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    if module:
        try:
            return getattr(importlib.import_module(module), "__version__", "unknown")
        except ImportError:
            return None
    return None


def pillow_flavour() -> dict[str, Any]:
    """Which Pillow is imported: stock Pillow or Pillow-SIMD (detected as the design brief says)."""
    import PIL

    simd = _version("pillow-simd")
    is_simd = simd is not None and simd == PIL.__version__ and ".post" in PIL.__version__
    return {"version": PIL.__version__, "flavour": "pillow-simd" if is_simd else "pillow",
            "pillow_simd_dist": simd}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def smt_siblings(core: int) -> set[int] | None:
    """The logical cores that share ``core``'s physical core (itself included), from sysfs; None
    where sysfs does not say."""
    path = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list")
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out or None


def _threads_per_core(core: int) -> int | None:
    """Logical cores sharing ``core``'s physical core (SMT); None where it is not known."""
    siblings = smt_siblings(core)
    return None if siblings is None else len(siblings)


def environment() -> dict[str, Any]:
    """Hardware, library versions, git commit and date, for the JSON of every benchmark."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = list(range(os.cpu_count() or 1))
    gpu: dict[str, Any] = {"available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu.update(name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                   memory_bytes=int(props.total_memory), capability=f"{props.major}.{props.minor}",
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "host": platform.node(),
        "hardware": {
            "gpu": gpu,
            "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "affinity": affinity,
            "usable_cores": len(affinity),
            "threads_per_core": _threads_per_core(affinity[0] if affinity else 0),
            "memory_bytes": mem,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": _version("torchvision", "torchvision"),
            "kornia": _version("kornia"),
            "kornia_rs": _version("kornia_rs"),
            "ultralytics": _version("ultralytics"),
            "opencv": _version("opencv-python") or _version("opencv-python-headless") or _version("x", "cv2"),
            "numpy": _version("numpy", "numpy"),
            "pillow": pillow_flavour(),
            "pipeline_opt": _version("pipeline-opt", "pipeline_opt"),
        },
    }


# --------------------------------------------------------------------------------------------------
# command line, output, time


def common_parser(description: str) -> argparse.ArgumentParser:
    """Options every benchmark takes: --quick, --out, --device, --rounds, --budget-s, --seed."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke test), seconds not minutes")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for the JSON results (default: benchmarks/results/<date>-<commit>-<bench>-<gpu>)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison")
    p.add_argument("--budget-s", type=float, default=None, help="wall-time guard for the whole benchmark")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true", help="log pipeline_opt at INFO level")
    return p


def sizes_for(args: argparse.Namespace, full: Any, quick: Any) -> Any:
    """``quick`` with ``--quick``, else ``full`` (frozen dataclasses of one benchmark's sizes), with
    ``--rounds`` and ``--budget-s`` applied where that dataclass has the field."""
    sizes = quick if args.quick else full
    fields = {f.name for f in dataclasses.fields(sizes)}
    changes = {name: value for name, value in (("rounds", getattr(args, "rounds", None)),
                                               ("budget_s", getattr(args, "budget_s", None)))
               if value and name in fields}
    return dataclasses.replace(sizes, **changes) if changes else sizes


def setup(args: argparse.Namespace) -> None:
    """Logging, and in --quick mode one torch thread (small CPU machines: no oversubscription) and
    a short wait for a quiet machine between windows (tiny loaders refill in moments)."""
    global SETTLE_MAX_S
    if args.quick:
        torch.set_num_threads(1)
        SETTLE_MAX_S = 0.3
    setup_logging(args.verbose)


def main_of(args: argparse.Namespace, run: Callable[[argparse.Namespace], Path]) -> int:
    """A script's ``main`` after parsing: :func:`setup`, ``run(args)``, then the path it wrote."""
    setup(args)
    path = run(args)
    print(f"wrote {path}")
    return 0


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    logging.getLogger("pipeline_opt").setLevel(logging.INFO if verbose else logging.WARNING)


RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# run_gpu.sh's default set of benchmarks: a folder of all four is a "gpu-suite"
SUITE = ("classification", "yolo", "transforms", "overhead")
# the order a folder of several benchmarks names them in (summarize.py's section order)
BENCH_ORDER = ("classification", "classification_train", "yolo_trainer", "yolo", "yolo_gap", "yolo_decide",
               "transforms", "overhead", "batch_size", "yolo_worker_stages")
_BENCH_TAGS = {"yolo_worker_stages": "worker-stages"}  # device_call.sh's step name
_GPU_VENDOR_WORDS = frozenset({"nvidia", "amd", "intel", "geforce", "tesla", "quadro", "radeon", "instinct"})


def short_commit(commit: str) -> str:
    """The first 7 hex digits of ``commit`` (``ac2f6e9+threads`` -> ``ac2f6e9``); ``unknown`` without any."""
    match = re.match(r"[0-9a-f]+", str(commit).strip().lower())
    return match.group(0)[:7] if match else "unknown"


def gpu_tag(env: dict[str, Any]) -> str:
    """The GPU of :func:`environment`'s ``env`` as a folder-name word: ``NVIDIA H100 80GB HBM3`` -> ``h100``,
    ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``; ``cpu`` when no GPU was available."""
    name = ((env.get("hardware") or {}).get("gpu") or {}).get("name")
    if not name:
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", str(name).lower()) if w and w not in _GPU_VENDOR_WORDS]
    kept: list[str] = []
    for word in words:  # up to the first word with a digit (the model number)
        kept.append(word)
        if any(c.isdigit() for c in word):
            break
    return re.sub(r"[^a-z0-9]", "", "".join(kept))[:16] or "gpu"


def bench_tag(benchmarks: Iterable[str]) -> str:
    """The benchmark part of a run folder's name: ``bench_yolo_trainer`` -> ``yolo-trainer``; several
    joined with ``+`` in :data:`BENCH_ORDER`; run_gpu.sh's four (:data:`SUITE`) together ``gpu-suite``."""
    names = list(dict.fromkeys(b.removeprefix("bench_") for b in benchmarks))
    if not names:
        raise ValueError("a run folder needs at least one benchmark name")
    if sorted(names) == sorted(SUITE):
        return "gpu-suite"
    names.sort(key=lambda b: (BENCH_ORDER.index(b) if b in BENCH_ORDER else len(BENCH_ORDER), b))
    return "+".join(_BENCH_TAGS.get(b, b.replace("_", "-")) for b in names)


def run_folder_name(benchmarks: Iterable[str], env: dict[str, Any] | None = None) -> str:
    """``<YYYYMMDD>-<commit7>-<bench>-<gpu>`` for a run of ``benchmarks`` (names with or without
    ``bench_``) on the machine ``env`` describes (default: this one, now); ``<bench>`` ends in
    ``-<n>cores`` when the process may run on fewer cores than the machine has (``taskset``)."""
    env = env or environment()
    date = str(env.get("date") or _dt.datetime.now(_dt.timezone.utc).isoformat())[:10].replace("-", "")
    hardware = env.get("hardware") or {}
    usable, total = hardware.get("usable_cores"), hardware.get("cpu_count")
    cores = f"-{usable}cores" if isinstance(usable, int) and isinstance(total, int) and usable < total else ""
    return f"{date}-{short_commit(env.get('commit', ''))}-{bench_tag(benchmarks)}{cores}-{gpu_tag(env)}"


def default_out_dir(benchmark: str, env: dict[str, Any] | None = None) -> Path:
    """``benchmarks/results/<run_folder_name>`` for a script run without ``--out``."""
    return RESULTS_DIR / run_folder_name([benchmark], env)


def pick_device(arg: str | None) -> torch.device:
    if arg is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(arg)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {arg} was requested but CUDA is not available; use --device cpu")
    return dev


class Deadline:
    """A wall-clock budget: ``left()`` seconds remain; ``expired(reserve)`` when fewer than ``reserve``."""

    def __init__(self, seconds: float | None) -> None:
        self.start = time.monotonic()
        self.seconds = math.inf if seconds is None else float(seconds)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def expired(self, reserve: float = 0.0) -> bool:
        return self.left() < reserve


def sync(device: torch.device | str | None) -> None:
    """Wait for all queued work on ``device`` (no-op on CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


# --------------------------------------------------------------------------------------------------
# statistics and rows


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, quartiles, IQR and relative spread ((max - min) / median)."""
    vals = sorted(float(v) for v in values)
    if not vals:
        raise ValueError("summarize() needs at least one value")
    med = statistics.median(vals)
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return {"median": med, "min": vals[0], "max": vals[-1], "q1": q1, "q3": q3, "iqr": q3 - q1,
            "spread": (vals[-1] - vals[0]) / med if med else 0.0, "n": len(vals)}


DRAIN_WAIT_S = 0.002  # a next() that waited this long found the ready queue empty
SETTLE_MAX_S = 10.0  # the longest wait for a quiet machine before a window
SETTLE_BUSY_CORES = 2.0  # "quiet": fewer cores busy than this (the training process idles on one)


@dataclass(frozen=True)
class Window:
    """One timed steady-state window."""

    steps: int
    samples: int
    seconds: float
    data_wait_s: float
    discarded: int

    @property
    def throughput(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "throughput": self.throughput,
                "data_wait_frac": self.data_wait_s / self.seconds if self.seconds > 0 else 0.0}


ROW_STATUSES = ("ok", "skipped", "failed", "missing")


@dataclass(frozen=True)
class Row:
    """One result line of a benchmark.

    ``stats`` summarises ``samples`` (median, min, max, q1, q3, iqr, spread, n), always in images per
    second so that every row reads the same way (timing rows convert seconds per call). ``extra``
    holds ledger columns (efficiency, step_time_s, data_wait_frac, ...) written at the row's top level.
    Only ``ok`` rows carry numbers; the others carry the reason.
    """

    name: str
    status: str = "ok"
    reason: str = ""
    stats: dict[str, float] = field(default_factory=dict)
    samples: tuple[float, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    windows: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in ROW_STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {ROW_STATUSES}")
        if self.status == "ok" and not self.stats:
            raise ValueError(f"row {self.name!r} is ok but has no measurements")

    @property
    def median(self) -> float | None:
        return self.stats.get("median") if self.stats else None

    def with_extra(self, **extra: Any) -> Row:
        return dataclasses.replace(self, extra={**self.extra, **extra})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.status == "ok":
            d.update(throughput=self.median, spread=self.stats["spread"], unit="img/s", stats=self.stats,
                     samples=list(self.samples))
        else:
            d["reason"] = self.reason
        d.update(self.extra)
        d["meta"] = self.meta
        if self.windows:
            d["windows"] = list(self.windows)
        return d


def row_of(name: str, samples: Sequence[float], meta: dict | None = None,
           windows: Iterable[Window] = (), **extra: Any) -> Row:
    """An ``ok`` row summarising ``samples`` (images per second)."""
    return Row(name=name, stats=summarize(samples), samples=tuple(float(s) for s in samples),
               meta=dict(meta or {}), windows=tuple(w.to_dict() for w in windows), extra=extra)


def row_of_windows(name: str, windows: Sequence[Window], meta: dict | None = None, **extra: Any) -> Row:
    """An ``ok`` row of measured windows, with the median step time and data-wait share."""
    steps = [w.seconds / w.steps for w in windows if w.steps]
    waits = [w.data_wait_s / w.seconds for w in windows if w.seconds > 0]
    extra.setdefault("step_time_s", statistics.median(steps) if steps else None)
    extra.setdefault("data_wait_frac", statistics.median(waits) if waits else None)
    return row_of(name, [w.throughput for w in windows], meta, windows, **extra)


def row_of_times(name: str, seconds: Sequence[float], images_per_call: int, meta: dict | None = None,
                 **extra: Any) -> Row:
    """An ``ok`` row of timed calls that each process ``images_per_call`` images."""
    if not seconds or min(seconds) <= 0:
        raise ValueError(f"row {name!r}: timings must be positive, got {list(seconds)[:5]}")
    extra.setdefault("seconds_per_call", statistics.median(seconds))
    extra.setdefault("images_per_call", images_per_call)
    return row_of(name, [images_per_call / s for s in seconds], meta, **extra)


def not_run(name: str, status: str, reason: str, meta: dict | None = None) -> Row:
    """A row that was skipped, failed or whose API is missing, with the reason."""
    return Row(name=name, status=status, reason=reason, meta=dict(meta or {}))


def ratio(num: Row | None, den: Row | None) -> float | None:
    """``num.median / den.median`` when both rows are ok, else None."""
    if num is None or den is None or not num.median or not den.median:
        return None
    return num.median / den.median


# --------------------------------------------------------------------------------------------------
# measuring


class Candidate:
    """A named configuration measured by :meth:`window`.

    ``factory()`` builds the batch source (a DataLoader, a DeviceLoader, a replay iterator...);
    ``step(batch)`` runs one training step on it; ``count(batch)`` is its number of samples;
    ``discard`` is how many batches each window throws away first (default: ``num_workers *
    prefetch_factor`` of the source, at least ``min_discard``); ``on_close(source)`` releases what
    the source holds beyond its iterator (e.g. a profiler); ``fresh=True`` builds a new source for
    every window and closes it afterwards (for sources that must not be alive together, such as
    torch.profiler sessions: only one may run at a time). ``warmup_s`` runs untimed steps for that
    long once, right after the source is built, so that a loader built for the benchmark is as warm
    as one that ran before (its workers' caches and buffers filled) when its first window starts.
    After the discarded batches each window drains the ready queue (see :meth:`_drain`; at most
    ``drain_max`` batches, default ``num_workers * prefetch_factor``, 0 to turn it off).
    """

    def __init__(self, name: str, factory: Callable[[], Iterable], step: Callable[[Any], Any],
                 count: Callable[[Any], int] | None = None, discard: int | None = None,
                 min_discard: int = 2, meta: dict | None = None,
                 on_close: Callable[[Any], None] | None = None, fresh: bool = False,
                 warmup_s: float = 0.0, drain_max: int | None = None) -> None:
        self.name = name
        self.drain_max = drain_max
        self.settled_s: list[float] = []  # the waits for a quiet machine before its windows
        self.warmup_s = warmup_s
        self.warmup_steps = 0
        self.fresh = fresh
        self.on_close = on_close
        self.factory = factory
        self.step = step
        self.count = count or _count
        self.discard = discard
        self.min_discard = min_discard
        self.meta = dict(meta or {})
        self.source: Iterable | None = None
        self._it: Iterator | None = None
        self.restarts = 0
        self.startup_s = 0.0

    def start(self) -> None:
        if self.source is None:
            t0 = time.perf_counter()
            self.source = self.factory()
            self._it = iter(self.source)
            self.startup_s = time.perf_counter() - t0
            prefilled = prefilled_batches(self.source)
            if self.discard is None:
                self.discard = max(self.min_discard, prefilled)
            if self.drain_max is None:
                self.drain_max = prefilled
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < self.warmup_s:
                self.step(self._next())
                self.warmup_steps += 1

    def _next(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self.restarts += 1
            self._it = iter(self.source)
            return next(self._it)

    def window(self, device: torch.device | str | None, min_steps: int = 5, min_seconds: float = 1.0,
               max_seconds: float = 10.0) -> Window:
        """Discard the pre-filled queue, then time a steady-state window (device-synchronised)."""
        self.start()
        for _ in range(self.discard):
            self.step(self._next())
        drained = self._drain()
        sync(device)
        samples = steps = 0
        wait = 0.0
        t0 = time.perf_counter()
        while True:
            tw = time.perf_counter()
            batch = self._next()
            wait += time.perf_counter() - tw
            self.step(batch)
            samples += self.count(batch)
            steps += 1
            elapsed = time.perf_counter() - t0
            if (steps >= min_steps and elapsed >= min_seconds) or elapsed >= max_seconds:
                break
        sync(device)
        return Window(steps=steps, samples=samples, seconds=time.perf_counter() - t0, data_wait_s=wait,
                      discarded=self.discard + drained)

    def _drain(self) -> int:
        """Step on until the source's ready queue is empty (two ``next()`` that wait within one round
        of the workers), at most
        ``prefilled_batches`` more: the workers refill their queue while the discarded batches are
        stepped, so a data-bound loader would otherwise start its window with a reserve of ready
        batches that its steady state does not have (on the H200 a 3 s YOLO window read 1.4x the
        loader's steady state that way). A compute-bound loader's queue stays full: it starts full."""
        if self.drain_max <= 0:
            return 0
        # A second wait within one round of the workers ends the drain: once the queue is empty at
        # least one next() per round waits (workers that run in step deliver in bursts of one batch
        # each), while a lone slow next() can be the scheduler on a busy machine.
        span = max(1, self.drain_max // max(1, prefetch_of(self.source))) + 1
        last_wait = None
        for k in range(self.drain_max):
            t0 = time.perf_counter()
            batch = self._next()
            waited = time.perf_counter() - t0
            self.step(batch)
            if waited >= DRAIN_WAIT_S:
                if last_wait is not None and k - last_wait <= span:
                    return k + 1
                last_wait = k
        return self.drain_max

    def close(self) -> None:
        """Drop the iterator and the source (shuts the workers down)."""
        it, source, self._it, self.source = self._it, self.source, None, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        elif hasattr(it, "close"):
            with contextlib.suppress(Exception):
                it.close()
        del it
        if self.on_close is not None and source is not None:
            self.on_close(source)
        del source
        gc.collect()


def _count(batch: Any) -> int:
    from pipeline_opt._core.step import batch_size_of

    return batch_size_of(batch)


def _dataloader_under(source: Any) -> torch.utils.data.DataLoader | None:
    loader = source
    for _ in range(4):  # DeviceLoader / wrappers expose the DataLoader as .loader
        if isinstance(loader, torch.utils.data.DataLoader):
            return loader
        loader = getattr(loader, "loader", None)
    return None


def prefilled_batches(source: Any) -> int:
    """``num_workers * prefetch_factor`` of the DataLoader under ``source`` (0 without workers)."""
    loader = _dataloader_under(source)
    if loader is None or loader.num_workers == 0:
        return 0
    return loader.num_workers * prefetch_of(loader)


def prefetch_of(source: Any) -> int:
    """``prefetch_factor`` of the DataLoader under ``source`` (torch's default 2; 1 without one)."""
    loader = _dataloader_under(source)
    if loader is None or loader.num_workers == 0:
        return 1
    return loader.prefetch_factor or 2


@dataclass
class Measured:
    """Windows and errors of one candidate across interleaved rounds."""

    windows: list[Window] = field(default_factory=list)
    error: str | None = None


def settle(max_s: float | None = None, busy_cores: float = SETTLE_BUSY_CORES, interval: float = 0.25) -> float:
    """Wait until the machine is quiet (fewer than ``busy_cores`` cores busy over ``interval``), at
    most ``max_s``; returns the seconds waited. After a window, the loader just measured refills its
    prefetch queue (on the H200 a YOLO loader's 8 workers stayed busy for seconds): without the
    wait, that work lands in the next candidate's window."""
    import psutil

    max_s = SETTLE_MAX_S if max_s is None else max_s
    t0 = time.perf_counter()
    psutil.cpu_percent(percpu=False)  # starts the interval
    while time.perf_counter() - t0 < max_s:
        time.sleep(interval)
        if psutil.cpu_percent(percpu=False) / 100.0 * psutil.cpu_count() < busy_cores:
            break
    return time.perf_counter() - t0


def interleave(candidates: Sequence[Candidate], rounds: int, device: torch.device | str | None,
               deadline: Deadline | None = None, close: bool = True, settle_s: float | None = None,
               **window_kw: Any) -> dict[str, Measured]:
    """Measure ``candidates`` in ``rounds`` rounds, alternating the order each round
    (:func:`pipeline_opt.tune.ab.interleave`, the library's one A/B primitive).

    Before every window the machine is let :func:`settle` (at most ``settle_s``, default
    ``SETTLE_MAX_S``; 0: no wait).

    A candidate that raises is recorded with its error and dropped from later rounds; the others go on.
    The first round always runs (every candidate gets a window); later rounds stop early, keeping
    what was measured, once ``deadline`` has expired.
    """
    from pipeline_opt.tune.ab import interleave as ab_interleave

    results = {c.name: Measured() for c in candidates}
    settle_s = SETTLE_MAX_S if settle_s is None else settle_s
    rounds_seen = [0]

    def measure(cand: Candidate) -> None:
        if settle_s > 0:
            cand.settled_s.append(settle(settle_s))
        w = cand.window(device, **window_kw)
        results[cand.name].windows.append(w)
        if cand.fresh:
            cand.close()
        rounds_seen[0] = len(results[cand.name].windows)
        log.info("round %d  %-40s %9.1f img/s  (wait %.0f%%)", rounds_seen[0], cand.name, w.throughput,
                 100 * w.data_wait_s / max(w.seconds, 1e-9))

    def failed(cand: Candidate, exc: Exception) -> bool:  # a failing configuration must not stop the others
        log.exception("%s failed", cand.name)
        results[cand.name].error = f"{type(exc).__name__}: {exc}"
        cand.close()
        return True

    def out_of_time() -> bool:
        if deadline is not None and deadline.expired():
            log.warning("time budget reached after round %d; keeping what was measured", rounds_seen[0])
            return True
        return False

    try:
        ab_interleave(list(candidates), rounds, measure, stop=out_of_time, on_error=failed)
    finally:
        if close:
            for cand in candidates:
                cand.close()
    return results


def rows_of(candidates: Sequence[Candidate], measured: dict[str, Measured]) -> list[Row]:
    """One row per candidate: ok with its windows, or failed with its error."""
    rows = []
    for cand in candidates:
        m = measured[cand.name]
        meta = {**cand.meta, "startup_s": cand.startup_s, "discarded_per_window": cand.discard,
                "warmup_s": cand.warmup_s, "warmup_steps": cand.warmup_steps,
                "settled_s": [round(x, 2) for x in cand.settled_s]}
        if m.windows:
            rows.append(row_of_windows(cand.name, m.windows, meta))
        elif m.error is not None:
            rows.append(not_run(cand.name, "failed", m.error, meta))
        else:
            rows.append(not_run(cand.name, "skipped", "time budget reached before it was measured", meta))
    return rows


def replay(batch: Any) -> Iterator[Any]:
    """An endless iterator yielding the same (device-resident) batch: the limit of a step."""
    while True:
        yield batch


class AttrDuring:
    """``fn`` called with ``obj.name`` set to ``value`` for each call (and restored after it): e.g.
    ``fused=False`` on a GPU augmentation for a row that times the unfused path."""

    def __init__(self, fn: Callable[..., Any], obj: Any, name: str, value: Any) -> None:
        self.fn, self.obj, self.name, self.value = fn, obj, name, value

    def __call__(self, *args: Any) -> Any:
        saved = getattr(self.obj, self.name)
        setattr(self.obj, self.name, self.value)
        try:
            return self.fn(*args)
        finally:
            setattr(self.obj, self.name, saved)


def time_callable(fn: Callable[[], Any], device: torch.device | str | None, reps: int = 20,
                  warmup: int = 3, max_seconds: float = 5.0) -> list[float]:
    """Seconds per call of ``fn``: CUDA events on a GPU, ``perf_counter`` on the CPU."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    for _ in range(warmup):
        fn()
    sync(dev)
    times: list[float] = []
    t_start = time.perf_counter()
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > max_seconds and len(times) >= 3:
            break
    return times


# --------------------------------------------------------------------------------------------------
# datasets


def image_folder(n_images: int, size: tuple[int, int], seed: int = 0) -> tuple[Path, float]:
    """The JPEG image folder (generated once per parameters, on every usable core) and seconds taken."""
    from pipeline_opt.datasets import make_image_folder

    t0 = time.perf_counter()
    path = make_image_folder(n_images=n_images, size=size, seed=seed, workers=usable_cores())
    return path, time.perf_counter() - t0


def yolo_dataset(n_train: int, size: tuple[int, int], seed: int = 0) -> tuple[Path, float]:
    """The YOLO detection set (generated once per parameters) and seconds taken; returns data.yaml."""
    from pipeline_opt.datasets import make_yolo_dataset

    t0 = time.perf_counter()
    path = make_yolo_dataset(n_train=n_train, n_val=8, size=size, seed=seed, workers=usable_cores())
    return path, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# optional APIs


class Missing:
    """What :func:`optional` returns when an API is absent; falsy, carries the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Missing({self.reason!r})"


def optional(module: str, *names: str) -> Any:
    """``getattr(import_module(module), name)`` for each name (a tuple if several), or :class:`Missing`.

    For optional dependencies (ultralytics, a Pillow-SIMD build): a row whose import fails is reported, not fatal.
    """
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a module that fails while others edit it
        return Missing(f"{module} cannot be imported ({type(exc).__name__}: {exc})")
    found = []
    for name in names:
        obj = getattr(mod, name, None)
        if obj is None:
            return Missing(f"{module}.{name} does not exist")
        found.append(obj)
    return found[0] if len(found) == 1 else tuple(found)


def trial_log(result: Any) -> list[str]:
    """One line per trial of a TuneResult: configuration, throughput, verdict and the reason."""
    from pipeline_opt.tune.candidates import LoaderConfig

    out = []
    for t in getattr(result, "trials", ()):
        try:
            label = LoaderConfig.from_dict(t.config).label()
        except (KeyError, TypeError, ValueError):
            label = str(t.config)
        what = f"{t.throughput:,.1f}/s ±{t.spread:.0%}" if t.status == "ok" else t.status
        out.append(f"{label}: {what}, {'accepted' if t.accepted else 'not kept'} - {t.reason}")
    return out


# --------------------------------------------------------------------------------------------------
# output


def write_result(out_dir: Path | None, benchmark: str, rows: Sequence[Row], *, config: dict[str, Any],
                 summary: dict[str, Any] | None = None, started: float | None = None,
                 env: dict[str, Any] | None = None, ledger: dict[str, Any] | None = None) -> Path:
    """Write ``<out_dir>/<benchmark>.json`` and return its path.

    ``rows`` holds the measured rows (each with a plain ``throughput`` in img/s, as the ledger reads
    them); ``not_measured`` the skipped / failed / missing ones with their reasons. ``ledger`` adds
    top-level ledger columns (model, batch, resolution, ddp, amp) that every row inherits.
    """
    env = env or environment()
    out = Path(out_dir) if out_dir is not None else default_out_dir(benchmark, env)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "schema": SCHEMA_VERSION,
        "benchmark": benchmark,
        "commit": env["commit"],
        "date": env["date"],
        **_jsonable(ledger or {}),
        "env": env,
        "config": _jsonable(config),
        "rows": [r.to_dict() for r in rows if r.status == "ok"],
        "not_measured": [r.to_dict() for r in rows if r.status != "ok"],
        "summary": _jsonable(summary or {}),
        "elapsed_s": None if started is None else time.monotonic() - started,
    }
    path = out / f"{benchmark}.json"
    path.write_text(json.dumps(_jsonable(payload), indent=2))
    return path


def _jsonable(value: Any) -> Any:
    def default(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        return str(o)

    return json.loads(json.dumps(value, default=default))


def append_to_ledger(result_paths: Iterable[Path], ledger_path: Path) -> str:
    """Append the rows of benchmark JSON files to the ledger (pipeline_opt.report.ledger), if it exists."""
    ledger = optional("pipeline_opt.report.ledger", "rows_from_result", "append")
    if not ledger:
        return f"ledger not appended: {ledger.reason}"
    rows_from_result, append = ledger
    rows = []
    for p in result_paths:
        result = json.loads(Path(p).read_text())
        if result.get("rows"):
            rows.extend(rows_from_result(result))
    if not rows:
        return "ledger not appended: no measured rows"
    append(rows, ledger_path)
    return f"appended {len(rows)} row(s) to {ledger_path}"


def format_table(rows: Sequence[Row], title: str | None = None, reference: Row | None = None) -> str:
    """Rows as text: name, median img/s, min..max, IQR, n, and (optionally) x of ``reference``."""
    head = f"{'row':<48} {'img/s':>9} {'min..max':>17} {'iqr':>7} {'n':>3}"
    if reference is not None:
        head += f" {'x ' + reference.name[:12]:>15}"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        if r.status != "ok":
            lines.append(f"{r.name[:48]:<48} {r.status:>9}  {r.reason[:100]}")
            continue
        v = r.stats
        span = f"{v['min']:.0f}..{v['max']:.0f}"
        line = f"{r.name[:48]:<48} {v['median']:>9.1f} {span:>17} {v['iqr']:>7.1f} {v['n']:>3}"
        if reference is not None:
            x = ratio(r, reference)
            line += f" {'' if x is None else f'{x:.3f}':>15}"
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# summary of a results directory (run_gpu.sh calls this at the end)


def load_results(directory: Path) -> list[dict[str, Any]]:
    """Every benchmark JSON in ``directory`` (files named bench_*.json), in name order."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("bench_*.json"))]


def markdown_summary(results: Sequence[dict[str, Any]]) -> str:
    """A Markdown table per benchmark (rows, median img/s, spread) plus its targets, for README files."""
    out = []
    for res in results:
        env = res.get("env", {})
        gpu = env.get("hardware", {}).get("gpu", {}).get("name", "no GPU")
        out.append(f"### {res.get('benchmark', '-')}  \n{gpu}, {env.get('hardware', {}).get('usable_cores')} cores, "
                   f"commit `{str(res.get('commit', ''))[:10]}`, {res.get('date', '')}\n")
        out += markdown_table(res)
        notes = markdown_notes(res.get("summary", {}))
        if notes:
            out.append("\n" + "\n".join(notes))
        out.append("")
    return "\n".join(out)


def markdown_table(res: dict[str, Any], extra: tuple[str, Callable[[dict[str, Any]], str]] | None = None
                   ) -> list[str]:
    """The lines of one result's Markdown table: row, median img/s, min..max, spread, n, and optionally
    one more column ``extra = (header, cell(row) -> str)``. Measured rows come first, then the rows not
    measured with their status and reason; a key that an older JSON lacks shows as ``-``."""
    head, rule = "| row | img/s (median) | min..max | spread | n |", "|---|---:|---:|---:|---:|"
    if extra is not None:
        head, rule = head + f" {extra[0]} |", rule + "---:|"
    lines = [head, rule]
    for r in res.get("rows", []):
        s = r.get("stats") or {}
        spread = r.get("spread", s.get("spread"))
        line = (f"| {_cell(r.get('name', '-'))} | {num_cell(s.get('median', r.get('throughput')), '.1f')} | "
                f"{num_cell(s.get('min'), '.0f')}..{num_cell(s.get('max'), '.0f')} | "
                f"{'-' if spread is None else f'{100 * spread:.0f}%'} | {num_cell(s.get('n'), 'd')} |")
        lines.append(line + (f" {extra[1](r)} |" if extra is not None else ""))
    blanks = " |" * (4 + (extra is not None))
    for r in res.get("not_measured", []):
        lines.append(f"| {_cell(r.get('name', '-'))} | {r.get('status', '-')}: {_cell(str(r.get('reason', ''))[:120])} |"
                     + blanks[2:])
    return lines


def markdown_notes(summary: dict[str, Any]) -> list[str]:
    """List items for the targets (met / missed / not measured) and caveats in a result's ``summary``."""
    targets = [f"- {k}: **{'met' if v else 'missed' if v is False else 'not measured'}**"
               for k, v in _targets(summary).items()]
    return targets + [f"- {where}caveat: {text}" for where, text in _caveats(summary)]


def num_cell(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` when it is missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(int(value) if spec == "d" else value, spec)


def _cell(text: Any) -> str:
    """Text for one Markdown table cell (stripped, pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _caveats(summary: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``(where, text)`` for every ``caveats`` list in ``summary`` (nested parts included)."""
    found: list[tuple[str, str]] = []
    for k, v in summary.items():
        if k == "caveats" and isinstance(v, list):
            found += [(prefix, str(text)) for text in v]
        elif isinstance(v, dict) and k != "parts":
            found += _caveats(v, f"{prefix}{k}: ")
    return found


def _targets(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for k, v in summary.items():
        if k == "targets" and isinstance(v, dict):
            found.update({f"{prefix}{t}": ok for t, ok in v.items()})
        elif k.startswith("target") and not isinstance(v, dict):
            found[f"{prefix}{k}"] = v
        elif k.startswith("target") and isinstance(v, dict):
            found.update({f"{prefix}{k}: {t}": ok for t, ok in v.items()})
        elif isinstance(v, dict) and k != "parts":
            found.update(_targets(v, f"{prefix}{k}: "))
    return found


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.harness",
                                description="Summarise a results directory: table, results.md, ledger.")
    p.add_argument("directory", type=Path, nargs="?")
    p.add_argument("--ledger", type=Path, default=None, help="append the rows to this ledger (.jsonl or .csv)")
    p.add_argument("--folder-name", nargs="+", metavar="BENCH",
                   help="print the run folder name for these benchmarks on this machine now, and exit "
                        "(run_gpu.sh's default $OUT)")
    args = p.parse_args(argv)
    if args.folder_name:
        print(run_folder_name(args.folder_name))
        return 0
    if args.directory is None:
        p.error("a results directory is needed (or --folder-name)")
    results = load_results(args.directory)
    if not results:
        print(f"no bench_*.json in {args.directory}")
        return 1
    md = markdown_summary(results)
    (args.directory / "results.md").write_text(md + "\n")
    print(md)
    if args.ledger is not None:
        print(append_to_ledger(sorted(args.directory.glob("bench_*.json")), args.ledger))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
