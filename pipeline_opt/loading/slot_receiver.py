"""The training process's side of shared slots: receive the batches, page-lock the slots, release them.

torch's sharing keeps one mapping per segment in the receiving process, so a slot is mapped once,
and :class:`SlotReceiver` registers it with CUDA (``cudaHostRegister``) once: the copy to the GPU
is an asynchronous DMA from the slot, with no pinning copy and no page faults. The receiver hands a
slot back (:meth:`SlotReceiver.release`) once the copy out of it has finished.
:class:`ReceiveThread` takes the batches from the loader's iterator and receives them in a
background thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import iter_leaves, map_leaves
from pipeline_opt.loading.slot_layout import SlotRef, bytes_view, header, tensor_header

log = get_logger("shared_slots")


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
    """The training process's side of a :class:`~pipeline_opt.loading.slot_pool.SlotPool`: receive
    slots, page-lock, release.

    ``receive(batch)`` turns a batch as the loader yields it into the batch with its tensors and
    the list of its slot-backed tensors. A slot storage seen for the first time is kept alive (which
    also keeps torch's mapping of it cached), page-locked with ``register=True`` (CUDA:
    ``cudaHostRegister``, so copies from it are asynchronous DMA) and announced to its worker, which
    then sends that slot's batches as :class:`SlotRef` references. A storage replaced at its flag
    index (a new worker incarnation, a bigger batch) is unregistered and dropped once its last batch
    is released. :meth:`close` unregisters everything (call it once no copy is pending). One receiver
    per pool: making one clears the workers' knowledge of an earlier one (use
    :meth:`~pipeline_opt.loading.slot_pool.SlotPool.receiver`).
    """

    def __init__(self, pool: Any, register: bool = False) -> None:
        self.pool = pool  # a SlotPool (not named here: slot_pool imports this module for SlotPool.receiver)
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
            head = tensor_header(t)
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
        head = header(held.storage) if verify else None
        if verify and (head is None or int(head[2]) != ref.ticket):
            raise RuntimeError(f"shared slot {ref.index} holds ticket {head and head[2]:#x}, not the batch's "
                               f"{ref.ticket:#x}: it was overwritten before its batch was released")
        return bytes_view(held.storage, ref.offset, ref.shape, ref.dtype)

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

    A loader made by :func:`~pipeline_opt.loading.slot_collate.slot_loader` has ``pin_memory=False``,
    which would leave the receiving (unpickling; for every tensor a descriptor handed over by the
    worker's resource-sharer thread, which waits for that busy worker's GIL) to the training thread,
    which then spends markedly more CPU per step. Here it happens in this thread, with
    :meth:`SlotReceiver.receive` (resolving the references, the first-time page-locking of each slot)
    and ``prepare(raw, slots)`` (e.g. pinning the small tensors that did not travel in a slot); its
    timing goes to :meth:`SlotReceiver.receive_stats`. Up to ``depth`` batches wait in the queue.
    :meth:`close` stops the thread and releases the slots of the batches it still holds; the
    iterator is dropped with the thread.
    """

    def __init__(self, it: Iterator, receiver: SlotReceiver, prepare: Callable[[Any, list], Any] | None = None,
                 depth: int = 2, device: torch.device | None = None) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self.receiver = receiver
        self._thread = threading.Thread(target=self._run, args=(it, prepare, device), daemon=True,
                                        name="pipeline_opt-slot-receiver")
        self._thread.start()

    def _put(self, item: Any) -> bool:
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
