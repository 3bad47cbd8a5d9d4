"""The trainer-free ultralytics pipeline: dataset, InfiniteDataLoader, DetectionModel and its loss step.

Built from the same pieces ``DetectionTrainer`` uses (``build_yolo_dataset``, ``build_dataloader``,
``DetectionModel`` with the trainer's hyperparameters as ``model.args``), without the trainer's
optimizer, EMA, validator or results logging, so benchmarks can profile and tune exactly the data
path and the step a training run has.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline_opt._core.device import resolve_device
from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._augment import build_gpu_augment
from pipeline_opt.integrations.ultralytics._decide import (
    AugmentDecision,
    AugmentSwitch,
    candidate_switch,
    check_gpu_augment,
    decide_gpu_affine,
    decide_gpu_augment,
)
from pipeline_opt.integrations.ultralytics._env import prepare_offline_env
from pipeline_opt.integrations.ultralytics._internals import ultralytics_name
from pipeline_opt.integrations.ultralytics._step import AMP_CHOICES, YoloStep, default_amp
from pipeline_opt.integrations.ultralytics._tune import tune_loader
from pipeline_opt.profile import profile
from pipeline_opt.tune.result import TuneResult

log = get_logger("integrations.ultralytics")


@dataclass(frozen=True)
class YoloPipeline:
    """What :func:`build_yolo_pipeline` built. ``step_fn(model, batch)`` is forward + loss + backward."""

    loader: Any = field(repr=False)  # ultralytics InfiniteDataLoader
    model: torch.nn.Module = field(repr=False)  # DetectionModel, training mode, on ``device``
    step_fn: YoloStep = field(repr=False)
    dataset: Any = field(repr=False)  # YOLODataset (train augmentation)
    device: torch.device
    imgsz: int
    batch: int
    amp: str
    gpu_augment: bool | str  # as asked: False, True (measured by tune_yolo) or "force"
    switch: AugmentSwitch | None = field(default=None, repr=False, compare=False)  # None without gpu_augment
    augment: torch.nn.Module | None = field(default=None, repr=False)  # the device-side augmentation built
    gpu_affine: bool | str = False  # as asked: False, True (measured by tune_yolo) or "force"

    @property
    def gpu_augment_active(self) -> bool:
        """Whether the step applies the GPU augmentation now (the CPU HSV / flips are silenced)."""
        return self.switch is not None and self.switch.active

    @property
    def cpu_stages_disabled(self) -> tuple[str, ...]:
        """The CPU stages silenced now (empty once the measured decision gave them back)."""
        return self.switch.disabled.names if self.gpu_augment_active else ()

    @property
    def gpu_affine_active(self) -> bool:
        """Whether the step also warps (RandomPerspective's gains on the device, the workers crop)."""
        return self.gpu_augment_active and self.switch.affine

    @property
    def augment_decision(self) -> AugmentDecision | None:
        """The measured (or forced) GPU-augmentation decision; ``None`` until :func:`tune_yolo` made it."""
        return None if self.switch is None else self.switch.decision

    @property
    def affine_decision(self) -> AugmentDecision | None:
        """The warp's decision (``gpu_affine``); ``None`` without one."""
        return None if self.switch is None else self.switch.affine_decision

    def close(self) -> None:
        """Shut the loader's workers down."""
        close = getattr(self.loader, "close", None)
        if callable(close):
            close()


def build_yolo_pipeline(
    data_yaml: str | os.PathLike,
    model_cfg: str = "yolo11n.yaml",
    imgsz: int = 640,
    batch: int = 64,
    workers: int = 8,
    device: torch.device | str | None = None,
    *,
    amp: str | None = None,
    gpu_augment: bool = False,
    gpu_affine: bool = False,
    **overrides: Any,
) -> YoloPipeline:
    """Build the ultralytics training data path and step for ``data_yaml`` without a trainer.

    Args:
        data_yaml: a detection ``data.yaml`` (e.g. from :func:`pipeline_opt.datasets.make_yolo_dataset`).
        model_cfg: a model YAML (built from scratch; no weights are downloaded).
        imgsz, batch, workers: as the trainer's arguments (``workers`` is capped by
            ``build_dataloader`` as in training: by the CPU count and the batches per epoch).
        device: default ``cuda:0`` when available, else CPU.
        amp: ``"bf16"`` / ``"fp16"`` / ``"fp32"``; default bf16 on a CUDA device with bf16, else fp32.
        gpu_augment: silence the dataset's CPU RandomHSV / RandomFlip and apply them on the device
            in the step. ``True`` makes it a candidate: :func:`tune_yolo` (or :func:`decide_yolo_augment`)
            measures it against the CPU stages and keeps it only when it is faster beyond the noise;
            ``"force"`` applies it unmeasured.
        gpu_affine: RandomPerspective's warp on the device as well (the workers then only crop the
            Mosaic canvas). ``True``: a second candidate, measured after the colour/flip was kept
            (colour/flip alone against colour/flip + warp) and kept only when faster; ``"force"``
            (or ``gpu_augment="force"``): part of the GPU augmentation, unmeasured. It pays where
            the workers are the bottleneck (few cores) and gains little or nothing where they are not.
        overrides: any other ultralytics training argument (``mosaic=0.0``, ``cache="ram"``, ...).

    Ultralytics is configured offline first (:func:`prepare_offline_env`).
    """
    if not isinstance(imgsz, int) or imgsz < 32:
        raise ValueError(f"imgsz={imgsz!r} must be an integer >= 32")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r} must be an integer >= 1")
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers={workers!r} must be an integer >= 0")
    if amp is not None and amp not in AMP_CHOICES:
        raise ValueError(f"amp={amp!r} must be one of {AMP_CHOICES} or None")
    check_gpu_augment(gpu_augment)
    check_gpu_augment(gpu_affine, name="gpu_affine")
    if gpu_affine and not gpu_augment:
        raise ValueError(f"gpu_affine={gpu_affine!r} needs gpu_augment=True (the warp runs in the GPU augmentation)")
    if not os.path.isfile(data_yaml):
        raise ValueError(f"data_yaml={str(data_yaml)!r} is not a file; pass a detection data.yaml "
                         "(pipeline_opt.datasets.make_yolo_dataset() writes one)")
    prepare_offline_env()
    get_cfg, DEFAULT_CFG = ultralytics_name("get_cfg"), ultralytics_name("DEFAULT_CFG")  # noqa: N806
    check_det_dataset, check_imgsz = ultralytics_name("check_det_dataset"), ultralytics_name("check_imgsz")
    build_yolo_dataset, build_dataloader = ultralytics_name("build_yolo_dataset"), ultralytics_name("build_dataloader")
    DetectionModel = ultralytics_name("DetectionModel")  # noqa: N806 (a class)

    dev = resolve_device(device)
    amp = amp or default_amp(dev)
    cfg = get_cfg(DEFAULT_CFG, {"data": str(data_yaml), "model": model_cfg, "imgsz": imgsz, "batch": batch,
                                "workers": workers, **overrides})
    data = check_det_dataset(str(data_yaml))
    model = DetectionModel(model_cfg, nc=data["nc"], ch=data.get("channels", 3), verbose=False)
    model.nc, model.names, model.args = data["nc"], data["names"], cfg
    model = model.to(dev).train()
    if dev.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # as the trainer does on CUDA
    stride = max(int(model.stride.max()), 32)
    cfg.imgsz = check_imgsz(imgsz, stride=stride, floor=stride, max_dim=1)
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", stride=stride)
    loader = build_dataloader(dataset, batch=batch, workers=workers, shuffle=True, rank=-1, device=dev)
    step = YoloStep(dev, amp=amp)
    augment, switch = None, None
    if gpu_augment:
        augment = build_gpu_augment(cfg, affine=bool(gpu_affine), device=dev)
        switch = candidate_switch(dataset, _StepInstall(step, augment), augment, gpu_augment, gpu_affine)
    log.info("YOLO pipeline: %s at %d px, batch %d, %d workers, %s on %s%s", model_cfg, cfg.imgsz, batch,
             loader.num_workers, amp, dev,
             f", GPU augmentation ({', '.join(switch.disabled.names)})" if switch is not None else "")
    return YoloPipeline(loader=loader, model=model, step_fn=step, dataset=dataset, device=dev, imgsz=int(cfg.imgsz),
                        batch=batch, amp=amp, gpu_augment=gpu_augment, switch=switch, augment=augment,
                        gpu_affine=gpu_affine)


class _StepInstall:
    """``AugmentSwitch.install`` for a :class:`YoloStep`: sets or clears its ``augment``."""

    def __init__(self, step: YoloStep, augment: torch.nn.Module) -> None:
        self.step = step
        self.augment = augment

    def __call__(self, on: bool) -> None:
        self.step.augment = self.augment if on else None


def _check_pipeline(pipeline: Any) -> None:
    if not isinstance(pipeline, YoloPipeline):
        raise TypeError(f"expected a YoloPipeline from build_yolo_pipeline(...), got {type(pipeline).__name__}")


def profile_yolo(pipeline: YoloPipeline, steps: int = 30, warmup: int = 5, loader: Any = None, **kwargs: Any) -> Any:
    """:func:`pipeline_opt.profile` of the pipeline's loader (or ``loader``) with its real step."""

    _check_pipeline(pipeline)
    return profile(pipeline.loader if loader is None else loader, pipeline.model, step_fn=pipeline.step_fn,
                   steps=steps, warmup=warmup, device=pipeline.device, **kwargs)


def decide_yolo_augment(pipeline: YoloPipeline, **kwargs: Any) -> AugmentDecision | None:
    """Measure the GPU augmentation against the CPU stages (A B A B) and keep the faster, beyond the noise.

    ``None`` when the pipeline was built without ``gpu_augment``; a decision already made (or
    ``"force"``) is returned as it is. ``kwargs`` go to :func:`decide_gpu_augment` (``rounds``,
    ``windows``, ``steps``, ``warmup``, ``min_gain``, ``time_budget_s``, ``seed``, ``measure``).
    With ``gpu_affine=True`` the warp is decided next, the same way (:func:`decide_gpu_affine`;
    ``pipeline.affine_decision``). Afterwards ``pipeline.gpu_augment_active`` and
    ``pipeline.gpu_affine_active`` say which pipeline the step runs.
    """
    _check_pipeline(pipeline)
    switch = pipeline.switch
    if switch is None:
        return None
    args = (pipeline.loader, pipeline.model, pipeline.step_fn, pipeline.device, switch)
    if switch.decision is None:
        switch.decision = decide_gpu_augment(*args, **kwargs)
    if pipeline.gpu_affine and switch.affine_decision is None:
        switch.affine_decision = decide_gpu_affine(*args, **kwargs)
    return switch.decision


@dataclass(frozen=True)
class YoloTuneResult(TuneResult):
    """A :class:`~pipeline_opt.tune.result.TuneResult` plus the GPU-augmentation decision (saved in tune.json)."""

    gpu_augment: dict[str, Any] | None = None
    gpu_affine: dict[str, Any] | None = None  # the warp's decision, with gpu_affine=True or "force"


def tune_yolo(pipeline: YoloPipeline, time_budget_s: float = 60.0, *, augment_kwargs: dict[str, Any] | None = None,
              **kwargs: Any) -> YoloTuneResult:
    """Decide the GPU augmentation (measured), then :func:`pipeline_opt.autotune` the loader on real steps.

    With ``gpu_augment=True`` the pipeline's GPU augmentation is first measured against the CPU
    stages (:func:`decide_yolo_augment` with ``augment_kwargs``) and kept only where it wins beyond
    the noise; the loader (workers, pin_memory, prefetch; with ``shared_slots=True`` on CUDA also shared slots: workers that
    reuse page-locked buffers for the images instead of a fresh shared-memory segment per batch)
    is then tuned for the pipeline kept. The returned ``loader`` is an ``InfiniteDataLoader`` clone
    with the chosen settings, or, when shared slots won, a
    :class:`~pipeline_opt.transforms.DeviceLoader` over one that yields the batches with ``img``
    already on the device (``step_fn`` takes either); ``gpu_augment`` holds the decision (both
    throughputs, the noise, the verdict), ``None`` without GPU augmentation.
    """
    _check_pipeline(pipeline)
    decision = decide_yolo_augment(pipeline, **(augment_kwargs or {}))
    result = tune_loader(pipeline.loader, pipeline.model, pipeline.step_fn, pipeline.device, time_budget_s, **kwargs)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    affine = pipeline.affine_decision
    return YoloTuneResult(**fields, gpu_augment=None if decision is None else decision.to_dict(),
                          gpu_affine=None if affine is None else affine.to_dict())
