"""``pipeline-opt demo``: find and fix a data bottleneck on this machine, end to end, in minutes.

It generates (once; cached) a folder of synthetic JPEGs, builds a deliberately naive loader (few
workers, every transform on the CPU) and a model sized to the machine (a small CNN on CPU, a
ResNet-50 with bf16 autocast and channels_last on a GPU), then runs ``po.profile`` ->
``po.autotune`` (whose last step is ``po.profile`` of the tuned loader) and writes the reports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import pipeline_opt as po
from pipeline_opt._core.log import get_logger
from pipeline_opt.datasets import make_image_folder
from pipeline_opt.report.text import before_after_table, unchanged
from pipeline_opt.tune.ab import noise_text
from pipeline_opt.tune.vetting import samples_clause

log = get_logger("demo")

RESULTS_DOC = "benchmarks/RESULTS.md"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DemoConfig:
    """Everything the demo needs; ``None`` fields take the defaults of the chosen device."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    out: Path = Path("pipeline_opt_demo")
    images: int | None = None  # CPU 256, GPU 2048
    size: tuple[int, int] | None = None  # (width, height): CPU 640x480, GPU 1280x960
    budget_s: float | None = None  # autotune time budget: CPU 40 s, GPU 90 s
    batch_size: int | None = None  # CPU 8, GPU 128
    steps: int | None = None  # measured steps per profile: CPU 16, GPU 30
    warmup: int | None = None  # CPU 3, GPU 5
    num_classes: int = 10
    seed: int = 0

    def resolved(self) -> DemoConfig:
        """A copy with the device resolved and every ``None`` filled for that device."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but CUDA is not available here; use --device cpu")
        if not (device == "cpu" or device.startswith("cuda")):
            raise ValueError(f"device={self.device!r} is not one of auto, cpu, cuda, cuda:N")
        gpu = device.startswith("cuda")
        defaults = {"images": 2048 if gpu else 256, "size": (1280, 960) if gpu else (640, 480),
                    "budget_s": 90.0 if gpu else 40.0, "batch_size": 128 if gpu else 8,
                    "steps": 30 if gpu else 16, "warmup": 5 if gpu else 3}
        filled = {k: v if getattr(self, k) is None else getattr(self, k) for k, v in defaults.items()}
        cfg = dataclasses.replace(self, device=device, out=Path(self.out), **filled)
        for name in ("images", "batch_size", "steps"):
            if int(getattr(cfg, name)) < 1:
                raise ValueError(f"{name}={getattr(cfg, name)!r} must be >= 1")
        if cfg.budget_s <= 0:
            raise ValueError(f"budget_s={cfg.budget_s!r} must be > 0 seconds")
        if cfg.images < cfg.batch_size:
            raise ValueError(f"images={cfg.images} is fewer than one batch ({cfg.batch_size}); raise --images")
        return cfg


@dataclass(frozen=True)
class DemoResult:
    """The three measurements of the demo and where they were written."""

    before: Any  # ProfileReport of the naive loader
    tune: Any  # TuneResult
    after: Any  # ProfileReport of the tuned loader
    out: Path
    table: str


class SmallCNN(nn.Module):
    """A strided stem and two convolutions. On a 2-core CPU its step costs about as much as loading
    a batch, so overlapping the two (a loader worker) is the visible win, as on a GPU."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def cpu_transform():
    """The naive all-on-CPU pipeline: Resize(256), CenterCrop(224), ToTensor, Normalize."""
    import torchvision.transforms as T

    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _images_on(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    images = images.to(device, non_blocking=True)
    if not images.is_floating_point():
        images = images.float().div_(255.0)
    return images


def cpu_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """Forward, cross-entropy, backward (no optimizer: the profiler restores the model anyway)."""
    images, labels = batch[0], batch[1]
    images = _images_on(model, images)
    loss = F.cross_entropy(model(images), labels.to(images.device))
    loss.backward()
    return loss.detach()


def gpu_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """The GPU step: channels_last input, bf16 autocast forward, fp32 loss, backward."""
    images, labels = batch[0], batch[1]
    images = _images_on(model, images).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(images)
    loss = F.cross_entropy(logits.float(), labels.to(images.device, non_blocking=True))
    loss.backward()
    return loss.detach()


def build(cfg: DemoConfig):
    """The dataset folder, the naive loader, the model and its step for a resolved config."""
    import torchvision
    from torch.utils.data import DataLoader

    folder = make_image_folder(n_images=cfg.images, size=cfg.size, num_classes=cfg.num_classes, seed=cfg.seed,
                               progress=True)
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=cpu_transform())
    gpu = cfg.device.startswith("cuda")
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        num_workers=4 if gpu else 0, generator=torch.Generator().manual_seed(cfg.seed))
    if gpu:
        model = torchvision.models.resnet50(weights=None, num_classes=cfg.num_classes)
        model = model.to(cfg.device).to(memory_format=torch.channels_last)
        step = gpu_step
    else:
        model, step = SmallCNN(cfg.num_classes), cpu_step
    return folder, loader, model, step


def cpu_caveat(tuned: Any) -> str:
    """What a CPU-only run could not show, from the tuner's own list of what it did not try."""
    skipped = [line for line in tuned.not_tried if "device is cpu" in line or "CUDA" in line]
    lines = ["No GPU on this machine, so this run shows the method (measure, change one thing, measure again)",
             "on the CPU side only; these were not tried:"]
    lines += [f"  - {line}" for line in skipped] or ["  - the GPU offloads (nvJPEG decoding, transforms on the device)"]
    lines.append("On a GPU the same call also moves decoding and transforms to the device: the measured GPU "
                 "results are in")
    lines.append(f"  {RESULTS_DOC} (and the README's Results table).")
    return "\n".join(lines)


def run_demo(config: DemoConfig | None = None) -> DemoResult:
    """Profile the naive loader, autotune it (which ends by profiling the tuned loader), write the reports.

    ``out`` receives report.html (the tuning report with both profiles), trace.json (the tuned
    loader's timeline), summary.txt (the before/after table), tune.json, and baseline/ (before) and
    best/ (after) with each profile's report.json, summary.txt, trace.json and report.html.
    """
    cfg = (config or DemoConfig()).resolved()
    log.info("demo on %s: %d images of %dx%d, batch %d, tuning budget %.0f s", cfg.device, cfg.images,
             cfg.size[0], cfg.size[1], cfg.batch_size, cfg.budget_s)
    threads = torch.get_num_threads()
    if not cfg.device.startswith("cuda") and threads > 1:
        # The CPU demo stands in for a GPU job, whose step one thread drives while the other cores
        # are the loader's; the small CNN would otherwise spread over every core with its intra-op
        # threads and take them from the workers, before and after alike.
        log.info("CPU demo: the model's step runs on 1 intra-op thread (torch.set_num_threads(1), %d before), "
                 "as one thread drives a GPU step; the other cores are the loader's", threads)
        torch.set_num_threads(1)
    try:
        return _run(cfg)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: DemoConfig) -> DemoResult:

    _, loader, model, step = build(cfg)
    common = {"step_fn": step, "device": cfg.device}
    log.info("1/2 profiling the naive loader (num_workers=%d, every transform on the CPU)", loader.num_workers)
    before = po.profile(loader, model, steps=cfg.steps, warmup=cfg.warmup, progress=True, **common)
    log.info("2/2 autotuning (budget %.0f s), then profiling the tuned loader", cfg.budget_s)
    tuned = po.autotune(loader, model, time_budget_s=cfg.budget_s, baseline=before, **common)  # one diagnosis
    # autotune ends with po.profile of the tuned loader (result.best): that is the "after" profile
    after = tuned.best
    log.info("tuned loader: %.1f -> %.1f samples/s in the tuning trials (%.2fx)", tuned.baseline_throughput,
             tuned.best_throughput, tuned.speedup)

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    tuned.save(out)  # tune.html/json/txt, trace.json, baseline/ (= before) and best/ (= after)
    # one page per kind: the tuning report (both profiles in it) is the demo's report.html, not a copy beside tune.html
    (out / "tune.html").replace(out / "report.html")

    claim = (f"{tuned.speedup:.2f}x over the naive loader in interleaved trials"
             if not unchanged(tuned.config, tuned.original_config)
             else "no change: nothing beat the naive loader beyond the noise in interleaved trials")
    table = (f"autotune: {claim} "
             f"({'measured ' if tuned.noise > 0 else ''}{noise_text(tuned.noise, 0)}, {len(tuned.trials)} trials in "
             f"{tuned.tuning_time_s:.0f} s); "
             f"{samples_clause(tuned.exactness, tuned.pixel_changes)}\n\n"
             + before_after_table(before, after, tuned.config, tuned.original_config, speedup=tuned.speedup,
                                  trial_throughput=(tuned.baseline_throughput, tuned.best_throughput)))
    if not cfg.device.startswith("cuda"):
        table += "\n\n" + cpu_caveat(tuned)
    (out / "summary.txt").write_text(table + "\n")
    return DemoResult(before=before, tune=tuned, after=after, out=out, table=table)
