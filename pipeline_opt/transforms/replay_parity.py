"""How far the replayed GPU path is from the CPU pipeline it replaces, step by step, in /255 units.

:func:`measure_replay_error` runs the original torchvision Compose on ``n`` images (PIL decode, the
CPU transforms, seeded) and the replay (JPEG header, :class:`~.replay.ReplaySampler`, device
decode, the :mod:`~.random_gpu` modules) on the same files with the same seed, and reports:

* whether the draws are the same (the torch RNG ends in the same state, and the outputs match);
* per step, the *isolated* error — the device op applied to the CPU pipeline's own input of that
  step, against the CPU op's output: the kernel's faithfulness alone — and the *cumulative* error
  of the device path so far against the CPU pipeline so far;
* the end-to-end error of :class:`~.random_gpu.RandomGpuPipeline` on the collated batch (the
  batched Kornia path, not the per-image stepping).

Errors are absolute differences in pixel levels (1 = 1/255): 8-bit images as they are, float
images times 255, normalised images times ``255 * std``. This is the "measured-error hook" of
:func:`pipeline_opt.loading.random_plan.plan_random_gpu_pipeline`: run it with
``device="cuda"`` to include nvJPEG's difference from libjpeg.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

import pipeline_opt.transforms as transforms_package
from pipeline_opt._core import rng
from pipeline_opt._core.grid import grid
from pipeline_opt._core.log import get_logger
from pipeline_opt.datasets import make_image_folder
from pipeline_opt.transforms.jpeg_batch import decode_jpegs
from pipeline_opt.transforms.replay import ReplayDataset, patch_shapes, replay_collate

__all__ = ["ReplayParity", "StepError", "main", "measure_replay_error", "standard_pipelines"]

log = get_logger("transforms.replay_parity")


@dataclass(frozen=True)
class StepError:
    """One step's error in pixel levels (1/255 units): isolated (the kernel alone) and cumulative."""

    name: str
    kind: str
    flavour: str
    isolated_mean: float
    isolated_max: float
    cumulative_mean: float
    cumulative_max: float


@dataclass(frozen=True)
class ReplayParity:
    """The replay against the CPU pipeline on ``images`` files, decoded by ``decoder``."""

    images: int
    seed: int
    decoder: str
    same_draws: bool  # the torch, Python and numpy RNGs ended in the same states after the CPU pipeline and the replay
    decode_mean: float  # device decode vs Pillow's decode, before any transform
    decode_max: float
    steps: tuple[StepError, ...]
    end_to_end_mean: float  # RandomGpuPipeline on the collated batch vs the CPU pipeline's outputs
    end_to_end_max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """A text table: one row per step (isolated and cumulative mean / max in levels)."""
        rows = [["decode", "-", "-", "-", f"{self.decode_mean:.3f}", f"{self.decode_max:.0f}"]]
        rows += [[s.name, s.flavour, f"{s.isolated_mean:.3f}", f"{s.isolated_max:.3f}", f"{s.cumulative_mean:.3f}",
                  f"{s.cumulative_max:.3f}"] for s in self.steps]
        rows.append(["end to end (batched)", "-", "-", "-", f"{self.end_to_end_mean:.3f}", f"{self.end_to_end_max:.3f}"])
        head = (f"replay vs CPU pipeline, {self.images} images, seed {self.seed}, decoder {self.decoder}, "
                f"same draws: {self.same_draws} (pixel levels, 1 = 1/255)")
        return head + "\n" + grid(["step", "on", "isolated mean", "isolated max", "cumulative mean",
                                   "cumulative max"], rows)


def _as_tensor(img: Any) -> torch.Tensor:
    """A CPU pipeline intermediate as a float (1, C, H, W) tensor in the device path's scale
    (0..255 levels for PIL / uint8, as it is for floats)."""
    if isinstance(img, Image.Image):
        arr = np.asarray(img.convert("RGB") if img.mode != "RGB" else img)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).unsqueeze(0).to(torch.float32)
    t = img.as_subclass(torch.Tensor)
    return t.unsqueeze(0).to(torch.float32)


class _Stats:
    def __init__(self) -> None:
        self.total, self.count, self.max = 0.0, 0, 0.0

    def add(self, diff: torch.Tensor) -> None:
        self.total += float(diff.double().sum())
        self.count += diff.numel()
        self.max = max(self.max, float(diff.max())) if diff.numel() else self.max

    @property
    def mean(self) -> float:
        return self.total / max(self.count, 1)


def _diff(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a.float().cpu() - b.float().cpu()).abs() * scale


def measure_replay_error(dataset: Any, n: int = 16, seed: int = 0, device: torch.device | str = "cpu",
                         indices: Sequence[int] | None = None) -> ReplayParity:
    """Compare the replay with ``dataset``'s own CPU pipeline on ``n`` of its images (see module doc).

    ``dataset`` is an ImageFolder-like dataset of JPEG files (``.samples``, ``.transform``, the
    default loader). The torch, Python ``random`` and numpy RNG states are saved and restored around
    the measurement.
    """
    replay = ReplayDataset.from_image_folder(dataset)
    compose = dataset.transform
    picked = list(indices) if indices is not None else list(range(min(int(n), len(replay))))
    if not picked:
        raise ValueError(f"n={n!r} picks no image; give n >= 1")
    steps = replay.sampler.steps
    modules = [transforms_package.replay_module(s) for s in steps]  # Kornia loads here
    pipeline = transforms_package.RandomGpuPipeline(replay.sampler, device=device)
    device = pipeline.device
    saved = rng.states()
    try:
        rng.seed_all(seed)
        cpu_runs = []
        for i in picked:
            path = replay.samples[i][0]
            with open(path, "rb") as f:
                img = Image.open(f).convert("RGB")
            trail = [img]
            for t in compose.transforms:  # a copy in: timm's RandomErasing writes into its input
                prev = trail[-1]
                trail.append(t(prev.clone() if isinstance(prev, torch.Tensor) else prev))
            cpu_runs.append(trail)
        cpu_states = rng.states()
        rng.seed_all(seed)
        items = [replay[i] for i in picked]
        same_draws = rng.same_states(cpu_states, rng.states())
    finally:
        rng.restore(saved)

    decode = _Stats()
    isolated = [_Stats() for _ in steps]
    cumulative = [_Stats() for _ in steps]
    for (data, params, _), trail in zip(items, cpu_runs):
        x = decode_jpegs([data], device)[0].unsqueeze(0).to(torch.float32)
        decode.add(_diff(x, _as_tensor(trail[0]), torch.ones(())))
        row = params.row.unsqueeze(0)
        patch_iter = iter(params.patches)
        scale = torch.ones(())  # levels per unit of the current representation
        for k, (step, module) in enumerate(zip(steps, modules)):
            shapes = patch_shapes(step, row[0].tolist())
            patches = [[next(patch_iter).to(device) for _ in shapes]] if shapes else None
            cpu_in = _as_tensor(trail[k]).to(device)
            outs = []
            for inp in (cpu_in, x):
                if module is None:
                    outs.append(inp)
                elif hasattr(module, "replay_single"):  # a Replay* augmentation: given this sample's row
                    outs.append(module.replay_single(inp, module.replay_params(row, patches, shape=inp.shape)))
                else:
                    outs.append(module(inp))
            if step.kind == "to_float":
                scale = torch.full((), 255.0)
            elif step.kind == "normalize":
                scale = 255.0 * torch.tensor(step.options["module"].std, dtype=torch.float32).view(1, -1, 1, 1)
            want = _as_tensor(trail[k + 1])
            isolated[k].add(_diff(outs[0], want, scale))
            x = outs[1]
            cumulative[k].add(_diff(x, want, scale))

    batch = replay_collate(items)
    out, _ = pipeline(batch)
    want = torch.cat([_as_tensor(trail[-1]) for trail in cpu_runs])
    end = _Stats()
    end.add(_diff(out, want, scale))
    report = ReplayParity(
        images=len(picked), seed=int(seed),
        decoder="nvJPEG (torchvision decode_jpeg on CUDA)" if device.type == "cuda" else "libjpeg (decode_jpeg on CPU)",
        same_draws=bool(same_draws), decode_mean=decode.mean, decode_max=decode.max,
        steps=tuple(StepError(s.name, s.kind, s.flavour, i.mean, i.max, c.mean, c.max)
                    for s, i, c in zip(steps, isolated, cumulative)),
        end_to_end_mean=end.mean, end_to_end_max=end.max)
    log.info("replay parity: same draws %s, end-to-end mean %.3f max %.3f levels", report.same_draws,
             report.end_to_end_mean, report.end_to_end_max)
    return report


# ------------------------------------------------------------------------------------------ report

def standard_pipelines() -> dict[str, Any]:
    """The training pipelines the report measures (torchvision v1 and v2, PIL and tensor inputs)."""
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    return {
        "v1 RRC+flip+jitter+gray+normalize+erase": T1.Compose([
            T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.ColorJitter(0.4, 0.4, 0.4, 0.1),
            T1.RandomGrayscale(0.2), T1.ToTensor(), T1.Normalize(mean, std), T1.RandomErasing(p=0.5)]),
        "v2 RRC+flip+jitter, ToImage first (uint8 tensors)": T2.Compose([
            T2.ToImage(), T2.RandomResizedCrop(224), T2.RandomHorizontalFlip(), T2.ColorJitter(0.4, 0.4, 0.4, 0.1),
            T2.ToDtype(torch.float32, scale=True), T2.Normalize(mean, std), T2.RandomErasing(value="random")]),
        "v1 jitter on float tensors (Kornia kernels)": T1.Compose([
            T1.RandomResizedCrop(224), T1.ToTensor(), T1.ColorJitter(0.4, 0.4, 0.4, 0.1), T1.Normalize(mean, std)]),
        "v1 reference recipe: RRC+flip+TrivialAugmentWide+erase (PIL)": T1.Compose([
            T1.RandomResizedCrop(224, interpolation=T1.InterpolationMode.BILINEAR, antialias=True), T1.RandomHorizontalFlip(),
            T1.TrivialAugmentWide(interpolation=T1.InterpolationMode.BILINEAR), T1.PILToTensor(),
            T1.ConvertImageDtype(torch.float), T1.Normalize(mean, std), T1.RandomErasing(0.25)]),
        "v1 reference recipe with RandAugment(magnitude=9) (PIL)": T1.Compose([
            T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.RandAugment(interpolation=T1.InterpolationMode.BILINEAR),
            T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize(mean, std), T1.RandomErasing(0.25)]),
        "v1 reference recipe with AutoAugment(imagenet) (PIL)": T1.Compose([
            T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.AutoAugment(interpolation=T1.InterpolationMode.BILINEAR),
            T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize(mean, std)]),
        "v1 reference recipe with AugMix (PIL)": T1.Compose([
            T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.AugMix(interpolation=T1.InterpolationMode.BILINEAR),
            T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize(mean, std)]),
        "v2 TrivialAugmentWide on uint8 tensors": T2.Compose([
            T2.PILToTensor(), T2.RandomResizedCrop(224, antialias=True), T2.RandomHorizontalFlip(),
            T2.TrivialAugmentWide(), T2.ToDtype(torch.float32, scale=True), T2.Normalize(mean, std)]),
    }


def timed_call(fn: Any, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median seconds, median host CPU seconds of the calling thread) of ``fn()`` over ``repeats``
    calls after one untimed call; on CUDA the seconds are CUDA events around the call. The host CPU
    time is what a preparing thread would hold (much of it under the GIL) beside the training loop."""

    walls, hosts = [], []
    for i in range(repeats + 1):
        c0 = time.thread_time()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            host = time.thread_time() - c0
            end.synchronize()
            wall = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            wall, host = time.perf_counter() - t0, time.thread_time() - c0
        if i:
            walls.append(wall)
            hosts.append(host)
    return float(np.median(walls)), float(np.median(hosts))


def _time_stage(dataset: Any, device: torch.device, batch_size: int,
                repeats: int) -> tuple[float, float, float]:
    """(median seconds per batch of the device stage, median host CPU seconds per batch, median
    seconds per image of the CPU pipeline on one thread)."""
    replay = ReplayDataset.from_image_folder(dataset)
    stage = transforms_package.RandomGpuPipeline(replay.sampler, device=device)
    batch = replay_collate([replay[i % len(replay)] for i in range(batch_size)])
    per_batch, host = timed_call(lambda: stage(batch), device, repeats)
    cpu = []
    for i in range(min(len(dataset), 16)):
        t0 = time.perf_counter()
        dataset[i]
        cpu.append(time.perf_counter() - t0)
    return per_batch, host, float(np.median(cpu))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline_opt.transforms.replay_parity [--device cuda] [--n 32]``: the parity table
    of each standard pipeline on generated photo-like JPEGs, and the device stage's time per batch."""
    import argparse
    import sys
    import tempfile

    from torchvision.datasets import ImageFolder

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=int, default=32, help="images compared per pipeline")
    parser.add_argument("--size", default="1280x960", help="generated JPEG size, WxH")
    parser.add_argument("--batch", type=int, default=64, help="batch size for the timing")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(n_images=max(args.n, 16), size=(width, height), num_classes=2, seed=0, root=tmp)
        for name, compose in standard_pipelines().items():
            ds = ImageFolder(str(root), transform=compose)
            parity = measure_replay_error(ds, n=args.n, seed=0, device=device)
            per_batch, host, per_image = _time_stage(ds, device, args.batch, repeats=5)
            sys.stdout.write(f"\n== {name}\n{parity.table()}\n")
            sys.stdout.write(f"device stage: {per_batch * 1e3:.1f} ms per batch of {args.batch} "
                             f"({args.batch / per_batch:.0f} img/s) on {device}, {host * 1e3:.1f} ms of it host CPU "
                             f"in the calling thread; CPU pipeline {per_image * 1e3:.1f} ms per image on one thread\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
