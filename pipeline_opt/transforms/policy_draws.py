"""The draws of torchvision's auto-augment policies, made in the worker as their ``forward`` makes them.

``AutoAugment``, ``RandAugment`` and ``TrivialAugmentWide`` (v1 and v2 classes) pick an operation, a
magnitude and a sign with the torch RNG inside ``forward``, in a fixed order. :func:`draw_policy`
makes exactly those calls, in that order, with the same arguments (v1 and v2 differ: v1 draws the
sign with ``torch.randint(2, (1,))``, v2 with ``torch.rand(()) <= 0.5``), on the image size the
policy would see, and returns the chosen operations as a parameter row; the torch RNG is left in
the state the original leaves it in. The pixels are made on the device from that row
(:mod:`pipeline_opt.transforms.policy_kernels`).

``AugMix`` (v1 and v2) is drawn the same way: its two Dirichlet draws (the original's weight and
the chains' weights, through the transform's own ``_sample_dirichlet``), then per chain its depth
and its operations (:func:`draw_augmix`; the row is ``[m0, w_1..w_K]`` then ``3`` slots per chain).

Row layout: ``slots`` pairs ``(op code, magnitude)``; the code indexes :data:`OPS` (``-1``: no
operation in that slot, an AutoAugment sub-policy step whose probability draw failed). The
magnitude is the one the original passes to its operation, except Solarize's, which is always the
threshold in levels (v2 multiplies its [0, 1] magnitude by 255 for uint8 and PIL images).

The magnitude tables are the transforms' own (``_augmentation_space`` in v1, ``_AUGMENTATION_SPACE``
in v2, v2 AutoAugment's ``_policies``): read here and nowhere else, and checked by
:func:`check_policy` so a torchvision that renamed them is refused with the name that moved.
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

from pipeline_opt.transforms.transform_info import UnsupportedTransform

__all__ = ["AUGMIX_DEPTH", "NO_OP", "OPS", "augmix_width", "check_policy", "draw_augmix", "draw_policy",
           "policy_slots"]

OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
NO_OP = -1.0
_CODE = {name: float(i) for i, name in enumerate(OPS)}
AUGMIX_DEPTH = 3  # the most operations of one AugMix chain (chain_depth=-1 draws 1 to 3)
_POLICY_CLASSES = (T1.AutoAugment, T1.RandAugment, T1.TrivialAugmentWide, T1.AugMix,
                   T2.AutoAugment, T2.RandAugment, T2.TrivialAugmentWide, T2.AugMix)
# the torchvision attributes each class's draws read (its magnitude tables; v2 AutoAugment's policies)
_INTERNALS = {T1.AutoAugment: ("policies", "_augmentation_space"), T1.RandAugment: ("_augmentation_space",),
              T1.TrivialAugmentWide: ("_augmentation_space",), T2.AutoAugment: ("_policies", "_AUGMENTATION_SPACE"),
              T2.RandAugment: ("_AUGMENTATION_SPACE",), T2.TrivialAugmentWide: ("_AUGMENTATION_SPACE",),
              T1.AugMix: ("_augmentation_space", "_sample_dirichlet"),
              T2.AugMix: ("_AUGMENTATION_SPACE", "_PARTIAL_AUGMENTATION_SPACE", "_sample_dirichlet")}


def check_policy(t: Any) -> None:
    """Raise :class:`UnsupportedTransform` unless ``t`` is a policy whose draws this module reproduces."""
    cls = type(t)
    if cls not in _INTERNALS:
        raise UnsupportedTransform(f"{cls.__name__} is not a torchvision policy whose draws are replayed "
                                   f"(replayed: {', '.join(sorted({c.__name__ for c in _POLICY_CLASSES}))})")
    missing = [name for name in _INTERNALS[cls] if not hasattr(t, name)]
    if missing:
        raise UnsupportedTransform(f"{cls.__name__} of torchvision {torchvision.__version__} has no "
                                   f"{', '.join(missing)}: its magnitude tables moved, so its draws cannot be "
                                   "reproduced; it stays on the CPU")


def policy_slots(t: Any) -> int:
    """How many operations one sample of ``t`` can get (the row holds two numbers per slot)."""
    if isinstance(t, (T1.AutoAugment, T2.AutoAugment)):
        return 2
    if isinstance(t, (T1.RandAugment, T2.RandAugment)):
        return int(t.num_ops)
    return 1


def _space_v1(t: Any, num_bins: int, height: int, width: int) -> dict[str, tuple[torch.Tensor | None, bool]]:
    if isinstance(t, T1.TrivialAugmentWide):
        space = t._augmentation_space(num_bins)
    else:
        space = t._augmentation_space(num_bins, (height, width))
    return {op: (m if m.ndim > 0 else None, signed) for op, (m, signed) in space.items()}


def augmix_width(t: Any) -> int:
    """Row width of AugMix ``t``: the original's weight, one weight per chain, 3 op slots per chain."""
    k = int(t.mixture_width)
    depth = int(t.chain_depth) if t.chain_depth > 0 else AUGMIX_DEPTH
    return 1 + k + 2 * depth * k


def draw_augmix(t: Any, height: int, width: int) -> list[float]:
    """One sample's row for AugMix ``t``: ``[m0, w_1..w_K]`` then, per chain, ``(code, magnitude)`` per slot
    (:data:`NO_OP` past the chain's depth), drawn with the torch RNG calls ``t.forward`` makes."""
    v2 = isinstance(t, T2.Transform)
    k = int(t.mixture_width)
    m = t._sample_dirichlet(torch.tensor([t.alpha, t.alpha]).expand(1, -1))
    weights = t._sample_dirichlet(torch.tensor([t.alpha] * k).expand(1, -1)) * m[:, 1].reshape([1, -1])
    if v2:
        space_v2 = t._AUGMENTATION_SPACE if t.all_ops else t._PARTIAL_AUGMENTATION_SPACE
    else:
        space_v1 = _space_v1(t, t._PARAMETER_MAX, height, width)
    slots = int(t.chain_depth) if t.chain_depth > 0 else AUGMIX_DEPTH
    row = [float(m[0, 0])] + [float(v) for v in weights[0].tolist()]
    for _ in range(k):
        depth = t.chain_depth if t.chain_depth > 0 else int(torch.randint(low=1, high=4, size=(1,)).item())
        chain: list[float] = []
        for _ in range(depth):
            if v2:
                op = _random_key_v2(space_v2)
                fn, signed = space_v2[op]
                magnitudes = fn(t._PARAMETER_MAX, height, width)
                index = int(torch.randint(t.severity, ())) if magnitudes is not None else None
                magnitude = _magnitude_v2(magnitudes, index, signed)
            else:
                op = list(space_v1)[int(torch.randint(len(space_v1), (1,)).item())]
                magnitudes, signed = space_v1[op]
                magnitude = 0.0
                if magnitudes is not None:
                    magnitude = float(magnitudes[torch.randint(t.severity, (1,), dtype=torch.long)].item())
                if signed and torch.randint(2, (1,)):
                    magnitude *= -1.0
            chain += [_CODE[op], _solarize_levels(op, magnitude, v2)]
        row += chain + [NO_OP, 0.0] * (slots - depth)
    return row


def _solarize_levels(op: str, magnitude: float, v2: bool) -> float:
    return magnitude * 255.0 if op == "Solarize" and v2 else magnitude


def _draw_trivial_v1(t: Any, h: int, w: int) -> list[tuple[str, float]]:
    space = _space_v1(t, t.num_magnitude_bins, h, w)
    op = list(space)[int(torch.randint(len(space), (1,)).item())]
    magnitudes, signed = space[op]
    magnitude = 0.0
    if magnitudes is not None:
        magnitude = float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long)].item())
    if signed and torch.randint(2, (1,)):
        magnitude *= -1.0
    return [(op, magnitude)]


def _draw_rand_v1(t: Any, h: int, w: int) -> list[tuple[str, float]]:
    space = _space_v1(t, t.num_magnitude_bins, h, w)
    chosen = []
    for _ in range(t.num_ops):
        op = list(space)[int(torch.randint(len(space), (1,)).item())]
        magnitudes, signed = space[op]
        magnitude = float(magnitudes[t.magnitude].item()) if magnitudes is not None else 0.0
        if signed and torch.randint(2, (1,)):
            magnitude *= -1.0
        chosen.append((op, magnitude))
    return chosen


def _draw_auto_v1(t: Any, h: int, w: int) -> list[tuple[str, float] | None]:
    policy_id, probs, signs = t.get_params(len(t.policies))
    space = _space_v1(t, 10, h, w)
    chosen: list[tuple[str, float] | None] = []
    for i, (op, p, magnitude_id) in enumerate(t.policies[policy_id]):
        if not probs[i] <= p:
            chosen.append(None)
            continue
        magnitudes, signed = space[op]
        magnitude = float(magnitudes[magnitude_id].item()) if magnitude_id is not None else 0.0
        if signed and signs[i] == 0:
            magnitude *= -1.0
        chosen.append((op, magnitude))
    return chosen


def _magnitude_v2(magnitudes: torch.Tensor | None, index: int | None, signed: bool) -> float:
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[index])
    if signed and torch.rand(()) <= 0.5:
        magnitude *= -1
    return magnitude


def _random_key_v2(space: dict) -> str:
    keys = tuple(space)
    return keys[int(torch.randint(len(keys), ()))]


def _draw_trivial_v2(t: Any, h: int, w: int) -> list[tuple[str, float]]:
    op = _random_key_v2(t._AUGMENTATION_SPACE)
    fn, signed = t._AUGMENTATION_SPACE[op]
    magnitudes = fn(t.num_magnitude_bins, h, w)
    index = int(torch.randint(t.num_magnitude_bins, ())) if magnitudes is not None else None
    return [(op, _magnitude_v2(magnitudes, index, signed))]


def _draw_rand_v2(t: Any, h: int, w: int) -> list[tuple[str, float]]:
    chosen = []
    for _ in range(t.num_ops):
        op = _random_key_v2(t._AUGMENTATION_SPACE)
        fn, signed = t._AUGMENTATION_SPACE[op]
        chosen.append((op, _magnitude_v2(fn(t.num_magnitude_bins, h, w), t.magnitude, signed)))
    return chosen


def _draw_auto_v2(t: Any, h: int, w: int) -> list[tuple[str, float] | None]:
    policy = t._policies[int(torch.randint(len(t._policies), ()))]
    chosen: list[tuple[str, float] | None] = []
    for op, probability, magnitude_idx in policy:
        if not torch.rand(()) <= probability:
            chosen.append(None)
            continue
        fn, signed = t._AUGMENTATION_SPACE[op]
        chosen.append((op, _magnitude_v2(fn(10, h, w), magnitude_idx, signed)))
    return chosen


_DRAWS = {T1.TrivialAugmentWide: _draw_trivial_v1, T1.RandAugment: _draw_rand_v1, T1.AutoAugment: _draw_auto_v1,
          T2.TrivialAugmentWide: _draw_trivial_v2, T2.RandAugment: _draw_rand_v2, T2.AutoAugment: _draw_auto_v2}


def draw_policy(t: Any, height: int, width: int) -> list[float]:
    """One sample's row for policy ``t`` on an image of ``height x width``: ``(code, magnitude)`` per
    slot, drawn with exactly the torch RNG calls ``t.forward`` makes."""
    v2 = isinstance(t, T2.Transform)
    row: list[float] = []
    for choice in _DRAWS[type(t)](t, int(height), int(width)):
        if choice is None:
            row += [NO_OP, 0.0]
        else:
            op, magnitude = choice
            row += [_CODE[op], _solarize_levels(op, magnitude, v2)]
    return row
