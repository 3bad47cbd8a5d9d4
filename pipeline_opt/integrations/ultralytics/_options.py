"""What :func:`~pipeline_opt.integrations.ultralytics.attach` does: :class:`AttachOptions`, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline_opt.integrations.ultralytics._decide import check_gpu_augment
from pipeline_opt.profile.main_profiler import DEFAULT_TRACE_STEPS

__all__ = ["AttachOptions"]


@dataclass(frozen=True)
class AttachOptions:
    """What :func:`attach` does; validated on construction."""

    profile: bool = True
    tune: bool = True
    gpu_augment: bool | str = True  # True: measured, kept only if faster; "force": always on
    gpu_affine: bool | str = False  # True: measured after the colour/flip was kept; "force": always with it
    shared_slots: bool | str = False  # True: a tuning candidate (CUDA); "force": the train loader always uses them
    output_dir: str | None = None
    tune_budget_s: float = 60.0
    steps: int = 30
    warmup: int = 5
    trace_steps: int = DEFAULT_TRACE_STEPS  # torch.profiler steps after the measured window (0: none)
    workers: int | None = None
    retune_epoch: int | None = None
    sync: bool = True
    tune_kwargs: dict[str, Any] | None = None  # extra keyword arguments for pipeline_opt.autotune
    augment_kwargs: dict[str, Any] | None = None  # extra keyword arguments for decide_gpu_augment

    def __post_init__(self) -> None:
        check_gpu_augment(self.gpu_augment)
        check_gpu_augment(self.gpu_affine, name="gpu_affine")
        check_gpu_augment(self.shared_slots, name="shared_slots")
        for name in ("profile", "tune", "sync"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.gpu_affine and not self.gpu_augment:
            raise ValueError(f"gpu_affine={self.gpu_affine!r} needs gpu_augment=True (the affine runs in the GPU "
                             "augmentation)")
        if not isinstance(self.tune_budget_s, (int, float)) or self.tune_budget_s <= 0:
            raise ValueError(f"tune_budget_s={self.tune_budget_s!r} must be a positive number of seconds")
        for name, low in (("steps", 1), ("warmup", 0), ("trace_steps", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        for name in ("workers", "retune_epoch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}={value!r} must be None or an integer >= 0")
        if self.tune_kwargs is not None and not isinstance(self.tune_kwargs, dict):
            raise TypeError(f"tune_kwargs must be a dict of pipeline_opt.autotune arguments, got "
                            f"{type(self.tune_kwargs).__name__}")
        if self.augment_kwargs is not None and not isinstance(self.augment_kwargs, dict):
            raise TypeError(f"augment_kwargs must be a dict of decide_gpu_augment arguments, got "
                            f"{type(self.augment_kwargs).__name__}")
        if self.retune_epoch is not None and not self.tune:
            raise ValueError(f"retune_epoch={self.retune_epoch} needs tune=True")
