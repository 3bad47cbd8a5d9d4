"""timm's training recipe drawn in the worker exactly as its transforms draw: Python ``random`` and numpy.

``timm.data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)``
builds ``RandomResizedCropAndInterpolation`` (``random.uniform`` / ``random.randint``, the same
arguments as torchvision's v1 ``get_params``), torchvision's flip, timm's ``RandAugment`` (the ops
with ``np.random.choice``, then per op ``random.random`` against its probability, ``random.gauss``
for the magnitude, ``random.random`` for the sign), ``MaybeToTensor``, ``Normalize`` and timm's
``RandomErasing`` (``random`` for the box, ``torch.normal_`` for the 'rand' / 'pixel' values).

:func:`draw_timm_policy` and :func:`draw_timm_erase` make those calls, in that order, with the same
arguments, and return what the pixels need: per op slot ``(code, argument)`` with the code indexing
:data:`TIMM_OPS` and the argument the one timm passes to its Pillow operation (degrees, shear
factor, pixels, bits, threshold, addend, enhance factor); per erase box ``(top, left, h, w)`` and the
drawn values as patches. The Python, numpy and torch RNGs are left where the original leaves them.

Nothing here imports timm: the transforms are read through their attributes, and
:func:`check_timm_policy` refuses, by name, a timm whose ops no longer hold what is read here
(``name``, ``prob``, ``magnitude``, ``magnitude_std``, ``level_fn``, ``aug_fn``, ``kwargs``) or an
op whose function is not timm's own for its name.
"""

from __future__ import annotations

import math
import numbers
import random
import sys
from typing import Any

import numpy as np
import torch

from pipeline_opt.transforms.transform_info import UnsupportedTransform

__all__ = ["KERNEL_OF", "NO_OP", "TIMM_OPS", "check_timm_erase", "check_timm_policy", "draw_timm_erase", "draw_timm_policy",
           "timm_erase_width", "timm_policy_options", "timm_policy_slots"]

NO_OP = -1.0
# The Pillow operation each timm op name runs (its NAME_TO_OP), by what the device kernel does.
KERNEL_OF = {
    "AutoContrast": "AutoContrast", "Equalize": "Equalize", "Invert": "Invert", "Rotate": "Rotate",
    "Posterize": "Posterize", "PosterizeIncreasing": "Posterize", "PosterizeOriginal": "Posterize",
    "Solarize": "Solarize", "SolarizeIncreasing": "Solarize", "SolarizeAdd": "SolarizeAdd",
    "Color": "Color", "ColorIncreasing": "Color", "Contrast": "Contrast", "ContrastIncreasing": "Contrast",
    "Brightness": "Brightness", "BrightnessIncreasing": "Brightness", "Sharpness": "Sharpness",
    "SharpnessIncreasing": "Sharpness", "ShearX": "ShearX", "ShearY": "ShearY", "TranslateX": "TranslateX",
    "TranslateY": "TranslateY", "TranslateXRel": "TranslateX", "TranslateYRel": "TranslateY",
}
TIMM_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY")
GEOMETRIC = frozenset({"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"})
_CODE = {name: float(TIMM_OPS.index(kernel)) for name, kernel in KERNEL_OF.items()}
_OP_ATTRIBUTES = ("name", "prob", "magnitude", "magnitude_std", "magnitude_max", "level_fn", "aug_fn", "kwargs",
                  "hparams")
_PIL_NEAREST, _PIL_BILINEAR = 0, 2


def _module_of(t: Any) -> Any:
    module = sys.modules.get(type(t).__module__)
    if module is None:  # the object exists, so its module was imported; a pickled copy may not have it yet
        raise UnsupportedTransform(f"{type(t).__name__}: its module {type(t).__module__} is not loaded")
    return module


def _is_rand_augment(t: Any) -> bool:
    """timm's RandAugment holds ``ops`` (drawn with numpy); its AutoAugment holds ``policy`` (sub-policies)."""
    return hasattr(t, "ops") and not hasattr(t, "policy")


def _ops_of(t: Any) -> list[Any]:
    """The AugmentOps of a timm RandAugment (``ops``) or AutoAugment (``policy``: sub-policies)."""
    if _is_rand_augment(t):
        return list(t.ops)
    return [op for sub in t.policy for op in sub]


def check_timm_policy(t: Any) -> None:
    """Raise :class:`UnsupportedTransform` naming why timm's ``RandAugment`` / ``AutoAugment`` ``t`` is not replayed."""
    name = type(t).__name__
    need = ("ops", "num_layers", "choice_weights") if _is_rand_augment(t) else ("policy",)
    module = _module_of(t)
    missing = [a for a in need if not hasattr(t, a)]
    missing += [a for a in ("NAME_TO_OP", "LEVEL_TO_ARG", "_LEVEL_DENOM") if not hasattr(module, a)]
    if missing:
        raise UnsupportedTransform(f"timm's {name} has no {', '.join(missing)}: this timm moved what its draws are "
                                   "read from, so they cannot be reproduced; it stays on the CPU")
    for op in _ops_of(t):
        absent = [a for a in _OP_ATTRIBUTES if not hasattr(op, a)]
        if absent:
            raise UnsupportedTransform(f"timm's {type(op).__name__} has no {', '.join(absent)}: its draws cannot be "
                                       "reproduced; it stays on the CPU")
        if op.name not in KERNEL_OF:
            raise UnsupportedTransform(f"timm's {op.name} op is not replayed on the GPU (replayed: "
                                       f"{', '.join(sorted(KERNEL_OF))}); the pipeline stays on the CPU")
        if op.aug_fn is not module.NAME_TO_OP.get(op.name) or op.level_fn is not module.LEVEL_TO_ARG.get(op.name):
            raise UnsupportedTransform(f"timm's {op.name} op runs a function other than timm's own for that name; "
                                       "its pixels cannot be reproduced")


def timm_policy_slots(t: Any) -> int:
    """How many ops one sample of ``t`` can get: RandAugment's ``num_layers``, AutoAugment's longest sub-policy."""
    if _is_rand_augment(t):
        return int(t.num_layers)
    return max(len(sub) for sub in t.policy)


def timm_policy_options(t: Any) -> dict[str, Any]:
    """The interpolation and fill of ``t``'s geometric ops (one for all of them); raises naming what is not replayed."""
    geometric = [op for op in _ops_of(t) if KERNEL_OF[op.name] in GEOMETRIC]
    resamples = {_resample_key(op.kwargs.get("resample")) for op in geometric}
    fills = {_fill_key(op.kwargs.get("fillcolor")) for op in geometric}
    if len(resamples) > 1 or len(fills) > 1:
        raise UnsupportedTransform(f"timm's {type(t).__name__} mixes interpolations {sorted(map(str, resamples))} or "
                                   f"fills {sorted(fills)} across its ops; only one of each is replayed")
    resample = resamples.pop() if resamples else _PIL_BILINEAR
    if isinstance(resample, tuple):
        raise UnsupportedTransform(f"timm's {type(t).__name__} picks its interpolation at random per op "
                                   f"({', '.join(map(str, resample))}; create_transform(interpolation='random')): "
                                   "Pillow's bicubic is not reproduced on the GPU; give interpolation='bilinear'")
    if resample not in (_PIL_NEAREST, _PIL_BILINEAR):
        raise UnsupportedTransform(f"timm's {type(t).__name__} resamples with Pillow filter {resample}: only "
                                   "nearest (0) and bilinear (2) are replayed; give interpolation='bilinear'")
    fill = fills.pop() if fills else ()
    return {"interpolation": "nearest" if resample == _PIL_NEAREST else "bilinear",
            "fill": tuple(float(v) for v in fill) or None}


def _fill_key(fill: Any) -> tuple[float, ...]:
    """timm's ``fillcolor``: one level for every channel, or one per channel (None: black)."""
    if fill is None:
        return ()
    if isinstance(fill, numbers.Number):
        return (float(fill),)
    return tuple(float(v) for v in fill)


def _resample_key(resample: Any) -> Any:
    if isinstance(resample, (list, tuple)):
        return tuple(int(r) for r in resample)
    return _PIL_BILINEAR if resample is None else int(resample)


def _draw_op(op: Any, denominator: float, height: int, width: int) -> list[float]:
    """One AugmentOp's ``__call__`` draws: ``[code, argument]``, or ``[NO_OP, 0]`` where its probability draw failed."""
    if op.prob < 1.0 and random.random() > op.prob:
        return [NO_OP, 0.0]
    magnitude = op.magnitude
    if op.magnitude_std > 0:
        if op.magnitude_std == float("inf"):
            magnitude = random.uniform(0, magnitude)
        else:
            magnitude = random.gauss(magnitude, op.magnitude_std)
    magnitude = max(0.0, min(magnitude, op.magnitude_max or denominator))
    args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()
    value = float(args[0]) if args else 0.0
    if op.name == "TranslateXRel":  # timm: pixels = pct * img.size[0] (the width), at this point of the pipeline
        value *= width
    elif op.name == "TranslateYRel":
        value *= height
    return [_CODE[op.name], value]


def draw_timm_policy(t: Any, height: int, width: int) -> list[float]:
    """One sample's row for timm's RandAugment / AutoAugment ``t`` on a ``height x width`` image:
    ``(code, argument)`` per slot, drawn with exactly the ``np.random`` / ``random`` calls ``t(img)`` makes."""
    denominator = float(_module_of(t)._LEVEL_DENOM)
    if _is_rand_augment(t):
        chosen = np.random.choice(len(t.ops), t.num_layers, replace=t.choice_weights is None, p=t.choice_weights)
        ops = [t.ops[int(i)] for i in chosen]
        slots = int(t.num_layers)
    else:
        ops = list(random.choice(t.policy))
        slots = timm_policy_slots(t)
    row: list[float] = []
    for op in ops:
        row += _draw_op(op, denominator, int(height), int(width))
    return row + [NO_OP, 0.0] * (slots - len(ops))


# ------------------------------------------------------------------------------------------- erasing

_ERASE_ATTRIBUTES = ("probability", "min_area", "max_area", "log_aspect_ratio", "min_count", "max_count", "mode",
                     "per_pixel", "rand_color", "device")


def check_timm_erase(t: Any) -> None:
    """Raise :class:`UnsupportedTransform` naming why timm's ``RandomErasing`` ``t`` is not replayed."""
    missing = [a for a in _ERASE_ATTRIBUTES if not hasattr(t, a)]
    if missing:
        raise UnsupportedTransform(f"timm's RandomErasing has no {', '.join(missing)}: its draws cannot be "
                                   "reproduced; it stays on the CPU")
    if str(t.device) != "cpu":
        raise UnsupportedTransform(f"timm's RandomErasing(device={t.device!r}) in a per-sample Compose draws its "
                                   "values on that device; give device='cpu' (create_transform does)")


def timm_erase_width(t: Any) -> int:
    """Row width: the box count, then ``(top, left, h, w)`` per box."""
    return 1 + 4 * int(t.max_count)


def draw_timm_erase(t: Any, channels: int, height: int, width: int, patches: list[torch.Tensor]) -> list[float]:
    """One sample's row for timm's RandomErasing ``t`` (its ``_erase`` draws, in order); the 'rand' /
    'pixel' values drawn with ``normal_`` are appended to ``patches``, one per box written."""
    slots = int(t.max_count)
    if random.random() > t.probability:
        return [0.0] + [0.0] * (4 * slots)
    area = height * width
    count = t.min_count if t.min_count == t.max_count else random.randint(t.min_count, t.max_count)
    boxes: list[float] = []
    for _ in range(count):
        for _attempt in range(10):
            target_area = random.uniform(t.min_area, t.max_area) * area / count
            aspect_ratio = math.exp(random.uniform(*t.log_aspect_ratio))
            h = int(round(math.sqrt(target_area * aspect_ratio)))
            w = int(round(math.sqrt(target_area / aspect_ratio)))
            if w < width and h < height:
                top = random.randint(0, height - h)
                left = random.randint(0, width - w)
                if t.per_pixel:
                    patches.append(torch.empty((channels, h, w), dtype=torch.float32).normal_())
                elif t.rand_color:
                    patches.append(torch.empty((channels, 1, 1), dtype=torch.float32).normal_())
                boxes += [float(top), float(left), float(h), float(w)]
                break
    written = len(boxes) // 4
    return [float(written)] + boxes + [0.0] * (4 * (slots - written))
