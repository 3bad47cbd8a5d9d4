"""Host-to-device uploads of small per-batch tensors that neither block nor fan out to CPU threads.

The GPU augmentations send a few small tensors to the device every step (the fused kernel's
parameter block, flip flags, warp matrices). ``t.pin_memory().to(device, non_blocking=True)``
does that without waiting for the device, but its page-locked copy (and the ``torch.zeros`` /
slice copies that build such a block) are ATen CPU operations: above 32,768 elements they run
on the intra-op thread pool. While DataLoader workers keep the cores busy, one of those pool
threads is often descheduled and the training thread waits for it at the parallel region's
barrier, so these few small copies can cost the training thread many times their own work per
step, and only while the loader is running.

:class:`PinnedStaging` keeps a ring of page-locked byte buffers per device, allocated once and
grown on demand. :meth:`PinnedStaging.upload` copies the tensor's bytes into the next buffer with
numpy (one thread, no pool), starts the non-blocking copy from it and records a CUDA event; a
buffer is rewritten only after its event completed (``RING`` uploads later, which in a training
loop is steps ago, so the wait is free).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

RING = 8  # buffers per device: an upload's buffer is reused RING uploads later
MAX_STAGED_BYTES = 4 << 20  # larger tensors are page-locked on their own (rare: batches are pinned by the loader)


class _Slot:
    __slots__ = ("buffer", "event")

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None


class PinnedStaging:
    """A ring of page-locked buffers for one CUDA device (see the module docstring)."""

    def __init__(self, device: torch.device, ring: int = RING) -> None:
        if device.type != "cuda":
            raise ValueError(f"PinnedStaging stages uploads to a CUDA device, got {device}")
        if ring < 2:
            raise ValueError(f"ring={ring} must be >= 2 (a buffer must not be rewritten while its copy runs)")
        self.device = device
        self._slots = [_Slot() for _ in range(ring)]
        self._next = 0
        self._lock = threading.Lock()

    def upload(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a CPU tensor) on the device; the host does not wait for the device's queue."""
        if t.device.type != "cpu":
            raise ValueError(f"upload takes a CPU tensor, got one on {t.device}")
        nbytes = t.numel() * t.element_size()
        if nbytes == 0 or nbytes > MAX_STAGED_BYTES or t.dtype.is_complex:
            return (t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True)
        src = _as_bytes(t)
        with self._lock:
            slot = self._slots[self._next]
            self._next = (self._next + 1) % len(self._slots)
            if slot.event is not None and not slot.event.query():
                slot.event.synchronize()  # the copy from this buffer RING uploads ago is still queued
            if slot.buffer is None or slot.buffer.numel() < nbytes:
                slot.buffer = torch.empty(max(nbytes, 4096), dtype=torch.uint8, pin_memory=True)
            staged = slot.buffer[:nbytes]
            np.copyto(staged.numpy(), src)
            out = staged.view(t.dtype).reshape(t.shape).to(self.device, non_blocking=True)
            if slot.event is None:
                slot.event = torch.cuda.Event()
            slot.event.record(torch.cuda.current_stream(self.device))
        return out


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` as a flat uint8 numpy array (a view where ``t`` is contiguous)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


_staging: dict[torch.device, PinnedStaging] = {}
_staging_lock = threading.Lock()


def staging_for(device: torch.device | str) -> PinnedStaging:
    """The process-wide :class:`PinnedStaging` of a CUDA device (``cuda`` means the current one)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with _staging_lock:
        staging = _staging.get(dev)
        if staging is None:
            staging = _staging[dev] = PinnedStaging(dev)
        return staging
