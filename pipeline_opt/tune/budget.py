"""The resource budget that bounds the tuner's search space.

How many DataLoader workers this process may run is limited by four things, each recorded with
its reason so the report can say why a candidate was capped or skipped:

* **CPU**: the cores in ``os.sched_getaffinity`` divided among the local distributed ranks, minus
  what the training process itself needs: the main thread's step, the pin-memory thread when
  pinning to an accelerator. That share comes from measurement where the baseline profile has it:
  with ``c`` CPU seconds per step in the training process and ``b`` CPU seconds per batch in a
  worker, a pipeline that keeps every core busy gives the training process ``c / (c + b)`` of them
  (a main thread that waits most of each step does not own a core; one that launches kernels all
  step long does). It is never more than the fixed rule it replaces (one core for the main
  thread, one for the pin-memory thread), which stays the rule when nothing was measured. A
  worker that mostly waits (I/O, sleep) needs only a fraction of a core, so the cap is
  ``usable_cpus / cpu_fraction`` rounded to the nearest worker (a worker left half a core or more
  is worth a trial: on a small machine whose main thread mostly waits, workers sharing the cores
  with it can still beat none; the trials decide) and bounded by an oversubscription ceiling.
* **RAM**: available memory divided by the memory one worker needs.
* **/dev/shm**: every worker keeps ``prefetch_factor`` batches in shared memory.
* **the dataset**: more workers than batches per epoch never helps.

:func:`compute_budget` is the pure arithmetic (unit-tested with injected numbers);
:func:`probe_budget` gathers the numbers of this machine and this loader.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from pipeline_opt._core import distributed
from pipeline_opt._core.log import get_logger
from pipeline_opt._core.sched import thread_sched
from pipeline_opt._core.step import iter_leaves, tensor_bytes
from pipeline_opt.loading.dataloader import clone_loader
from pipeline_opt.profile.cpu_share import reserved_cpus

log = get_logger("tune.budget")

DEFAULT_WORKER_RAM_BYTES = 256 * 2**20  # used when no worker has been measured yet
RAM_FRACTION = 0.8  # share of available RAM the workers may take
SHM_FRACTION = 0.5  # share of free /dev/shm the prefetched batches may take
OVERSUBSCRIBE = 8  # at most this many workers per usable core, however idle they are
MIN_CPU_FRACTION = 1.0 / OVERSUBSCRIBE


@dataclass(frozen=True)
class ResourceBudget:
    """How many workers (and how much prefetch) this process may use, and why."""

    max_workers: int
    binding: str  # the limit that set max_workers: cpu | ram | shm | batches | user
    cpus_in_affinity: int
    local_ranks: int
    usable_cpus: float  # per rank, after the main and pin-memory threads
    cpu_fraction: float  # share of a core one worker keeps busy (measured on a probe batch)
    cpu_cap: int
    ram_available_bytes: int
    ram_per_worker_bytes: int
    ram_cap: int
    shm_free_bytes: int | None
    bytes_per_batch: int
    shm_cap: int | None  # workers the shm allows at the given prefetch factor (None: no /dev/shm)
    batches_per_epoch: int | None
    user_cap: int | None
    reasons: tuple[str, ...] = ()
    reserved_cpus: float = 0.0  # per rank, for the training process (main and pin-memory threads)
    main_cpu_s: float | None = None  # measured CPU seconds per step of the training process (None: not measured)
    worker_cpu_s: float | None = None  # CPU seconds a worker spends per batch (None: not measured)

    def shm_allows(self, num_workers: int, prefetch_factor: int | None) -> tuple[bool, str]:
        """Whether ``num_workers * prefetch_factor`` batches fit in the /dev/shm share."""
        if num_workers == 0 or self.shm_free_bytes is None or self.bytes_per_batch <= 0:
            return True, ""
        need = self.bytes_per_batch * (prefetch_factor or 2) * num_workers
        limit = SHM_FRACTION * self.shm_free_bytes
        if need > limit:
            return False, (f"needs {need / 2**20:.0f} MiB of /dev/shm ({num_workers} workers x prefetch "
                           f"{prefetch_factor} x {self.bytes_per_batch / 2**20:.1f} MiB per batch), "
                           f"over {SHM_FRACTION:.0%} of the {self.shm_free_bytes / 2**20:.0f} MiB free")
        return True, ""

    def allows(self, num_workers: int, prefetch_factor: int | None) -> tuple[bool, str]:
        """``(True, "")`` when the configuration fits, else ``(False, why)``."""
        if num_workers > self.max_workers:
            return False, f"num_workers={num_workers} is over the budget of {self.max_workers} ({self.binding}-bound)"
        return self.shm_allows(num_workers, prefetch_factor)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def compute_budget(
    *,
    cpus: int,
    local_ranks: int = 1,
    pin_thread: bool = False,
    cpu_fraction: float = 1.0,
    main_cpu_s: float | None = None,
    worker_cpu_s: float | None = None,
    pin_cpu_s: float = 0.0,
    ram_available_bytes: int,
    ram_per_worker_bytes: int = DEFAULT_WORKER_RAM_BYTES,
    shm_free_bytes: int | None = None,
    bytes_per_batch: int = 0,
    prefetch_factor: int = 2,
    batches_per_epoch: int | None = None,
    user_max: int | None = None,
) -> ResourceBudget:
    """The budget from plain numbers (no probing); every cap comes with a sentence in ``reasons``.

    ``main_cpu_s`` (the training process's CPU seconds per step), ``worker_cpu_s`` (a worker's CPU
    seconds per batch) and ``pin_cpu_s`` (the pin-memory thread's per batch, when the measured
    process did not pin yet) size the training process's reserve (:func:`reserved_cpus`)."""
    if cpus < 1:
        raise ValueError(f"cpus={cpus!r} must be >= 1")
    if local_ranks < 1:
        raise ValueError(f"local_ranks={local_ranks!r} must be >= 1")
    reasons: list[str] = []
    per_rank = cpus / local_ranks
    reserved, why = reserved_cpus(per_rank, pin_thread, main_cpu_s, worker_cpu_s, pin_cpu_s)
    usable = max(1.0, per_rank - reserved)
    frac = min(1.0, max(MIN_CPU_FRACTION, float(cpu_fraction)))
    cpu_cap = max(1, int(math.floor(usable / frac + 0.5)))
    reasons.append(
        f"cpu: {cpus} core(s) in the affinity mask / {local_ranks} local rank(s) - {why} = {usable:.2f} usable; "
        f"a worker keeps {frac:.0%} of a core busy -> up to {cpu_cap} workers"
    )
    per_worker = max(1, int(ram_per_worker_bytes))
    ram_cap = max(1, int(RAM_FRACTION * ram_available_bytes // per_worker))
    reasons.append(f"ram: {ram_available_bytes / 2**30:.1f} GiB available x {RAM_FRACTION:.0%} / "
                   f"{per_worker / 2**20:.0f} MiB per worker -> up to {ram_cap} workers")
    shm_cap = None
    if shm_free_bytes is not None and bytes_per_batch > 0:
        shm_cap = max(1, int(SHM_FRACTION * shm_free_bytes // (bytes_per_batch * max(1, prefetch_factor))))
        reasons.append(f"shm: {shm_free_bytes / 2**20:.0f} MiB free in /dev/shm x {SHM_FRACTION:.0%} / "
                       f"({bytes_per_batch / 2**20:.2f} MiB per batch x prefetch {prefetch_factor}) -> up to "
                       f"{shm_cap} workers")
    caps = {"cpu": cpu_cap, "ram": ram_cap}
    if shm_cap is not None:
        caps["shm"] = shm_cap
    if batches_per_epoch is not None and batches_per_epoch > 0:
        caps["batches"] = batches_per_epoch
        reasons.append(f"batches: {batches_per_epoch} batch(es) per epoch -> more workers than that never help")
    if user_max is not None:
        caps["user"] = user_max
        reasons.append(f"user: max_workers={user_max}")
    binding = min(caps, key=lambda k: (caps[k], k != "user"))
    return ResourceBudget(
        max_workers=int(caps[binding]), binding=binding, cpus_in_affinity=cpus, local_ranks=local_ranks,
        usable_cpus=usable, cpu_fraction=frac, cpu_cap=cpu_cap, ram_available_bytes=int(ram_available_bytes),
        ram_per_worker_bytes=per_worker, ram_cap=ram_cap, shm_free_bytes=shm_free_bytes,
        bytes_per_batch=int(bytes_per_batch), shm_cap=shm_cap, batches_per_epoch=batches_per_epoch,
        user_cap=user_max, reasons=tuple(reasons), reserved_cpus=reserved, main_cpu_s=main_cpu_s,
        worker_cpu_s=worker_cpu_s,
    )


# ---------------------------------------------------------------- probing this machine / loader


def affinity_cpus() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where unsupported)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_world_size() -> int:
    """Processes of this job on this host (torchrun's LOCAL_WORLD_SIZE, or the process group's size)."""
    return distributed.local_world_size()


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes in the shared-memory file system, or None where there is none."""
    try:
        return int(shutil.disk_usage(path).free)
    except OSError:
        return None


@dataclass(frozen=True)
class BatchProbe:
    """One batch produced in the main process: wall, CPU and run-queue seconds, and its size in bytes."""

    wall_s: float
    cpu_s: float
    bytes: int
    runqueue_s: float = 0.0  # runnable but waiting for a core (other processes' load), not the dataset's own wait
    pin_cpu_s: float = 0.0  # CPU seconds to copy the batch into page-locked memory (0: no accelerator here)

    @property
    def cpu_fraction(self) -> float:
        """Share of a core the batch needs when it has one: cpu / (wall - time waiting for a core)."""
        own = max(self.wall_s - self.runqueue_s, self.cpu_s)
        return 1.0 if own <= 0 else min(1.0, self.cpu_s / own)


def probe_batch(loader: Any, check: Callable[[Any], None] | None = None) -> BatchProbe | None:
    """Produce one batch of ``loader`` in this process (a 0-worker clone) and time it; None on error.

    ``check(batch)`` then runs on that batch (the front door's step validation,
    :class:`pipeline_opt._core.step.CheckedStep`); its errors propagate, the loader's do not (the
    baseline measurement surfaces those with context)."""

    try:
        clone = clone_loader(loader, num_workers=0)
        it = iter(clone)
        s0, c0, t0 = thread_sched(), time.process_time(), time.perf_counter()
        batch = next(it)
        wall, cpu, s1 = time.perf_counter() - t0, time.process_time() - c0, thread_sched()
        del it
    except Exception as exc:  # the baseline measurement surfaces real errors with context
        log.debug("batch probe failed (%s); assuming CPU-bound workers", exc)
        return None
    if check is not None:
        check(batch)
    runqueue = 0.0
    if s0 is not None and s1 is not None:
        runqueue = max(0.0, s1[1] - s0[1])
        cpu = max(cpu, s1[0] - s0[0])
    return BatchProbe(wall_s=wall, cpu_s=cpu, bytes=tensor_bytes(batch), runqueue_s=runqueue,
                      pin_cpu_s=pin_cpu_seconds(batch))


def pin_cpu_seconds(batch: Any) -> float:
    """CPU seconds the pin-memory thread spends on ``batch`` (copying it into page-locked memory),
    measured on a second copy (the first allocates the host cache); 0.0 without an accelerator."""
    if not torch.cuda.is_available():
        return 0.0
    tensors = [t for t in iter_leaves(batch) if t.device.type == "cpu"]
    if not tensors:
        return 0.0
    try:
        for t in tensors:
            t.pin_memory()
        c0 = time.thread_time()
        for t in tensors:
            t.pin_memory()
        return time.thread_time() - c0
    except RuntimeError as exc:  # no usable driver: the pin-memory thread is then not measurable
        log.debug("could not time pinning (%s)", exc)
        return 0.0


def measured_cpu(report: Any, probe: BatchProbe | None, pin_thread: bool) -> tuple[float | None, float | None, float]:
    """``(main_cpu_s, worker_cpu_s, pin_cpu_s)`` for :func:`compute_budget` from the baseline
    profile and the probe batch; None where not measured.

    The training process's CPU per step is the profile's ``main_cpu_s``; a worker's CPU per batch
    is the profile's worker seconds per batch times the probe's CPU fraction (the probe's own CPU
    seconds without a profile); the pin-memory thread's is the probe's pinning time unless the
    profiled loader pinned with workers already (its thread is then in ``main_cpu_s``)."""
    main = getattr(report, "main_cpu_s", 0.0) or None
    batch_wall = getattr(report, "batch_cpu_s", 0.0) or 0.0
    if batch_wall > 0:
        worker = batch_wall * (probe.cpu_fraction if probe is not None else 1.0)
    else:
        worker = probe.cpu_s if probe is not None and probe.cpu_s > 0 else None
    config = getattr(report, "loader_config", None) or {}
    pinned_already = bool(config.get("pin_memory")) and int(config.get("num_workers") or 0) > 0
    pin = probe.pin_cpu_s if pin_thread and probe is not None and not pinned_already else 0.0
    return main, worker, pin


def probe_budget(
    loader: Any,
    *,
    pin_thread: bool,
    worker_rss_bytes: int | None = None,
    user_max: int | None = None,
    probe: BatchProbe | None = None,
    report: Any = None,
) -> ResourceBudget:
    """The budget of this process for ``loader`` (affinity, LOCAL_WORLD_SIZE, RAM, /dev/shm, probe batch;
    the training process's CPU reserve from the baseline ``report``, a ProfileReport, when given)."""
    probe = probe if probe is not None else probe_batch(loader)
    per_worker = DEFAULT_WORKER_RAM_BYTES if not worker_rss_bytes else int(worker_rss_bytes)
    prefetch = loader.prefetch_factor if loader.num_workers > 0 and loader.prefetch_factor else 2
    if probe is not None:
        per_worker += probe.bytes * prefetch
    try:
        batches = len(loader)
    except TypeError:
        batches = None
    main_cpu, worker_cpu, pin_cpu = measured_cpu(report, probe, pin_thread)
    return compute_budget(
        cpus=affinity_cpus(), local_ranks=local_world_size(), pin_thread=pin_thread,
        cpu_fraction=1.0 if probe is None else probe.cpu_fraction,
        main_cpu_s=main_cpu, worker_cpu_s=worker_cpu, pin_cpu_s=pin_cpu,
        ram_available_bytes=int(psutil.virtual_memory().available), ram_per_worker_bytes=per_worker,
        shm_free_bytes=shm_free_bytes(), bytes_per_batch=0 if probe is None else probe.bytes,
        prefetch_factor=prefetch, batches_per_epoch=batches, user_max=user_max,
    )
