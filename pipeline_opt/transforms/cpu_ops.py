"""The CPU part's own step: :class:`ToUint8CHW`, the last op of a split's CPU part."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

__all__ = ["ToUint8CHW"]


class ToUint8CHW:
    """The CPU part's last step: a PIL image, HWC/HW uint8 array or uint8 tensor -> uint8 CHW tensor.

    A plain ``torch.Tensor`` comes out (not a ``tv_tensors.Image``), so ``default_collate`` stacks it
    into one uint8 batch. Floating-point input is refused: the GPU part expects 0..255 uint8.
    """

    def __call__(self, img: Any) -> torch.Tensor:
        if isinstance(img, torch.Tensor):
            if img.dtype != torch.uint8:
                raise TypeError(f"ToUint8CHW got a {img.dtype} tensor; the CPU part must end in uint8 "
                                "(split_transforms assumed the transforms before it keep a PIL / uint8 image)")
            out = img.as_subclass(torch.Tensor)
            return out.unsqueeze(0) if out.dim() == 2 else out
        if isinstance(img, np.ndarray):
            if img.dtype != np.uint8:
                raise TypeError(f"ToUint8CHW got a {img.dtype} array; expected uint8 HWC or HW")
            arr = img[:, :, None] if img.ndim == 2 else img
            return torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1).contiguous()
        if isinstance(img, Image.Image):
            return TF.pil_to_tensor(img)
        raise TypeError(f"ToUint8CHW expects a PIL image, a uint8 numpy array or a uint8 tensor, "
                        f"got {type(img).__name__}")

    def __repr__(self) -> str:
        return "ToUint8CHW()"
