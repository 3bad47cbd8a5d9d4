"""The device side of timm's recipe: its auto-augment ops and its random erasing, fed the workers' draws.

:class:`ReplayTimmAugment` applies timm's ``RandAugment`` / ``AutoAugment`` slot by slot, the samples
that drew one op together, in Pillow's arithmetic (timm's ops are Pillow's:
:func:`~pipeline_opt.transforms.policy_kernels.apply_timm_op`). :class:`ReplayTimmErasing` writes
timm's erase boxes: zeros ('const'), or the per-box / per-pixel normal values the worker drew
('rand' / 'pixel'). Both register their replay kinds with :mod:`~.replay_ops` on import (through
:mod:`~.random_gpu`, where Kornia loads).
"""

from __future__ import annotations

from typing import Any

import torch
from kornia.augmentation import IntensityAugmentationBase2D

from pipeline_opt.transforms import replay_kernels as K
from pipeline_opt.transforms.policy_kernels import apply_timm_op
from pipeline_opt.transforms.replay import ReplayStep
from pipeline_opt.transforms.replay_ops import ReplayAugment, apply_slot, register_replay_module
from pipeline_opt.transforms.timm_draws import TIMM_OPS

__all__ = ["ReplayTimmAugment", "ReplayTimmErasing"]


class ReplayTimmAugment(ReplayAugment, IntensityAugmentationBase2D):
    """timm's ``RandAugment`` / ``AutoAugment`` with the workers' draws, on PIL-flavour levels."""

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("timm_augment",))
        self.slots = int(step.options["slots"])

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"codes": rows[:, 0::2].to(torch.long), "values": rows[:, 1::2].clone()}

    def _apply(self, code: int, x: torch.Tensor, values: list[float]) -> torch.Tensor:
        o = self.step.options
        return apply_timm_op(TIMM_OPS[code], x, values, o["interpolation"], o["fill"])

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        codes, values = params["codes"].cpu(), params["values"].cpu()
        x = input
        for slot in range(self.slots):
            x = apply_slot(x, codes[:, slot], values[:, slot], self._apply)
        return x


class ReplayTimmErasing(ReplayAugment, IntensityAugmentationBase2D):
    """timm's ``RandomErasing`` with the workers' boxes (and, for 'rand' / 'pixel', their drawn values)."""

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("timm_erase",))
        self.boxes = int(step.options["boxes"])
        self.mode = step.options["mode"]

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        out = {"count": rows[:, 0].to(torch.long), "box": rows[:, 1:].reshape(rows.shape[0], self.boxes, 4).long()}
        if self.mode != "const":
            out["patches"] = list(patches) if patches is not None else [[] for _ in range(rows.shape[0])]
        return out

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        count, boxes = params["count"].cpu(), params["box"].cpu()
        x = input
        if self.mode == "const":
            zero = torch.zeros(1, dtype=x.dtype)
            for i in range(self.boxes):
                if bool((count > i).any()):
                    x = K.erase_constant(x, boxes[:, i], count > i, zero)
            return x
        chosen = [(b, i) for b in range(x.shape[0]) for i in range(int(count[b]))]
        short = sorted({b for b, i in chosen if len(params["patches"][b]) <= i})
        if short:
            raise ValueError(f"ReplayTimmErasing(mode={self.mode!r}) needs the drawn values of samples {short}; "
                             "pass patches= to replay_params (RandomGpuPipeline does)")
        return K.erase_patches(x, [tuple(boxes[b, i].tolist()) for b, i in chosen], [b for b, _ in chosen],
                               [params["patches"][b][i] for b, i in chosen])


register_replay_module("timm_augment", ReplayTimmAugment)
register_replay_module("timm_erase", ReplayTimmErasing)
