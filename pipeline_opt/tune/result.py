"""Result dataclasses of :func:`pipeline_opt.autotune` (the API contract; fields may be added)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline_opt._core.render import render
from pipeline_opt.profile.report import ProfileReport, _plain
from pipeline_opt.tune.exactness import REPLAY_NAME, PixelChange

DATALOADER_ARGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


@dataclass(frozen=True)
class Trial:
    """One measured candidate configuration."""

    config: dict[str, Any]
    throughput: float  # median samples/s over the trial's repeat windows (0.0 when it failed)
    spread: float  # (max - min) / median of the steady-state windows (those not in startup_windows)
    accepted: bool
    reason: str  # why it was accepted, rejected, skipped or failed
    status: str = "ok"  # ok | failed | skipped
    windows: tuple[float, ...] = ()  # throughput of each repeat window
    elapsed_s: float = 0.0
    startup_windows: tuple[int, ...] = ()  # indices of windows holding a worker (re)start (not in the noise)


@dataclass(frozen=True)
class TuneResult:
    """What :func:`pipeline_opt.autotune` found. ``loader`` is ready to use in training."""

    loader: Any = field(repr=False, compare=False)
    config: dict[str, Any]
    baseline: ProfileReport
    best: ProfileReport
    trials: tuple[Trial, ...]
    # The one speedup figure, printed everywhere (table, verdict, CLI, tune.html): best_throughput /
    # baseline_throughput, the pooled medians of every steady-state window of the returned
    # configuration's trials and of the loader as given's, measured interleaved in this run (the
    # final check's rounds included); exactly 1.0 when the loader as given is returned. The
    # baseline / best profiles are single short runs for the breakdown: their ratio is not it.
    speedup: float
    noise: float = 0.0  # measured run-to-run relative spread of the baseline
    tuning_time_s: float = 0.0
    not_tried: tuple[str, ...] = ()  # candidates skipped for lack of budget, with the reason
    original_config: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""  # one sentence: what won and by how much, or that nothing did
    budget: dict[str, Any] = field(default_factory=dict)  # the resource budget and its reasons
    # What the returned loader's changes do to the samples (pipeline_opt.tune.exactness): "bitwise"
    # (the same bytes), "tolerance" (the same operation by another kernel) or "decode" (another JPEG
    # decoder); every change that is not bitwise is in pixel_changes with its measured error.
    exactness: str = "bitwise"
    pixel_changes: tuple[PixelChange, ...] = ()
    pixel_checks: tuple[PixelChange, ...] = ()  # every error measured during the run, refused changes included
    exact: bool = False  # autotune(exact=True): only bit-identical changes were allowed
    baseline_throughput: float = 0.0  # pooled median samples/s of the loader as given's trials
    best_throughput: float = 0.0  # pooled median samples/s of the returned configuration's trials
    cautions: tuple[str, ...] = ()  # what weakens the claim (trials of one configuration that disagree)

    def dataloader_kwargs(self, changed_only: bool = False) -> dict[str, Any]:
        """The tuned settings that are ``torch.utils.data.DataLoader`` arguments, ready for
        ``DataLoader(dataset, **kwargs)``: num_workers, pin_memory, and with workers,
        persistent_workers and prefetch_factor (DataLoader refuses those two without workers).

        The tuner's other changes (GPU transforms, another JPEG decoder, shared slots) are not
        DataLoader arguments: :meth:`other_changes` says how to apply them, and ``loader`` applies
        everything. ``changed_only`` keeps only the arguments that differ from the loader as given.
        """
        out = {k: self.config[k] for k in DATALOADER_ARGS if k in self.config}
        if not out.get("num_workers"):
            out.pop("persistent_workers", None)
            out.pop("prefetch_factor", None)
        if changed_only:
            original = self.original_config or {}
            out = {k: v for k, v in out.items() if k not in original or original[k] != v}
        return out

    def other_changes(self) -> dict[str, str]:
        """The changes that are not DataLoader arguments, each with how to apply it by hand
        (``loader`` already applies them all); empty when only DataLoader arguments changed."""
        cfg, out = self.config, {}
        decode = cfg.get("decode") or ("draft" if cfg.get("draft_decode") else "pil")
        gpu = list(cfg.get("gpu_transforms") or ())
        if gpu and decode != "nvjpeg":
            out["gpu_transforms"] = (
                f"run {'+'.join(gpu)} on the device, per batch: `ds, gpu = "
                "pipeline_opt.transforms.offload_dataset_transform(dataset)`, build the DataLoader on `ds`, "
                "iterate `pipeline_opt.transforms.DeviceLoader(loader, device, transform=gpu)`")
        if decode == "draft":
            out["decode"] = ("JPEG draft decoding (libjpeg DCT scaling): `dataset = "
                             "pipeline_opt.transforms.draft_dataset(dataset)`")
        elif decode == "nvjpeg" and any(c.name == REPLAY_NAME for c in self.pixel_changes):
            out["decode"] = ("JPEG decoding + your random augmentations replayed on the GPU (the same draws): "
                             "`plan, why = pipeline_opt.transforms.plan_random_gpu_pipeline(loader)`, then "
                             "`loader = plan.build(loader, device, dataloader_kwargs"
                             + ("" if cfg.get("decode_thread") else ", prepare_in_thread=False") + ")`")
        elif decode == "nvjpeg":
            out["decode"] = ("JPEG decoding on the GPU (nvJPEG): `pipeline_opt.transforms.gpu_jpeg_loader(dataset, "
                             "pipeline_opt.transforms.GpuJpegDecoder(size, mean=..., std=..., crop=...), "
                             + ("" if cfg.get("decode_thread") else "prepare_in_thread=False, ")
                             + "**dataloader_kwargs)` with your Resize / CenterCrop / Normalize values")
        if cfg.get("shared_slots"):
            out["shared_slots"] = ("image tensors through reused page-locked slots: `loader = "
                                   "pipeline_opt.loading.shared_slots.slot_loader(loader)`, iterated through "
                                   "`pipeline_opt.transforms.DeviceLoader(loader, device, reuse_buffers=True)`")
        for change in self.pixel_changes:
            key = change.setting.partition("=")[0]
            if key in out:
                out[key] += f" [changes pixels: {change.error_text()}]"
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "loader"}
        return json.loads(json.dumps(_plain(out)))

    def table(self) -> str:
        """Every trial, its throughput and spread, and why it was kept or not (also written as tune.txt)."""
        return render("tune_table", self)

    def save(self, directory: str | Path) -> Path:
        """Write tune.json, tune.txt, tune.html, and the baseline/ and best/ profile reports."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "tune.json").write_text(json.dumps(self.to_dict(), indent=2))
        (d / "tune.txt").write_text(self.table() + "\n")
        self.baseline.save(d / "baseline")
        self.best.save(d / "best")
        (d / "tune.html").write_text(render("tune_html", self.to_dict()))
        # the best trial's merged trace at the top level, for a one-click look
        (d / "trace.json").write_text((d / "best" / "trace.json").read_text())
        return d


def trial_spread(trial: Mapping[str, Any]) -> str:
    """``±12%``: the spread of a trial's steady-state windows; ``-`` when fewer than two of its
    windows were steady (the others held a worker start-up) or it measured none."""
    windows = trial.get("windows") or ()
    steady = len(windows) - len(trial.get("startup_windows") or ())
    if windows and steady < 2:
        return "-"
    return f"±{100 * float(trial.get('spread') or 0.0):.0f}%"
