"""Workers that deliver their batches' image tensors in reused shared-memory slots: :func:`slot_loader`.

A stock DataLoader worker puts every batch in a *fresh* shared-memory segment; the training process
maps it, faults its pages in, copies it into pinned memory (``pin_memory=True``) and unmaps it. For
a YOLO batch (64 x 3 x 640 x 640 uint8 = 79 MB) at ~14 batches/s that is ~1 GB/s of page-table work
in the training process, and it can slow a launch-bound training step noticeably (the same
loader drained next to a replayed batch costs as much; ``benchmarks/bench_yolo_gap.py`` measures it).

With shared slots each worker owns ``slots_per_worker`` shared-memory buffers and writes every
batch's image tensor into one of them (stacking straight into it where the collate function is
known): :class:`SlotCollate`, the loader's collate function, claims a slot of the worker's
:class:`~pipeline_opt.loading.slot_pool.SlotPool` and packs the batch into it
(:mod:`~pipeline_opt.loading.slot_layout`); the training process receives it with
:class:`~pipeline_opt.loading.slot_receiver.SlotReceiver`.

Nothing here changes which samples a batch holds or their order: only where the image bytes live.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from pipeline_opt._core.step import image_key, map_leaves
from pipeline_opt.loading.batch_formats import StackedCollate, find_collate, stacked_collate_of
from pipeline_opt.loading.dataloader import clone_loader, loader_config
from pipeline_opt.loading.slot_layout import (
    HEADER_BYTES,
    MAGIC,
    PACK_RESERVE_MIN,
    SlotRef,
    aligned,
    bytes_view,
)
from pipeline_opt.loading.slot_pool import (
    ALLOC_FAILED,
    BUSY,
    BY_REF,
    COLLATE_NS,
    FETCH_NS,
    SLOTTED,
    UNSUPPORTED,
    SlotPool,
)

DEFAULT_EXTRA_SLOTS = 2  # beyond prefetch_factor: the batch being copied and the one before it


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
            self.pool.count(self.worker_id, BUSY)
            return None
        entry = self.storages.get(index)
        if entry is None or entry[0].nbytes() < HEADER_BYTES + nbytes:
            size = HEADER_BYTES + aligned(nbytes) + max(PACK_RESERVE_MIN, aligned(nbytes // 64))
            try:
                storage = torch.UntypedStorage._new_shared(size)
            except RuntimeError:
                self.pool.release(index, ticket)
                self.pool.count(self.worker_id, ALLOC_FAILED)
                return None
            entry = self.storages[index] = (storage, ticket)  # a storage's id: the ticket of its first claim
        storage, storage_id = entry
        head = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (32,)).view(torch.int64)
        head.copy_(torch.tensor([MAGIC, index, ticket, storage_id], dtype=torch.int64))
        self.pool.count(self.worker_id, SLOTTED)
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
            self.pool.count(slots.worker_id, FETCH_NS, start - slots.last_end_ns)
        try:
            return self._collate(samples, slots)
        finally:
            slots.last_end_ns = end = time.perf_counter_ns()
            self.pool.count(slots.worker_id, COLLATE_NS, end - start)

    def _collate(self, samples: list, slots: _WorkerSlots) -> Any:
        if not slots.owner:
            self.pool.count(slots.worker_id, UNSUPPORTED)
            return self.collate_fn(samples)
        fmt = stacked_collate_of(self.collate_fn)
        if fmt is not None:
            placed = self._stack_into_slot(fmt, samples, slots)
            if placed is not None:
                return self._send(*placed, slots)
        batch = self.collate_fn(samples)
        place = _image_place(batch)
        if place is None:
            self.pool.count(slots.worker_id, UNSUPPORTED)
            return batch
        image = batch[place]
        if not _packable(image):  # on a device, or a tensor subclass whose metadata a copy would lose
            self.pool.count(slots.worker_id, UNSUPPORTED)
            return batch
        claim = slots.take(image.nbytes)
        if claim is None:
            return batch
        view = bytes_view(claim.storage, HEADER_BYTES, tuple(image.shape), image.dtype)
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
        view = bytes_view(claim.storage, HEADER_BYTES, (len(images), *images[0].shape), images[0].dtype)
        torch.stack(images, 0, out=view)
        return fmt.collate_around(self.collate_fn, samples, view), view, claim

    def _send(self, batch: Any, image: torch.Tensor, claim: _Claim, slots: _WorkerSlots) -> Any:
        """``batch`` as it goes to the training process: with the slot's tensor the first time the
        receiver sees this storage, with :class:`SlotRef` placeholders (every tensor packed) after."""
        if int(self.pool.known[claim.index]) != claim.storage_id:
            return batch
        end = HEADER_BYTES + aligned(image.nbytes)
        capacity = claim.storage.nbytes()

        def pack(t: torch.Tensor) -> Any:
            nonlocal end
            if t is image:
                return claim.ref(HEADER_BYTES, t)
            if not _packable(t) or end + t.nbytes > capacity:
                return t  # travels the ordinary way
            offset = end
            bytes_view(claim.storage, offset, tuple(t.shape), t.dtype).copy_(t)
            end = offset + aligned(t.nbytes)
            return claim.ref(offset, t)

        packed = map_leaves(batch, torch.Tensor, pack)
        self.pool.count(slots.worker_id, BY_REF)
        return packed


def slot_loader(loader: DataLoader, slots_per_worker: int | None = None, **overrides: Any) -> DataLoader:
    """A clone of ``loader`` (``overrides`` applied) whose workers deliver image tensors in reused slots.

    The clone has ``pin_memory=False``: the slots are page-locked by :class:`~pipeline_opt.loading.slot_receiver.SlotReceiver` instead.
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
