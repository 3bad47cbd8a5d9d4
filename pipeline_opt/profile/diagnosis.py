"""The diagnosis: which part sets the pace, the evidence, and what to change.

Pure functions of measured numbers (:class:`Measurements`), so they are tested on recorded numbers
without a GPU. Signatures (thresholds below):

* **sync** — host-device syncs / collectives (``cudaStreamSynchronize``, ``.item()``, NCCL) take a
  large share of the window;
* **data** — the main thread is blocked in ``next(loader)`` for a large share of the step;
* **compute** — the GPU is busy (on CPU: the loader costs almost nothing);
* **launch** — the GPU idles although the loader is not the cause (the main thread cannot issue
  kernels fast enough);
* **balanced** — none of the above dominates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline_opt._core.littles_law import MARGIN, workers_for
from pipeline_opt.profile.cpu_share import reserved_cpus
from pipeline_opt.transforms.registry import TransformInfo, infos_named

DATA_WAIT_HIGH = 0.30  # data-bound above this share of the step blocked on the loader
DATA_WAIT_LOW = 0.10  # below it the loader keeps up
GPU_IDLE_LOW = 0.15  # compute-bound when the GPU idles less than this
GPU_IDLE_HIGH = 0.30  # launch-bound when it idles more than this with a low data wait
SYNC_HIGH = 0.25  # sync-bound above this share of the window in sync ops
TRANSFORM_SHARE = 0.05  # a transform worth naming takes at least this share of sample time
OUTSIDE_SHARE = 0.5  # reading / decoding worth code changes: at least this share of sample time
SETTING_SHARE = 0.3  # ... worth one setting of the dataset's own (Measurements.decode_advice)
CORE_WAIT_SHARE = 0.10  # the training thread queued for a core this share of its step: worth a change
UNSHARED_BATCH_BYTES = 8 << 20  # a collated batch copied again to be sent: worth naming from 8 MiB


_SYNC_RE = re.compile(
    r"cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy(?!Async)|aten::item|aten::_local_scalar_dense"
    r"|nccl|all_?reduce|all_?gather|reduce_scatter|broadcast|barrier|c10d::",
    re.IGNORECASE,
)


def is_sync_op(name: str) -> bool:
    """True for host-device synchronisations and collectives (not ``cudaDeviceSynchronize``,
    which the profiler itself issues at the window's ends)."""
    return bool(_SYNC_RE.search(name))


@dataclass(frozen=True)
class Measurements:
    """The numbers the diagnosis reads (seconds are medians / means per step or per sample)."""

    device_type: str  # "cuda" gets the GPU signatures; anything else the CPU ones
    step_time_s: float
    compute_time_s: float  # GPU time of the step on CUDA, host time on CPU
    data_wait_frac: float
    gpu_idle_frac: float | None = None
    launch_time_s: float = 0.0  # host time issuing the step
    sync_frac: float = 0.0
    sync_ops: tuple[str, ...] = ()
    batch_cpu_s: float = 0.0  # worker wall seconds to make one batch (0 when not measured)
    sample_s: float = 0.0  # worker seconds per sample
    transform_s: Mapping[str, float] = field(default_factory=dict)  # seconds per sample, by name
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    usable_cpus: int = 1
    pillow_simd: bool = False
    model_dtype: str = "float32"
    has_conv: bool = False
    throughput: float = 0.0
    limit_throughput: float | None = None
    decode_advice: str = ""  # the dataset's own setting that removes its decode (profile.decode_advice)
    unshared_batch_bytes: float = 0.0  # per batch, collated into ordinary memory in a worker (copied to be sent)
    main_cpu_s: float | None = None  # the training process's CPU seconds per step outside making batches
    intra_op_threads: int = 1  # torch.get_num_threads() of the training process
    main_runqueue_s: float | None = None  # per step, the training thread runnable but waiting for a core
    main_runqueue_frac: float | None = None  # the same as a share of the measured window
    main_thread_cpu_s: float | None = None  # per step, the training thread's own time on a CPU (part of main_cpu_s)
    window_step_s: float | None = None  # the measured window's wall seconds per step (its mean step, not the median)


@dataclass(frozen=True)
class Diagnosis:
    """The bottleneck, the evidence behind it, and concrete changes to make."""

    bottleneck: str
    evidence: tuple[str, ...]
    recommendations: tuple[str, ...]


def _device_info(name: str, names: list[str]) -> TransformInfo | None:
    """The registry entry with a device path for a recorded transform name. Where several frameworks
    have a class of that name, the one whose classes name most of the other recorded transforms wins."""
    found = [i for i in infos_named(name) if i.device is not None]
    if len(found) <= 1:
        return found[0] if found else None
    votes = {i.origin: sum(1 for n in names if any(j.origin == i.origin for j in infos_named(n))) for i in found}
    return max(found, key=lambda i: votes[i.origin])


def _is_pil_resize(name: str) -> bool:
    return any(i.cost == "resize" and i.origin == "torchvision" for i in infos_named(name))


def step_budget_s(m: Measurements) -> float:
    """The time one step takes without waiting on data: what the loader must keep up with."""
    budget = max(m.compute_time_s, m.launch_time_s)
    if budget <= 0:
        budget = m.step_time_s * (1.0 - m.data_wait_frac)
    return budget


def workers_needed(batch_cpu_s: float, step_s: float) -> int:
    """Little's law: workers that keep a step of ``step_s`` fed with batches costing ``batch_cpu_s``
    (:func:`~pipeline_opt._core.littles_law.workers_for`, the tuner's formula too)."""
    if batch_cpu_s < 0 or step_s <= 0:
        raise ValueError(f"batch_cpu_s={batch_cpu_s!r} must be >= 0 and step_s={step_s!r} > 0")
    return workers_for(batch_cpu_s, step_s)


def max_workers(m: Measurements) -> int:
    """Workers the machine can host: usable cores minus the training process's measured share of them
    (the tuner's budget rule, :func:`~pipeline_opt.profile.cpu_share.reserved_cpus`; without a
    measurement one core for the main thread and one for the pin-memory thread)."""
    reserved, _ = reserved_cpus(float(m.usable_cpus), m.pin_memory and m.device_type == "cuda",
                                m.main_cpu_s, m.batch_cpu_s or None)
    return max(1, int(math.floor(m.usable_cpus - reserved + 0.5)))


def classify(m: Measurements) -> str:
    """The bottleneck name for ``m``."""
    if m.sync_frac >= SYNC_HIGH and m.sync_frac >= m.data_wait_frac:
        return "sync"
    if m.data_wait_frac >= DATA_WAIT_HIGH:
        return "data"
    if m.device_type == "cuda" and m.gpu_idle_frac is not None:
        if m.gpu_idle_frac <= GPU_IDLE_LOW:
            return "compute"
        if m.gpu_idle_frac >= GPU_IDLE_HIGH and m.data_wait_frac < DATA_WAIT_LOW:
            return "launch"
        return "balanced"
    if m.data_wait_frac < DATA_WAIT_LOW:
        return "compute"
    return "balanced"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _transform_shares(m: Measurements) -> list[tuple[str, float]]:
    if m.sample_s <= 0:
        return []
    shares = [(name, s / m.sample_s) for name, s in m.transform_s.items()]
    return sorted(shares, key=lambda kv: -kv[1])


def outside_share(sample_s: float, transform_s: Mapping[str, float]) -> float | None:
    """The share of a worker's time per sample spent outside the timed transforms (reading,
    decoding, the dataset's own code), or None without per-transform times."""
    if sample_s <= 0 or not transform_s:
        return None
    return 1 - sum(transform_s.values()) / sample_s


def evidence(m: Measurements) -> tuple[str, ...]:
    """Sentences stating the measured facts behind the diagnosis."""
    out = [f"data wait {_pct(m.data_wait_frac)} of step time (median step {m.step_time_s:.4f} s, "
           f"compute {m.compute_time_s:.4f} s)"]
    if m.gpu_idle_frac is not None:
        out.append(f"GPU idle {_pct(m.gpu_idle_frac)} of the measured window")
    if m.device_type == "cuda" and m.launch_time_s > 0:
        out.append(f"main thread issues a step in {m.launch_time_s:.4f} s (host) for {m.compute_time_s:.4f} s "
                   "of GPU time")
    if m.sync_frac > 0.01:
        ops = ", ".join(m.sync_ops[:3]) or "sync ops"
        out.append(f"host-device sync / collectives {_pct(m.sync_frac)} of the window ({ops})")
    if m.main_runqueue_s is not None and m.main_runqueue_frac is not None:
        out.append(f"the training thread waited {m.main_runqueue_s * 1e3:.1f} ms per step for a free core "
                   f"({_pct(m.main_runqueue_frac)} of the measured window; runnable, not running)")
    if m.main_thread_cpu_s is not None and m.step_time_s > 0:
        # the CPU seconds are the window's, per step: their share is of the window's mean step, which a
        # few long steps (an epoch start, a validation) put far above the median
        mean = m.window_step_s
        if mean and mean > 0 and abs(mean - m.step_time_s) > 0.1 * m.step_time_s:
            share = (f"{_pct(min(m.main_thread_cpu_s / mean, 1.0))} of the measured window's mean step of "
                     f"{mean * 1e3:.1f} ms; the median step is {m.step_time_s * 1e3:.1f} ms")
        else:
            share = f"{_pct(min(m.main_thread_cpu_s / (mean or m.step_time_s), 1.0))} of the step"
        line = f"the training thread ran on a CPU {m.main_thread_cpu_s * 1e3:.1f} ms per step ({share})"
        if m.main_cpu_s and m.main_cpu_s > m.main_thread_cpu_s:
            line += (f"; the training process's threads together {m.main_cpu_s * 1e3:.1f} ms (the rest: "
                     "intra-op, autograd and loader threads)")
        out.append(line)
    if m.batch_cpu_s > 0:
        budget = step_budget_s(m)
        out.append(f"workers need {m.batch_cpu_s:.4f} s per batch vs a step budget of {budget:.4f} s "
                   f"with {m.num_workers} worker(s)")
    shares = _transform_shares(m)
    if shares:
        top = ", ".join(f"{n} {_pct(s)}" for n, s in shares[:3])
        outside = outside_share(m.sample_s, m.transform_s)
        out.append(f"per-sample time {m.sample_s * 1e3:.2f} ms; transforms: {top}"
                   + (f"; outside the transforms (reading, decoding): {_pct(outside)}" if outside >= 0.005 else ""))
    if m.unshared_batch_bytes >= 1 << 20:
        out.append(f"each worker batch holds {m.unshared_batch_bytes / (1 << 20):.0f} MiB of tensors outside shared "
                   "memory, which the DataLoader copies into shared memory to send it")
    if m.limit_throughput and m.throughput > m.limit_throughput:  # a limit is an upper bound: that run was off
        out.append(f"throughput {m.throughput:.1f} samples/s is above the {m.limit_throughput:.1f} samples/s the "
                   "step reached on a device-resident batch: the limit could not be measured reliably")
    elif m.limit_throughput:
        out.append(f"throughput {m.throughput:.1f} samples/s = {_pct(m.throughput / m.limit_throughput)} of "
                   f"the {m.limit_throughput:.1f} samples/s the step reaches on a device-resident batch")
    return tuple(out)


def _littles_law_text(m: Measurements) -> str:
    budget = step_budget_s(m)
    need = workers_needed(m.batch_cpu_s, budget)
    return (f"Little's law: batch CPU {m.batch_cpu_s:.3f} s / step {budget:.3f} s = {m.batch_cpu_s / budget:.1f}, "
            f"rounded up plus {MARGIN:.0%} (at least one) = {need}")


def _data_recommendations(m: Measurements) -> list[str]:
    recs: list[str] = []
    cap = max_workers(m)
    if m.batch_cpu_s > 0 and step_budget_s(m) > 0:
        need = workers_needed(m.batch_cpu_s, step_budget_s(m))
        target = min(need, cap)
        if target > m.num_workers:
            capped = f"; capped at {cap}, the cores free for workers" if target < need else ""
            recs.append(f"raise num_workers from {m.num_workers} to {target} ({_littles_law_text(m)}{capped})")
        if need > cap:
            free = f"{cap} cores are" if cap != 1 else "1 core is"
            recs.append(f"{need} workers would be needed but only {free} free for workers: "
                        "reduce the CPU work per sample (below)")
        if need <= m.num_workers:
            recs.append(f"{m.num_workers} workers already cover the {m.batch_cpu_s:.3f} s of CPU per batch: the wait "
                        "comes from moving batches across processes; ship uint8 images instead of float32 "
                        "(4x fewer bytes) and pack each batch into one tensor")
    elif m.num_workers == 0:
        recs.append(f"use worker processes: num_workers={min(4, cap)} (samples are made on the main thread now)")
    if m.num_workers > 0 and not m.persistent_workers:
        recs.append("set persistent_workers=True (workers are re-created every epoch otherwise)")
    if m.device_type == "cuda" and not m.pin_memory:
        recs.append("set pin_memory=True (page-locked buffers make the host-to-device copy asynchronous)")
    recs += _thread_recommendations(m, max(m.num_workers, min(4, cap)))
    recs += _transform_recommendations(m) + _collate_recommendations(m)
    return recs


def _thread_recommendations(m: Measurements, workers: int) -> list[str]:
    """A model trained on the CPU spreads its step over ``intra_op_threads`` cores, the same cores the
    workers need: on a 2-core machine 2 workers beside a 2-thread step read 162 img/s, beside a
    1-thread step 283 (a small CNN, 640x480 JPEGs)."""
    free = max(1, m.usable_cpus - workers)
    if m.device_type != "cpu" or workers == 0 or m.intra_op_threads <= free:
        return []
    return [f"the step's {m.intra_op_threads} intra-op threads and {workers} worker(s) share {m.usable_cpus} cores: "
            f"torch.set_num_threads({free}) in the training process leaves the workers theirs (a model trained "
            "on the CPU; measure both, the step itself gets fewer threads)"]


def _collate_recommendations(m: Measurements) -> list[str]:
    if m.unshared_batch_bytes < UNSHARED_BATCH_BYTES:
        return []
    return [f"the collate function returns {m.unshared_batch_bytes / (1 << 20):.0f} MiB per batch in ordinary memory, "
            "which every worker then copies into shared memory to send: deliver through shared slots "
            "(po.autotune(..., shared_slots=True); attach(..., shared_slots=True) for ultralytics), or stack the "
            "large tensors with torch.utils.data.default_collate(list_of_tensors) instead of torch.stack (in a "
            "worker it allocates the batch in shared memory, which saves the copy but measured no gain beyond the "
            "noise on an ultralytics trainer)"]


def _transform_recommendations(m: Measurements) -> list[str]:
    recs = []
    shares = _transform_shares(m)
    names = [n for n, _ in shares]
    movable = [(n, s, info) for n, s in shares if s >= TRANSFORM_SHARE
               for info in (_device_info(n, names),) if info is not None]
    if movable and m.device_type == "cuda":
        for hint in dict.fromkeys(info.hint for _, _, info in movable):
            moved = ", ".join(f"{n} ({_pct(s)} of sample time)" for n, s, info in movable if info.hint == hint)
            recs.append(f"move {moved} to the GPU: {hint}")
    elif movable:
        names_text = ", ".join(f"{n} ({_pct(s)})" for n, s, _ in movable)
        recs.append(f"cheapen the per-sample CPU work: {names_text}")
    resize = sum(s for n, s in shares if _is_pil_resize(n))
    if resize >= 0.25 and not m.pillow_simd:
        recs.append(f"install Pillow-SIMD: resizing is {_pct(resize)} of worker time and Pillow-SIMD resizes 5-8x "
                    "faster (pip uninstall -y pillow && CC=\"cc -mavx2\" pip install --no-cache-dir --no-deps "
                    "pillow-simd)")
    outside = outside_share(m.sample_s, m.transform_s)
    if outside is not None and m.decode_advice and outside >= SETTING_SHARE:
        recs.append(f"{_pct(outside)} of sample time is outside the transforms: {m.decode_advice}")
    elif outside is not None and outside > OUTSIDE_SHARE:
        recs.append(f"{_pct(outside)} of sample time is outside the transforms (reading / decoding): "
                    "decode at reduced size (PIL Image.draft) or on the GPU (torchvision.io.decode_jpeg(device='cuda'))")
    return recs


def _fewer_workers(m: Measurements, why: str) -> list[str]:
    if m.batch_cpu_s <= 0 or step_budget_s(m) <= 0 or m.num_workers <= 1:
        return []
    need = workers_needed(m.batch_cpu_s, step_budget_s(m))
    if need < m.num_workers:
        return [f"lower num_workers from {m.num_workers} to {need} ({_littles_law_text(m)}); {why}"]
    return []


def _core_recommendations(m: Measurements) -> list[str]:
    """The training thread waited for a core for ``CORE_WAIT_SHARE`` of its step or more: whatever the
    bottleneck's name, the step ran slower because others held the cores. The DataLoader's workers are
    the usual others: each busy worker keeps a core, and the thread that launches the step (and, with a
    GPU decode, the thread that decodes) queues behind them."""
    if m.main_runqueue_frac is None or m.main_runqueue_frac < CORE_WAIT_SHARE:
        return []
    waited = (f"the training thread waited for a core {_pct(m.main_runqueue_frac)} of the time "
              f"({m.num_workers} worker(s) on {m.usable_cpus} usable cores)")
    if m.num_workers > 0 and m.batch_cpu_s > 0 and step_budget_s(m) > 0:
        need = workers_needed(m.batch_cpu_s, step_budget_s(m))
        if need < m.num_workers:
            return [f"{waited}: lower num_workers from {m.num_workers} to {need} ({_littles_law_text(m)}), which "
                    "leaves it a core"]
    return [f"{waited}: leave it a core (fewer workers if the loader keeps up with fewer, fewer other processes "
            "on the machine); po.autotune measures the worker count"]


def recommend(m: Measurements, bottleneck: str) -> tuple[str, ...]:
    """Concrete changes for ``bottleneck`` given ``m``."""
    core = _core_recommendations(m)
    rest = [r for r in _bottleneck_recommendations(m, bottleneck)
            if not (core and r.startswith(f"lower num_workers from {m.num_workers}"))]
    # a data-bound step needs its data first; otherwise the cores the step queued for come first
    return tuple(rest + core if bottleneck == "data" else core + rest)


def _bottleneck_recommendations(m: Measurements, bottleneck: str) -> list[str]:
    recs: list[str] = []
    if bottleneck == "data":
        recs = _data_recommendations(m)
    elif bottleneck == "compute":
        if m.device_type == "cuda" and m.model_dtype == "float32":
            recs.append("use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) around the forward pass")
        if m.has_conv:
            recs.append("use channels_last: model.to(memory_format=torch.channels_last) and the same for the images")
        recs.append("try torch.compile(model); a smaller input resolution or batch trades accuracy for speed")
        recs += _fewer_workers(m, "the loader keeps up with fewer, which frees CPU")
    elif bottleneck == "launch":
        recs += _fewer_workers(m, "extra workers steal CPU from the main thread that launches the kernels")
        recs.append("cut per-step launch overhead: torch.compile(model, mode='reduce-overhead') (CUDA graphs), "
                    "a larger batch, fewer small ops")
        if m.device_type == "cuda" and m.model_dtype == "float32":
            recs.append("mixed precision (bf16 autocast) shortens kernels but not launches: measure after the above")
    elif bottleneck == "sync":
        ops = ", ".join(m.sync_ops[:3]) or "sync ops"
        recs.append(f"remove per-step host syncs ({ops}): avoid .item() / .cpu() / printing losses every step; "
                    "log metrics every N steps")
        if any(re.search(r"nccl|all_?reduce|c10d", o, re.IGNORECASE) for o in m.sync_ops):
            recs.append("for DDP: overlap communication (bucket_cap_mb, gradient_as_bucket_view=True) and use "
                        "no_sync() during gradient accumulation")
    else:
        if m.batch_cpu_s > 0 and step_budget_s(m) > 0:
            need = min(workers_needed(m.batch_cpu_s, step_budget_s(m)), max_workers(m))
            if need > m.num_workers:
                recs.append(f"raise num_workers from {m.num_workers} to {need} ({_littles_law_text(m)})")
        recs += _transform_recommendations(m) + _collate_recommendations(m)
    return recs


def diagnose(m: Measurements) -> Diagnosis:
    """Classify, explain and recommend."""
    for name in ("data_wait_frac", "sync_frac"):
        value = getattr(m, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value!r} must be in 0..1")
    bottleneck = classify(m)
    return Diagnosis(bottleneck=bottleneck, evidence=evidence(m), recommendations=recommend(m, bottleneck))
