"""Batches delivered through shared-memory slots that the DataLoader workers reuse.

A stock DataLoader worker puts every batch in a *fresh* shared-memory segment; the training process
maps it, faults its pages in, copies it into pinned memory (``pin_memory=True``) and unmaps it. For
a YOLO batch (64 x 3 x 640 x 640 uint8 = 79 MB) at ~14 batches/s that is ~1 GB/s of page-table work
in the training process, and it can slow a launch-bound training step noticeably (the same
loader drained next to a replayed batch costs as much; ``benchmarks/bench_yolo_gap.py`` measures it).

With shared slots each worker owns ``slots_per_worker`` shared-memory buffers and writes every
batch's image tensor into one of them (stacking straight into it where the collate function is
known). torch's sharing keeps one mapping per segment in the receiving process, so a slot is
mapped once, and :class:`SlotReceiver` registers it with CUDA (``cudaHostRegister``) once: the copy
to the GPU is an asynchronous DMA from the slot, with no pinning copy and no page faults. The
receiver hands a slot back (:meth:`SlotReceiver.release`) once the copy out of it has finished.

Once the training process holds a slot's storage (it received one batch of it the ordinary way),
the worker sends the next batches of that slot *by reference*: the image and the batch's other
tensors (boxes, labels, indices) are written into the slot and the batch carries small
:class:`SlotRef` placeholders that :meth:`SlotReceiver.receive` turns back into tensors. Such a batch
pickles without a single file descriptor: the ordinary path hands one descriptor per tensor over
through the worker's resource-sharer thread, which has to wait for that busy worker's GIL.

Safety rules:

* A worker writes a slot only after the training process released it; a worker that finds none
  free, or cannot allocate one, returns the batch the ordinary way (counted in :meth:`SlotPool.stats`).
  It never waits, so a consumer that never releases cannot stall the loader.
* Every claim carries a ticket (worker pid and a counter), written into the slot's header and into
  the pool's flag; a release only clears a flag that still holds the ticket of the batch released.
  A new incarnation of a worker (a fresh epoch of a non-persistent loader) allocates its own slots,
  so a late release of a batch of the previous incarnation cannot free a slot in use.
* Two live processes with the same worker id (two concurrent iterators of one non-persistent loader)
  are detected: the second uses the ordinary path.
* A worker sends a reference only to a storage the receiver has said it holds (the pool's ``known``
  flag carries that storage's id); a new receiver, a closed one and a new worker incarnation clear
  those flags. A reference the receiver cannot resolve raises, it is never guessed.

Nothing here changes which samples a batch holds or their order: only where the image bytes live.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import image_key, iter_leaves, map_leaves
from pipeline_opt.loading.batch_formats import StackedCollate, find_collate, stacked_collate_of
from pipeline_opt.loading.dataloader import clone_loader, loader_config

__all__ = ["ReceiveStats", "SlotCollate", "SlotPool", "SlotReceiver", "SlotRef", "SlotStats", "slot_loader"]

log = get_logger("shared_slots")

MAGIC = 0x706F5F736C6F7473  # "po_slots"
HEADER_BYTES = 64  # magic, flag index, ticket, storage id; 64 keeps the payload aligned for every dtype
ALIGN = 64  # every tensor packed into a slot starts at a multiple of this
PACK_RESERVE_MIN = 256 * 1024  # room in a slot beyond its image for the batch's other tensors
LOCK_TIMEOUT_S = 1.0
DEFAULT_EXTRA_SLOTS = 2  # beyond prefetch_factor: the batch being copied and the one before it

# counters per worker (columns of SlotPool.counters)
_SLOTTED, _BUSY, _ALLOC_FAILED, _UNSUPPORTED, _BY_REF, _FETCH_NS, _COLLATE_NS = range(7)


@dataclass(frozen=True)
class SlotStats:
    """How the workers delivered their batches' image tensors."""

    slotted: int  # written into a reused slot
    all_busy: int  # the ordinary way: every slot of the worker was still held by the consumer
    alloc_failed: int  # the ordinary way: a slot could not be allocated (shared memory full)
    unsupported: int  # the ordinary way: no image tensor, or a second live process with the same worker id
    by_ref: int = 0  # of ``slotted``: sent as references to a slot the receiver holds (no descriptors)
    fetch_s: float = 0.0  # the workers' seconds between collate calls: loading samples, and idling while no task waits
    collate_s: float = 0.0  # the workers' seconds collating (writing the slots included)

    @property
    def batches(self) -> int:
        return self.total

    @property
    def total(self) -> int:
        return self.slotted + self.all_busy + self.alloc_failed + self.unsupported

    @property
    def slotted_frac(self) -> float:
        return self.slotted / self.total if self.total else 0.0


class SlotPool:
    """The shared state of one loader's slots: a flag per slot, its owner per worker, counters, a lock.

    Created in the training process before the workers start; the workers get it with the collate
    function (inherited on fork, pickled through torch's shared-memory reductions on spawn).
    """

    def __init__(self, num_workers: int, slots_per_worker: int, context: Any = None) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be an integer >= 1 (slots need worker processes)")
        if not isinstance(slots_per_worker, int) or slots_per_worker < 1:
            raise ValueError(f"slots_per_worker={slots_per_worker!r} must be an integer >= 1")
        import multiprocessing

        ctx = context if context is not None else multiprocessing.get_context()
        if isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self.num_workers = num_workers
        self.slots_per_worker = slots_per_worker
        self.flags = torch.zeros(num_workers * slots_per_worker, dtype=torch.int64).share_memory_()
        self.owners = torch.zeros(num_workers, dtype=torch.int64).share_memory_()
        self.counters = torch.zeros(num_workers, 7, dtype=torch.int64).share_memory_()
        self.known = torch.zeros(num_workers * slots_per_worker, dtype=torch.int64).share_memory_()
        self.lock = ctx.Lock()
        self._receiver: SlotReceiver | None = None  # the training process's, never pickled

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_receiver": None}

    def receiver(self, register: bool = False) -> SlotReceiver:
        """This pool's :class:`SlotReceiver` in this process (made on first use; ``register=True``
        page-locks the slots seen from now on). Every consumer of one pool must share it: a
        worker's references are only valid for the receiver that holds the slot."""
        if self._receiver is None:
            SlotReceiver(self, register=register)  # registers itself as self._receiver
        elif register and not self._receiver.register:
            self._receiver.register = True
        return self._receiver

    def __repr__(self) -> str:
        return f"SlotPool(num_workers={self.num_workers}, slots_per_worker={self.slots_per_worker})"

    def stats(self) -> SlotStats:
        """Counts over every worker so far."""
        c = self.counters.sum(dim=0).tolist()
        return SlotStats(slotted=int(c[_SLOTTED]), all_busy=int(c[_BUSY]), alloc_failed=int(c[_ALLOC_FAILED]),
                         unsupported=int(c[_UNSUPPORTED]), by_ref=int(c[_BY_REF]), fetch_s=c[_FETCH_NS] * 1e-9,
                         collate_s=c[_COLLATE_NS] * 1e-9)

    def count(self, worker_id: int, what: int, n: int = 1) -> None:
        self.counters[worker_id, what] += n  # one writer per row: the worker itself

    # ------------------------------------------------------------------ worker side

    def take_over(self, worker_id: int, pid: int) -> bool:
        """Make ``pid`` the owner of ``worker_id``'s slots; False while another live process owns them."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            return False
        try:
            owner = int(self.owners[worker_id])
            if owner not in (0, pid) and _alive(owner):
                return False
            self.owners[worker_id] = pid
            lo = worker_id * self.slots_per_worker
            self.flags[lo:lo + self.slots_per_worker] = 0  # the previous incarnation's slots are not reused
            self.known[lo:lo + self.slots_per_worker] = 0
            return True
        finally:
            self.lock.release()

    def claim(self, worker_id: int, ticket: int, start: int) -> int | None:
        """A free slot of ``worker_id`` (searching from its ``start``-th), now flagged with ``ticket``."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            return None
        try:
            lo, k = worker_id * self.slots_per_worker, self.slots_per_worker
            for j in range(k):
                index = lo + (start + j) % k
                if int(self.flags[index]) == 0:
                    self.flags[index] = ticket
                    return index
            return None
        finally:
            self.lock.release()

    # ------------------------------------------------------------------ consumer side

    def release(self, index: int, ticket: int) -> bool:
        """Free slot ``index`` if it still holds ``ticket``; False if it does not (nothing is changed)."""
        if not 0 <= index < self.flags.numel():
            return False
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            log.warning("shared slots: the slot lock was not released within %.0f s (a worker died holding it?); "
                        "slot %d stays in use", LOCK_TIMEOUT_S, index)
            return False
        try:
            if int(self.flags[index]) != ticket:
                return False
            self.flags[index] = 0
            return True
        finally:
            self.lock.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _image_place(batch: Any) -> Any:
    """The key / index of the image tensor of a collated batch (``DeviceLoader``'s rule), or None."""
    try:
        return image_key(batch)
    except TypeError:
        return None


def _replace(batch: Any, place: Any, value: torch.Tensor) -> Any:
    if isinstance(batch, dict):
        batch[place] = value
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return batch._replace(**{batch._fields[place]: value})
    values = list(batch)
    values[place] = value
    return values if type(batch) is list else type(batch)(values)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _bytes_view(storage: torch.UntypedStorage, offset: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous ``shape`` / ``dtype`` tensor over ``storage`` from byte ``offset``."""
    numel = 1
    for d in shape:
        numel *= int(d)
    raw = torch.empty(0, dtype=torch.uint8).set_(storage, offset, (numel * dtype.itemsize,))
    return raw.view(dtype).view(shape)


def _header(storage: torch.UntypedStorage) -> list[int] | None:
    """``[magic, flag index, ticket, storage id]`` of a slot storage, else None."""
    if storage.nbytes() < HEADER_BYTES:
        return None
    head = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (32,)).view(torch.int64).tolist()
    return head if head[0] == MAGIC else None


class SlotRef:
    """A tensor a worker wrote into a slot the receiver holds: where it is, not its bytes."""

    __slots__ = ("storage_id", "index", "ticket", "offset", "shape", "dtype")

    def __init__(self, storage_id: int, index: int, ticket: int, offset: int, shape: tuple, dtype: torch.dtype) -> None:
        self.storage_id, self.index, self.ticket = storage_id, index, ticket
        self.offset, self.shape, self.dtype = offset, shape, dtype

    def __reduce__(self) -> tuple:
        return SlotRef, (self.storage_id, self.index, self.ticket, self.offset, self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"SlotRef(slot={self.index}, offset={self.offset}, shape={self.shape}, dtype={self.dtype})"


@dataclass
class _Claim:
    """A slot a worker claimed for one batch."""

    storage: torch.UntypedStorage
    index: int
    ticket: int
    storage_id: int

    def ref(self, offset: int, t: torch.Tensor) -> SlotRef:
        return SlotRef(self.storage_id, self.index, self.ticket, offset, tuple(t.shape), t.dtype)


class _WorkerSlots:
    """One worker process's slot buffers (shared-memory storages: header, image, the batch's other tensors)."""

    def __init__(self, pool: SlotPool, worker_id: int) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.owner = pool.take_over(worker_id, self.pid)
        self.storages: dict[int, tuple[torch.UntypedStorage, int]] = {}  # flag index -> storage, its id
        self.counter = 0
        self.last_end_ns = 0  # when the previous collate call returned

    def take(self, nbytes: int) -> _Claim | None:
        """A claimed slot with room for an ``nbytes`` image after its header (and a reserve for the rest)."""
        self.counter += 1
        ticket = (self.pid << 32) | (self.counter & 0xFFFFFFFF)
        start = self.counter % self.pool.slots_per_worker
        index = self.pool.claim(self.worker_id, ticket, start)
        if index is None:
            self.pool.count(self.worker_id, _BUSY)
            return None
        entry = self.storages.get(index)
        if entry is None or entry[0].nbytes() < HEADER_BYTES + nbytes:
            size = HEADER_BYTES + _aligned(nbytes) + max(PACK_RESERVE_MIN, _aligned(nbytes // 64))
            try:
                storage = torch.UntypedStorage._new_shared(size)
            except RuntimeError:
                self.pool.release(index, ticket)
                self.pool.count(self.worker_id, _ALLOC_FAILED)
                return None
            entry = self.storages[index] = (storage, ticket)  # a storage's id: the ticket of its first claim
        storage, storage_id = entry
        head = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (32,)).view(torch.int64)
        head.copy_(torch.tensor([MAGIC, index, ticket, storage_id], dtype=torch.int64))
        self.pool.count(self.worker_id, _SLOTTED)
        return _Claim(storage, index, ticket, storage_id)


def _packable(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided \
        and not t.is_quantized and not t.requires_grad


class SlotCollate:
    """Wraps a loader's ``collate_fn``: in a worker, the batch's image tensor is put in a reused slot.

    In the training process (``num_workers=0``) it is the wrapped function. A registered
    :class:`~pipeline_opt.loading.batch_formats.StackedCollate` (a framework's collate function, e.g.
    ultralytics') gets its images stacked straight into the slot; any other is called as it is and the
    image tensor it returns (the first tensor, or ``batch["img"]`` / ``batch["image"]``...) is copied
    in. Once the receiver holds the slot, the batch's other plain tensors are copied in as well and
    every tensor travels as a :class:`SlotRef`. Batches, keys and values are otherwise exactly what
    ``collate_fn`` returns.
    """

    def __init__(self, collate_fn: Callable[[list], Any], pool: SlotPool) -> None:
        if not callable(collate_fn):
            raise TypeError(f"collate_fn={collate_fn!r} must be callable")
        self.collate_fn = collate_fn
        self.pool = pool
        self._slots: _WorkerSlots | None = None

    def __repr__(self) -> str:
        return f"SlotCollate({getattr(self.collate_fn, '__qualname__', self.collate_fn)!r}, {self.pool!r})"

    def __getstate__(self) -> dict:
        return {"collate_fn": self.collate_fn, "pool": self.pool, "_slots": None}

    def _worker_slots(self) -> _WorkerSlots | None:
        info = get_worker_info()
        if info is None or info.id >= self.pool.num_workers:
            return None
        slots = self._slots
        if slots is None or slots.pid != os.getpid():
            slots = self._slots = _WorkerSlots(self.pool, info.id)
        return slots

    def __call__(self, samples: list) -> Any:
        slots = self._worker_slots()
        if slots is None:
            return self.collate_fn(samples)
        start = time.perf_counter_ns()
        if slots.last_end_ns:
            self.pool.count(slots.worker_id, _FETCH_NS, start - slots.last_end_ns)
        try:
            return self._collate(samples, slots)
        finally:
            slots.last_end_ns = end = time.perf_counter_ns()
            self.pool.count(slots.worker_id, _COLLATE_NS, end - start)

    def _collate(self, samples: list, slots: _WorkerSlots) -> Any:
        if not slots.owner:
            self.pool.count(slots.worker_id, _UNSUPPORTED)
            return self.collate_fn(samples)
        fmt = stacked_collate_of(self.collate_fn)
        if fmt is not None:
            placed = self._stack_into_slot(fmt, samples, slots)
            if placed is not None:
                return self._send(*placed, slots)
        batch = self.collate_fn(samples)
        place = _image_place(batch)
        if place is None:
            self.pool.count(slots.worker_id, _UNSUPPORTED)
            return batch
        image = batch[place]
        if not _packable(image):  # on a device, or a tensor subclass whose metadata a copy would lose
            self.pool.count(slots.worker_id, _UNSUPPORTED)
            return batch
        claim = slots.take(image.nbytes)
        if claim is None:
            return batch
        view = _bytes_view(claim.storage, HEADER_BYTES, tuple(image.shape), image.dtype)
        view.copy_(image)
        return self._send(_replace(batch, place, view), view, claim, slots)

    def _stack_into_slot(self, fmt: StackedCollate, samples: list,
                         slots: _WorkerSlots) -> tuple[Any, torch.Tensor, _Claim] | None:
        images = fmt.images(samples)
        if images is None:
            return None  # let the collate function handle (or reject) it
        claim = slots.take(len(images) * images[0].nbytes)
        if claim is None:
            return None
        view = _bytes_view(claim.storage, HEADER_BYTES, (len(images), *images[0].shape), images[0].dtype)
        torch.stack(images, 0, out=view)
        return fmt.collate_around(self.collate_fn, samples, view), view, claim

    def _send(self, batch: Any, image: torch.Tensor, claim: _Claim, slots: _WorkerSlots) -> Any:
        """``batch`` as it goes to the training process: with the slot's tensor the first time the
        receiver sees this storage, with :class:`SlotRef` placeholders (every tensor packed) after."""
        if int(self.pool.known[claim.index]) != claim.storage_id:
            return batch
        end = HEADER_BYTES + _aligned(image.nbytes)
        capacity = claim.storage.nbytes()

        def pack(t: torch.Tensor) -> Any:
            nonlocal end
            if t is image:
                return claim.ref(HEADER_BYTES, t)
            if not _packable(t) or end + t.nbytes > capacity:
                return t  # travels the ordinary way
            offset = end
            _bytes_view(claim.storage, offset, tuple(t.shape), t.dtype).copy_(t)
            end = offset + _aligned(t.nbytes)
            return claim.ref(offset, t)

        packed = map_leaves(batch, torch.Tensor, pack)
        self.pool.count(slots.worker_id, _BY_REF)
        return packed


def slot_loader(loader: DataLoader, slots_per_worker: int | None = None, **overrides: Any) -> DataLoader:
    """A clone of ``loader`` (``overrides`` applied) whose workers deliver image tensors in reused slots.

    The clone has ``pin_memory=False``: the slots are page-locked by :class:`SlotReceiver` instead.
    ``slots_per_worker`` defaults to the clone's ``prefetch_factor + 2``. Iterate it through
    :class:`~pipeline_opt.loading.device_loader.DeviceLoader` (``reuse_buffers=True``), which
    releases each slot once its copy is done; iterated directly, the slots are never released and
    the workers fall back to the ordinary path after their first batches.
    """

    if not isinstance(loader, DataLoader):
        raise TypeError(f"shared slots need a torch DataLoader, got {type(loader).__name__}")
    if slot_collate_of(loader) is not None:
        raise ValueError("this loader already delivers through shared slots; pass it as it is")
    cfg = {**loader_config(loader), **overrides}
    workers = int(cfg.get("num_workers") or 0)
    if workers < 1:
        raise ValueError(f"num_workers={workers}: shared slots need worker processes; pass num_workers >= 1")
    prefetch = int(cfg.get("prefetch_factor") or 2)
    per_worker = prefetch + DEFAULT_EXTRA_SLOTS if slots_per_worker is None else slots_per_worker
    pool = SlotPool(workers, per_worker, loader.multiprocessing_context)
    overrides = {**overrides, "pin_memory": False, "collate_fn": SlotCollate(loader.collate_fn, pool)}
    return clone_loader(loader, **overrides)


def slot_collate_of(loader: Any) -> SlotCollate | None:
    """The :class:`SlotCollate` of a loader made by :func:`slot_loader` (also under collate wrappers
    that keep the function they wrap in ``.collate_fn``, e.g. the worker profiler's), else None."""
    return find_collate(getattr(loader, "collate_fn", None), SlotCollate)


def slot_pool_of(loader: Any) -> SlotPool | None:
    """The :class:`SlotPool` of a loader made by :func:`slot_loader`, else None."""
    collate = slot_collate_of(loader)
    return None if collate is None else collate.pool


def with_own_pool(collate: SlotCollate, context: Any = None) -> SlotCollate:
    """A :class:`SlotCollate` like ``collate`` with a fresh pool of the same shape: for a clone of a
    slot loader whose workers run next to the original's (two worker sets never share slots)."""
    pool = collate.pool
    return SlotCollate(collate.collate_fn, SlotPool(pool.num_workers, pool.slots_per_worker, context))


def _tensor_header(t: torch.Tensor) -> list[int] | None:
    """The slot header of the storage ``t`` lives in (past the header), else None."""
    if t.device.type != "cpu" or t.storage_offset() * t.element_size() < HEADER_BYTES:
        return None
    return _header(t.untyped_storage())


def slot_header(t: torch.Tensor) -> tuple[int, int] | None:
    """``(flag index, ticket)`` when ``t`` lives in a slot's payload, else None."""
    head = _tensor_header(t)
    return None if head is None else (int(head[1]), int(head[2]))


@dataclass(frozen=True)
class ReceiveStats:
    """Where the receiving thread's time went, over the batches it received."""

    batches: int
    wait_s: float  # waiting on the DataLoader iterator (workers not ready, or unpickling)
    work_s: float  # resolving slots, page-locking new ones, pinning the small tensors
    # the thread's own CPU over both (unpickling included); wait + work beyond it is time the thread
    # was blocked: on the workers, or waiting for the GIL while the training thread held it
    cpu_s: float = 0.0

    @property
    def wait_ms_per_batch(self) -> float:
        return 1e3 * self.wait_s / self.batches if self.batches else 0.0

    @property
    def work_ms_per_batch(self) -> float:
        return 1e3 * self.work_s / self.batches if self.batches else 0.0

    @property
    def cpu_ms_per_batch(self) -> float:
        return 1e3 * self.cpu_s / self.batches if self.batches else 0.0


class _Held:
    """A slot storage the receiver keeps alive, and the tickets of its batches not yet released."""

    __slots__ = ("storage", "storage_id", "pending", "retired")

    def __init__(self, storage: torch.UntypedStorage, storage_id: int) -> None:
        self.storage = storage
        self.storage_id = storage_id
        self.pending: set[int] = set()
        self.retired = False


class SlotReceiver:
    """The training process's side of a :class:`SlotPool`: receive slots, page-lock, release.

    ``receive(batch)`` turns a batch as the loader yields it into the batch with its tensors and
    the list of its slot-backed tensors. A slot storage seen for the first time is kept alive (which
    also keeps torch's mapping of it cached), page-locked with ``register=True`` (CUDA:
    ``cudaHostRegister``, so copies from it are asynchronous DMA) and announced to its worker, which
    then sends that slot's batches as :class:`SlotRef` references. A storage replaced at its flag
    index (a new worker incarnation, a bigger batch) is unregistered and dropped once its last batch
    is released. :meth:`close` unregisters everything (call it once no copy is pending). One receiver
    per pool: making one clears the workers' knowledge of an earlier one (use :meth:`SlotPool.receiver`).
    """

    def __init__(self, pool: SlotPool, register: bool = False) -> None:
        self.pool = pool
        self.register = register
        self._at: dict[int, _Held] = {}  # flag index -> the storage seen last there
        self._by_ptr: dict[int, _Held] = {}  # data_ptr -> every storage kept (current and retired)
        self._by_id: dict[int, _Held] = {}  # storage id -> the same storages
        self._registered: set[int] = set()
        self._pending: set[int] = set()  # tickets received and not released yet, over every storage
        self._lock = threading.Lock()
        self.register_failed = False
        self._timing = [0, 0.0, 0.0, 0.0]  # batches, wait s, work s, CPU s (the receiving thread's)
        pool.known.zero_()
        pool._receiver = self

    @property
    def kept(self) -> int:
        """Slot storages kept alive now (current and not yet dropped retired ones)."""
        return len(self._by_ptr)

    def receive_stats(self) -> ReceiveStats:
        """Timing of the receiving thread (:class:`ReceiveThread`) so far."""
        n, wait, work, cpu = self._timing
        return ReceiveStats(batches=int(n), wait_s=float(wait), work_s=float(work), cpu_s=float(cpu))

    def add_timing(self, wait_s: float, work_s: float, cpu_s: float = 0.0) -> None:
        self._timing[0] += 1
        self._timing[1] += wait_s
        self._timing[2] += work_s
        self._timing[3] += cpu_s

    def find(self, batch: Any, announce: bool = False) -> list[tuple[torch.Tensor, int, int]]:
        """``(tensor, flag index, ticket)`` of each slot-backed tensor nested in ``batch``; with
        ``announce``, workers may send their next batches of these slots as references (only for a
        consumer that resolves them with :meth:`receive`)."""
        out = []
        for t in iter_leaves(batch):
            head = _tensor_header(t)
            if head is None:
                continue
            _, index, ticket, storage_id = (int(v) for v in head)
            out.append((t, index, ticket))
            self._hold(index, ticket, storage_id, t.untyped_storage(), announce)
        return out

    def receive(self, batch: Any) -> tuple[Any, list[tuple[torch.Tensor, int, int]]]:
        """The batch with every :class:`SlotRef` resolved to its tensor, and its slot-backed tensors.

        Release the slots (:meth:`release`) once nothing reads those tensors any more."""
        slots = self.find(batch, announce=True)
        verified: set[int] = set()  # tickets whose slot header was checked (one per batch and slot)

        def resolve(ref: SlotRef) -> torch.Tensor:
            t = self._resolve(ref, verify=ref.ticket not in verified)
            verified.add(ref.ticket)
            slots.append((t, ref.index, ref.ticket))
            return t

        batch = map_leaves(batch, SlotRef, resolve)
        for index, ticket in {(index, ticket) for _, index, ticket in slots}:
            self._reclaim_lost(index, ticket)
        return batch, slots

    def _resolve(self, ref: SlotRef, verify: bool = True) -> torch.Tensor:
        with self._lock:
            held = self._by_id.get(ref.storage_id)
            if held is not None:
                held.pending.add(ref.ticket)
                self._pending.add(ref.ticket)
        if held is None:
            raise RuntimeError(
                f"a batch refers to shared slot {ref.index} (storage {ref.storage_id:#x}), which this "
                f"process does not hold: every consumer of one slot loader must share its pool's receiver "
                f"(SlotPool.receiver(); DeviceLoader(..., reuse_buffers=True) does)")
        head = _header(held.storage) if verify else None
        if verify and (head is None or int(head[2]) != ref.ticket):
            raise RuntimeError(f"shared slot {ref.index} holds ticket {head and head[2]:#x}, not the batch's "
                               f"{ref.ticket:#x}: it was overwritten before its batch was released")
        return _bytes_view(held.storage, ref.offset, ref.shape, ref.dtype)

    def _hold(self, index: int, ticket: int, storage_id: int, storage: torch.UntypedStorage,
              announce: bool) -> None:
        with self._lock:
            ptr = storage.data_ptr()
            held = self._by_ptr.get(ptr)
            if held is None:
                held = self._by_ptr[ptr] = _Held(storage, storage_id)
                self._by_id[storage_id] = held
                if self.register and not self.register_failed:
                    self._pin(ptr, storage.nbytes())
            held.pending.add(ticket)
            self._pending.add(ticket)
            old = self._at.get(index)
            if old is not held:
                self._at[index] = held
                if old is not None:
                    old.retired = True
                    self._drop_if_done(old)
            if announce and storage_id and 0 <= index < self.pool.known.numel():
                self.pool.known[index] = storage_id

    def _reclaim_lost(self, index: int, ticket: int) -> None:
        """Free the slots of batches the loader dropped before they reached this receiver.

        A worker's batches arrive in the order it made them (the loader yields them in sampler
        order, and a worker works through its indices in that order), so when a batch with ticket
        ``ticket`` arrives, a slot of the same worker process still flagged with an *earlier* ticket
        that this receiver never received belongs to a batch that is gone: a persistent loader's
        reset drains the batches in flight of an abandoned epoch. No release would ever come for it.
        """
        k = self.pool.slots_per_worker
        if not 0 <= index < self.pool.flags.numel():
            return
        lo = index // k * k
        pid, counter = ticket >> 32, ticket & 0xFFFFFFFF
        for j, flag in enumerate(self.pool.flags[lo:lo + k].tolist()):
            if flag and flag >> 32 == pid and (flag & 0xFFFFFFFF) < counter and flag not in self._pending:
                if self.pool.release(lo + j, flag):
                    log.debug("shared slots: slot %d of a dropped batch given back", lo + j)

    def _pin(self, ptr: int, nbytes: int) -> None:
        err = int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))
        if err != 0:
            self.register_failed = True
            log.warning("shared slots: cudaHostRegister failed (cudaError %d); copies from the slots are "
                        "synchronous", err)
            return
        self._registered.add(ptr)

    def _unpin(self, ptr: int) -> None:
        if ptr in self._registered:
            self._registered.discard(ptr)
            err = int(torch.cuda.cudart().cudaHostUnregister(ptr))
            if err != 0:
                log.debug("shared slots: cudaHostUnregister returned %d", err)

    def _drop_if_done(self, held: _Held) -> None:
        if held.retired and not held.pending:
            ptr = held.storage.data_ptr()
            self._unpin(ptr)
            self._by_ptr.pop(ptr, None)
            if self._by_id.get(held.storage_id) is held:
                del self._by_id[held.storage_id]

    def release(self, slots: list[tuple[torch.Tensor, int, int]]) -> None:
        """Hand the slots of a batch back to their workers (once nothing reads them any more)."""
        done: set[tuple[int, int]] = set()
        for t, index, ticket in slots:
            if (index, ticket) in done:
                continue  # several tensors of one batch in one slot
            done.add((index, ticket))
            self.pool.release(index, ticket)
            with self._lock:
                self._pending.discard(ticket)
                held = self._by_ptr.get(t.untyped_storage().data_ptr())
                if held is not None:
                    held.pending.discard(ticket)
                    self._drop_if_done(held)

    def close(self) -> None:
        """Unregister every page-locked slot and drop the storages (no copy may be pending). The
        workers send whole tensors again until the receiver holds their slots anew."""
        with self._lock:
            self.pool.known.zero_()
            if self._registered and torch.cuda.is_available():
                torch.cuda.synchronize()  # no DMA may still read a slot being unregistered
            for ptr in list(self._registered):
                self._unpin(ptr)
            self._at.clear()
            self._by_ptr.clear()
            self._by_id.clear()
            self._pending.clear()


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ReceiveThread:
    """Takes batches from a DataLoader iterator in a background thread, as DataLoader's pin-memory
    thread does, so the training thread never waits on receiving them.

    A loader made by :func:`slot_loader` has ``pin_memory=False``, which would leave the receiving
    (unpickling; for every tensor a descriptor handed over by the worker's resource-sharer thread,
    which waits for that busy worker's GIL) to the training thread, which then spends markedly
    more CPU per step. Here it happens in this thread, with :meth:`SlotReceiver.receive` (resolving the
    references, the first-time page-locking of each slot) and ``prepare(raw, slots)`` (e.g. pinning
    the small tensors that did not travel in a slot); its timing goes to
    :meth:`SlotReceiver.receive_stats`. Up to ``depth`` batches wait in the queue. :meth:`close` stops the thread and releases the slots of
    the batches it still holds; the iterator is dropped with the thread.
    """

    def __init__(self, it: Iterator, receiver: SlotReceiver, prepare: Callable[[Any, list], Any] | None = None,
                 depth: int = 2, device: torch.device | None = None) -> None:
        import queue

        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self.receiver = receiver
        self._thread = threading.Thread(target=self._run, args=(it, prepare, device), daemon=True,
                                        name="pipeline_opt-slot-receiver")
        self._thread.start()

    def _put(self, item: Any) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, it: Iterator, prepare: Callable[[Any, list], Any] | None, device: torch.device | None) -> None:
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)
            clock, cpu = time.perf_counter, time.thread_time
            ready, cpu_ready = clock(), cpu()
            for raw in it:
                got = clock()
                raw, slots = self.receiver.receive(raw)
                if prepare is not None:
                    raw = prepare(raw, slots)
                self.receiver.add_timing(got - ready, clock() - got, cpu() - cpu_ready)
                if not self._put((raw, slots)):
                    self.receiver.release(slots)
                    return
                ready, cpu_ready = clock(), cpu()
                del raw, slots
                if self._stop.is_set():
                    return
            self._put(_End())
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failed(exc))
        finally:
            del it

    def __iter__(self) -> ReceiveThread:
        return self

    def __next__(self) -> tuple[Any, list]:
        import queue

        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the shared-slot receiving thread ended without a result") from None
                continue
            if isinstance(item, _End):
                self._put(item)  # every later next() ends too
                raise StopIteration
            if isinstance(item, _Failed):
                raise item.exc
            return item

    def close(self) -> None:
        """Stop the thread (it drops the iterator, shutting its workers down) and release held slots."""
        import queue

        self._stop.set()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                if not self._thread.is_alive():
                    break
                self._thread.join(timeout=0.1)
                continue
            if isinstance(item, tuple):
                self.receiver.release(item[1])
        self._thread.join(timeout=10.0)
