"""What each change the tuner can make does to the samples, and the measured error where they differ.

Every change belongs to one of three classes (:data:`EXACTNESS`, strictest first):

* ``bitwise``: the tuned loader yields the same bytes as the loader as given. num_workers,
  pin_memory, persistent_workers, prefetch_factor and shared slots change how batches are made and
  delivered, not their values; ``ToFloat`` / ``ConvertDtype`` / ``Normalize`` / ``CenterCrop`` on the
  device (:mod:`pipeline_opt.transforms.gpu`) compute torchvision's arithmetic in torchvision's order,
  each step an IEEE-rounded float operation, so they give the same bits on the CPU and on CUDA.
* ``tolerance``: the same operation by another kernel. ``Resize`` on the device is an antialiased
  bilinear resize equal to torchvision's tensor resize and within :data:`RESIZE_BOUND` (1/255) of
  PIL ``BILINEAR`` (documented in :mod:`pipeline_opt.transforms.gpu`); where it replaces a PIL
  resize, single pixels may differ by that much.
* ``decode``: another JPEG decoder. Draft decoding (libjpeg DCT scaling, then the pipeline's resize)
  and nvJPEG on the GPU (another IDCT and chroma upsampling, then the device resize).

A decode change is offered only after its error has been measured on :data:`SAMPLE_IMAGES` images
of the user's own dataset (before any trial of it), and only while that error stays within
:data:`DECODE_MEAN_ERROR` (mean absolute difference per pixel value) and :data:`DECODE_MAX_ERROR`
(the largest difference of any pixel value). A ``tolerance`` change is measured the same way where
possible and reported; it is not refused (its bound is documented). ``autotune(exact=True)`` allows
only ``bitwise`` changes.

All errors are in 1/255 units (levels of an 8-bit pixel value), after the pipeline's resize and
before ``Normalize``. Why these bounds: draft decoding on photo-like JPEGs measured a mean of
0.3-1.1/255 and a largest single-pixel difference of 7-24/255 (at sharp edges: DCT scaling is a box
filter); nvJPEG against libjpeg after the resize, a mean under 1/255 and a largest difference near
12/255. The bounds take those decoders with room to spare and refuse one that shifts colours or
geometry (a wrong colour conversion or a misplaced resize moves the mean by several levels).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from pipeline_opt._core import rng
from pipeline_opt._core.log import get_logger
from pipeline_opt.loading.decode import (
    EncodedJpegDataset,
    GpuJpegDecoder,
    measure_draft_error,
    packed_jpeg_collate,
)
from pipeline_opt.transforms.gpu import Normalize
from pipeline_opt.transforms.registry import device_exactness
from pipeline_opt.tune.offload import tolerance_names, variant_dataset

log = get_logger("tune.exactness")

EXACTNESS = ("bitwise", "tolerance", "decode")  # strictest first
SAMPLE_IMAGES = 12  # images of the user's dataset a decode change is measured on
DECODE_MAX_ERROR = 32.0  # largest allowed difference of any pixel value, in 1/255 units
DECODE_MEAN_ERROR = 2.0  # largest allowed mean absolute difference per pixel value, in 1/255 units
RESIZE_BOUND = 1.0  # documented: the device Resize is within 1/255 of PIL BILINEAR

_DECODE_NAMES = {"draft": "JPEG draft decoding", "nvjpeg": "JPEG decoding on the GPU (nvJPEG)"}


@dataclass(frozen=True)
class PixelChange:
    """One change of the tuned loader that makes its samples differ from the loader as given.

    ``mean_error`` / ``max_error`` are in 1/255 units (levels of an 8-bit pixel value): the mean
    absolute difference per pixel value, and the largest one, over ``n_images`` images of the
    user's dataset. ``n_images == 0`` means not measured: ``max_error`` is then the documented
    bound and ``mean_error`` is None.
    """

    name: str  # what the change is, e.g. "JPEG draft decoding"
    kind: str  # "tolerance" | "decode"
    setting: str  # the config entry that makes it: "decode=draft", "decode=nvjpeg", "gpu_transforms=Resize"
    mean_error: float | None
    max_error: float
    n_images: int
    size_mismatches: int = 0  # sampled images whose size after the resize differs from the original's
    allowed: bool = True  # within the bounds for its kind (refused changes are never tried)
    note: str = ""  # how it was measured, or why it was refused

    def applies_to(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` (a ``TuneResult.config``) makes this change."""
        key, _, value = self.setting.partition("=")
        if key == "decode":
            return config.get("decode") == value
        if key == "gpu_transforms":
            return config.get("decode") != "nvjpeg" and value in (config.get("gpu_transforms") or ())
        return False

    def error_text(self) -> str:
        """``mean 0.74/255, max 24/255 per pixel value over 12 of your images`` (or the documented bound)."""
        if self.n_images == 0:
            return f"documented bound: within {self.max_error:g}/255 per pixel value (not measured)"
        mean = "n/a" if self.mean_error is None else f"{self.mean_error:.3g}/255"
        text = f"mean {mean}, max {self.max_error:.3g}/255 per pixel value over {self.n_images} of your images"
        if self.size_mismatches:
            text += f"; {self.size_mismatches} of them one pixel off in size after the resize"
        return text

    @property
    def identical_where_measured(self) -> bool:
        """Measured on the user's images and no pixel value differed (e.g. draft decoding where every
        image checked was decoded at full scale): the same pixels there, but not guaranteed on others."""
        return self.n_images > 0 and self.max_error == 0 and not self.mean_error

    def describe(self) -> str:
        """One line: the change, its class and its measured error."""
        what = {"decode": "a different JPEG decoder", "tolerance": "the same operation, another kernel"}[self.kind]
        return f"{self.name} ({self.setting}; {what}): {self.error_text()}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exactness_of(config: Mapping[str, Any]) -> str:
    """The class of a configuration's least exact change: ``bitwise``, ``tolerance`` or ``decode``."""
    if (config.get("decode") or "pil") != "pil" or config.get("draft_decode"):
        return "decode"
    if any(device_exactness(name) != "bitwise" for name in config.get("gpu_transforms") or ()):
        return "tolerance"
    return "bitwise"


def changes_in(config: Mapping[str, Any], checks: Sequence[PixelChange]) -> tuple[PixelChange, ...]:
    """The measured changes (``checks``) that ``config`` makes, in the order they were measured."""
    return tuple(c for c in checks if c.allowed and c.applies_to(config))


def refusal(change: PixelChange) -> str:
    """Why a measured decode change must not be offered ("" when it may)."""
    if change.kind != "decode":
        return ""
    over = []
    if change.mean_error is not None and change.mean_error > DECODE_MEAN_ERROR:
        over.append(f"mean {change.mean_error:.3g}/255 > {DECODE_MEAN_ERROR:g}/255")
    if change.max_error > DECODE_MAX_ERROR:
        over.append(f"max {change.max_error:.3g}/255 > {DECODE_MAX_ERROR:g}/255")
    if change.size_mismatches:
        over.append(f"{change.size_mismatches} of {change.n_images} images change size by a pixel after the resize")
    if not over:
        return ""
    return (f"measured on {change.n_images} of your images, its error is beyond the bound ({'; '.join(over)}; "
            "pipeline_opt.tune.exactness.DECODE_MEAN_ERROR / DECODE_MAX_ERROR): not offered")


def sample_indices(total: int, n: int = SAMPLE_IMAGES) -> list[int]:
    """``n`` indices spread evenly over ``range(total)`` (all of them when ``total <= n``)."""
    if total <= 0:
        return []
    if total <= n:
        return list(range(total))
    return sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})


def measure_draft(dataset: Any, plan: Any, n: int = SAMPLE_IMAGES) -> PixelChange:
    """Draft decoding against a full decode on ``n`` of ``dataset.samples``, after the plan's resize
    (:func:`pipeline_opt.loading.decode.measure_draft_error`)."""
    samples = dataset.samples
    paths = [str(samples[i][0]) for i in sample_indices(len(samples), n)]
    err = measure_draft_error(paths, plan.target)
    change = PixelChange(name=_DECODE_NAMES["draft"], kind="decode", setting="decode=draft",
                         mean_error=float(err.mean_abs), max_error=float(err.max_abs), n_images=err.images,
                         size_mismatches=int(err.size_mismatches),
                         note=f"draft vs full libjpeg decode, both resized to {plan.target} (PIL bilinear)")
    if err.mean_reduction <= 1.0:
        # libjpeg drafts at 1/2, 1/4 or 1/8 scale only where the image is at least twice the target
        return replace(change, allowed=False,
                       note=f"draft() reduces none of {err.images} of your images at the target {plan.target} (a "
                            "JPEG draft decodes at 1/2, 1/4 or 1/8 scale only where that stays at least the "
                            "target size): it would change nothing, so it is not offered")
    return _judged(change)


def measure_nvjpeg(dataset: Any, plan: Any, device: torch.device, n: int = SAMPLE_IMAGES) -> PixelChange:
    """The GPU decoder the candidate would use (``plan``: a :class:`~pipeline_opt.tune.gpu_decode.NvjpegDecode`)
    against the dataset's own pipeline (its loader + transform, on the CPU) on ``n`` images."""
    samples = [plan.samples[i] for i in sample_indices(len(plan.samples), n)]
    decoder = GpuJpegDecoder(plan.size, mean=plan.mean, std=plan.std, crop=plan.crop, device=device)
    encoded = EncodedJpegDataset(samples)
    got, _ = decoder(packed_jpeg_collate([encoded[i] for i in range(len(encoded))]))
    want = torch.stack([dataset.transform(dataset.loader(path)) for path, _ in samples])
    mean, peak = _levels(got.detach().float().cpu(), want.float(), plan.std)
    change = PixelChange(name=_DECODE_NAMES["nvjpeg"], kind="decode", setting="decode=nvjpeg", mean_error=mean,
                         max_error=peak, n_images=len(samples),
                         note=f"the GPU decoder on {device} vs the dataset's PIL pipeline on the CPU")
    return _judged(change)


REPLAY_NAME = "JPEG decoding + random augmentation replayed on the GPU (nvJPEG)"


def measure_random_replay(plan: Any, device: torch.device, n: int = SAMPLE_IMAGES) -> PixelChange:
    """A random training pipeline replayed on the device (``plan``: a
    :class:`~pipeline_opt.loading.random_plan.RandomGpuPlan`) against the CPU pipeline on ``n`` of
    the user's files with the same seed: the same draws are required and the end-to-end mean within
    the plan's tolerance.

    The decode bounds (:data:`DECODE_MEAN_ERROR`, :data:`DECODE_MAX_ERROR`) apply to the decoder as
    they do for every decode change: after the pipeline's resize (here its first resize or resized crop, the
    decoder's output and Pillow's both taken through it). At full resolution nvJPEG's chroma
    upsampling moves single pixels at sharp colour edges by tens of levels, which the resize averages
    away. They do not apply to the end-to-end output: the replayed operations reproduce the CPU ones
    on the same input, but threshold operations (solarize, posterize, equalize, autocontrast) turn a
    one-level difference into a jump of many levels at the pixels near a threshold, so the end-to-end
    maximum of such a recipe says how far a pixel can move, not how good the decoder is. The change
    names the end-to-end error (what the user's samples see), the decoder's own at full resolution,
    and the decoder's through the resize (the one judged)."""
    parity = plan.measure_error(device=device, n=n)
    ok, why = plan.within_tolerance(parity)
    resized_mean, resized_max, through = _through_the_resize(parity)
    change = PixelChange(name=REPLAY_NAME, kind="decode", setting="decode=nvjpeg",
                         mean_error=float(parity.end_to_end_mean), max_error=float(parity.end_to_end_max),
                         n_images=int(parity.images),
                         note=f"{parity.decoder} + the replayed augmentation on {device} vs the CPU pipeline, "
                              f"same seed (same draws: {parity.same_draws}); the decoder alone: mean "
                              f"{parity.decode_mean:.3g}/255, max {parity.decode_max:.3g}/255 at full resolution, "
                              f"mean {resized_mean:.3g}/255, max {resized_max:.3g}/255 through {through}")
    if not ok:
        return replace(change, allowed=False, note=f"{why}: not offered")
    decoder = refusal(replace(change, mean_error=resized_mean, max_error=resized_max))
    if decoder:
        return replace(change, allowed=False, note=f"{parity.decoder} through {through}: {decoder}")
    return change


_RESAMPLING = frozenset({"resized_crop", "resize"})
_BEFORE_THE_RESIZE = frozenset({"crop", "center_crop", "hflip", "vflip", "to_uint8"})  # move pixels, change none


def _through_the_resize(parity: Any) -> tuple[float, float, str]:
    """The decoder's error after the pipeline's first resampling step (resize or resized crop: the step's
    cumulative error, the decoder plus the resize's rounding), where only crops and flips come before it;
    else at full resolution (a crop does not average the decoder's error away, and an op that changes
    levels before the resize would be charged to the decoder)."""
    for step in getattr(parity, "steps", ()):
        if step.kind in _RESAMPLING:
            return float(step.cumulative_mean), float(step.cumulative_max), f"the pipeline's {step.name}"
        if step.kind not in _BEFORE_THE_RESIZE:
            break
    return float(parity.decode_mean), float(parity.decode_max), "no resize before other ops (full resolution)"


def measure_offload(dataset: Any, plan: Any, device: torch.device, n: int = SAMPLE_IMAGES) -> PixelChange | None:
    """The device transforms of ``plan`` (a :class:`~pipeline_opt.tune.offload.GpuOffload`) against the
    dataset's CPU transform on ``n`` samples; None when every moved transform is bit-identical.

    Both sides draw the same random numbers (the CPU part is the same transforms in the same order).
    When the samples cannot be compared, the documented bound is reported instead."""
    moved = list(tolerance_names(plan.gpu_transform))
    if not moved:
        return None
    name = f"{'+'.join(moved)} on the device"
    setting = f"gpu_transforms={moved[0]}"
    try:
        variant = variant_dataset(dataset, plan, None)
        got, want = [], []
        for i in sample_indices(len(dataset), n):
            with same_draws(i):
                want.append(_image(dataset[i]))
            with same_draws(i):
                x = _image(variant[i])
            got.append(plan.gpu_transform(x.unsqueeze(0).to(device))[0].detach().cpu())
        mean, peak = _levels(torch.stack(got), torch.stack(want), _normalize_std(plan.gpu_transform))
    except Exception as exc:  # the documented bound still holds; say why nothing was measured
        log.debug("could not measure %s on the dataset: %s", name, exc)
        return PixelChange(name=name, kind="tolerance", setting=setting, mean_error=None, max_error=RESIZE_BOUND,
                           n_images=0, note=f"not measured ({type(exc).__name__}: {exc})")
    return PixelChange(name=name, kind="tolerance", setting=setting, mean_error=mean, max_error=peak,
                       n_images=len(got), note=f"on {device} vs the dataset's CPU transform; documented bound "
                       f"{RESIZE_BOUND:g}/255 against PIL bilinear")


def _judged(change: PixelChange) -> PixelChange:
    why = refusal(change)
    if not why:
        return change
    return replace(change, allowed=False, note=why)


def _levels(got: torch.Tensor, want: torch.Tensor, std: Sequence[float] | None) -> tuple[float, float]:
    """(mean, max) absolute difference in 1/255 units, undoing a Normalize's ``std`` (float images in [0, 1])."""
    if got.shape != want.shape:
        raise ValueError(f"the outputs differ in shape: {tuple(got.shape)} vs {tuple(want.shape)}")
    diff = (got.double() - want.double()).abs()
    if want.is_floating_point():
        if std is not None:
            diff = diff * torch.tensor(list(std), dtype=torch.float64).view(1, -1, 1, 1)
        diff = diff * 255.0
    return float(diff.mean()), float(diff.max())


def _normalize_std(pipeline: Any) -> tuple[float, ...] | None:
    modules = list(pipeline) if isinstance(pipeline, torch.nn.Sequential) else [pipeline]
    found = [m for m in modules if isinstance(m, Normalize)]
    return tuple(found[-1].std) if found else None


def _image(item: Any) -> torch.Tensor:
    """The image tensor of a dataset item: the item, its first tensor, or ``item["img"]``."""
    if isinstance(item, torch.Tensor):
        return item
    if isinstance(item, Mapping) and isinstance(item.get("img"), torch.Tensor):
        return item["img"]
    if isinstance(item, (tuple, list)):
        for x in item:
            if isinstance(x, torch.Tensor):
                return x
    raise TypeError(f"no image tensor in a dataset item of type {type(item).__name__}")


@contextlib.contextmanager
def same_draws(seed: int) -> Iterator[None]:
    """Seed torch, numpy and ``random`` with ``seed``; restore the caller's states afterwards."""
    saved = rng.states()
    rng.seed_all(seed)
    try:
        yield
    finally:
        rng.restore(saved)
