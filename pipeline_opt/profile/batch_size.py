"""May I raise the batch size? :func:`max_batch_size` measures it instead of guessing.

On real batches of the user's loader and with the user's step (AMP and all), the peak memory the
allocator reserves is measured at two or three batch sizes, the allocator's cache released before
each size so that no earlier (larger) step's cached segments count in its peak. A line through these
peaks predicts the largest batch whose peak keeps ``margin`` of the device free (``predicted``).

The line is only a first guess: reserved peaks are step-shaped (the allocator rounds segments) and
the memory per sample can grow with the batch, so a line through small sizes can overshoot the real
limit. The answer is therefore found with real steps, starting at the prediction: each probe runs
two measured steps at one size. A peak within the budget ``(1 - margin) * total`` makes the size a
fit; a peak above it makes the size one more point, and the next probe is interpolated between it
and the largest fit; an out-of-memory makes the size an upper bound, and the next probe is the
midpoint between the largest fit and it (or the line through the two largest fits, where that is
lower). While nothing has failed, the next probe is the line through the two largest fits, at least
:data:`TOLERANCE` and at most twice above the largest. Probing stops once the largest fit and the smallest size that does not fit are within
:data:`TOLERANCE` of each other (or one sample apart), or after :data:`MAX_PROBES` probes.
``verified`` is the largest size whose real step peaked within the budget (the measured current
batch when nothing larger does, which ``note`` says). A few timed steps at the current and the
verified size say what the larger batch gives in throughput. The model's parameters, buffers,
gradients, modes and the RNG states are restored bitwise afterwards, as in
:func:`pipeline_opt.profile`; after an out-of-memory the gradients are dropped and the cache emptied.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt._core.step import (
    ModelStateGuard,
    batch_size_of,
    default_step,
    move_to_device,
    resolve_device,
    tensor_bytes,
)
from pipeline_opt.loading.dataloader import first_batch
from pipeline_opt.profile.memory import CudaMemory, GiB, MemoryBackend

log = get_logger("profile.batch_size")

DEFAULT_MARGIN = 0.10
TIMED_STEPS = 3
MAX_PROBES = 6  # real-step probes after the line's points
TOLERANCE = 0.03  # probing stops once the largest fit and the smallest failure are this close


@dataclass(frozen=True)
class BatchSizeAdvice:
    """What :func:`max_batch_size` measured, predicted and verified."""

    measured: bool
    current: int = 0
    batch_sizes: tuple[int, ...] = ()  # the sizes measured for the fit
    peak_reserved_bytes: tuple[int, ...] = ()
    bytes_per_sample: float = 0.0  # the line's slope
    fixed_bytes: float = 0.0  # its intercept (model, gradients, optimizer-free workspace)
    device_total_bytes: int = 0
    margin: float = DEFAULT_MARGIN
    predicted: int = 0  # the line's largest batch whose peak keeps ``margin`` free (the first probe)
    verified: int | None = None  # the largest size whose real step peaked within the budget
    verified_peak_bytes: int | None = None
    out_of_memory: tuple[int, ...] = ()  # sizes that ran out of memory
    probes: tuple[tuple[int, int | None], ...] = ()  # (size, peak reserved or None: out of memory), in order
    throughput: dict[int, float] = field(default_factory=dict)  # samples/s per size (synchronised steps)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def budget_bytes(self) -> float:
        """The largest peak that keeps ``margin`` of the device free."""
        return (1.0 - self.margin) * self.device_total_bytes

    @property
    def gain(self) -> float | None:
        """Throughput at the verified size over the current one (None if either was not timed)."""
        if self.verified is None or self.current not in self.throughput or self.verified not in self.throughput:
            return None
        return self.throughput[self.verified] / max(self.throughput[self.current], 1e-12)

    def summary(self) -> str:
        if not self.measured:
            return f"batch size: {self.note}"
        line = (f"batch size: peak memory {self.fixed_bytes / GiB:.2f} GiB + {self.bytes_per_sample / (1 << 20):.1f} "
                f"MiB per sample (measured at {', '.join(map(str, self.batch_sizes))}); with {self.margin:.0%} of "
                f"{self.device_total_bytes / GiB:.1f} GiB kept free the line predicted {self.predicted:,}")
        if self.probes:
            line += "; real steps: " + ", ".join(self._probe_text(n, peak) for n, peak in self.probes)
        if self.verified is None:
            return line + f"; {self.note or 'no size ran within the budget'}"
        line += f"; verified {self.verified:,} (peak {(self.verified_peak_bytes or 0) / GiB:.2f} GiB)"
        if self.note:
            line += f" ({self.note})"
        if self.gain is not None:
            line += (f"; throughput {self.throughput[self.current]:,.0f} -> {self.throughput[self.verified]:,.0f} "
                     f"samples/s ({self.gain:.2f}x)")
        return line

    def _probe_text(self, n: int, peak: int | None) -> str:
        if peak is None:
            return f"{n:,} out of memory"
        return f"{n:,} {'fits' if peak <= self.budget_bytes else 'over budget'} ({peak / GiB:.1f} GiB)"


PER_BOX_KEYS = ("batch_idx", "cls", "bboxes", "keypoints")  # ultralytics' detection batch: one row per box


def resize_batch(batch: Any, n: int) -> Any:
    """``batch`` with ``n`` samples: its samples repeated (or the first ``n`` kept) along dim 0 of every
    tensor whose first dimension is the batch size. An ultralytics detection batch (a dict with
    ``img`` and ``batch_idx``) gets each repeated sample's boxes, renumbered. Raises ``TypeError`` when
    any other tensor has another first dimension: pass ``make_batch=`` to :func:`max_batch_size`."""
    if isinstance(batch, Mapping) and "img" in batch and isinstance(batch.get("batch_idx"), torch.Tensor):
        return _resize_detection(batch, n)
    size = batch_size_of(batch)

    def resize(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != size:
                raise TypeError(f"a tensor of shape {tuple(value.shape)} in the batch does not have the batch size "
                                f"{size} first; pass make_batch=lambda n: <a batch of n samples> to max_batch_size")
            return value[torch.arange(n, device=value.device) % size]
        if isinstance(value, Mapping):
            return type(value)({k: resize(v) for k, v in value.items()}) if isinstance(value, dict) \
                else {k: resize(v) for k, v in value.items()}
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            items = [resize(v) for v in value]
            return type(value)(items) if isinstance(value, (list, tuple)) else items
        return value

    return resize(batch)


def _resize_detection(batch: Mapping[str, Any], n: int) -> dict[str, Any]:
    """:func:`resize_batch` for ultralytics' layout: per-sample tensors and lists indexed like the
    images, per-box tensors (:data:`PER_BOX_KEYS`) gathered sample by sample, ``batch_idx`` renumbered."""
    size = int(batch["img"].shape[0])
    source = [j % size for j in range(n)]
    owner = batch["batch_idx"].long()
    boxes_of = [torch.nonzero(owner == s).flatten() for s in range(size)]
    rows = torch.cat([boxes_of[s] for s in source]) if n else owner[:0]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "batch_idx":
            out[key] = torch.cat([torch.full((len(boxes_of[s]),), j, dtype=value.dtype)
                                  for j, s in enumerate(source)]).to(value.device) if n else value[:0]
        elif key in PER_BOX_KEYS and isinstance(value, torch.Tensor):
            out[key] = value[rows.to(value.device)]
        elif isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == size:
            out[key] = value[torch.tensor(source, dtype=torch.long, device=value.device)]
        elif isinstance(value, (list, tuple)) and len(value) == size:
            out[key] = type(value)(value[s] for s in source)
        else:
            out[key] = value
    return out


def max_batch_size(loader: Any, model: torch.nn.Module, step_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
                   device: torch.device | str | None = None, *, margin: float = DEFAULT_MARGIN,
                   sizes: Sequence[int] | None = None, make_batch: Callable[[int], Any] | None = None,
                   time_steps: int = TIMED_STEPS, backend: MemoryBackend | None = None,
                   max_probes: int = MAX_PROBES, tolerance: float = TOLERANCE) -> BatchSizeAdvice:
    """The largest batch that fits with ``margin`` of the device's memory free, measured and verified.

    Args:
        loader: the training loader; its first batch is the template (its samples are repeated).
        model, step_fn, device: as :func:`pipeline_opt.profile` (the default step: forward + backward).
        margin: the share of device memory to keep free (0.10: a peak of at most 90%).
        sizes: the batch sizes to measure for the line (default: half the loader's batch and the batch
            itself, plus twice it when that is predicted to fit).
        make_batch: ``make_batch(n)`` returns a batch of ``n`` samples, for batches whose tensors do not
            all have the batch size first (detection boxes).
        time_steps: synchronised steps timed at the current and the verified size (0: none).
        backend: the memory readings (default: ``torch.cuda`` on ``device``).
        max_probes: the most real-step probes after the line's points (the line's prediction first).
        tolerance: probing stops once the largest size that fits and the smallest that does not are
            within this share of the former (or one sample apart).

    On a CPU device nothing is measured: the result says so.
    """
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r} must be a fraction in [0, 1), e.g. 0.1")
    dev = resolve_device(model, device)
    if dev.type != "cuda" and backend is None:
        return BatchSizeAdvice(measured=False, note=f"not measured on {dev.type} (CUDA devices only)")
    memory = backend if backend is not None else CudaMemory(dev)
    step = step_fn if step_fn is not None else default_step
    template = first_batch(loader)
    current = batch_size_of(template)
    min_slope = max(1.0, tensor_bytes(template) / max(current, 1))  # a sample's own tensors are on the device
    build = make_batch if make_batch is not None else (lambda n: resize_batch(template, n))
    total = memory.total()
    budget = (1.0 - margin) * total
    try:
        with ModelStateGuard(model):
            measured: dict[int, int] = {}
            oom: list[int] = []
            wanted = list(sizes) if sizes else [max(1, current // 2), current]
            for n in wanted:
                peak = peak_bytes(step, model, build(n), dev, memory)
                if peak is None:
                    return BatchSizeAdvice(measured=True, current=current, batch_sizes=tuple(measured),
                                           peak_reserved_bytes=tuple(measured.values()), device_total_bytes=total,
                                           margin=margin, out_of_memory=(n,),
                                           note=f"batch {n} already ran out of memory")
                measured[n] = peak
            slope, fixed = _fit(measured, min_slope)
            predicted = _predict(slope, fixed, budget)
            if not sizes and predicted >= 2 * current and len(measured) == 2:  # a third point, far out
                peak = peak_bytes(step, model, build(2 * current), dev, memory)
                if peak is None:
                    oom.append(2 * current)
                else:
                    measured[2 * current] = peak
                    slope, fixed = _fit(measured, min_slope)
                    predicted = _predict(slope, fixed, budget)
            search = _Search(dict(measured), oom, budget, tolerance, min_slope)
            probes: list[tuple[int, int | None]] = []
            n = search.first(predicted)
            while n is not None and len(probes) < max_probes:
                peak = peak_bytes(step, model, build(n), dev, memory)
                probes.append((n, peak))
                search.add(n, peak)
                n = search.next()
            verified = search.fits
            verified_peak = search.points[verified] if verified is not None else None
            note = _note(search, current, margin, len(probes), max_probes)
            throughput = {}
            if time_steps > 0:
                for n in {current, verified} - {None}:
                    throughput[n] = step_throughput(step, model, build(n), dev, time_steps)
    finally:
        _release(memory, dev)  # leave no cache of the probes behind for the training that follows
    advice = BatchSizeAdvice(
        measured=True, current=current, batch_sizes=tuple(measured), peak_reserved_bytes=tuple(measured.values()),
        bytes_per_sample=slope, fixed_bytes=fixed, device_total_bytes=total, margin=margin, predicted=predicted,
        verified=verified, verified_peak_bytes=verified_peak, out_of_memory=tuple(search.oom), probes=tuple(probes),
        throughput=throughput, note=note)
    log.info("%s", advice.summary())
    return advice


class _Search:
    """The bracket of the real-step search: ``fits`` (the largest size whose peak kept within
    ``budget``) and ``fails`` (the smallest that did not: a peak above the budget, or out of memory),
    and every measured peak in ``points``. Sizes are probed strictly between the two, so the bracket
    only narrows."""

    def __init__(self, points: dict[int, int], oom: list[int], budget: float, tolerance: float,
                 min_slope: float = 1.0) -> None:
        self.points, self.oom, self.budget, self.tolerance = points, oom, budget, tolerance
        self.min_slope = min_slope
        within = [n for n, peak in points.items() if peak <= budget]
        above = [n for n, peak in points.items() if peak > budget] + oom
        self.fits: int | None = max(within) if within else None
        self.fails: int | None = min(above) if above else None

    def add(self, n: int, peak: int | None) -> None:
        if peak is None:
            self.oom.append(n)
        else:
            self.points[n] = peak
        if peak is not None and peak <= self.budget:
            self.fits = n if self.fits is None else max(self.fits, n)
        else:
            self.fails = n if self.fails is None else min(self.fails, n)

    @property
    def closed(self) -> bool:
        """Whether the largest fit and the smallest failure are within the tolerance (or one sample)."""
        return (self.fits is not None and self.fails is not None
                and self.fails - self.fits <= max(1, int(self.tolerance * self.fits)))

    def first(self, predicted: int) -> int | None:
        """The line's prediction where it lies inside the bracket, else :meth:`next`."""
        if self.fits is not None and predicted > self.fits and (self.fails is None or predicted < self.fails):
            return predicted
        return self.next()

    def next(self) -> int | None:
        """The next size to probe, or None when the bracket is closed (or nothing fits at all)."""
        lo, hi = self.fits, self.fails
        if lo is None or self.closed:
            return None
        if hi is None:  # nothing failed yet: the line through the two largest fits, 1 tolerance to 2x up
            step = max(1, int(self.tolerance * lo))
            return min(max(self._line_through_fits(), lo + step), 2 * lo)
        step = max(1, int(self.tolerance * lo / 2))  # a probe this close to either end closes the bracket
        if hi in self.points and self.points[hi] > self.points[lo]:  # ran above the budget: interpolate
            guess = lo + math.floor((self.budget - self.points[lo]) * (hi - lo) / (self.points[hi] - self.points[lo]))
        else:  # out of memory: bisection, or the line through the fits where that is lower
            guess = min((lo + hi) // 2, self._line_through_fits())
        return min(max(guess, lo + step), hi - step)

    def _line_through_fits(self) -> int:
        largest = sorted(n for n, peak in self.points.items() if peak <= self.budget)[-2:]
        slope, fixed = _fit({n: self.points[n] for n in largest}, self.min_slope)
        return _predict(slope, fixed, self.budget)


def _note(search: _Search, current: int, margin: float, probes: int, max_probes: int) -> str:
    """What ``verified`` is when it is not simply the search's answer above the current batch."""
    verified = search.fits
    if verified is None:
        return f"no measured size kept {margin:.0%} of the memory free"
    if verified < current:
        return f"nothing from the current batch {current} up kept {margin:.0%} of the memory free"
    if verified == current:
        return f"no batch above the current {current} kept {margin:.0%} free: the current batch is the fallback"
    if not search.closed and probes >= max_probes:
        failing = f", {search.fails} does not" if search.fails is not None else ""
        return f"stopped after {probes} probes: {verified} fits{failing}"
    return ""


def _fit(points: dict[int, int], min_slope: float = 1.0) -> tuple[float, float]:
    """Least-squares line ``peak = fixed + slope * n``, the slope at least ``min_slope`` bytes per sample
    (equal reserved peaks at two sizes, one allocator segment, would otherwise give a flat line that
    predicts an absurd batch)."""
    xs, ys = list(points), [float(v) for v in points.values()]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var > 0 else mean_y / max(mean_x, 1)
    slope = max(slope, min_slope)
    return slope, mean_y - slope * mean_x


def _predict(slope: float, fixed: float, budget: float) -> int:
    """The largest size whose peak on the line ``fixed + slope * n`` stays within ``budget``."""
    return max(0, math.floor((budget - fixed) / slope + 1e-6))  # 1e-6: float round-off


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _release(memory: MemoryBackend, dev: torch.device) -> None:
    """Drop unreachable tensors (reference cycles, a caught exception's frames) and hand the allocator's
    cached segments back, through ``memory.release()`` where the backend has one (``torch.cuda.empty_cache``
    on a CUDA device otherwise)."""
    gc.collect()
    release = getattr(memory, "release", None)
    if release is not None:
        release()
    elif dev.type == "cuda":
        torch.cuda.empty_cache()


def peak_bytes(step: Callable, model: torch.nn.Module, batch: Any, dev: torch.device, memory: MemoryBackend) -> int | None:
    """The peak reserved bytes of two steps ``step(model, batch)`` from a released cache, or None when
    they ran out of memory (gradients dropped, the cache released).

    The allocator keeps freed segments cached, and resetting its peak statistics sets the reserved
    peak to what is reserved now, cache included: without the release, a size measured after a larger
    one would read the larger one's peak. Both steps are counted (the second one's allocator state is
    the steady one, fragmentation included). The caller restores the model
    (:class:`~pipeline_opt._core.step.ModelStateGuard`)."""
    try:
        batch = move_to_device(batch, dev) if dev.type == "cuda" else batch
        _release(memory, dev)
        memory.reset_peak()
        for _ in range(2):
            step(model, batch)
        _sync(dev)
        return int(memory.peaks()[1])
    except Exception as exc:
        if not _is_oom(exc):
            raise
    # out of the except block: the exception and the step's frames it held are gone
    batch = None
    model.zero_grad(set_to_none=True)
    _release(memory, dev)
    return None


def step_throughput(step: Callable, model: torch.nn.Module, batch: Any, dev: torch.device, steps: int) -> float:
    """Samples per second of ``steps`` synchronised steps on ``batch``, after one untimed step."""
    batch = move_to_device(batch, dev) if dev.type == "cuda" else batch
    step(model, batch)  # warm-up (allocator, cuDNN's choice for this shape)
    _sync(dev)
    start = time.perf_counter()
    for _ in range(steps):
        step(model, batch)
    _sync(dev)
    return steps * batch_size_of(batch) / max(time.perf_counter() - start, 1e-9)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
