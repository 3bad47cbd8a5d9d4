"""``pipeline-opt doctor``: the machine facts that decide data-pipeline speed, each with advice.

Every check returns a :class:`Finding` (frozen) with a status (``ok`` / ``warn`` / ``info``) and a
concrete recommendation; :func:`run_doctor` gathers them into a :class:`DoctorReport`. Nothing here
imports ultralytics or kornia (versions come from package metadata), so the doctor is fast.
"""

from __future__ import annotations

import importlib.metadata as metadata
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pipeline_opt._core.log import get_logger

log = get_logger("doctor")

_GIB = 1024**3
_STATUSES = ("ok", "warn", "info")


@dataclass(frozen=True)
class Finding:
    """One checked fact: what was found and what to do about it."""

    check: str
    value: str
    status: str  # ok | warn | info
    recommendation: str

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status={self.status!r} must be one of {_STATUSES}")


@dataclass(frozen=True)
class DoctorReport:
    """All findings, in the order they were checked."""

    findings: tuple[Finding, ...]

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "warn")

    def get(self, check: str) -> Finding:
        """The finding of ``check`` (e.g. ``"pillow"``); ``KeyError`` naming the known checks otherwise."""
        for f in self.findings:
            if f.check == check:
                return f
        raise KeyError(f"no check {check!r}; known: {[f.check for f in self.findings]}")

    def to_dict(self) -> dict:
        return {"findings": [asdict(f) for f in self.findings]}

    def table(self) -> str:
        """Aligned text: check, status, value, and the recommendation under each row."""
        width = max((len(f.check) for f in self.findings), default=5)
        lines = ["pipeline_opt doctor"]
        for f in self.findings:
            lines.append(f"  {f.check:<{width}}  [{f.status:^4}]  {f.value}")
            if f.recommendation:
                lines.append(f"  {'':<{width}}          -> {f.recommendation}")
        n = len(self.warnings)
        lines.append(f"{n} warning(s)" if n else "no warnings")
        return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_cpu(has_cuda: bool | None = None) -> Finding:
    """Usable cores; the advice for few cores depends on whether there is a GPU to move work to
    (``has_cuda``; None: ask torch)."""
    has_cuda = _has_cuda() if has_cuda is None else has_cuda
    total = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    value = f"{usable} usable of {total} logical cores"
    if usable < total:
        return Finding("cpu", value + " (restricted by CPU affinity)", "warn",
                       f"DataLoader workers can only use {usable} cores; leave 1-2 for the main thread "
                       "(num_workers <= usable - 2) or widen the affinity (taskset / cgroup cpuset).")
    if usable <= 2:
        first = "move tensor work (normalize, resize) to the GPU" if has_cuda else \
            "keep the per-sample work light (JPEG draft decoding, a Resize before costly transforms)"
        return Finding("cpu", value, "info", f"few cores: {first}; how many workers fit beside the training "
                       "thread depends on its own CPU use: po.autotune measures it and reserves that share.")
    return Finding("cpu", value, "ok", f"num_workers up to about {max(1, usable - 2)} leaves cores for the "
                   "main thread and the pin-memory thread.")


def check_shm() -> Finding:
    if not os.path.isdir("/dev/shm"):
        return Finding("/dev/shm", "missing", "warn", "worker batches travel through shared memory: mount a "
                       "tmpfs at /dev/shm (docker: --shm-size=8g or --ipc=host).")
    usage = shutil.disk_usage("/dev/shm")
    value = f"{usage.total / _GIB:.1f} GiB, {usage.free / _GIB:.1f} GiB free"
    if usage.total < 1 * _GIB:
        return Finding("/dev/shm", value, "warn", "too small for several workers x prefetch_factor batches "
                       "(\"bus error\" in workers): run docker with --shm-size=8g or --ipc=host.")
    if usage.free < 0.25 * usage.total:
        return Finding("/dev/shm", value, "warn", "mostly used: stale files from crashed jobs? Clean "
                       "/dev/shm or lower num_workers * prefetch_factor.")
    return Finding("/dev/shm", value, "ok", "")


def check_ram() -> Finding:
    import psutil

    vm = psutil.virtual_memory()
    value = f"{vm.total / _GIB:.1f} GiB, {vm.available / _GIB:.1f} GiB available"
    if vm.available < 4 * _GIB:
        return Finding("ram", value, "warn", "each worker holds a copy of the dataset object and its batches: "
                       "keep num_workers small or the dataset light (paths, not decoded images).")
    return Finding("ram", value, "ok", "")


def check_cuda() -> Finding:
    import torch

    if not torch.cuda.is_available():
        return Finding("cuda", f"not available (torch {torch.__version__}, built for CUDA {torch.version.cuda})",
                       "info", "profiling and tuning run on the CPU; GPU idle time and GPU transforms need a "
                       "CUDA device.")
    props = torch.cuda.get_device_properties(0)
    n = torch.cuda.device_count()
    value = f"{n} x {props.name}, {props.total_memory / _GIB:.0f} GiB, CUDA {torch.version.cuda}"
    return Finding("cuda", value, "ok", "use pin_memory=True and non_blocking copies; ship uint8 and normalize "
                   "on the GPU (po.transforms).")


def check_versions() -> Finding:
    names = ("torch", "torchvision", "kornia", "ultralytics", "pillow", "pillow-simd", "opencv-python",
             "opencv-python-headless", "numpy")
    found = {n: v for n in names if (v := _version(n))}
    value = ", ".join(f"{n} {v}" for n, v in found.items())
    missing = [n for n in ("torch", "torchvision", "kornia") if n not in found]
    if missing:
        return Finding("versions", value, "warn", f"install {' '.join(missing)} (pip install pipeline-opt).")
    hint = "" if "ultralytics" in found else "ultralytics is not installed: `pipeline-opt yolo` needs the yolo extra."
    return Finding("versions", value, "ok" if not hint else "info", hint)


def pillow_flavour() -> tuple[str, str]:
    """``("pillow-simd", version)`` when Pillow-SIMD is what ``import PIL`` loads, else ``("pillow", version)``."""
    import PIL

    simd = _version("pillow-simd")
    if simd is not None and simd == PIL.__version__ and ".post" in PIL.__version__:
        return "pillow-simd", PIL.__version__
    return "pillow", PIL.__version__


def measure_resize_ms(repeats: int = 10) -> float:
    """Median milliseconds of one 1280x960 -> 224x224 bilinear RGB resize with the loaded PIL."""
    import numpy as np
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (960, 1280, 3), dtype=np.uint8))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        img.resize((224, 224), Image.BILINEAR)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def check_pillow(has_cuda: bool | None = None) -> Finding:
    """Which Pillow loads and how fast it resizes; the GPU is named as the alternative only when there
    is one (``has_cuda``; None: ask torch)."""
    has_cuda = _has_cuda() if has_cuda is None else has_cuda
    flavour, version = pillow_flavour()
    ms = measure_resize_ms()
    value = f"{flavour} {version}; 1280x960 -> 224 resize {ms:.2f} ms"
    if flavour == "pillow-simd":
        return Finding("pillow", value, "ok", "Pillow-SIMD is active; reinstalling torchvision may silently "
                       "restore stock Pillow: re-run `make simd` after it.")
    simd = _version("pillow-simd")
    if simd is not None:
        return Finding("pillow", value, "warn", f"pillow-simd {simd} is installed but stock Pillow {version} is what "
                       "loads (a later torchvision/pillow install restored it): run `make simd` again.")
    gpu = ", or move resize to the GPU (po.transforms)" if has_cuda else ""
    return Finding("pillow", value, "info", f"stock Pillow: Pillow-SIMD resizes 5-8x faster on AVX2 CPUs "
                   f"(`make simd`){gpu}.")


def check_opencv() -> Finding:
    try:
        import cv2
    except ImportError:
        return Finding("opencv", "not installed", "info", "")
    threads = cv2.getNumThreads()
    value = f"{cv2.__version__}, {threads} thread(s)"
    if threads > 1:
        return Finding("opencv", value, "info", "inside DataLoader workers every worker spawns its own OpenCV "
                       "threads: call cv2.setNumThreads(0) in worker_init_fn to avoid oversubscription.")
    return Finding("opencv", value, "ok", "")


def check_start_method() -> Finding:
    method = mp.get_start_method(allow_none=True) or mp.get_context().get_start_method()
    value = f"{method} (multiprocessing default)"
    if method == "fork":
        return Finding("start method", value, "ok", "fork starts workers fastest; never initialise CUDA before "
                       "the loader forks (or pass multiprocessing_context='spawn').")
    return Finding("start method", value, "info", f"{method} re-imports the dataset in every worker at each "
                   "epoch: use persistent_workers=True, keep datasets and transforms picklable and module-level.")


CHECKS: tuple[Callable[[], Finding], ...] = (
    check_cpu, check_shm, check_ram, check_cuda, check_versions, check_pillow, check_opencv, check_start_method,
)


def run_doctor() -> DoctorReport:
    """Run every check; a check that raises becomes a ``warn`` finding naming the error."""
    findings = []
    for check in CHECKS:
        try:
            findings.append(check())
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            log.debug("check %s failed", check.__name__, exc_info=True)
            findings.append(Finding(check.__name__.removeprefix("check_"), f"check failed: {exc!r}", "warn",
                                    "report this as a pipeline_opt bug with the error above."))
    return DoctorReport(tuple(findings))
