"""A loader wrapper that delivers batches on the device, transformed there, one batch ahead.

:class:`DeviceLoader` wraps any DataLoader (or iterable of batches). For each batch it

1. applies ``batch_transform`` to the batch as the loader yields it (host tensors; e.g. the
   :class:`~pipeline_opt.loading.decode.GpuJpegDecoder` of packed JPEG batches),
2. copies every tensor nested in tuples / lists / dicts / namedtuples to ``device``
   (``non_blocking`` — asynchronous from pinned memory),
3. applies ``transform`` to the batch's image tensor (the one
   :func:`pipeline_opt._core.step.extract_images` finds: the first tensor of a tuple / list,
   ``batch["img"]`` / ``batch["image"]``... of a dict) and puts the result back in its place.

On CUDA all three run on a side stream, and the next batch is submitted before the current one is
handed out, so copy + transform of batch ``i + 1`` overlap the training step of batch ``i``. The
consumer's stream waits on the side stream (``wait_stream``) before it gets a batch, and every
tensor of the batch is ``record_stream``-ed on the consumer's stream so the caching allocator never
hands its memory to the side stream while the step still reads it. The side stream in turn waits
for the consumer's stream before each submission (transform parameters made there are ready).
On CPU it is a plain pass-through that applies the same transforms.

With ``prepare_in_thread=True`` a background thread takes the batches and prepares them
(:mod:`pipeline_opt.loading.prepare_thread`): a ``batch_transform`` that blocks its caller until it
is done (torchvision's nvJPEG decode does) then runs while the training step does.

With ``reuse_buffers=True`` the loader's workers deliver image tensors through shared-memory slots
they reuse (:mod:`pipeline_opt.loading.shared_slots`): the training process maps and page-locks each slot
once instead of mapping, faulting in and pin-copying a fresh segment per batch. A slot is handed
back to its worker once the copy out of it has completed (a CUDA event), so nothing the step reads
is ever overwritten; on the CPU the batch is copied out of the slot first.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt._core.device import resolve_device
from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import image_key, map_leaves, move_to_device
from pipeline_opt.loading.dataloader import release_workers
from pipeline_opt.loading.prepare_thread import PreparingThread
from pipeline_opt.loading.slot_collate import slot_loader, slot_pool_of
from pipeline_opt.loading.slot_layout import slot_header
from pipeline_opt.loading.slot_receiver import ReceiveThread

__all__ = ["DeviceLoader", "apply_to_images"]

log = get_logger("transforms.device_loader")

_END = object()


def apply_to_images(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A batch like ``batch`` with its image tensor replaced by ``fn(image)``; ``batch`` is not modified."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    slot = image_key(batch)
    if isinstance(batch, Mapping):
        items = {k: (fn(v) if k == slot else v) for k, v in batch.items()}
        return items if type(batch) is dict else type(batch)(items)
    new = fn(batch[slot])
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return batch._replace(**{batch._fields[slot]: new})
    values = list(batch)
    values[slot] = new
    return values if type(batch) is list else type(batch)(values)


def _record_stream(batch: Any, stream: torch.cuda.Stream) -> None:
    """``record_stream`` every CUDA tensor nested in ``batch`` on ``stream``."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record_stream(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record_stream(value, stream)


class DeviceLoader:
    """Iterate ``loader`` with every batch on ``device``, transformed there, prefetched one batch ahead.

    Args:
        loader: a ``torch.utils.data.DataLoader`` (or any re-iterable of batches). Use
            ``pin_memory=True`` on it so the copies are truly asynchronous.
        device: where batches go; ``None`` picks the current CUDA device, else the CPU.
        transform: callable on the batched image tensor (e.g. the GPU part of
            :func:`~pipeline_opt.transforms.split.split_transforms`), applied after the copy.
        non_blocking: passed to ``Tensor.to``.
        batch_transform: callable on the whole batch as the loader yields it, before the copy (host
            tensors, on the side stream); tensors it returns already on ``device`` are not copied
            again. For decoders that read host data, e.g. ``GpuJpegDecoder``.
        prepare_in_thread: take each batch from ``loader`` and prepare it (``batch_transform``, copy,
            ``transform``) in a background thread instead of the training loop's
            (:class:`~pipeline_opt.loading.prepare_thread.PreparingThread`). For a ``batch_transform``
            that blocks its caller until done, such as nvJPEG decoding, the step of one batch then
            runs while the next is decoded. Not with ``reuse_buffers``.
        reuse_buffers: deliver the image tensors through reused shared-memory slots
            (:func:`pipeline_opt.loading.slot_collate.slot_loader`). ``loader`` must be a DataLoader; unless
            it was made by ``slot_loader`` already, a clone of it (``pin_memory=False``: the slots are
            page-locked instead) is what gets iterated, and ``.loader`` is that clone. With
            ``num_workers=0`` there is nothing to reuse and the loader is used as it is.

    ``len()``, ``.loader``, ``.device``, ``.transform`` and the loader's own attributes
    (``.dataset``, ``.batch_size``, ``.sampler``, ``.num_workers``...) are available. Each ``iter()``
    starts a fresh pass over ``loader``; an abandoned pass releases the loader's iterator (and its
    worker processes, unless they are persistent) when the generator is closed or collected.
    """

    @classmethod
    def through_slots(cls, loader: torch.utils.data.DataLoader, device: torch.device | str | None = None, *,
                      transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      **overrides: Any) -> DeviceLoader:
        """The one way to build a loader delivering through shared slots: a clone of ``loader``
        (``overrides`` applied, :func:`pipeline_opt.loading.slot_collate.slot_loader`) iterated by a
        ``DeviceLoader`` that reuses its page-locked buffers."""

        return cls(slot_loader(loader, **overrides), device=device, transform=transform, reuse_buffers=True)

    def __init__(self, loader: Iterable, device: torch.device | str | None = None,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None, non_blocking: bool = True,
                 batch_transform: Callable[[Any], Any] | None = None, reuse_buffers: bool = False,
                 prepare_in_thread: bool = False) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches (a DataLoader), got {type(loader).__name__}")
        if isinstance(loader, Iterator):
            raise TypeError("loader is a one-shot iterator; pass the DataLoader itself so it can be iterated again")
        for name, fn in (("transform", transform), ("batch_transform", batch_transform)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}={fn!r} must be a callable or None")
        if prepare_in_thread and reuse_buffers:
            raise ValueError("prepare_in_thread=True and reuse_buffers=True cannot be combined: the shared "
                             "slots have a receiving thread of their own; choose one")
        self.loader = loader
        self.prepare_in_thread = bool(prepare_in_thread)
        self._thread_spans: Iterable[tuple[str, int, int]] = ()  # the latest pass's preparing thread
        self.device = resolve_device(device)
        self.transform = transform
        self.non_blocking = bool(non_blocking)
        self.batch_transform = batch_transform
        self.reuse_buffers = bool(reuse_buffers)  # as asked; ``reuses_buffers`` says whether it applies
        self._receiver = None
        self._receiving = None  # the receiving thread of the latest CUDA iteration (shared slots)
        if reuse_buffers:
            self._use_slots()

    def _use_slots(self) -> None:

        loader = self.loader
        if not isinstance(loader, DataLoader):
            raise TypeError(f"reuse_buffers=True needs a torch DataLoader, got {type(loader).__name__}")
        pool = slot_pool_of(loader)
        if pool is None:
            if loader.num_workers == 0:
                log.info("reuse_buffers: the loader has no workers (batches are made in this process); "
                         "nothing to reuse")
                return
            loader = self.loader = slot_loader(loader)
            pool = slot_pool_of(loader)
        self._receiver = pool.receiver(register=self.device.type == "cuda")
        weakref.finalize(self, self._receiver.close)

    @property
    def reuses_buffers(self) -> bool:
        """Whether batches come through reused shared-memory slots."""
        return self._receiver is not None

    def slot_stats(self) -> Any:
        """:class:`~pipeline_opt.loading.slot_pool.SlotStats` of the workers so far; None without ``reuse_buffers``."""
        return None if self._receiver is None else self._receiver.pool.stats()

    def receive_stats(self) -> Any:
        """:class:`~pipeline_opt.loading.slot_receiver.ReceiveStats` of the receiving thread so far (CUDA);
        None without ``reuse_buffers``."""
        return None if self._receiver is None else self._receiver.receive_stats()

    def close(self) -> None:
        """Shut the wrapped loader's workers down (a persistent iterator's; another wrapper's own
        ``close()``) and un-page-lock the shared slots. Iterating again afterwards starts new workers."""
        close = getattr(self.loader, "close", None)
        if not isinstance(self.loader, DataLoader) and callable(close):
            close()
        release_workers(self.loader)
        if self._receiver is not None:
            self._receiver.close()

    def thread_spans(self) -> tuple[tuple[str, int, int], ...]:
        """``(what, t0_ns, t1_ns)`` of the latest pass's preparing thread (``prepare_in_thread``):
        "next batch" (waiting for the loader) and "prepare batch" for each of its latest batches
        (``prepare_thread.SPANS_KEPT`` spans); empty without the thread."""
        return tuple(self._thread_spans)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: forward public names to the wrapped loader.
        if name.startswith("_") or "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def __repr__(self) -> str:
        thread = ", prepare_in_thread=True" if self.prepare_in_thread else ""
        return (f"DeviceLoader(device={self.device}, transform={self.transform!r}, "
                f"batch_transform={self.batch_transform!r}{thread}, loader={type(self.loader).__name__})")

    def prepare(self, batch: Any) -> Any:
        """``batch_transform``, copy to the device, ``transform`` — on the current stream."""
        if self.batch_transform is not None:
            batch = self.batch_transform(batch)
        batch = move_to_device(batch, self.device, self.non_blocking)
        if self.transform is not None:
            batch = apply_to_images(batch, self.transform)
        return batch

    def __iter__(self) -> Iterator[Any]:
        if self.prepare_in_thread:
            return self._iter_threaded()
        if self.device.type == "cuda":
            return self._iter_cuda()
        return self._iter_plain()

    def _iter_threaded(self) -> Iterator[Any]:

        it = iter(self.loader)
        preparing = PreparingThread(it, self.prepare, self.device)
        self._thread_spans = preparing.spans
        try:
            for batch, event in preparing:
                if event is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_event(event)
                    _record_stream(batch, consumer)
                yield batch
                del batch
        finally:
            preparing.close()
            del it

    def _iter_plain(self) -> Iterator[Any]:
        receiver = self._receiver
        for raw in self.loader:
            if receiver is None:
                yield self.prepare(raw)
                continue
            raw, slots = receiver.receive(raw)
            batch = _without_slots(self.prepare(raw))
            del raw
            receiver.release(slots)
            del slots
            yield batch

    def _iter_cuda(self) -> Iterator[Any]:
        side = torch.cuda.Stream(device=self.device)
        copies: list[tuple[torch.cuda.Event, list]] = []  # slots being copied out of, oldest first
        if self._receiver is not None and getattr(self.loader, "persistent_workers", False):
            # a persistent DataLoader hands every iteration the same iterator: an abandoned
            # iteration's receiving thread must stop taking from it before it is reset
            previous, self._receiving = self._receiving, None
            if previous is not None:
                previous.close()
        it = iter(self.loader)
        if self._receiver is not None:

            it = self._receiving = ReceiveThread(it, self._receiver, prepare=_pin_small, device=self.device)
        try:
            pending = self._submit(it, side, copies)
            while pending is not _END:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(side)
                _record_stream(pending, consumer)
                batch, pending = pending, None
                pending = self._submit(it, side, copies)
                yield batch
                del batch
        finally:
            if self._receiver is not None:
                it.close()
            del it
            for event, slots in copies:
                event.synchronize()
                self._receiver.release(slots)
            copies.clear()

    def _submit(self, it: Iterator[Any], side: torch.cuda.Stream, copies: list) -> Any:
        """Take the next batch and enqueue its copy + transforms on ``side``; ``_END`` when exhausted."""
        try:
            raw = next(it)
        except StopIteration:
            return _END
        slots = None
        if self._receiver is not None:
            raw, slots = raw  # from the receiving thread: the batch and its slots
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            batch = self.prepare(raw)
            if slots:
                batch = _without_slots(batch)  # a host tensor handed out must not be a slot
                event = torch.cuda.Event()
                event.record(side)
                copies.append((event, slots))
        del raw
        while copies and copies[0][0].query():  # copies done: their slots go back to the workers
            self._receiver.release(copies.pop(0)[1])
        return batch


def _pin_small(batch: Any, slots: list) -> Any:
    """The loader does not pin (the slots are page-locked already); a pageable copy of the small
    tensors (boxes, labels) would block until the side stream, which waits for the step, caught up:
    an implicit device synchronisation per batch. So they are pinned here."""
    return _pin_others(batch, {id(t) for t, _, _ in slots}) if slots else batch


def _pin_others(batch: Any, skip: set[int]) -> Any:
    """``batch`` with every host tensor not in ``skip`` (by ``id``) and not pinned yet copied to pinned memory."""

    def pin(t: torch.Tensor) -> torch.Tensor:
        return t if id(t) in skip or t.device.type != "cpu" or t.is_pinned() else t.pin_memory()

    return map_leaves(batch, torch.Tensor, pin)


def _without_slots(batch: Any) -> Any:
    """``batch`` with every host tensor that lives in a shared slot replaced by a copy."""

    return map_leaves(batch, torch.Tensor, lambda t: t.clone() if slot_header(t) is not None else t)
