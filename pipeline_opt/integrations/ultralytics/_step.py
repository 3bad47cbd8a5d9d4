"""Training steps of an ultralytics detection model, as ``step_fn(model, batch)`` for profile / autotune.

* :class:`TrainerStep` is the trainer's own step: ``trainer.preprocess_batch`` (with the GPU
  augmentation when attached), the trainer's autocast setting (bf16 / fp16 AMP / fp32), the
  model's loss, ``trainer.scaler.scale(loss).backward()``. The optimizer is never called.
* :class:`YoloStep` is the same step without a trainer (benchmarks): device copy, ``/255``,
  autocast, ``model(batch)`` (the criterion), backward.

Both copy the batch dict before preprocessing, so a replayed batch (the profiler's speed-of-light
measurement) is preprocessed from its original uint8 images every time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipeline_opt._core.step import move_to_device
from pipeline_opt.integrations.ultralytics._internals import ultralytics_name

AMP_CHOICES = ("bf16", "fp16", "fp32")


def _sum_loss(model: torch.nn.Module, batch: dict, compiled: bool) -> torch.Tensor:
    if compiled:  # as the trainer does with compile=True: forward, then the criterion
        preds = model(batch["img"])
        loss, _ = ultralytics_name("unwrap_model")(model).loss(batch, preds)
    else:
        loss, _ = model(batch)
    return loss.sum()


class TrainerStep:
    """The step of ``trainer`` (an ultralytics ``BaseTrainer`` after its setup), minus the optimizer."""

    def __init__(self, trainer: Any) -> None:
        for attr in ("preprocess_batch", "scaler", "device", "args"):
            if not hasattr(trainer, attr):
                raise TypeError(f"TrainerStep needs an ultralytics trainer after setup; {type(trainer).__name__} "
                                f"has no {attr!r} (call it from on_pretrain_routine_end or later)")
        self.trainer = trainer

    @property
    def amp(self) -> str:
        """``bf16`` / ``fp16`` / ``fp32``: the precision the trainer's autocast runs."""
        t = self.trainer
        if t.args.amp == "bf16":
            return "bf16"
        return "fp16" if bool(getattr(t, "amp", False)) else "fp32"

    def __call__(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        autocast = ultralytics_name("autocast")
        t = self.trainer
        with autocast(torch.bfloat16 if t.args.amp == "bf16" else bool(t.amp), device=t.device.type):
            prepared = t.preprocess_batch(dict(batch))
            loss = _sum_loss(model, prepared, bool(t.args.compile))
        t.scaler.scale(loss).backward()
        return loss.detach()


def images_to_device(batch: dict, device: torch.device) -> dict:
    """A copy of ``batch`` with only ``img`` on ``device`` (the copy to a GPU does not block).

    The GPU augmentation takes the boxes from the CPU: a warp filters them there without making
    the host wait, and the augmentation copies them to the device itself."""
    batch = dict(batch)
    batch["img"] = move_to_device(batch["img"], device, non_blocking=device.type == "cuda")
    return batch


def preprocess_images(batch: dict, device: torch.device) -> dict:
    """The device copy and ``/255`` of ``DetectionTrainer.preprocess_batch`` (no multi-scale)."""
    batch = move_to_device(batch, device, non_blocking=device.type == "cuda")
    batch["img"] = batch["img"].float() / 255
    return batch


def default_amp(device: torch.device) -> str:
    """``bf16`` on a CUDA device that supports it, else ``fp32``."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


class YoloStep:
    """A detection training step without a trainer.

    Args:
        device: where the model runs.
        amp: ``"bf16"`` (autocast bfloat16), ``"fp16"`` (autocast float16 + GradScaler, as the
            trainer's default AMP) or ``"fp32"``.
        augment: optional batch transform applied on the device before ``/255`` (the GPU
            augmentation); ``None`` for the dataset's own CPU augmentation only.
    """

    def __init__(self, device: torch.device | str, amp: str = "fp32",
                 augment: Callable[[dict], dict] | None = None) -> None:
        if amp not in AMP_CHOICES:
            raise ValueError(f"amp={amp!r} must be one of {AMP_CHOICES}")
        self.device = torch.device(device)
        if amp != "fp32" and self.device.type != "cuda":
            raise ValueError(f"amp={amp!r} needs a CUDA device (got {self.device}); pass amp='fp32'")
        self.amp = amp
        self.augment = augment
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp == "fp16")

    def preprocess(self, batch: dict) -> dict:
        if self.augment is not None:
            batch = images_to_device(batch, self.device)
            with torch.autocast(device_type=self.device.type, enabled=False):
                batch = dict(self.augment(batch))
        return preprocess_images(batch, self.device)

    def __call__(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.amp)
        with torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None):
            loss = _sum_loss(model, self.preprocess(batch), compiled=False)
        self.scaler.scale(loss).backward()
        return loss.detach()
