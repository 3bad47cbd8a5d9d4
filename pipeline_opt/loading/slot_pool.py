"""The shared state of one loader's slots (:class:`SlotPool`) and the workers' counts (:class:`SlotStats`).

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
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.loading.slot_receiver import SlotReceiver

log = get_logger("shared_slots")

LOCK_TIMEOUT_S = 1.0

# counters per worker (columns of SlotPool.counters)
SLOTTED, BUSY, ALLOC_FAILED, UNSUPPORTED, BY_REF, FETCH_NS, COLLATE_NS = range(7)


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
        return SlotStats(slotted=int(c[SLOTTED]), all_busy=int(c[BUSY]), alloc_failed=int(c[ALLOC_FAILED]),
                         unsupported=int(c[UNSUPPORTED]), by_ref=int(c[BY_REF]), fetch_s=c[FETCH_NS] * 1e-9,
                         collate_s=c[COLLATE_NS] * 1e-9)

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
