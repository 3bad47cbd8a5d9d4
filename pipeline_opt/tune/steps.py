"""The tuner's per-knob steps, each a few moves of a :class:`~pipeline_opt.tune.search.Search`:
persistent workers after a lost first guess, GPU JPEG decoding, the dataset changes (offload, draft
decoding), and the flags (pin_memory, shared slots, persistent_workers, prefetch_factor).

A step tries a change through :meth:`Search.try_change` / :meth:`Search.consider` (which measure,
accept or roll back) or notes with :meth:`Search.skip` why it is not tried; the order of the steps
is :func:`pipeline_opt.tune.api.tune_loader`'s.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from pipeline_opt.loading.random_plan import RandomGpuPlan
from pipeline_opt.tune.candidates import LoaderConfig, workers_to_keep_up
from pipeline_opt.tune.exactness import REPLAY_NAME
from pipeline_opt.tune.gpu_decode import GPU_DECODE_CHANGE, gpu_decode_workers
from pipeline_opt.tune.search import Search


def retry_with_persistent_workers(search: Search, guess: LoaderConfig) -> None:
    """Workers that lost to the loader as given may have lost to their start-up at every epoch
    (which is out of proportion on a machine whose cores are busy): the same workers started once
    are tried before the search climbs from no workers, where a single worker cannot win."""
    if search.incumbent.num_workers or not guess.num_workers or guess.persistent_workers:
        return
    if search.consider(guess.with_(persistent_workers=True),
                       f"{guess.label()} lost to the loader as given: the same workers started once (persistent), "
                       "not at every epoch"):
        search.tune_workers("num_workers with persistent workers")


def gpu_decode_name(plan) -> str:
    """What the GPU-decode candidate of ``plan`` does, for its trial's reason."""
    return REPLAY_NAME if isinstance(plan, RandomGpuPlan) else "JPEG decoding on the GPU (nvJPEG)"


def tune_gpu_decode(search: Search, plan, why_not: str) -> None:
    """Decode the JPEGs on the GPU (nvJPEG, or the random-augmentation replay ``plan``) in a background
    thread with few workers (unless that was measured already, as the first guess); then, if that
    lost, with the incumbent's workers. ``why_not`` is noted when ``plan`` is None."""
    if plan is None:
        search.skip("nvjpeg decode", why_not)
        return
    inc = search.incumbent
    what = gpu_decode_name(plan)
    # torchvision's nvJPEG call returns only once the batch is decoded: from the training loop it
    # waits between two steps; from a thread of its own it runs while the step does, which won
    # beyond the noise at every worker count of the committed classification grids, so the
    # candidate decodes in the thread (one trial, not two). Pinned memory makes the decoder's
    # host-to-device copies faster at any worker count.
    light = gpu_decode_workers(inc.num_workers, search.budget.max_workers)
    change = GPU_DECODE_CHANGE
    first = inc.with_(num_workers=light, **change)
    if first not in search.history and search.try_change(
            f"{what}, in a background thread overlapping the step, with {light} workers (they only read files)",
            num_workers=light, **change):
        search.tune_workers("num_workers after GPU decoding")
        return
    # lost with few workers: where reading the files is what starves the step (a slow disk, a network
    # file system), the same decode with the incumbent's workers may still win
    runs = search.evidence(inc.with_(num_workers=light, **change))
    need = workers_to_keep_up(runs[-1], light) if runs else None
    if need is not None and inc.num_workers > light and search.try_change(
            f"{what}, in a background thread, with the incumbent's {inc.num_workers} workers ({light} left the step "
            f"waiting on data: Little's law asks for {need})", num_workers=inc.num_workers, **change):
        search.tune_workers("num_workers after GPU decoding")


def tune_flags(search: Search, loader: DataLoader, dev: torch.device, shared_slots: bool = True,
               persistent: bool = True) -> None:
    """pin_memory (on CUDA), shared slots, persistent_workers (unless ``persistent`` is False),
    then prefetch_factor doubled or halved."""
    inc = search.incumbent
    if dev.type == "cuda":
        search.try_change(f"pin_memory -> {not inc.pin_memory}", pin_memory=not inc.pin_memory)
    else:
        search.skip("pin_memory", f"device is {dev.type}: pinned memory only speeds up copies to an accelerator")
    tune_shared_slots(search, loader, dev, shared_slots)
    if search.incumbent.num_workers == 0:
        search.skip("persistent_workers, prefetch_factor", "the best configuration has no workers")
        return
    if persistent and not search.incumbent.persistent_workers:
        # clone_loader keeps a persistent clone's epoch order equal to the original's
        if search.try_change("persistent_workers -> True", persistent_workers=True):
            search.tune_workers("num_workers with persistent workers")  # restarts no longer price the workers
    pf = search.incumbent.prefetch_factor or 2
    if not search.try_change(f"prefetch_factor {pf} -> {2 * pf}", prefetch_factor=2 * pf) and pf > 1:
        search.try_change(f"prefetch_factor {pf} -> {pf // 2}", prefetch_factor=pf // 2)


def tune_shared_slots(search: Search, loader: DataLoader, dev: torch.device, enabled: bool) -> None:
    """Image tensors through reused, page-locked shared-memory slots, when ``enabled`` and they can
    apply (CUDA, workers, a CPU decode, a DataLoader); the reason is noted once otherwise."""
    inc = search.incumbent
    why = None if enabled else "disabled (shared_slots=False)"
    if why is None and dev.type != "cuda":
        why = f"device is {dev.type}: the slots save the pinning and mapping of batches copied to an accelerator"
    elif why is None and inc.num_workers == 0:
        why = "the best configuration has no workers (batches are made in the training process)"
    elif why is None and inc.decode == "nvjpeg":
        why = "nvJPEG batches are encoded bytes, small to send"
    elif why is None and not isinstance(loader, DataLoader):
        why = f"the loader is a {type(loader).__name__}, not a DataLoader"
    if why is None and inc.shared_slots:
        return  # tried already (and kept)
    if why is not None:
        if not any(line.startswith("shared_slots:") for line in search.not_tried):
            search.skip("shared_slots", why)
        return
    search.try_change("image tensors through reused, page-locked shared-memory slots", shared_slots=True)


def each_lever_on_its_own(search: Search, levers: list[str]) -> None:
    """The first guess bundled dataset changes with the worker count (``levers``, when the workers were
    capped): each is measured on its own, the incumbent without it, and stays only if the incumbent is
    faster beyond the noise (:meth:`~pipeline_opt.tune.search.Search.consider`'s unproven-lever rule)."""
    if not levers or search.incumbent == search.baseline:
        return
    inc = search.incumbent
    if inc.gpu_transforms:
        search.consider(inc.with_(gpu_transforms=()), f"the first guess without {'+'.join(inc.gpu_transforms)} on "
                                                      "the device (each of its changes measured on its own)")
    inc = search.incumbent
    if inc.decode == "draft":
        search.consider(inc.with_(decode="pil"), "the first guess without JPEG draft decoding (each of its changes "
                                                 "measured on its own)")


def tune_dataset_changes(search: Search, gpu_plan, gpu_why: str, draft_plan, draft_why: str) -> None:
    """The offload and draft decoding not already in the incumbent (GPU decoding replaces both)."""
    if search.incumbent.decode == "nvjpeg":
        search.skip("gpu_transforms, draft_decode", "the GPU decodes, resizes and normalises already (nvjpeg)")
        return
    if gpu_plan is None:
        search.skip("gpu_transforms", gpu_why)
    elif not search.incumbent.gpu_transforms and \
            search.try_change(f"move {'+'.join(gpu_plan.names)} to the device", gpu_transforms=gpu_plan.names):
        search.tune_workers("num_workers after the offload")
    if draft_plan is None:
        search.skip("draft_decode", draft_why)
    elif search.incumbent.decode == "pil" and search.try_change("JPEG draft decoding", decode="draft"):
        search.tune_workers("num_workers after draft decoding")
