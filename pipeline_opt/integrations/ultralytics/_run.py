"""The state of one attached trainer's run (:class:`Run`), shared by the attach steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline_opt.integrations.ultralytics._augment import GpuAugmentedPreprocess
from pipeline_opt.integrations.ultralytics._decide import AugmentSwitch
from pipeline_opt.loading.dataloader import loader_config
from pipeline_opt.profile.main_profiler import StepProfiler
from pipeline_opt.profile.memory import MemoryMeter
from pipeline_opt.profile.validation import ValidationRecorder

__all__ = ["OUTPUT_SUBDIR", "SUMMARY_FILE", "Run", "epoch_batch_sizes", "sized"]

OUTPUT_SUBDIR = "pipeline_opt"
SUMMARY_FILE = "integration.json"


def epoch_batch_sizes(loader: Any) -> list[int]:
    """Samples in each batch of one epoch of ``loader`` (the callbacks never see the batch itself)."""
    cfg = loader_config(loader)
    batch = int(cfg["batch_size"] or 1)
    sampler = getattr(loader, "sampler", None)
    samples = len(sampler) if sampler is not None else len(loader) * batch
    full, rest = divmod(samples, batch)
    return [batch] * full + ([rest] if rest and not loader.drop_last else [])


def sized(n: int) -> torch.Tensor:
    """A zero-byte stand-in with ``n`` rows: what ``StepProfiler.after_data`` counts as the batch size."""
    return torch.empty((n, 0))


class Run:
    """State of one trainer's run: what was decided, applied and measured so far."""

    def __init__(self, trainer: Any, output_dir: str | None, rank: int | None = None, warmup: int = 5) -> None:
        self.trainer = trainer
        self.rank = rank  # the DDP rank, None without DDP
        self.root_dir = Path(output_dir) if output_dir else Path(trainer.save_dir) / OUTPUT_SUBDIR
        self.out_dir = self.root_dir if rank is None else self.root_dir / f"rank_{rank}"
        self.augment_votes: list[bool] | None = None
        self.affine_votes: list[bool] | None = None
        self.notes: list[str] = []
        self.augment: GpuAugmentedPreprocess | None = None  # the wrapper built (installed only while active)
        self.switch: AugmentSwitch | None = None
        self.tunes: list[dict[str, Any]] = []
        self.loader_setting: dict[str, Any] | None = None  # the settings applied to trainer.train_loader
        self.profiler: StepProfiler | None = None
        self.collector: Any = None
        self.plain_loader: Any = None
        self.profiled_loader: Any = None
        self.loader_config: dict[str, Any] = {}
        self.batch_sizes: list[int] = []
        self.position = 0
        self.report: Any = None
        self.validation = ValidationRecorder(warmup_steps=warmup)  # each training step, each validation pass
        self.batch_end: float | None = None
        self.memory = MemoryMeter(getattr(trainer, "device", "cpu"))  # peak per training step outside the window
        self.epoch_peaks: dict[int, int] = {}  # epoch -> the largest step peak (allocated bytes)
        self.batch_size = getattr(trainer, "batch_size", None)  # to notice ultralytics' out-of-memory retry

    @property
    def disabled(self) -> list[dict[str, Any]]:
        """The CPU stages silenced now, with the settings they had."""
        return [] if self.switch is None else self.switch.disabled.to_dict()["stages"]

    @property
    def profiling(self) -> bool:
        """Whether the profile window is running (started, not done, no report yet)."""
        return self.profiler is not None and self.report is None and not self.profiler.done

    def note(self, text: str) -> None:
        """Add ``text`` to the run's notes once."""
        if text not in self.notes:
            self.notes.append(text)

    def validation_analysis(self) -> Any:
        """The steps after the validation passes so far against the steady ones (None before any)."""
        loader = getattr(self.trainer, "train_loader", None)
        try:
            per_epoch = len(loader) if loader is not None else None
        except TypeError:
            per_epoch = None
        return self.validation.analyse(per_epoch)
