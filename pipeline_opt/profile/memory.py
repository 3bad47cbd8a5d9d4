"""CUDA memory per training step: peak allocated and reserved, the device's total, the headroom.

"Memory sits far below the limit but I dare not raise the batch size", and "memory spikes mid-run":
:class:`MemoryMeter` resets the allocator's peak statistics at each step start and reads them at its
end (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``: the peak inside the step, not a
sample at its end), so every step's peak is known; :func:`summarise` turns the steps into a
:class:`MemoryStats` with the headroom and the steps whose peak stands out (a spike). On a CPU device
nothing is measured and the report says so.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

SPIKE = 1.10  # a step whose peak exceeds the median step's peak by this factor is a spike
FRAGMENTATION_SHARE = 0.20  # reserved-but-unallocated above this share of reserved is worth a line
GiB = float(1 << 30)


class MemoryBackend(Protocol):
    """What :class:`MemoryMeter` reads (``torch.cuda`` on a device; a fake in tests).

    A backend may also have ``release()``: hand the allocator's cached (reserved but unallocated)
    memory back. :func:`pipeline_opt.profile.batch_size.peak_bytes` calls it before each measurement
    when it exists, because resetting the peak keeps the cache in the reserved peak."""

    def reset_peak(self) -> None: ...

    def peaks(self) -> tuple[int, int]: ...  # (max allocated, max reserved) since the last reset

    def total(self) -> int: ...


class CudaMemory:
    """:class:`MemoryBackend` of one CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peaks(self) -> tuple[int, int]:
        return int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.max_memory_reserved(self.device))

    def total(self) -> int:
        return int(torch.cuda.get_device_properties(self.device).total_memory)

    def release(self) -> None:
        """Hand the caching allocator's unused segments back to the driver (``torch.cuda.empty_cache``)."""
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class MemoryStats:
    """Peak CUDA memory of the measured steps, and what it leaves free."""

    measured: bool
    device_total_bytes: int = 0
    peak_allocated_bytes: tuple[int, ...] = ()  # per measured step
    peak_reserved_bytes: tuple[int, ...] = ()
    steady_peak_bytes: int = 0  # median step's peak allocated
    max_peak_bytes: int = 0
    max_reserved_bytes: int = 0
    headroom_bytes: int = 0  # device total - the largest reserved peak
    fragmentation_bytes: int = 0  # reserved - allocated at the largest reserved peak
    spikes: tuple[int, ...] = ()  # indices of the steps whose peak exceeds SPIKE x steady
    top_alloc_ops: tuple[tuple[str, int], ...] = ()  # (op, bytes it allocated) in the traced steps
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The memory lines of the text report."""
        if not self.measured:
            return [f"memory: {self.note}"]
        out = [f"memory: peak {self.max_peak_bytes / GiB:.2f} GiB allocated, {self.max_reserved_bytes / GiB:.2f} GiB "
               f"reserved of {self.device_total_bytes / GiB:.1f} GiB; headroom {self.headroom_bytes / GiB:.2f} GiB "
               f"({self.headroom_bytes / max(self.device_total_bytes, 1):.0%})"]
        if self.spikes:
            out.append(f"memory spikes: {len(self.spikes)} step(s) peaked above {SPIKE:.2f}x the steady "
                       f"{self.steady_peak_bytes / GiB:.2f} GiB (steps {', '.join(map(str, self.spikes[:8]))})")
        if self.top_alloc_ops:
            out.append("allocated most (traced steps): " + ", ".join(
                f"{name} {size / GiB:.2f} GiB" for name, size in self.top_alloc_ops[:3]))
        if self.fragmentation_bytes > FRAGMENTATION_SHARE * max(self.max_reserved_bytes, 1):
            out.append(f"memory fragmentation: {self.fragmentation_bytes / GiB:.2f} GiB reserved but not allocated "
                       "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True often returns it)")
        return out


def not_measured(device: torch.device | str) -> MemoryStats:
    return MemoryStats(measured=False, note=f"not measured on {torch.device(device).type} (CUDA devices only)")


class MemoryMeter:
    """Per-step peak memory: call :meth:`begin` before a step and :meth:`end` after it (synchronised)."""

    def __init__(self, device: torch.device | str, backend: MemoryBackend | None = None) -> None:
        self.device = torch.device(device)
        self.backend = backend if backend is not None else (CudaMemory(self.device) if self.device.type == "cuda"
                                                            else None)
        self.allocated: list[int] = []
        self.reserved: list[int] = []

    @property
    def active(self) -> bool:
        return self.backend is not None

    def begin(self) -> None:
        if self.backend is not None:
            self.backend.reset_peak()

    def end(self) -> None:
        if self.backend is not None:
            allocated, reserved = self.backend.peaks()
            self.allocated.append(allocated)
            self.reserved.append(reserved)

    def stats(self) -> MemoryStats:
        if self.backend is None:
            return not_measured(self.device)
        return summarise(self.allocated, self.reserved, self.backend.total())


def summarise(allocated: list[int], reserved: list[int], total: int) -> MemoryStats:
    """:class:`MemoryStats` of per-step peaks (``allocated[i]``, ``reserved[i]``) on a device of ``total`` bytes."""
    if not allocated:
        return MemoryStats(measured=False, device_total_bytes=total, note="no step was measured")
    steady = int(statistics.median(allocated))
    top = max(range(len(reserved)), key=reserved.__getitem__)
    spikes = tuple(i for i, a in enumerate(allocated) if steady > 0 and a > SPIKE * steady)
    return MemoryStats(
        measured=True, device_total_bytes=total, peak_allocated_bytes=tuple(allocated),
        peak_reserved_bytes=tuple(reserved), steady_peak_bytes=steady, max_peak_bytes=max(allocated),
        max_reserved_bytes=max(reserved), headroom_bytes=max(total - max(reserved), 0),
        fragmentation_bytes=max(reserved[top] - allocated[top], 0), spikes=spikes)
