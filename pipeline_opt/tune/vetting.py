"""The dataset changes the tuner may offer, and what each does to the samples.

:func:`plan_dataset_changes` plans the tensor-transform offload, JPEG draft decoding and GPU JPEG
decoding (nvJPEG, or the random-augmentation replay) for a loader; each decoder is measured on a few
of the user's images first (:func:`vetted`) and offered only within the documented error bounds
(:mod:`pipeline_opt.tune.exactness`); with ``exact=True`` only bit-identical changes are planned
(:data:`EXACT_REFUSAL`). :func:`samples_clause` says in the verdict whether the tuned loader's samples
are the original ones bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.loading.random_plan import RandomGpuPlan, plan_random_gpu_pipeline
from pipeline_opt.tune.exactness import (
    PixelChange,
    measure_draft,
    measure_nvjpeg,
    measure_offload,
    measure_random_replay,
)
from pipeline_opt.tune.gpu_decode import NvjpegDecode, plan_nvjpeg_decode
from pipeline_opt.tune.offload import DraftDecode, GpuOffload, plan_draft_decode, plan_gpu_offload

log = get_logger("tune")

EXACT_REFUSAL = "exact=True allows only bit-identical changes, and {} (the pixels differ)"


@dataclass(frozen=True)
class DatasetChanges:
    """The dataset changes the tuner may try (each None with its reason when it may not), and every
    pixel error measured while deciding (``TuneResult.pixel_checks``)."""

    gpu: GpuOffload | None  # tensor transforms moved to the device
    gpu_why: str
    draft: DraftDecode | None  # JPEG draft decoding
    draft_why: str
    nvjpeg: NvjpegDecode | RandomGpuPlan | None  # JPEG decoding on the GPU, or the random-augmentation replay
    nvjpeg_why: str
    checks: tuple[PixelChange, ...]
    held_back: tuple[tuple[str, str], ...]  # (what, why) parts of a planned change left out


def plan_dataset_changes(loader: Any, dev: torch.device, *, gpu_transforms: bool, draft_decode: bool,
                         exact: bool) -> DatasetChanges:
    """Plan the offload, draft decoding and GPU decoding for ``loader`` on ``dev``; the decoders are
    measured on the user's images before any trial, and the offload's error too."""
    gpu_plan, gpu_why = (None, f"device is {dev.type}: nothing to offload to") if dev.type != "cuda" \
        else (None, "disabled (gpu_transforms=False)") if not gpu_transforms \
        else plan_gpu_offload(loader.dataset, exact=exact)
    held_back = (("gpu_transforms Resize", gpu_why),) if gpu_plan is not None and gpu_why else ()
    draft_plan, draft_why = (None, "disabled (draft_decode=False)") if not draft_decode \
        else plan_draft_decode(loader.dataset)
    nvjpeg_plan, nvjpeg_why = (None, f"device is {dev.type}: nvJPEG decodes on CUDA devices only") \
        if dev.type != "cuda" else (None, "disabled (gpu_transforms=False)") if not gpu_transforms \
        else plan_nvjpeg_decode(loader)
    # what each change does to the samples: decoders measured on the user's images before any trial
    checks: list[PixelChange] = []
    if exact:
        draft_plan, draft_why = (None, EXACT_REFUSAL.format("JPEG draft decoding decodes at a reduced DCT scale")) \
            if draft_plan is not None else (None, draft_why)
        nvjpeg_plan, nvjpeg_why = (None, EXACT_REFUSAL.format("nvJPEG is a different JPEG decoder")) \
            if nvjpeg_plan is not None else (None, nvjpeg_why)
    else:
        draft_plan, draft_why = vetted(draft_plan, draft_why, lambda: measure_draft(loader.dataset, draft_plan),
                                       checks)
        nvjpeg_plan, nvjpeg_why = vetted(nvjpeg_plan, nvjpeg_why,
                                         lambda: measure_nvjpeg(loader.dataset, nvjpeg_plan, dev), checks)
        if nvjpeg_plan is None and dev.type == "cuda" and gpu_transforms:
            # a random training Compose: the workers draw its parameters, the device decodes and replays
            replay_plan, replay_why = plan_random_gpu_pipeline(loader)
            if replay_plan is not None:
                nvjpeg_plan, nvjpeg_why = vetted(replay_plan, replay_why,
                                                 lambda: measure_random_replay(replay_plan, dev), checks)
            else:
                nvjpeg_why = f"{nvjpeg_why}; random-augmentation replay: {replay_why}"
    if gpu_plan is not None:
        offload_change = measure_offload(loader.dataset, gpu_plan, dev)
        if offload_change is not None:
            checks.append(offload_change)
    return DatasetChanges(gpu=gpu_plan, gpu_why=gpu_why, draft=draft_plan, draft_why=draft_why, nvjpeg=nvjpeg_plan,
                          nvjpeg_why=nvjpeg_why, checks=tuple(checks), held_back=held_back)


def vetted(plan, why: str, measure: Callable[[], PixelChange], checks: list[PixelChange]):
    """``(plan, why)`` of a decode candidate once its error on the user's images is known: the plan
    when the error is within the bounds, else ``(None, the measured reason)``. The measurement is
    kept in ``checks`` either way (``TuneResult.pixel_checks``)."""
    if plan is None:
        return None, why
    try:
        change = measure()
    except Exception as exc:
        log.debug("measuring a decode change failed", exc_info=True)
        return None, f"its error could not be measured on your images ({type(exc).__name__}: {exc}): not offered"
    checks.append(change)
    if not change.allowed:
        log.info("autotune: %s refused: %s", change.name, change.note)
        return None, change.note
    log.debug("autotune: %s", change.describe())
    return plan, ""


def samples_clause(exactness: str, changes: tuple[PixelChange, ...]) -> str:
    """A clause for the verdict: whether the tuned loader's samples are bit-for-bit the original ones."""
    if exactness == "bitwise":
        return "samples bit-for-bit identical to the loader as given"
    named = "; ".join(f"{c.name}: {c.error_text()}" for c in changes) or f"{exactness} changes"
    if changes and all(c.identical_where_measured for c in changes):
        return (f"samples identical on every image checked but not guaranteed bit-for-bit ({named}; "
                "exact=True guarantees it)")
    return f"samples NOT bit-for-bit identical ({named})"
