"""What the library knows about each transform class: one entry per class, asked by every part.

Each supported class is registered once, as a :class:`~.transform_info.TransformInfo`: what it does,
what it costs on the CPU, what it does to image sizes, how it runs on the device and how exactly, and
the two builders the device paths use (the batch module for :func:`~.split.split_transforms`, the
:class:`~.transform_info.ReplaySpec` for :mod:`~.replay`). The Compose split, the tuner's offload and
exactness, the GPU decode plan, draft decoding, the diagnosis and the replay all ask here; none of them
names a transform class.

Lookups are by exact class (:func:`info_of`): a subclass may override ``forward``, so it is unknown —
kept on the CPU, of unknown size — until it is registered itself. The worker profiler records class
names only, so :func:`infos_named` answers by name. torchvision's v1 and v2 classes and the project's
own are registered below; an integration registers its framework's classes with :func:`register`
(name-only entries, ``classes=()``, are found by name alone).

An optional framework's classes are registered by ``"module.QualName"`` (``class_paths``), so the
framework is never imported for it: timm's recipe is :mod:`~pipeline_opt.transforms.timm_recipe`.

Adding a transform: one :func:`register` call (or one line of :data:`_ENTRIES`) and its test.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torchvision.transforms import InterpolationMode

from pipeline_opt.transforms import gpu
from pipeline_opt.transforms.cpu_ops import ToUint8CHW
from pipeline_opt.transforms.policy_draws import augmix_width, check_policy, policy_slots
from pipeline_opt.transforms.transform_info import BOUNDARY, ReplaySpec, TransformInfo, UnsupportedTransform

__all__ = ["BOUNDARY", "DEVICE_HINTS", "ReplaySpec", "TransformInfo", "UnsupportedTransform", "device_exactness",
           "domain_after", "equal_sizes_after", "info_of", "infos_named", "register", "registered"]

# How a user moves a transform of each device path to the GPU (the diagnosis's advice).
DEVICE_HINTS = {
    "batch": "cpu, gpu = po.transforms.split_transforms(compose); po.DeviceLoader(loader, transform=gpu) "
             "(and ship uint8)",
    "replay": "po.autotune(loader, model) replays it on the GPU with the same draws "
              "(po.transforms.split_random_transforms(compose) by hand)",
    "kornia": "its kornia.augmentation counterpart on the batch (its own draws)",
}

_BY_CLASS: dict[type, TransformInfo] = {}
_BY_PATH: dict[str, TransformInfo] = {}
_BY_NAME: dict[str, list[TransformInfo]] = {}


def register(info: TransformInfo) -> TransformInfo:
    """Add ``info`` for each of its ``classes`` (and under its name); a class registered twice is refused."""
    for cls in info.classes:
        if cls in _BY_CLASS:
            raise ValueError(f"{cls.__module__}.{cls.__qualname__} is registered already "
                             f"(as {_BY_CLASS[cls].name} from {_BY_CLASS[cls].origin})")
    for path in info.class_paths:
        if path in _BY_PATH:
            raise ValueError(f"{path} is registered already (as {_BY_PATH[path].name} from {_BY_PATH[path].origin})")
    for cls in info.classes:
        _BY_CLASS[cls] = info
    for path in info.class_paths:
        _BY_PATH[path] = info
    named = _BY_NAME.setdefault(info.name, [])
    if info not in named:
        named.append(info)
    return info


def info_of(transform: Any) -> TransformInfo | None:
    """The entry of ``transform``'s exact class, or None (unknown: it stays where it is)."""
    cls = type(transform)
    found = _BY_CLASS.get(cls)
    return found if found is not None else _BY_PATH.get(f"{cls.__module__}.{cls.__qualname__}")


def infos_named(name: str, origin: str | None = None) -> tuple[TransformInfo, ...]:
    """The entries registered under a class name (``Resize#2`` reads as ``Resize``), of ``origin`` if given."""
    found = _BY_NAME.get(name.split("#", 1)[0], ())
    return tuple(i for i in found if origin is None or i.origin == origin)


def registered() -> tuple[TransformInfo, ...]:
    """Every entry, in registration order."""
    return tuple(i for infos in _BY_NAME.values() for i in infos)


def domain_after(transform: Any, domain: str) -> str:
    """The domain (``pil`` / ``uint8`` / ``float``) of an image after ``transform`` ran on the CPU;
    unknown transforms are assumed to keep it (the split then checks the tail it moves starts in uint8)."""
    info = info_of(transform)
    op = info.op if info is not None else ""
    if op in ("to_uint8", "to_pure_tensor"):
        return "uint8"
    if op == "to_tensor":
        return "float"
    if op == "convert_dtype" and isinstance(transform.dtype, torch.dtype):
        return "float" if transform.dtype.is_floating_point else "uint8"
    if op == "to_pil":
        return "pil"
    return domain


def equal_sizes_after(transform: Any, equal: bool) -> bool:
    """Whether every image has one size after ``transform`` (``equal``: they had before it)."""
    info = info_of(transform)
    size = info.size if info is not None else None
    if size == "same":
        return equal
    if size == "fixed":
        return True
    if size == "resize":
        return equal or _resize_pair(transform) is not None
    if size == "rotation":
        return equal and not getattr(transform, "expand", True)
    return False


def device_exactness(module_name: str) -> str | None:
    """``bitwise`` / ``tolerance`` of the project's device module called ``module_name`` (the names a
    tuned configuration lists under ``gpu_transforms``); None for a name that is not one."""
    for info in infos_named(module_name, origin="pipeline_opt"):
        if info.exactness is not None:
            return info.exactness
    return None


# ---------------------------------------------------------------------------------- shared readers

def is_bilinear(transform: Any) -> bool:
    """Whether a resizing transform's ``interpolation`` is bilinear (enum, string or PIL's code 2)."""
    mode = transform.interpolation
    if isinstance(mode, str):
        return mode.lower() == "bilinear"
    try:
        return InterpolationMode(mode) == InterpolationMode.BILINEAR
    except ValueError:
        return mode in (2, InterpolationMode.BILINEAR)


def pair(size: Any) -> tuple[int, int]:
    """``size`` (an int, or 1 or 2 values) as ``(h, w)``."""
    if isinstance(size, numbers.Integral):
        return int(size), int(size)
    size = list(size)
    return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))


def resize_size(transform: Any) -> int | tuple[int, int] | None:
    """A Resize's ``size`` as torchvision reads it: None, the shorter side (int) or ``(h, w)``."""
    size = transform.size
    if size is None or isinstance(size, numbers.Integral):
        return size
    size = list(size)
    return int(size[0]) if len(size) == 1 else (int(size[0]), int(size[1]))


def _resize_pair(transform: Any) -> tuple[int, int] | None:
    size = resize_size(transform)
    return size if isinstance(size, tuple) else None


def _fill_values(t: Any) -> tuple[float, ...]:
    fill = t.fill
    if isinstance(fill, dict):
        raise UnsupportedTransform(f"{type(t).__name__}(fill={fill!r}): a per-type fill dict is not replayed; "
                                   "give one number or one value per channel")
    if fill is None:
        return (0.0,)
    if isinstance(fill, numbers.Number):
        return (float(fill),)
    return tuple(float(v) for v in fill)


def _dtype_of(t: Any) -> Any:
    dtype = t.dtype
    return dtype.get(torch.Tensor, dtype.get("others")) if isinstance(dtype, dict) else dtype


# ----------------------------------------------------------------------- batch modules (split_transforms)

def batch_to_tensor(t: Any, domain: str) -> Any:
    return gpu.ToFloat() if domain == "pil" else None


def batch_to_uint8(t: Any, domain: str) -> Any:
    return BOUNDARY if domain in ("pil", "uint8") else None


def _batch_convert_v1(t: Any, domain: str) -> Any:  # v1 divides by 255, like ToFloat
    if domain == "pil":
        return None
    if domain == "uint8" and t.dtype.is_floating_point:
        return gpu.ToFloat(t.dtype)
    return gpu.ConvertDtype(t.dtype, scale=True)


def _batch_convert_v2(t: Any, domain: str) -> Any:
    return gpu.ConvertDtype(t.dtype, scale=True) if domain != "pil" else None


def _batch_to_dtype(t: Any, domain: str) -> Any:  # v2 multiplies by 1/255: ConvertDtype calls the same kernel
    if not isinstance(t.dtype, torch.dtype) or domain == "pil":
        return None
    return gpu.ConvertDtype(t.dtype, scale=bool(t.scale))


def _batch_normalize(t: Any, domain: str) -> Any:
    return gpu.Normalize(t.mean, t.std) if domain == "float" else None


def _batch_resize(t: Any, domain: str) -> Any:
    if not is_bilinear(t):
        return None
    # PIL resizes always antialias; tensors follow the flag (None means False, as in torchvision).
    antialias = True if domain == "pil" else t.antialias is not None and bool(t.antialias)
    return gpu.Resize(resize_size(t), antialias=antialias, max_size=t.max_size)


def _batch_center_crop(t: Any, domain: str) -> Any:
    return gpu.CenterCrop(tuple(t.size))


# ------------------------------------------------------------------------------ replay specs (replay)

def replay_resized_crop(t: Any, domain: str) -> ReplaySpec:
    if not is_bilinear(t):
        raise UnsupportedTransform(f"{type(t).__name__}(interpolation={t.interpolation}) is not replayed: only "
                                   "bilinear resizing is reproduced on the GPU (Pillow's bicubic differs from torch's)")
    antialias = True if domain == "pil" else bool(getattr(t, "antialias", True))
    return ReplaySpec("resized_crop", {"size": pair(t.size), "antialias": antialias}, domain)


def _replay_crop(t: Any, domain: str) -> ReplaySpec:
    mode = t.padding_mode
    if mode not in ("constant", "edge", "reflect", "symmetric"):
        raise UnsupportedTransform(f"{type(t).__name__}(padding_mode={mode!r}) is not replayed")
    return ReplaySpec("crop", {"size": pair(t.size), "fill": _fill_values(t), "padding_mode": mode}, domain)


def _replay_center_crop(t: Any, domain: str) -> ReplaySpec:
    return ReplaySpec("center_crop", {"size": pair(t.size)}, domain)


def _replay_resize(t: Any, domain: str) -> ReplaySpec:
    if not is_bilinear(t):
        raise UnsupportedTransform(f"{type(t).__name__}(interpolation={t.interpolation}) is not replayed: "
                                   "only bilinear")
    size = t.size if t.size is None or isinstance(t.size, numbers.Integral) else list(t.size)
    antialias = True if domain == "pil" else t.antialias is not None and bool(t.antialias)
    return ReplaySpec("resize", {"size": size, "max_size": t.max_size, "antialias": antialias}, domain)


def _replay_flip(kind: str):
    def spec(t: Any, domain: str) -> ReplaySpec:
        return ReplaySpec(kind, {"p": float(t.p)}, domain)
    return spec


def _replay_color_jitter(t: Any, domain: str) -> ReplaySpec:
    ranges = {k: getattr(t, k) for k in ("brightness", "contrast", "saturation", "hue")}
    return ReplaySpec("color_jitter", {"ranges": ranges}, domain)


def _replay_random_grayscale(t: Any, domain: str) -> ReplaySpec:
    return ReplaySpec("random_grayscale", {"p": float(t.p)}, domain)


def _replay_grayscale(t: Any, domain: str) -> ReplaySpec:
    if t.num_output_channels != 3:
        raise UnsupportedTransform(f"{type(t).__name__}(num_output_channels={t.num_output_channels}) is not "
                                   "replayed: only 3-channel grayscale keeps the batch RGB; use num_output_channels=3")
    return ReplaySpec("grayscale", {}, domain)


def replay_to_uint8(t: Any, domain: str) -> ReplaySpec:
    if domain == "float":
        raise UnsupportedTransform(f"{type(t).__name__} after a float conversion is not replayed")
    return ReplaySpec("to_uint8", {}, "uint8")


def replay_to_tensor(t: Any, domain: str) -> ReplaySpec:
    if domain == "float":
        raise UnsupportedTransform(f"{type(t).__name__} on a float tensor is not replayed")
    return ReplaySpec("to_float", {"module": gpu.ToFloat()}, "float")


def _replay_convert(module: Any):
    def spec(t: Any, domain: str) -> ReplaySpec:
        dtype, scale = _dtype_of(t), getattr(t, "scale", True)
        if domain != "uint8" or dtype != torch.float32 or not scale:
            raise UnsupportedTransform(f"{type(t).__name__}(dtype={dtype}, scale={scale}) on a {domain} image is "
                                       "not replayed; only uint8 -> float32 with scaling to [0, 1] is")
        return ReplaySpec("to_float", {"module": module()}, "float")
    return spec


def _replay_normalize(t: Any, domain: str) -> ReplaySpec:
    if domain != "float":
        raise UnsupportedTransform(f"{type(t).__name__} on a {domain} image is not replayed "
                                   "(torchvision needs a float tensor)")
    return ReplaySpec("normalize", {"module": gpu.Normalize(t.mean, t.std)}, domain)


def _replay_erase(t: Any, domain: str) -> ReplaySpec:
    if domain != "float":
        raise UnsupportedTransform(f"{type(t).__name__} on a {domain} image is not replayed; "
                                   "erase after ToTensor / ToDtype")
    value = t.value
    if not isinstance(t, T2.Transform):  # v1: "random" (a string), one number or one per channel
        value = None if isinstance(value, str) else ([float(value)] if isinstance(value, numbers.Number)
                                                    else [float(v) for v in value])
    return ReplaySpec("erase", {"p": float(t.p), "value": None if value is None else tuple(value)}, domain)


def _policy_options(t: Any, domain: str) -> dict[str, Any]:
    """The interpolation and fill a policy's device ops need; raises naming what is not replayed."""
    check_policy(t)
    name = type(t).__name__
    if domain == "float":
        raise UnsupportedTransform(f"{name} on a float tensor is not replayed (torchvision's policies run on PIL "
                                   "images or uint8 tensors)")
    mode = InterpolationMode(t.interpolation) if isinstance(t.interpolation, str) else t.interpolation
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise UnsupportedTransform(f"{name}(interpolation={mode}) is not replayed: only nearest and bilinear")
    fill = t.fill
    if isinstance(fill, dict):
        raise UnsupportedTransform(f"{name}(fill={fill!r}): a fill per input type is not replayed; give one "
                                   "number or one per channel")
    if fill is not None:
        fill = (float(fill),) if isinstance(fill, numbers.Number) else tuple(float(v) for v in fill)
    return {"interpolation": mode.value, "fill": fill}


def _replay_policy(t: Any, domain: str) -> ReplaySpec:
    """AutoAugment / RandAugment / TrivialAugmentWide: their draws replayed (policy_draws), their ops
    on the device in Pillow's or torchvision's tensor arithmetic (policy_kernels)."""
    options = _policy_options(t, domain)
    slots = policy_slots(t)
    return ReplaySpec("auto_augment", {"slots": slots, "width": 2 * slots, **options}, domain)


def _replay_augmix(t: Any, domain: str) -> ReplaySpec:
    """AugMix: its Dirichlet weights and chains drawn in the worker; the chains on the device in
    torchvision's uint8 tensor arithmetic (AugMix converts a PIL image to a tensor itself)."""
    options = _policy_options(t, domain)
    depth = int(t.chain_depth) if t.chain_depth > 0 else 3
    return ReplaySpec("augmix", {"chains": int(t.mixture_width), "depth": depth, "width": augmix_width(t),
                                 **options}, domain)


# ------------------------------------------------------------------------------------------- entries

def _classes(*names: str, v1: bool = True, v2: bool = True) -> tuple[type, ...]:
    """The torchvision classes called ``names`` in v1 and / or v2 that this torchvision has."""
    found = []
    for name in names:
        for api, wanted in ((T1, v1), (T2, v2)):
            cls = getattr(api, name, None) if wanted else None
            if isinstance(cls, type) and cls not in found:
                found.append(cls)
    return tuple(found)


def _tv(name: str, op: str, cost: str, *, v1: bool = True, v2: bool = True, **kw: Any) -> TransformInfo:
    if kw.get("device") and "hint" not in kw:
        kw["hint"] = DEVICE_HINTS.get(kw["device"], "")
    return TransformInfo(name=name, origin="torchvision", op=op, cost=cost, classes=_classes(name, v1=v1, v2=v2),
                         **kw)


def _own(cls: type, op: str, cost: str, **kw: Any) -> TransformInfo:
    return TransformInfo(name=cls.__name__, origin="pipeline_opt", op=op, cost=cost, classes=(cls,), **kw)


_ENTRIES: tuple[TransformInfo, ...] = (
    # conversions
    _tv("ToTensor", "to_tensor", "convert", device="batch", exactness="bitwise", to_device=batch_to_tensor,
        replay=replay_to_tensor),
    _tv("PILToTensor", "to_uint8", "convert", device="batch", exactness="bitwise", to_device=batch_to_uint8,
        replay=replay_to_uint8),
    _tv("ToImage", "to_uint8", "convert", v1=False, device="batch", exactness="bitwise", to_device=batch_to_uint8,
        replay=replay_to_uint8),
    _tv("ToPureTensor", "to_pure_tensor", "convert", v1=False, to_device=batch_to_uint8),
    _tv("ConvertImageDtype", "convert_dtype", "convert", v2=False, device="batch", exactness="bitwise",
        to_device=_batch_convert_v1, replay=_replay_convert(gpu.ToFloat)),
    _tv("ConvertImageDtype", "convert_dtype", "convert", v1=False, device="batch", exactness="bitwise",
        to_device=_batch_convert_v2, replay=_replay_convert(lambda: gpu.ConvertDtype(torch.float32, scale=True))),
    _tv("ToDtype", "convert_dtype", "convert", v1=False, device="batch", exactness="bitwise",
        to_device=_batch_to_dtype, replay=_replay_convert(lambda: gpu.ConvertDtype(torch.float32, scale=True))),
    _tv("ToPILImage", "to_pil", "convert"),
    _tv("Normalize", "normalize", "normalize", device="batch", exactness="bitwise", to_device=_batch_normalize,
        replay=_replay_normalize),
    # deterministic geometry
    _tv("Resize", "resize", "resize", size="resize", device="batch", exactness="tolerance",
        to_device=_batch_resize, replay=_replay_resize),
    _tv("CenterCrop", "center_crop", "crop", size="fixed", device="batch", exactness="bitwise",
        to_device=_batch_center_crop, replay=_replay_center_crop),
    _tv("Grayscale", "grayscale", "colour", device="replay", replay=_replay_grayscale),
    # random augmentations replayed with the same draws
    _tv("RandomResizedCrop", "resized_crop", "resize", random=True, size="fixed", device="replay",
        replay=replay_resized_crop),
    _tv("RandomCrop", "crop", "crop", random=True, size="fixed", device="replay", replay=_replay_crop),
    _tv("RandomHorizontalFlip", "hflip", "flip", random=True, device="replay", replay=_replay_flip("hflip")),
    _tv("RandomVerticalFlip", "vflip", "flip", random=True, device="replay", replay=_replay_flip("vflip")),
    _tv("ColorJitter", "color_jitter", "colour", random=True, device="replay", replay=_replay_color_jitter),
    _tv("RandomGrayscale", "random_grayscale", "colour", random=True, device="replay",
        replay=_replay_random_grayscale),
    _tv("RandomErasing", "erase", "erase", random=True, device="replay", replay=_replay_erase),
    # random policies: their draws replayed in the worker, their ops on the device
    _tv("AutoAugment", "policy", "policy", random=True, device="replay", replay=_replay_policy),
    _tv("RandAugment", "policy", "policy", random=True, device="replay", replay=_replay_policy),
    _tv("TrivialAugmentWide", "policy", "policy", random=True, device="replay", replay=_replay_policy),
    _tv("AugMix", "policy", "policy", random=True, device="replay", replay=_replay_augmix),
    # random augmentations Kornia has (not moved automatically)
    _tv("GaussianBlur", "blur", "blur", random=True, device="kornia"),
    _tv("RandomAffine", "affine", "geometry", random=True, device="kornia"),
    _tv("RandomPerspective", "perspective", "geometry", random=True, device="kornia"),
    # known to keep sizes (or not), stay on the CPU
    _tv("RandomRotation", "rotation", "geometry", random=True, size="rotation"),
    _tv("RandomInvert", "invert", "colour", random=True),
    _tv("RandomPosterize", "posterize", "colour", random=True),
    _tv("RandomSolarize", "solarize", "colour", random=True),
    _tv("RandomAdjustSharpness", "sharpness", "colour", random=True),
    _tv("RandomAutocontrast", "autocontrast", "colour", random=True),
    _tv("RandomEqualize", "equalize", "colour", random=True),
    _tv("RandomPhotometricDistort", "photometric_distort", "colour", random=True, v1=False),
    _tv("RandomChannelPermutation", "channel_permutation", "colour", random=True, v1=False),
    _tv("ElasticTransform", "elastic", "geometry", random=True),
    _tv("GaussianNoise", "noise", "noise", random=True, v1=False),
    _tv("ScaleJitter", "scale_jitter", "resize", random=True, size=None, v1=False),
    _tv("RandomShortestSize", "shortest_size", "resize", random=True, size=None, v1=False),
    _tv("Lambda", "lambda", "other", size=None),
    # the project's own: the CPU part's last step, and the device modules (their names in gpu_transforms)
    _own(ToUint8CHW, "to_uint8", "convert"),
    _own(gpu.ToFloat, "to_tensor", "convert", exactness="bitwise"),
    _own(gpu.ConvertDtype, "convert_dtype", "convert", exactness="bitwise"),
    _own(gpu.Normalize, "normalize", "normalize", exactness="bitwise"),
    _own(gpu.CenterCrop, "center_crop", "crop", size="fixed", exactness="bitwise"),
    # within 1/255 of PIL bilinear (bit-identical to torchvision's tensor resize): tune.exactness.RESIZE_BOUND
    _own(gpu.Resize, "resize", "resize", size="resize", exactness="tolerance"),
)


def _register_all(entries: Iterable[TransformInfo]) -> None:
    for info in entries:
        if info.classes or info.origin != "torchvision":  # a class this torchvision lacks is not registered
            register(info)


_register_all(_ENTRIES)
