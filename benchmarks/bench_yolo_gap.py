"""Where the YOLO pipeline loses against its replayed-batch limit: CPU load, decoding, augmentation.

(Run ed354e1 found the answer that the rows below were built to look for: the loader's supply.
The workers spend about 0.8-1.0 s of CPU per 64-image batch, and the earlier 3 s windows began
with a reserve of buffered batches. The harness drains that reserve now. The paragraph below is
the hypothesis those rows tested.)

bench_yolo measures the ultralytics pipeline at ~0.65x the limit of the same step on one replayed
batch while the step waits for data less than 10% of the time: the step itself gets slower when
the loader runs. This benchmark separates the candidate causes in one interleaved run (YOLO11n,
640 px, batch 64, bf16, all usable cores), and records for every window the machine's busy cores
and the training thread's own CPU seconds per step:

    limit                       one pinned batch replayed through the step (as bench_yolo)
    replay of 16 batches        16 consecutive real batches, pinned, replayed in turn: what the
                                step costs on batches that differ (box counts, so the loss's
                                target shapes), with no loader running
    limit + N CPU-busy procs    the same replay while N processes run worker-like OpenCV work
                                (JPEG decode + warpAffine of a 640x640 image): the cost of a busy
                                CPU alone, without any data arriving
    limit + N dataset procs     the same replay while N forked processes run the loader's own
                                dataset[i] in a loop and drop the results: the workers' work
                                (and memory traffic) without any batch delivered
    limit + GPU HSV/flip        the replayed batch through the GPU-augmenting step (no loader)
    limit + GPU ... + affine    the same through the step that also warps (gpu_affine), no loader
    default                     ultralytics' loader (8 workers), images decoded from disk
    cache=ram                   the same loader with ultralytics' RAM image cache (no decode)
    cache=ram + GPU HSV/flip    and ultralytics' CPU HSV / flip done on the GPU (forced)
    default, GIL switch 0.2 ms  the default loader with sys.setswitchinterval(0.0002) during its
                                windows: the training thread waits less for the GIL that the
                                pin-memory thread holds while it receives and pins batches
    default, pin_memory=False   the default loader without the pin-memory thread
    ring + loader drained       the 16-batch replay while the default loader runs and every step
                                also takes (and drops) one batch from it: the cost of receiving
                                batches (pin-memory thread, unpickling) without training on them
    ... drained, pin_memory=False   the same without the pin-memory thread (the training thread
                                receives the batches itself and drops them unpinned)
    ... drained, file_system    the same with torch's file_system sharing strategy in the workers
                                (shared-memory files by name instead of passed descriptors)
    default, workers timed      the default loader with its collate function timed per worker
                                (time between batches = loading samples; collating)
    default, shared slots       the default loader's settings with pipeline_opt's shared slots: the
                                workers write the images into reused shared-memory buffers that
                                the training process page-locks once (pipeline_opt.loading.shared_slots);
                                its meta has the workers' and the receiving thread's time per batch
    ... shared slots, not page-locked   the same without cudaHostRegister (a diagnostic)
    12 workers, ...             the default loader and the shared slots with more workers
                                (``Sizes.more_workers``): whether the workers' supply is the limit;
                                and with the GPU HSV/flip through shared slots
    loader alone: ...           the loader drained with no training step (each batch's images
                                only copied to the device): how fast the loader delivers when
                                nothing else runs, at the default and the larger worker count
    ... GPU HSV/flip, shared slots  the GPU-augmenting default through shared slots: once the
                                workers keep up, whether receiving batches still slows the step;
                                "GIL switch 0.2 ms": the same with sys.setswitchinterval(0.0002)
                                during its windows (the slot rows wait ~7% for data with the
                                workers ahead: is it the receiving thread's hold on the GIL?)
    ... GPU HSV/flip + affine   gpu_affine=True: RandomPerspective's gains on the GPU too, the
                                workers only crop the Mosaic canvas (and through shared slots)
    ... GPU HSV/flip, workers nice 10     the GPU-augmenting default with its workers at nice 10:
                                the training process's threads win every contested core
    ... GPU HSV/flip, workers off N cores  the same with the workers' CPU affinity excluding the
                                first N usable cores and their SMT siblings: the training
                                process's threads get cores that no worker shares

Every window also records the CPU seconds (user, system) and page faults of all the worker
processes (children of this process) per batch, so a window whose workers did more work per
batch (faulting in fresh memory, say) can be told apart from one where they were starved.
With ``--timecourse-s S`` a fresh clone of the default loader first trains for S seconds and the
throughput and data wait of every 2-second bucket go into ``summary.timecourse``: how a new
loader's speed develops from its first batch.

Every row that keeps its source runs 8 s of untimed steps once, right after it is built, before
its first window: a loader built for the benchmark then starts as warm as the default one (in
the run at 29e6c15 every freshly built loader's first window read 30-50% slower, its later ones not).

With --torch-profile N, every row then runs N steps under torch.profiler (CPU + CUDA activity):
``summary.torch_profile`` has per step the wall time, the device's kernel time, the top host
operations by self CPU time, the top kernels and the syncing operations (a diagnostic: tracing
slows the host).

With --sample, a thread samples every Python thread's innermost frame every 2 ms during every
window (the counts go into each row's meta): where the training thread and the pin-memory thread
spend their wall time.

    python -m benchmarks.bench_yolo_gap --out DIR        # H200: about 3 minutes
    python -m benchmarks.bench_yolo_gap --quick --device cpu
    python -m benchmarks.bench_yolo_gap --rows replay,default     # the limit and those rows only
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_yolo_gap.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks.bench_yolo import Bench, _close_loader, _count, _per_batch_ms, slot_meta  # noqa: E402
from benchmarks.bench_yolo import Sizes as YoloSizes  # noqa: E402
from pipeline_opt.loading.dataloader import clone_loader  # noqa: E402

NAME = "bench_yolo_gap"


@dataclass(frozen=True)
class Sizes:
    yolo: YoloSizes = YoloSizes(min_seconds=3.0, budget_s=200.0)
    busy_procs: int = 8
    busy_image: int = 640
    ring_batches: int = 16
    warmup_s: float = 8.0  # untimed steps once per row before its first window (fresh loaders warm up)
    more_workers: int = 12  # the worker count of the "12 workers" and "loader alone" rows
    timecourse_s: float = 0.0  # seconds of the fresh-loader time course (0: none)
    reserved_cores: int = 2  # "workers off N cores": cores (with SMT siblings) no worker may use


QUICK = Sizes(yolo=YoloSizes(n_train=16, image_size=(160, 120), imgsz=64, batch=2, default_workers=1, rounds=2,
                             budget_s=40.0, min_steps=2, min_seconds=0.0, max_seconds=1.0),
              busy_procs=1, busy_image=64, ring_batches=3, warmup_s=0.5, more_workers=2, timecourse_s=1.0,
              reserved_cores=1)


def _busy(stop: Any, size: int) -> None:
    """Worker-like CPU work until ``stop`` is set: JPEG decode and an affine warp, as Mosaic does."""
    import cv2
    import numpy as np

    cv2.setNumThreads(0)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (size * 3 // 4, size, 3), dtype=np.uint8)
    img = cv2.GaussianBlur(img, (0, 0), 3)  # photo-like, so the JPEG is not trivially small
    ok, jpeg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    m = np.array([[0.9, 0.1, 5.0], [-0.1, 0.9, 3.0]], dtype=np.float32)
    while not stop.is_set():
        dec = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
        cv2.warpAffine(dec, m, (size, size), borderValue=(114, 114, 114))


class BusyCPU:
    """``n`` processes of worker-like CPU work, started by ``start()`` and stopped by ``stop()``."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size
        self.ctx = mp.get_context("spawn")  # no CUDA state copied into the children
        self.event = None
        self.procs: list[Any] = []

    def process_args(self, k: int) -> tuple[Any, tuple]:
        """The target and arguments of the ``k``-th process."""
        return _busy, (self.event, self.size)

    def start(self) -> None:
        self.event = self.ctx.Event()
        self.procs = [self.ctx.Process(target=target, args=args, daemon=True)
                      for target, args in map(self.process_args, range(self.n))]
        for p in self.procs:
            p.start()
        time.sleep(1.0)  # spawned interpreters import cv2 before they load the CPU

    def stop(self) -> None:
        if self.event is not None:
            self.event.set()
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs = []


def _run_dataset(stop: Any, dataset: Any, start: int, step: int) -> None:
    """A loader worker's work without the delivery: ``dataset[i]`` in a loop, results dropped."""
    import cv2

    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    i = start
    while not stop.is_set():
        dataset[i % len(dataset)]
        i += step


class DatasetBusy(BusyCPU):
    """``n`` forked processes running the loader's own ``dataset.__getitem__`` (Mosaic, affine, HSV,
    decoding...) as fast as they can, delivering nothing: the workers' CPU and memory traffic without
    shared-memory batches, pinning or unpickling in the training process."""

    def __init__(self, n: int, dataset: Any) -> None:
        super().__init__(n, 0)
        self.ctx = mp.get_context("fork")  # as the loader's workers (no CUDA call in the children)
        self.dataset = dataset

    def process_args(self, k: int) -> tuple[Any, tuple]:
        return _run_dataset, (self.event, self.dataset, k, self.n)


class LoadedReplay:
    """The replayed batch while :class:`BusyCPU` runs (the Candidate's ``fresh`` source)."""

    def __init__(self, batch: dict, busy: BusyCPU) -> None:
        self.batch, self.busy = batch, busy
        busy.start()

    def __iter__(self):
        return H.replay(self.batch)

    def close(self) -> None:
        self.busy.stop()


def _where(frame: Any) -> str:
    code = frame.f_code
    return f"{'/'.join(Path(code.co_filename).parts[-2:])}:{frame.f_lineno} {code.co_name}"


class StackSampler:
    """Samples every other Python thread's innermost frame every ``interval`` seconds.

    A sample of a thread blocked in a C call (a CUDA launch, a queue wait, a GIL re-acquire) shows
    the Python line that made the call, so the counts say where each thread's wall time goes.
    """

    def __init__(self, interval: float = 0.002, top: int = 12) -> None:
        self.interval, self.top = interval, top
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        own = threading.get_ident()
        main = threading.main_thread().ident
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == own:
                    continue
                name = "training thread" if tid == main else f"{names.get(tid, 'thread')} #{tid % 100000}"
                self.counts[name][_where(frame)] += 1
            self.samples += 1

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        n = max(self.samples, 1)
        return {"samples": self.samples, "interval_s": self.interval,
                "threads": {name: [[where, round(k / n, 4)] for where, k in c.most_common(self.top)]
                            for name, c in self.counts.items()}}


def _faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of process ``pid`` so far; (0, 0) where /proc does not say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[7]), int(fields[9])
    except (OSError, IndexError, ValueError):
        return 0, 0


def worker_counters() -> dict[int, tuple[float, float, int, int]]:
    """Per child process of this one (the loaders' workers, mostly idle but for the measured
    row's): (user CPU s, system CPU s, minor faults, major faults)."""
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            out[child.pid] = (t.user, t.system, *_faults(child.pid))
        except psutil.Error:
            continue
    return out


def worker_deltas(before: dict[int, tuple], after: dict[int, tuple]) -> tuple[float, float, int, int]:
    """Summed (user s, system s, minor faults, major faults) the children did between two
    :func:`worker_counters` readings (a child started in between counts from zero)."""
    zero = (0.0, 0.0, 0, 0)
    sums = [0.0, 0.0, 0, 0]
    for pid, now in after.items():
        was = before.get(pid, zero)
        for k in range(4):
            sums[k] += max(now[k] - was[k], 0)
    return sums[0], sums[1], int(sums[2]), int(sums[3])


class _IntraOpThreads:
    """``torch.set_num_threads(n)`` for a block, the previous count restored after it (None: no-op)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.saved = n, None

    def __enter__(self) -> None:
        if self.n is not None:
            self.saved = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            torch.set_num_threads(self.saved)
            self.saved = None


class ProbedCandidate(H.Candidate):
    """A Candidate that also records, per window, busy cores, the training thread's CPU s/step and
    the worker processes' CPU seconds and page faults per batch."""

    def __init__(self, *args: Any, switch_interval: float | None = None, intra_op_threads: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.switch_interval = switch_interval
        self.intra_op_threads = intra_op_threads
        self.sample = False
        self.stacks: list[dict[str, Any]] = []
        self.busy_cores: list[float] = []
        self.thread_cpu_per_step: list[float] = []
        self.workers: list[dict[str, float]] = []

    def window(self, device: Any, **kw: Any) -> H.Window:
        with self.threads():
            return self._window(device, **kw)

    def threads(self) -> Any:
        """The training process's intra-op thread count set to this row's for the block (a no-op
        without ``intra_op_threads``): set once per window, as resizing the pools costs thread starts."""
        return _IntraOpThreads(self.intra_op_threads)

    def _window(self, device: Any, **kw: Any) -> H.Window:
        self.start()
        saved = sys.getswitchinterval()
        if self.switch_interval is not None:
            sys.setswitchinterval(self.switch_interval)
        sampler = StackSampler() if self.sample else None
        try:
            if sampler is not None:
                sampler.start()
            k0 = worker_counters()
            c0, t0, wall0 = psutil.cpu_times(), time.thread_time(), time.perf_counter()
            w = super().window(device, **kw)
            c1, t1, wall1 = psutil.cpu_times(), time.thread_time(), time.perf_counter()
            k1 = worker_counters()
        finally:
            sys.setswitchinterval(saved)
            if sampler is not None:
                self.stacks.append(sampler.stop())
        busy = sum(c1) - sum(c0) - (c1.idle - c0.idle) - (getattr(c1, "iowait", 0) - getattr(c0, "iowait", 0))
        wall_steps = w.steps + w.discarded
        self.busy_cores.append(busy / max(wall1 - wall0, 1e-9))  # discarded steps included
        self.thread_cpu_per_step.append((t1 - t0) / max(wall_steps, 1))
        user, system, minor, major = worker_deltas(k0, k1)
        batches = max(wall_steps, 1)  # the batches the window (its discarded ones included) consumed
        self.workers.append({"user_ms_per_batch": round(1e3 * user / batches, 2),
                             "sys_ms_per_batch": round(1e3 * system / batches, 2),
                             "minor_faults_per_batch": round(minor / batches, 1),
                             "major_faults_per_batch": round(major / batches, 2)})
        return w

    def reset_probes(self) -> None:
        """Forget what earlier windows recorded (after a warm-up window)."""
        self.busy_cores.clear()
        self.thread_cpu_per_step.clear()
        self.workers.clear()
        self.stacks.clear()

    def probe_meta(self) -> dict[str, Any]:
        def med(xs: list[float]) -> float | None:
            return statistics.median(xs) if xs else None

        return {"busy_cores_median": med(self.busy_cores), "busy_cores": self.busy_cores,
                **({"stacks": self.stacks} if self.stacks else {}),
                "train_thread_cpu_s_per_step_median": med(self.thread_cpu_per_step),
                "train_thread_cpu_s_per_step": self.thread_cpu_per_step,
                "workers_per_window": self.workers}


def _pinned_batches(bench: Bench, n: int) -> list[dict]:
    """``n`` consecutive real batches of the default loader, pinned (on CUDA)."""
    it = iter(bench.base.loader)
    batches = [next(it) for _ in range(n)]
    del it
    cuda = bench.device.type == "cuda"
    return [{k: (v.pin_memory() if isinstance(v, torch.Tensor) and cuda else v) for k, v in b.items()}
            for b in batches]


def _ring(batches: list[dict]) -> Any:
    """An endless iterator over ``batches`` in turn."""
    while True:
        yield from batches


class DrainedRing:
    """Replays ``batches`` in turn while taking (and dropping) one batch of ``loader`` per step."""

    def __init__(self, loader: Any, batches: list[dict]) -> None:
        self.loader, self.batches = loader, batches

    def __iter__(self):
        it = iter(self.loader)
        for batch in _ring(self.batches):
            try:
                next(it)
            except StopIteration:
                it = iter(self.loader)
                next(it)
            yield batch

    def close(self) -> None:
        _close_loader(self.loader)


class _Lazy:
    """A pipeline built the first time it is asked for (rows not selected cost nothing)."""

    def __init__(self, build: Any) -> None:
        self.build, self.value = build, None

    def __call__(self) -> Any:
        if self.value is None:
            self.value = self.build()
        return self.value


class SlotsRow:
    """The default loader's settings through shared slots, built once; its slot counts, the workers'
    time per batch and the receiving thread's go in the row's meta. ``page_locked=False`` leaves the
    slots pageable (a diagnostic: copies from them are then synchronous); ``workers`` overrides the
    worker count; ``name`` replaces the row's name; ``source()`` gives the loader to wrap (default:
    the default loader)."""

    def __init__(self, bench: Bench, page_locked: bool = True, workers: int | None = None,
                 name: str | None = None, source: Any = None) -> None:
        self.bench, self.loader, self.row, self.page_locked = bench, None, None, page_locked
        self.workers, self.name = workers, name
        self.source = source or (lambda: bench.base.loader)

    def candidate(self, step: Any, switch_interval: float | None = None) -> ProbedCandidate:
        name = self.name or "default, shared slots" + ("" if self.page_locked else ", not page-locked")
        meta = {"what": "default settings, images through reused worker buffers", "page_locked": self.page_locked,
                "workers": self.workers or self.bench.base.loader.num_workers}
        if switch_interval is not None:
            meta["switch_interval_s"] = switch_interval
        self.row = ProbedCandidate(name, self, step, count=_count, on_close=self.close, meta=meta,
                                   switch_interval=switch_interval)
        return self.row

    def __call__(self) -> Any:
        if self.loader is None:
            from pipeline_opt.loading import DeviceLoader
            from pipeline_opt.loading.shared_slots import slot_loader

            source = self.source()
            if self.workers is not None:
                source = slot_loader(source, num_workers=self.workers)
            self.loader = DeviceLoader(source, device=self.bench.device, reuse_buffers=True)
            if not self.page_locked:
                self.loader._receiver.register = False  # diagnostic only: no cudaHostRegister of the slots
        return self.loader

    def close(self, loader: Any) -> None:
        self.row.meta.update(slot_meta(loader))
        loader.close()


def copy_only(device: torch.device) -> Any:
    """The "loader alone" rows' step: the batch's images to the device, no training."""
    def step(batch: dict) -> None:
        batch["img"].to(device, non_blocking=True)

    return step


def timecourse(bench: Bench, step: Any, seconds: float, bucket_s: float = 2.0) -> dict[str, Any]:
    """Train ``seconds`` on a fresh clone of the default loader, from its first batch; per
    ``bucket_s`` of wall time: the throughput and the fraction of it spent waiting for data.
    The first bucket includes the workers' start."""
    loader = clone_loader(bench.base.loader)
    buckets: list[list[float]] = []  # [samples, wait s]
    t_start = time.perf_counter()
    try:
        it = iter(loader)
        while time.perf_counter() - t_start < seconds:
            tw = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:  # a small set's epoch ended
                it = iter(loader)
                batch = next(it)
            wait = time.perf_counter() - tw
            step(batch)
            k = int((time.perf_counter() - t_start) // bucket_s)
            while len(buckets) <= k:
                buckets.append([0.0, 0.0])
            buckets[k][0] += _count(batch)
            buckets[k][1] += wait
    finally:
        _close_loader(loader)
    return {"bucket_s": bucket_s, "workers": loader.num_workers,
            "throughput": [round(n / bucket_s, 1) for n, _ in buckets],
            "data_wait_frac": [round(w / bucket_s, 3) for _, w in buckets]}


class TimedCollate:
    """A loader's collate function, timed per worker (the default path's counterpart of the slot
    rows' worker timing): seconds between batches (loading samples, and idling while the prefetch
    queue is full, e.g. during other rows' windows) and collating."""

    def __init__(self, collate_fn: Any, workers: int) -> None:
        self.collate_fn = collate_fn
        self.counters = torch.zeros(workers, 3, dtype=torch.int64).share_memory_()  # batches, fetch ns, collate ns
        self.last_end_ns = 0

    def __call__(self, samples: list) -> Any:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None or info.id >= self.counters.shape[0]:
            return self.collate_fn(samples)
        start = time.perf_counter_ns()
        try:
            return self.collate_fn(samples)
        finally:
            end = time.perf_counter_ns()
            row = self.counters[info.id]
            row[0] += 1
            if self.last_end_ns:
                row[1] += start - self.last_end_ns
            row[2] += end - start
            self.last_end_ns = end

    def meta(self) -> dict[str, Any]:
        n, fetch, collate = self.counters.sum(dim=0).tolist()
        return {"batches": n, "worker_fetch_ms_per_batch": _per_batch_ms(fetch * 1e-9, n),
                "worker_collate_ms_per_batch": _per_batch_ms(collate * 1e-9, n)}


class TimedDefaultRow:
    """The default loader with its workers' time per batch measured (TimedCollate)."""

    def __init__(self, bench: Bench) -> None:
        self.bench, self.loader, self.timed, self.row = bench, None, None, None

    def candidate(self, step: Any) -> ProbedCandidate:
        self.row = ProbedCandidate("default, workers timed", self, step, count=_count, on_close=self.close,
                                   meta={"what": "the default loader, its collate function timed per worker"})
        return self.row

    def __call__(self) -> Any:
        if self.loader is None:
            base = self.bench.base.loader
            self.timed = TimedCollate(base.collate_fn, base.num_workers)
            self.loader = clone_loader(base, collate_fn=self.timed)
        return self.loader

    def close(self, loader: Any) -> None:
        self.row.meta["worker_stats"] = self.timed.meta()
        _close_loader(loader)


def _clone_sharing(loader: Any, strategy: str, **kw: Any) -> Any:
    """A clone of ultralytics' InfiniteDataLoader ``loader`` whose workers start under torch's
    ``strategy`` for sharing tensors (it starts them in its constructor, while the strategy is set)."""
    import torch.multiprocessing as tmp

    saved = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy(strategy)
    try:
        return clone_loader(loader, **kw)
    finally:
        tmp.set_sharing_strategy(saved)


def worker_cores(reserved: int) -> tuple[list[int], list[int]]:
    """(reserved, for the workers): the first ``reserved`` usable cores with their SMT siblings,
    and the usable cores left for the workers (all of them when nothing would be left)."""
    usable = sorted(os.sched_getaffinity(0))
    keep: set[int] = set()
    for core in usable[:reserved]:
        keep |= H.smt_siblings(core) or {core}
    rest = [c for c in usable if c not in keep]
    return sorted(keep & set(usable)), rest or usable


class WorkerPlacement:
    """A ``worker_init_fn`` that lowers each worker's priority and/or sets its CPU affinity, then
    calls the loader's own ``worker_init_fn``."""

    def __init__(self, inner: Any, nice: int = 0, cores: list[int] | None = None) -> None:
        self.inner, self.nice, self.cores = inner, nice, cores

    def __call__(self, worker_id: int) -> None:
        if self.nice:
            os.nice(self.nice)
        if self.cores:
            os.sched_setaffinity(0, self.cores)
        if self.inner is not None:
            self.inner(worker_id)


def placed(loader: Any, nice: int = 0, cores: list[int] | None = None) -> Any:
    """A clone of ``loader`` whose workers start through :class:`WorkerPlacement`."""
    return clone_loader(loader, worker_init_fn=WorkerPlacement(loader.worker_init_fn, nice=nice, cores=cores))


def candidates(bench: Bench, sizes: Sizes) -> list[ProbedCandidate]:
    batches = _pinned_batches(bench, sizes.ring_batches)
    batch = batches[0]
    step = bench.stepper(bench.base.step_fn)
    busy = BusyCPU(sizes.busy_procs, sizes.busy_image)
    y = sizes.yolo

    def build(**kw: Any) -> Any:
        kw.setdefault("workers", y.default_workers)
        return bench.build(bench.data_yaml, "yolo11n.yaml", imgsz=y.imgsz, batch=y.batch,
                           device=bench.device, amp=bench.amp, plots=False, close_mosaic=0, pretrained=False, **kw)

    slots, pageable_slots, timed = SlotsRow(bench), SlotsRow(bench, page_locked=False), TimedDefaultRow(bench)
    more = sizes.more_workers
    more_slots = SlotsRow(bench, workers=more, name=f"{more} workers, shared slots")
    alone_slots = SlotsRow(bench, name="loader alone: default, shared slots")
    alone_more_slots = SlotsRow(bench, workers=more, name=f"loader alone: {more} workers, shared slots")
    copy = copy_only(bench.device)
    cached, cached_gpu = _Lazy(lambda: build(cache="ram")), _Lazy(lambda: build(cache="ram", gpu_augment="force"))
    gpu_aug = _Lazy(lambda: build(gpu_augment="force"))
    gpu_aug_more = _Lazy(lambda: build(gpu_augment="force", workers=more))
    gpu_affine = _Lazy(lambda: build(gpu_augment="force", gpu_affine=True))
    gpu_meta = {"cpu_stages_disabled": ["RandomHSV", "RandomFlip(horizontal)"]}
    placement = worker_cores(sizes.reserved_cores)
    gpu_slots = SlotsRow(bench, name="default + GPU HSV/flip (fused), shared slots", source=lambda: gpu_aug().loader)
    gil_gpu_slots = SlotsRow(bench, name="default + GPU HSV/flip (fused), shared slots, GIL switch 0.2 ms",
                             source=lambda: gpu_aug().loader)
    affine_slots = SlotsRow(bench, name="default + GPU HSV/flip + affine, shared slots",
                            source=lambda: gpu_affine().loader)
    more_gpu_slots = SlotsRow(bench, workers=more, name=f"{more} workers + GPU HSV/flip (fused), shared slots",
                              source=lambda: gpu_aug().loader)
    return [
        ProbedCandidate("limit (replayed pinned batch)", lambda: H.replay(batch), step, count=_count, discard=3),
        ProbedCandidate(f"replay of {len(batches)} distinct pinned batches", lambda: _ring(batches), step,
                        count=_count, discard=3,
                        meta={"what": "consecutive real batches of the default loader, pinned, replayed in turn"}),
        ProbedCandidate(f"limit + {sizes.busy_procs} CPU-busy processes", lambda: LoadedReplay(batch, busy), step,
                        count=_count, discard=3, fresh=True, on_close=lambda src: src.close(),
                        meta={"busy": "cv2 JPEG decode + warpAffine loop per process"}),
        ProbedCandidate(f"limit + {y.default_workers} dataset processes",
                        lambda: LoadedReplay(batch, DatasetBusy(y.default_workers, bench.base.loader.dataset)), step,
                        count=_count, discard=3, fresh=True, on_close=lambda src: src.close(),
                        meta={"busy": "dataset[i] in a loop per forked process, results dropped"}),
        ProbedCandidate("limit + GPU HSV/flip (fused kernel)", lambda: H.replay(batch),
                        lambda b: bench.stepper(gpu_aug().step_fn)(b), count=_count, discard=3,
                        meta={**gpu_meta, "what": "the replayed batch through the GPU-augmenting step, no loader"}),
        ProbedCandidate("limit + GPU HSV/flip + affine", lambda: H.replay(batch),
                        lambda b: bench.stepper(gpu_affine().step_fn)(b), count=_count, discard=3,
                        meta={"cpu_stages_disabled": ["RandomHSV", "RandomFlip(horizontal)", "RandomPerspective"],
                              "what": "the replayed batch through the GPU affine + HSV/flip step, no loader"}),
        ProbedCandidate(f"default (ultralytics, workers={y.default_workers})", lambda: bench.base.loader, step,
                        count=_count, on_close=_close_loader),
        ProbedCandidate("cache=ram", lambda: cached().loader, lambda b: bench.stepper(cached().step_fn)(b),
                        count=_count, on_close=_close_loader),
        ProbedCandidate("cache=ram + GPU HSV/flip", lambda: cached_gpu().loader,
                        lambda b: bench.stepper(cached_gpu().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={"cpu_stages_disabled": ["RandomHSV", "RandomFlip(horizontal)"]}),
        ProbedCandidate("default + GPU HSV/flip (fused kernel)", lambda: gpu_aug().loader,
                        lambda b: bench.stepper(gpu_aug().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={**gpu_meta, "kernel": "pipeline_opt.transforms.fused (one Triton kernel)"}),
        ProbedCandidate("default + GPU HSV/flip (fused), 1 intra-op thread", lambda: clone_loader(gpu_aug().loader),
                        lambda b: bench.stepper(gpu_aug().step_fn)(b), count=_count, on_close=_close_loader,
                        intra_op_threads=1,
                        meta={**gpu_meta, "intra_op_threads": 1,
                              "what": "torch.set_num_threads(1) in the training process during its windows"}),
        ProbedCandidate("default + GPU HSV/flip, torch ops", lambda: clone_loader(gpu_aug().loader),
                        lambda b: bench.stepper(H.AttrDuring(gpu_aug().step_fn, gpu_aug().augment, "fused", False))(b),
                        count=_count, on_close=_close_loader,
                        meta={**gpu_meta, "kernel": "torch operations (augment.fused=False during the step)"}),
        gpu_slots.candidate(lambda b: bench.stepper(gpu_aug().step_fn)(b)),
        gil_gpu_slots.candidate(lambda b: bench.stepper(gpu_aug().step_fn)(b), switch_interval=0.0002),
        ProbedCandidate("default + GPU HSV/flip + affine (gpu_affine)", lambda: gpu_affine().loader,
                        lambda b: bench.stepper(gpu_affine().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={"cpu_stages_disabled": ["RandomHSV", "RandomFlip(horizontal)", "RandomPerspective"],
                              "what": "RandomPerspective's gains on the GPU; the workers crop the Mosaic canvas"}),
        affine_slots.candidate(lambda b: bench.stepper(gpu_affine().step_fn)(b)),
        ProbedCandidate("default + GPU HSV/flip (fused), workers nice 10", lambda: placed(gpu_aug().loader, nice=10),
                        lambda b: bench.stepper(gpu_aug().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={**gpu_meta, "worker_nice": 10}),
        ProbedCandidate(f"default + GPU HSV/flip (fused), workers off {sizes.reserved_cores} cores",
                        lambda: placed(gpu_aug().loader, cores=placement[1]),
                        lambda b: bench.stepper(gpu_aug().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={**gpu_meta, "reserved_cores": placement[0], "worker_cores": placement[1]}),
        ProbedCandidate(f"{more} workers + GPU HSV/flip (fused kernel)", lambda: gpu_aug_more().loader,
                        lambda b: bench.stepper(gpu_aug_more().step_fn)(b), count=_count, on_close=_close_loader,
                        meta={**gpu_meta, "workers": more}),
        ProbedCandidate("default, GIL switch 0.2 ms", lambda: clone_loader(bench.base.loader), step, count=_count,
                        on_close=_close_loader, switch_interval=0.0002, meta={"switch_interval_s": 0.0002}),
        ProbedCandidate("default, pin_memory=False", lambda: clone_loader(bench.base.loader, pin_memory=False), step,
                        count=_count, on_close=_close_loader),
        timed.candidate(step),
        slots.candidate(step),
        pageable_slots.candidate(step),
        ProbedCandidate(f"{more} workers", lambda: clone_loader(bench.base.loader, num_workers=more), step,
                        count=_count, on_close=_close_loader, meta={"workers": more}),
        more_slots.candidate(step),
        more_gpu_slots.candidate(lambda b: bench.stepper(gpu_aug().step_fn)(b)),
        ProbedCandidate(f"loader alone: default (workers={y.default_workers})", lambda: clone_loader(bench.base.loader),
                        copy, count=_count, on_close=_close_loader,
                        meta={"what": "the loader drained, images copied to the device, no training step"}),
        ProbedCandidate(f"loader alone: {more} workers", lambda: clone_loader(bench.base.loader, num_workers=more),
                        copy, count=_count, on_close=_close_loader, meta={"workers": more}),
        alone_slots.candidate(copy),
        alone_more_slots.candidate(copy),
        ProbedCandidate(f"ring + loader drained (replay of {len(batches)}, default loader running)",
                        lambda: DrainedRing(clone_loader(bench.base.loader), batches), step, count=_count,
                        on_close=lambda src: src.close(),
                        meta={"what": "each step takes and drops one batch of the default loader, trains on the ring"}),
        ProbedCandidate("ring + loader drained, pin_memory=False",
                        lambda: DrainedRing(clone_loader(bench.base.loader, pin_memory=False), batches), step,
                        count=_count, on_close=lambda src: src.close()),
        ProbedCandidate("ring + loader drained, file_system sharing",
                        lambda: DrainedRing(_clone_sharing(bench.base.loader, "file_system"), batches), step,
                        count=_count, on_close=lambda src: src.close(),
                        meta={"sharing_strategy": "file_system"}),
    ]


_SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
             "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::unique", "aten::_unique2")


def _per_step(total_us: float, steps: int) -> float:
    return round(total_us / 1e3 / max(steps, 1), 3)


def _call_site(event: Any, depth: int = 4) -> str:
    """The nearest Python frames above a profiled operation (torch's own frames skipped)."""
    frames, parent = [], event.cpu_parent
    while parent is not None and len(frames) < depth:
        name = parent.name
        if ".py(" in name and not name.startswith(("torch/", "<built-in")) and "/torch/" not in name:
            frames.append(name)
        parent = parent.cpu_parent
    return " < ".join(frames)


def _by_call_site(events: Any, steps: int, top: int) -> list[list[Any]]:
    """Host operations' self CPU time per step grouped by (operation, Python call site)."""
    total: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if ".py(" in e.name or e.name.startswith("<built-in"):
            continue
        acc = total[(e.name, f"[thread {e.thread}] {_call_site(e)}")]
        acc[0] += e.self_cpu_time_total
        acc[1] += 1
    ranked = sorted(total.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    return [[op, _per_step(us, steps), round(n / steps, 1), site] for (op, site), (us, n) in ranked]


def _on_device(event: Any) -> bool:
    """Whether a profiler event is device work itself (a kernel, memcpy, memset), not a host operation."""
    return str(getattr(event, "device_type", "")).endswith(("CUDA", "PrivateUse1"))


def torch_profile(cand: ProbedCandidate, device: torch.device, steps: int, warm_steps: int = 10,
                  top: int = 12, stacks: bool = False) -> dict[str, Any]:
    """``steps`` steps of ``cand`` under torch.profiler (CPU + CUDA activity), after ``warm_steps``.

    Per step: wall time, the device's kernel time, the training thread's top operations by self CPU
    time (a host sync shows as cudaStreamSynchronize / _local_scalar_dense time), the top kernels
    by device time, and the known syncing operations with their counts. A diagnostic of where the
    step's time goes, not a throughput (tracing slows the host by ~20%). With ``stacks`` the top
    host operations are also listed by their Python call site (``top_cpu_by_stack``)."""
    with cand.threads():
        return _torch_profile(cand, device, steps, warm_steps, top, stacks)


def _torch_profile(cand: ProbedCandidate, device: torch.device, steps: int, warm_steps: int, top: int,
                   stacks: bool) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    cand.start()
    for _ in range(warm_steps):
        cand.step(cand._next())
    H.sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts, with_stack=stacks) as prof:
        for _ in range(steps):
            cand.step(cand._next())
        H.sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()

    def dev(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

    by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    by_dev = sorted(events, key=dev, reverse=True)[:top]
    by_stack = _by_call_site(prof.events(), steps, 2 * top) if stacks else []
    return {
        **({"top_cpu_by_stack": by_stack} if stacks else {}),
        "steps": steps, "wall_ms_per_step": round(1e3 * wall / steps, 2),
        # kernels and copies only: an operation's own device time repeats its kernels' (the JSON of
        # 0b869ae..cab8f1c summed both, about twice the kernel time)
        "device_ms_per_step": _per_step(sum(dev(e) for e in events if _on_device(e)), steps),
        "cpu_ms_per_step": _per_step(sum(e.self_cpu_time_total for e in events), steps),
        "top_cpu": [[e.key, _per_step(e.self_cpu_time_total, steps), round(e.count / steps, 1)] for e in by_cpu],
        "top_device": [[e.key[:90], _per_step(dev(e), steps), round(e.count / steps, 1)] for e in by_dev if dev(e) > 0],
        "syncs": {e.key: [_per_step(e.self_cpu_time_total, steps), round(e.count / steps, 1)]
                  for e in events if e.key in _SYNC_OPS},
    }


def trace_rows(cands: list[ProbedCandidate], device: torch.device, steps: int, stacks: bool, budget_s: float,
               into: dict[str, Any], on_row: Any = None) -> dict[str, Any]:
    """:func:`torch_profile` of each row into ``into[name]``, each row's source closed after its
    trace; rows not started within ``budget_s`` are skipped (said in their entry), a failing row is
    recorded with its error, and ``on_row()`` runs after each row (the script rewrites its JSON, so
    a run cut short keeps the rows traced so far)."""
    until = H.Deadline(budget_s)
    for c in cands:
        try:
            if until.expired():
                into[c.name] = {"skipped": f"the {budget_s:.0f} s tracing budget ran out"}
                continue
            into[c.name] = torch_profile(c, device, steps, stacks=stacks)
        except Exception as exc:  # a diagnostic: one failing row must not lose the measured ones
            into[c.name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            c.close()
        if on_row is not None:
            on_row()
    return into


def select(cands: list[ProbedCandidate], rows: str | None) -> list[ProbedCandidate]:
    """The limit row and the rows whose names start with one of the comma-separated ``rows``
    (``_`` stands for a space, so that a prefix can be passed through a shell variable unquoted;
    a trailing ``$`` asks for the whole name: ``default,_shared_slots$``)."""
    if not rows:
        return cands
    pieces: list[str] = []
    for w in rows.split(","):  # "default,_shared" is the prefix "default, shared" (a name with a comma)
        if w.startswith("_") and pieces:
            pieces[-1] += "," + w
        else:
            pieces.append(w)
    wanted = [w.strip().replace("_", " ") for w in pieces if w.strip()]

    def matches(name: str, w: str) -> bool:  # a trailing "$" asks for the whole name
        return name == w[:-1] if w.endswith("$") else name.startswith(w)

    picked = [c for c in cands[1:] if any(matches(c.name, w) for w in wanted)]
    if not picked:
        raise SystemExit(f"--rows {rows!r} matches no row; the rows are: {[c.name for c in cands]}")
    return [cands[0], *picked]


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = QUICK if args.quick else Sizes()
    y = sizes.yolo
    if args.rounds:
        y = replace(y, rounds=args.rounds)
    if args.budget_s:
        y = replace(y, budget_s=args.budget_s)
    sizes = replace(sizes, yolo=y)
    if getattr(args, "warmup_s", None) is not None:
        sizes = replace(sizes, warmup_s=args.warmup_s)
    if getattr(args, "timecourse_s", None) is not None:
        sizes = replace(sizes, timecourse_s=args.timecourse_s)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    data_yaml, gen_s = H.yolo_dataset(y.n_train, y.image_size, seed=args.seed)
    bench = Bench(data_yaml, y, device)
    cands = select(candidates(bench, sizes), args.rows)
    for c in cands:
        c.sample = args.sample
        if not c.fresh:
            c.warmup_s = sizes.warmup_s
    cands[0].window(device, min_steps=3, min_seconds=0.0, max_seconds=5.0)  # cuDNN + allocator warm-up
    cands[0].reset_probes()
    course = timecourse(bench, cands[0].step, sizes.timecourse_s) if sizes.timecourse_s > 0 else None
    # with --torch-profile the sources stay open for the traced steps (a closed ultralytics loader
    # cannot be iterated again); each is closed right after its trace
    measured = H.interleave(cands, y.rounds, device, deadline=H.Deadline(y.budget_s), min_steps=y.min_steps,
                            min_seconds=y.min_seconds, max_seconds=y.max_seconds, close=not args.torch_profile)
    for c in cands:
        c.meta.update(c.probe_meta())
    default_name = f"default (ultralytics, workers={y.default_workers})"
    summary: dict[str, Any] = {}

    def write() -> tuple[Path, list[H.Row]]:
        """The rows and summary from the rows' current meta (a row's source adds to it when it is
        closed, e.g. the shared slots' counts, after its trace with --torch-profile), written out."""
        rows = H.rows_of(cands, measured)
        limit = rows[0]
        rows = [r.with_extra(efficiency=H.ratio(r, limit)) for r in rows]
        by = {r.name: r for r in rows}
        summary.update({"dataset_generation_s": gen_s, "cores": H.usable_cores(),
                        "vs limit": {r.name: H.ratio(r, limit) for r in rows[1:]},
                        "busy cores": {c.name: c.meta["busy_cores_median"] for c in cands},
                        "train thread CPU s/step": {c.name: c.meta["train_thread_cpu_s_per_step_median"]
                                                    for c in cands},
                        "cache=ram vs default": H.ratio(by.get("cache=ram"), by.get(default_name)),
                        **({"timecourse": course} if course is not None else {})})
        path = H.write_result(args.out, NAME, rows, config={**asdict(sizes), "device": str(device)}, summary=summary,
                              started=started, ledger={"model": "yolo11n", "batch": y.batch, "resolution": y.imgsz,
                                                       "ddp": False, "amp": bench.amp})
        return path, rows

    path, rows = write()  # the measured rows are kept even if the tracing below is cut short
    if args.torch_profile:
        summary["torch_profile"] = {}
        trace_rows(cands, device, args.torch_profile, args.profile_stacks, args.profile_budget_s,
                   summary["torch_profile"], on_row=write)
        path, rows = write()
    print(H.format_table(rows, title=f"{NAME} ({device})"))
    return path


def main(argv: list[str] | None = None) -> int:
    p = H.common_parser(__doc__.splitlines()[0])
    p.add_argument("--rows", default=None, help="comma-separated row-name prefixes to measure (the limit always)")
    p.add_argument("--torch-profile", type=int, default=0, metavar="STEPS",
                   help="after the windows, trace STEPS steps of every row with torch.profiler (summary.torch_profile)")
    p.add_argument("--profile-budget-s", type=float, default=150.0,
                   help="with --torch-profile: rows not started within this many seconds are skipped (default 150)")
    p.add_argument("--profile-stacks", action="store_true",
                   help="with --torch-profile: also the top host operations by Python call site")
    p.add_argument("--sample", action="store_true", help="sample every thread's Python frame every 2 ms per window")
    p.add_argument("--warmup-s", type=float, default=None, help="untimed steps per row before its first window "
                                                                 "(default 8)")
    p.add_argument("--timecourse-s", type=float, default=None,
                   help="first train this long on a fresh default loader, throughput per 2 s (default 0: off)")
    args = p.parse_args(argv)
    return H.main_of(args, run)


if __name__ == "__main__":
    sys.exit(main())
