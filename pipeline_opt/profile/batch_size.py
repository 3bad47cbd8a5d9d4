"""May I raise the batch size? :func:`max_batch_size` measures it instead of guessing.

On real batches of the user's loader and with the user's step (AMP and all), the peak memory the
allocator reserves is measured at two or three batch sizes; a line through them predicts the largest
batch whose peak keeps ``margin`` of the device free; one real step at that size verifies it (an
out-of-memory there is caught, the cache emptied and a smaller size tried), and a few timed steps at
the current and the predicted size say what the larger batch gives in throughput. The model's
parameters, buffers, gradients, modes and the RNG states are restored bitwise afterwards, as in
:func:`pipeline_opt.profile`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pipeline_opt._logging import get_logger
from pipeline_opt._step import ModelStateGuard, batch_size_of, default_step, move_to_device, resolve_device
from pipeline_opt.profile.memory import CudaMemory, GiB, MemoryBackend

log = get_logger("profile.batch_size")

DEFAULT_MARGIN = 0.10
TIMED_STEPS = 3


@dataclass(frozen=True)
class BatchSizeAdvice:
    """What :func:`max_batch_size` measured and predicted."""

    measured: bool
    current: int = 0
    batch_sizes: tuple[int, ...] = ()  # the sizes measured for the fit
    peak_reserved_bytes: tuple[int, ...] = ()
    bytes_per_sample: float = 0.0  # the line's slope
    fixed_bytes: float = 0.0  # its intercept (model, gradients, optimizer-free workspace)
    device_total_bytes: int = 0
    margin: float = DEFAULT_MARGIN
    predicted: int = 0  # the largest batch whose predicted peak keeps ``margin`` free
    verified: int | None = None  # the largest size that ran one real step (the prediction or below)
    verified_peak_bytes: int | None = None
    out_of_memory: tuple[int, ...] = ()  # sizes that ran out of memory
    throughput: dict[int, float] = field(default_factory=dict)  # samples/s per size (synchronised steps)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
                f"{self.device_total_bytes / GiB:.1f} GiB kept free the largest batch is {self.predicted}")
        if self.verified is None:
            return line + "; no larger batch ran without running out of memory"
        line += f"; a real step at {self.verified} peaked at {(self.verified_peak_bytes or 0) / GiB:.2f} GiB"
        if self.gain is not None:
            line += (f"; throughput {self.throughput[self.current]:,.0f} -> {self.throughput[self.verified]:,.0f} "
                     f"samples/s ({self.gain:.2f}x)")
        return line


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
                   time_steps: int = TIMED_STEPS, backend: MemoryBackend | None = None) -> BatchSizeAdvice:
    """The largest batch that fits with ``margin`` of the device's memory free, measured and verified.

    Args:
        loader: the training loader; its first batch is the template (its samples are repeated).
        model, step_fn, device: as :func:`pipeline_opt.profile` (the default step: forward + backward).
        margin: the share of device memory to keep free (0.10: a peak of at most 90%).
        sizes: the batch sizes to measure (default: half the loader's batch and the batch itself,
            plus twice it when that is predicted to fit).
        make_batch: ``make_batch(n)`` returns a batch of ``n`` samples, for batches whose tensors do not
            all have the batch size first (detection boxes).
        time_steps: synchronised steps timed at the current and the verified size (0: none).
        backend: the memory readings (default: ``torch.cuda`` on ``device``).

    On a CPU device nothing is measured: the result says so.
    """
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r} must be a fraction in [0, 1), e.g. 0.1")
    dev = resolve_device(model, device)
    if dev.type != "cuda" and backend is None:
        return BatchSizeAdvice(measured=False, note=f"not measured on {dev.type} (CUDA devices only)")
    memory = backend if backend is not None else CudaMemory(dev)
    step = step_fn if step_fn is not None else default_step
    from pipeline_opt.tune.measure import first_batch

    template = first_batch(loader)
    current = batch_size_of(template)
    build = make_batch if make_batch is not None else (lambda n: resize_batch(template, n))
    total = memory.total()
    with ModelStateGuard(model):
        measured: dict[int, int] = {}
        wanted = list(sizes) if sizes else [max(1, current // 2), current]
        for n in wanted:
            peak = peak_bytes(step, model, build(n), dev, memory)
            if peak is None:
                return BatchSizeAdvice(measured=True, current=current, batch_sizes=tuple(measured),
                                       peak_reserved_bytes=tuple(measured.values()), device_total_bytes=total,
                                       margin=margin, out_of_memory=(n,),
                                       note=f"batch {n} already ran out of memory")
            measured[n] = peak
        slope, fixed = _fit(measured)
        predicted = _predict(slope, fixed, total, margin)
        if not sizes and predicted >= 2 * current and len(measured) == 2:  # a third point, far out, steadies the line
            peak = peak_bytes(step, model, build(2 * current), dev, memory)
            if peak is not None:
                measured[2 * current] = peak
                slope, fixed = _fit(measured)
                predicted = _predict(slope, fixed, total, margin)
        verified, verified_peak, oom = None, None, []
        for n in (predicted, int(predicted * 0.9)):
            if n <= 0 or n in oom:
                continue
            peak = peak_bytes(step, model, build(n), dev, memory)
            if peak is None:
                oom.append(n)
                continue
            verified, verified_peak = n, peak
            break
        throughput = {}
        if time_steps > 0:
            for n in {current, verified} - {None}:
                throughput[n] = step_throughput(step, model, build(n), dev, time_steps)
    advice = BatchSizeAdvice(
        measured=True, current=current, batch_sizes=tuple(measured), peak_reserved_bytes=tuple(measured.values()),
        bytes_per_sample=slope, fixed_bytes=fixed, device_total_bytes=total, margin=margin, predicted=predicted,
        verified=verified, verified_peak_bytes=verified_peak, out_of_memory=tuple(oom), throughput=throughput)
    log.info("%s", advice.summary())
    return advice


def _fit(points: dict[int, int]) -> tuple[float, float]:
    """Least-squares line ``peak = fixed + slope * n`` (slope >= 1 byte per sample)."""
    xs, ys = list(points), [float(v) for v in points.values()]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var > 0 else mean_y / max(mean_x, 1)
    slope = max(slope, 1.0)
    return slope, mean_y - slope * mean_x


def _predict(slope: float, fixed: float, total: int, margin: float) -> int:
    return max(0, math.floor(((1.0 - margin) * total - fixed) / slope + 1e-6))  # 1e-6: float round-off


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def peak_bytes(step: Callable, model: torch.nn.Module, batch: Any, dev: torch.device, memory: MemoryBackend) -> int | None:
    """The peak reserved bytes over two steps ``step(model, batch)`` on ``batch`` (the second one's
    allocator state is the steady one), or None when it ran out of memory (gradients dropped, the cache
    emptied). The caller restores the model (:class:`~pipeline_opt._step.ModelStateGuard`)."""
    try:
        batch = move_to_device(batch, dev) if dev.type == "cuda" else batch
        peak = 0
        for _ in range(2):
            memory.reset_peak()
            step(model, batch)
            _sync(dev)
            peak = max(peak, memory.peaks()[1])
        return peak
    except Exception as exc:
        if not _is_oom(exc):
            raise
        model.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
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
