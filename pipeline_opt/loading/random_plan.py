"""Planning the random-augmentation GPU path for a loader: what the tuner calls.

:func:`plan_random_gpu_pipeline` looks at a DataLoader's dataset (or the dataset itself) and
returns ``(RandomGpuPlan, "")`` when its training pipeline can run as "parameters on the CPU,
pixels on the GPU" — or ``(None, reason)`` naming what prevents it. The plan carries everything a
candidate loader needs:

* ``plan.dataset()`` — the workers' dataset (:class:`~pipeline_opt.transforms.replay.ReplayDataset`: read the file,
  its header, draw the parameters; no decoding), ``plan.collate_fn`` (:func:`~pipeline_opt.transforms.replay.replay_collate`);
* ``plan.gpu_stage(device)`` — the :class:`~pipeline_opt.transforms.random_gpu.RandomGpuPipeline` to give
  ``DeviceLoader(..., batch_transform=...)``; ``plan.build(loader, device, overrides)`` does all
  three around a clone of the user's loader (same sampler, order, generator);
* ``plan.exactness`` — ``"decode"``: the same draws, and pixels that differ only by the decoder
  (nvJPEG vs libjpeg on CUDA) and the resize rounding (torchvision's tensor kernel vs Pillow's
  8-bit two-pass one), random policies (AutoAugment, RandAugment, TrivialAugmentWide) included;
* ``plan.measure_error(device)`` — the measured-error hook
  (:func:`~pipeline_opt.transforms.replay_parity.measure_replay_error`) and ``plan.within_tolerance(parity)`` to accept or
  reject the candidate on it.

Nothing here imports Kornia until a stage is built; without Kornia the plan is ``(None, reason)``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from pipeline_opt import transforms
from pipeline_opt._core.log import get_logger
from pipeline_opt.loading.dataloader import clone_loader
from pipeline_opt.loading.device_loader import DeviceLoader
from pipeline_opt.transforms.batch_mix import BatchMix, ReplayCollate, find_batch_mix
from pipeline_opt.transforms.jpeg_header import jpeg_folder_problem, read_jpeg_header
from pipeline_opt.transforms.replay import (
    ReplayDataset,
    ReplaySampler,
    UnsupportedTransform,
    recognise,
    replay_collate,
)
from pipeline_opt.transforms.replay_parity import measure_replay_error

__all__ = ["HEADERS_CHECKED", "RandomGpuPlan", "Tolerance", "plan_random_gpu_pipeline"]

log = get_logger("loading.random_plan")

HEADERS_CHECKED = 16  # JPEG headers read at planning time (colour components, readable frame header)
_RANDOM_KINDS = frozenset({"resized_crop", "crop", "hflip", "vflip", "color_jitter", "random_grayscale", "erase",
                           "auto_augment", "augmix"})


@dataclass(frozen=True)
class Tolerance:
    """Accepted error of the replay against the CPU pipeline, in pixel levels (1 = 1/255).

    The mean bounds the whole output; no maximum is bounded, because a one-level resize
    difference can move the hue of a near-grey pixel by several levels (docs/gpu_ops.md)."""

    mean_levels_cpu_decode: float = 0.5  # decode_jpeg on CPU is libjpeg, as Pillow: only the resize rounding differs
    mean_levels_nvjpeg: float = 2.0  # nvJPEG's IDCT / chroma upsampling differ from libjpeg by a few levels


@dataclass(frozen=True)
class RandomGpuPlan:
    """How to rebuild a loader whose random augmentations run on the GPU with the same draws."""

    samples: tuple[tuple[str, Any], ...]
    transform: Any  # the original Compose (its transforms are the sampler's)
    target_transform: Any
    moved: tuple[str, ...]  # the transforms the device replays, in order
    exactness: str = "decode"  # same draws: the pixels differ by the decoder and the resampling rounding only
    tolerance: Tolerance = field(default_factory=Tolerance)
    batch_mix: BatchMix | None = None  # the loader's collate_fn mixed batches (MixUp / CutMix): replayed too

    @property
    def collate_fn(self) -> Any:
        if self.batch_mix is None:
            return replay_collate
        return ReplayCollate(self.batch_mix, replay_collate, self.sampler().output_size(512, 512))

    def sampler(self) -> ReplaySampler:
        return ReplaySampler.from_compose(self.transform)

    def dataset(self) -> ReplayDataset:
        """The workers' dataset: ``(bytes, ReplayParams, label)`` per file."""
        return ReplayDataset(self.samples, self.sampler(), self.target_transform)

    def gpu_stage(self, device: torch.device | str | None = None, then: Any = None) -> Any:
        """The :class:`~pipeline_opt.transforms.random_gpu.RandomGpuPipeline` for ``DeviceLoader(batch_transform=...)``."""
        return transforms.RandomGpuPipeline(self.sampler(), device=device, then=then,  # Kornia loads here
                                            batch_mix=self.batch_mix is not None)

    def build(self, loader: Any, device: torch.device | str, overrides: dict[str, Any] | None = None, *,
              prepare_in_thread: bool = True) -> Any:
        """A ``DeviceLoader`` replaying on ``device`` around a clone of ``loader`` with ``overrides``
        (num_workers, pin_memory, persistent_workers, prefetch_factor...); ``prepare_in_thread`` (the
        default) decodes and replays in a background thread while the step runs
        (``DeviceLoader(prepare_in_thread=True)``); ``False`` does it in the training loop."""
        stage = self.gpu_stage(device)
        clone = clone_loader(loader, dataset=self.dataset(), collate_fn=self.collate_fn, **(overrides or {}))
        return DeviceLoader(clone, device=stage.device, batch_transform=stage, prepare_in_thread=prepare_in_thread)

    def measure_error(self, device: torch.device | str = "cpu", n: int = 16, seed: int = 0) -> Any:
        """The measured-error hook: :func:`~pipeline_opt.transforms.replay_parity.measure_replay_error` on ``n`` of the
        plan's files (``device="cuda"`` includes nvJPEG)."""
        owner = SimpleNamespace(samples=list(self.samples), transform=self.transform,
                                target_transform=self.target_transform)
        return measure_replay_error(owner, n=n, seed=seed, device=device)

    def within_tolerance(self, parity: Any) -> tuple[bool, str]:
        """Whether a measured :class:`~pipeline_opt.transforms.replay_parity.ReplayParity` is acceptable, and why not."""
        if not parity.same_draws:
            return False, "the replay did not reproduce the CPU pipeline's draws (torch RNG ended elsewhere)"
        nvjpeg = parity.decoder.startswith("nvJPEG")
        bound = self.tolerance.mean_levels_nvjpeg if nvjpeg else self.tolerance.mean_levels_cpu_decode
        if parity.end_to_end_mean > bound:
            return False, (f"mean error {parity.end_to_end_mean:.3f} levels exceeds the {bound} accepted with "
                           f"{parity.decoder}")
        return True, ""

    def describe(self) -> list[str]:
        mixed = "" if self.batch_mix is None else f", then the collate_fn's {type(self.batch_mix.transform).__name__}"
        return [f"{len(self.samples)} JPEG files; GPU replays {', '.join(self.moved)}{mixed}",
                "exactness: same draws; pixels differ by the decoder and the resize rounding only"
                + ("" if self.batch_mix is None else " (the batch mix itself is the original's arithmetic)")]


def _dataset_of(obj: Any) -> tuple[Any, Any]:
    """``(dataset, loader or None)``."""
    if isinstance(obj, DataLoader):
        return obj.dataset, obj
    return obj, None


def plan_random_gpu_pipeline(loader_or_dataset: Any, same_distribution: bool = False
                             ) -> tuple[RandomGpuPlan | None, str]:
    """A plan for replaying ``loader_or_dataset``'s random augmentations on the GPU, or ``(None, why)``.

    Applies to an ImageFolder-like dataset (``.samples`` of JPEG files, the default image loader)
    whose ``transform`` is a torchvision Compose :func:`~pipeline_opt.transforms.replay.recognise` replays and that has at
    least one random transform (deterministic pipelines are the nvJPEG decode plan's). Given a
    DataLoader, it must batch with the default collate, or with ``lambda batch: mix(*default_collate(batch))``
    for a v2 MixUp / CutMix / RandomChoice of them (replayed too). ``same_distribution`` is accepted for
    compatibility and changes nothing (the random policies are replayed with the same draws).
    """
    if importlib.util.find_spec("kornia") is None:
        return None, "Kornia is not installed (the GPU stage is built on it): pip install 'pipeline-opt[gpu]'"
    dataset, loader = _dataset_of(loader_or_dataset)
    if loader is not None:
        if loader.batch_size is None and loader.batch_sampler is None:
            return None, "the loader does not batch (batch_size=None)"
    mix = None
    if loader is not None:
        name = getattr(loader.collate_fn, "__name__", "")
        if loader.collate_fn is not default_collate and name != "default_collate":
            mix, why = find_batch_mix(loader.collate_fn)
            if mix is None:
                return None, why
    problem = jpeg_folder_problem(dataset)
    if problem:
        return None, problem
    samples = dataset.samples
    transform = getattr(dataset, "transform", None)
    try:
        steps = recognise(transform, same_distribution=same_distribution)
    except UnsupportedTransform as e:
        return None, str(e)
    if not any(s.kind in _RANDOM_KINDS for s in steps):
        return None, "the transform has no random augmentation; the nvJPEG decode plan covers deterministic pipelines"
    stride = max(1, len(samples) // HEADERS_CHECKED)
    for path, _ in list(samples)[::stride][:HEADERS_CHECKED]:
        try:
            header = read_jpeg_header(path)
        except (OSError, ValueError) as e:
            return None, f"cannot read the JPEG header of {path}: {e}"
        if header.components not in (1, 3):
            return None, (f"{path} has {header.components} colour components (CMYK/YCCK): Pillow and the GPU "
                          "decoder convert those to RGB differently")
    plan = RandomGpuPlan(samples=tuple((str(p), y) for p, y in samples), transform=transform,
                         target_transform=getattr(dataset, "target_transform", None),
                         moved=tuple(s.name for s in steps), batch_mix=mix)
    if mix is not None and not any(s.kind == "to_float" for s in steps):
        return None, "the collate_fn mixes batches (MixUp / CutMix), which needs float images; the transform ends in uint8"
    log.info("random GPU plan: %s", "; ".join(plan.describe()))
    return plan, ""
