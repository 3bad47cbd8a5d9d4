"""Prepare the next batches in a background thread, so a blocking decode overlaps the training step.

torchvision's ``decode_jpeg(..., device="cuda")`` (nvJPEG) synchronises its own CUDA stream before it
returns: the thread that calls it waits for the whole batch to be decoded. Called from the training
loop (as :class:`~pipeline_opt.loading.device_loader.DeviceLoader` does by default, one batch
ahead), that wait sits between two steps, and a step that synchronises (``loss.item()``, a metric)
cannot run while the next batch decodes. :class:`PreparingThread` calls the loader's iterator and the
preparation (decode, copy, transforms) in a thread of its own, on a CUDA side stream, ``ahead``
batches ahead: the step of batch ``i`` runs while batch ``i + 1`` is decoded. The decode releases
the GIL, so the two truly run at once.

Each prepared batch carries a CUDA event recorded on the side stream after its preparation; the
consumer's stream waits on that event (not on the whole side stream) before it gets the batch, and
every tensor of the batch is ``record_stream``-ed on the consumer's stream so the caching allocator
never hands its memory back to the side stream while the step still reads it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["PreparingThread"]

_END = object()
_POLL_S = 0.1  # how often a blocked hand-over looks whether the consumer stopped
SPANS_KEPT = 4096  # the latest spans (two per batch): a pass may never end (an infinite loader)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class PreparingThread:
    """Iterate ``source`` and ``prepare`` each batch in a daemon thread, ``ahead`` batches ahead
    (plus the one the thread is preparing: up to ``ahead + 1`` prepared batches wait on the device).

    Iterating a ``PreparingThread`` yields ``(batch, event)``: ``event`` is the CUDA event that marks
    the batch ready on ``device`` (None off CUDA). An exception raised by ``source`` or ``prepare``
    is raised in the consumer, in order, after the batches prepared before it. :meth:`close` stops the
    thread (it finishes the batch in hand first) and is idempotent; the consumer must call it (a
    ``try / finally``) so no thread outlives its iteration.
    """

    def __init__(self, source: Iterator[Any], prepare: Callable[[Any], Any], device: torch.device,
                 ahead: int = 1, name: str = "pipeline_opt-prepare") -> None:
        if not isinstance(ahead, int) or ahead < 1:
            raise ValueError(f"ahead={ahead!r} must be an integer >= 1")
        if device.type == "cuda" and device.index is None:  # the caller's current device, not the thread's
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._source, self._prepare = source, prepare
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        # (what, t0_ns, t1_ns) on the epoch clock of the profiler's spans: "next batch" (waiting for
        # the loader) and "prepare batch" (decode, copy, transforms) of the latest batches, for the trace
        self.spans: deque[tuple[str, int, int]] = deque(maxlen=SPANS_KEPT)
        self._stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _hand_over(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self._stream is not None:
                torch.cuda.set_device(self.device)  # the current device is per thread
            while not self._stop.is_set():
                t0 = time.time_ns()
                try:
                    raw = next(self._source)
                except StopIteration:
                    break
                t1 = time.time_ns()
                event = None
                with torch.autograd.profiler.record_function("pipeline_opt.prepare_batch"):
                    if self._stream is None:
                        batch = self._prepare(raw)
                    else:
                        with torch.cuda.stream(self._stream):
                            batch = self._prepare(raw)
                            event = torch.cuda.Event()
                            event.record(self._stream)
                self.spans.extend((("next batch", t0, t1), ("prepare batch", t1, time.time_ns())))
                del raw
                if not self._hand_over((batch, event)):
                    return
                del batch
        except BaseException as exc:  # handed to the consumer, raised there
            self._hand_over(_Failure(exc))
            return
        self._hand_over(_END)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def close(self) -> None:
        """Stop the thread and wait for it; batches prepared but not taken are dropped."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()  # unblock a hand-over in progress
            except queue.Empty:
                pass
            self._thread.join(timeout=_POLL_S)
        while not self._queue.empty():
            self._queue.get_nowait()
