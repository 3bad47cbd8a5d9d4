"""Turn a :class:`LoaderConfig` into a loader: a clone of the user's DataLoader, maybe wrapped.

Trial loaders carry a DataLoader ``timeout`` so a hung worker fails the trial; the final loader
keeps the user's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from pipeline_opt.loading import DeviceLoader
from pipeline_opt.loading.dataloader import clone_loader
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.gpu_decode import NvjpegDecode
from pipeline_opt.tune.offload import DraftDecode, GpuOffload, variant_dataset


@dataclass(frozen=True)
class CandidateBuilder:
    """Builds the loader of any candidate from the user's ``loader`` and the offload plans."""

    loader: DataLoader
    device: torch.device
    gpu: GpuOffload | None = None
    draft: DraftDecode | None = None
    nvjpeg: NvjpegDecode | None = None
    trial_timeout_s: float = 0.0

    def build(self, cfg: LoaderConfig, *, trial: bool = True) -> Any:
        """The loader for ``cfg``; ``trial=False`` builds the one handed back to the user."""
        if cfg.gpu_transforms and self.gpu is None:
            raise ValueError(f"{cfg.label()} asks for GPU transforms but no offload plan exists")
        if cfg.draft_decode and self.draft is None:
            raise ValueError(f"{cfg.label()} asks for draft decoding but no draft plan exists")
        if cfg.decode == "nvjpeg" and self.nvjpeg is None:
            raise ValueError(f"{cfg.label()} asks for GPU JPEG decoding but no nvJPEG plan exists")
        if cfg.decode == "nvjpeg" and cfg.gpu_transforms:
            raise ValueError(f"{cfg.label()}: GPU JPEG decoding replaces the whole transform; drop gpu_transforms")
        if cfg.decode == "nvjpeg" and cfg.shared_slots:
            raise ValueError(f"{cfg.label()}: GPU JPEG decoding sends encoded bytes; drop shared_slots")
        gpu = self.gpu if cfg.gpu_transforms else None
        draft = self.draft if cfg.draft_decode else None
        overrides = cfg.loader_overrides()
        if trial and cfg.num_workers > 0 and self.trial_timeout_s > 0:
            user = float(self.loader.timeout or 0)
            overrides["timeout"] = self.trial_timeout_s if user <= 0 else min(user, self.trial_timeout_s)
        if cfg.decode == "nvjpeg":
            return self.nvjpeg.build(self.loader, self.device, overrides, prepare_in_thread=cfg.decode_thread)
        if gpu is not None or draft is not None:
            overrides["dataset"] = variant_dataset(self.loader.dataset, gpu, draft)
        if cfg.shared_slots:

            return DeviceLoader.through_slots(self.loader, self.device,
                                              transform=None if gpu is None else gpu.gpu_transform, **overrides)
        clone = clone_loader(self.loader, **overrides)
        if gpu is None:
            return clone

        return DeviceLoader(clone, device=self.device, transform=gpu.gpu_transform)
