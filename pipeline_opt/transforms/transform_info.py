"""The shape of what the library knows about one transform class (:class:`TransformInfo`).

The entries themselves are in :mod:`pipeline_opt.transforms.registry` (torchvision's classes and the
project's own) and in the integrations (their frameworks' classes); this module holds only the
vocabulary they share, so that the entries' builders and the registry import nothing of each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["BOUNDARY", "COSTS", "DEVICE_PATHS", "DOMAINS", "SIZES", "ReplaySpec", "TransformInfo",
           "UnsupportedTransform"]

DOMAINS = ("pil", "uint8", "float")  # what an image is before an op: PIL image, uint8 tensor, float tensor
SIZES = ("same", "fixed", "resize", "rotation")  # how an op changes sizes (None: unknown)
COSTS = ("convert", "normalize", "resize", "crop", "flip", "colour", "blur", "geometry", "erase", "policy",
         "noise", "other")  # what an op spends its CPU time on
DEVICE_PATHS = ("batch", "replay", "kornia", "attach")  # how it runs on the device (None: it stays)
BOUNDARY = "boundary"  # to_device's answer for a conversion to uint8 that ends the CPU part


class UnsupportedTransform(ValueError):
    """A transform cannot be moved or replayed the way it was asked to; the message names it and why."""


class ReplaySpec(NamedTuple):
    """How one transform is replayed on an image of a given domain: the replay ``kind`` (the key of
    its sampler and of its device module), the static ``options`` the device side needs, and the
    domain of the image after it."""

    kind: str
    options: dict[str, Any]
    domain_after: str


@dataclass(frozen=True)
class TransformInfo:
    """One transform class as every part of the library sees it.

    * ``op``: what it does (``resize``, ``center_crop``, ``to_tensor``, ``to_uint8``, ``convert_dtype``,
      ``normalize``, ``resized_crop``, ``crop``, ``hflip``, ``color_jitter``, ``erase``, ``policy``...).
    * ``cost``: what its CPU time is spent on (:data:`COSTS`): the diagnosis names ``resize`` work for
      Pillow-SIMD, and groups the rest by it.
    * ``random``: it draws random numbers.
    * ``size``: ``"same"`` (output size = input size), ``"fixed"`` (set by its parameters), ``"resize"``
      (fixed when given a (h, w) pair), ``"rotation"`` (same unless ``expand``), None (unknown).
    * ``device``: how it runs on the device (:data:`DEVICE_PATHS`): ``batch`` (moved bit for bit or
      within ``exactness`` by :func:`~pipeline_opt.transforms.split.split_transforms`), ``replay`` (same
      draws, :mod:`~pipeline_opt.transforms.replay`), ``kornia``
      (Kornia has it; not moved automatically), ``attach`` (an integration moves it); None: stays.
    * ``exactness``: of the device module against the CPU op (``bitwise`` / ``tolerance``), where one exists.
    * ``to_device(t, domain)``: the batch module reproducing ``t`` on an image of ``domain``,
      :data:`BOUNDARY` for a uint8 conversion, None when it cannot move there.
    * ``replay(t, domain)``: its :class:`ReplaySpec`; raises :class:`UnsupportedTransform` naming why not.
    * ``hint``: how a user moves it to the GPU (the diagnosis's advice), where ``device`` is set.
    * ``classes`` / ``class_paths``: the exact classes it describes, as objects or as
      ``"module.QualName"`` (an optional framework's classes, matched without importing it).
    """

    name: str
    origin: str  # "torchvision", "pipeline_opt", or an integration's framework
    op: str
    cost: str
    random: bool = False
    size: str | None = "same"
    device: str | None = None
    exactness: str | None = None
    to_device: Callable[[Any, str], Any] | None = None
    replay: Callable[[Any, str], ReplaySpec] | None = None
    hint: str = ""
    classes: tuple[type, ...] = field(default=(), compare=False)
    # classes named ``module.qualname`` instead, for a framework that is not imported to register them
    class_paths: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.cost not in COSTS:
            raise ValueError(f"{self.name}: cost={self.cost!r} must be one of {COSTS}")
        if self.size is not None and self.size not in SIZES:
            raise ValueError(f"{self.name}: size={self.size!r} must be one of {SIZES} or None")
        if self.device is not None and self.device not in DEVICE_PATHS:
            raise ValueError(f"{self.name}: device={self.device!r} must be one of {DEVICE_PATHS} or None")
        if self.device is not None and not self.hint:
            raise ValueError(f"{self.name}: device={self.device!r} needs a hint (how a user moves it to the GPU)")
        if self.exactness not in (None, "bitwise", "tolerance"):
            raise ValueError(f"{self.name}: exactness={self.exactness!r} must be 'bitwise', 'tolerance' or None")
