"""timm's training transforms in the registry, by class path: timm is never imported for it.

``timm.data.create_transform(..., is_training=True, auto_augment=..., re_prob=...)`` is a torchvision
``Compose`` of timm's own classes around torchvision's flip and Normalize. Each is registered here
under ``"module.QualName"`` (:attr:`~.transform_info.TransformInfo.class_paths`), so a pipeline that
holds them is recognised (and replayed) wherever timm is installed, and nothing changes where it is not:

* ``RandomResizedCropAndInterpolation``: torchvision's v1 crop with Python ``random`` draws and the
  same ``get_params(img, scale, ratio)``, so it is replayed as a resized crop; its
  ``interpolation='random'`` (bilinear or bicubic per image) is refused by name.
* ``RandAugment`` / ``AutoAugment`` (``timm.data.auto_augment``): draws in
  :mod:`~pipeline_opt.transforms.timm_draws`, ops on the device in Pillow's arithmetic
  (:func:`~pipeline_opt.transforms.policy_kernels.apply_timm_op`). ``AugMixAugment`` is refused by name.
* ``MaybeToTensor`` / ``MaybePILToTensor`` / ``ToNumpy``: conversions.
* ``RandomErasing`` (``timm.data.random_erasing``): 'const', 'rand' and 'pixel' modes, any count.
"""

from __future__ import annotations

from typing import Any

from pipeline_opt.transforms.registry import (
    DEVICE_HINTS,
    batch_to_tensor,
    batch_to_uint8,
    register,
    replay_resized_crop,
    replay_to_tensor,
    replay_to_uint8,
)
from pipeline_opt.transforms.timm_draws import (
    check_timm_erase,
    check_timm_policy,
    timm_erase_width,
    timm_policy_options,
    timm_policy_slots,
)
from pipeline_opt.transforms.transform_info import ReplaySpec, TransformInfo, UnsupportedTransform

__all__ = ["ENTRIES"]


def _replay_crop_and_interpolation(t: Any, domain: str) -> ReplaySpec:
    if isinstance(t.interpolation, (tuple, list)):
        raise UnsupportedTransform("RandomResizedCropAndInterpolation(interpolation='random') picks bilinear or "
                                   "bicubic per image; Pillow's bicubic is not reproduced on the GPU; give "
                                   "interpolation='bilinear' (create_transform's default)")
    return replay_resized_crop(t, domain)


def _replay_policy(t: Any, domain: str) -> ReplaySpec:
    check_timm_policy(t)
    if domain != "pil":
        raise UnsupportedTransform(f"timm's {type(t).__name__} on a {domain} image is not replayed (its ops are "
                                   "Pillow's; it runs on PIL images)")
    slots = timm_policy_slots(t)
    return ReplaySpec("timm_augment", {"slots": slots, "width": 2 * slots, **timm_policy_options(t)}, domain)


def _refuse_augmix(t: Any, domain: str) -> ReplaySpec:
    raise UnsupportedTransform("timm's AugMixAugment is not replayed: it mixes its chains with Image.blend on "
                               "numpy Dirichlet / Beta draws per image; use torchvision's AugMix (replayed) or keep "
                               "it on the CPU")


def _replay_erase(t: Any, domain: str) -> ReplaySpec:
    check_timm_erase(t)
    if domain != "float":
        raise UnsupportedTransform(f"timm's RandomErasing on a {domain} image is not replayed; it erases the "
                                   "normalized float tensor (after MaybeToTensor and Normalize)")
    mode = "pixel" if t.per_pixel else "rand" if t.rand_color else "const"
    return ReplaySpec("timm_erase", {"boxes": int(t.max_count), "mode": mode, "width": timm_erase_width(t)},
                      domain)


def _timm(path: str, op: str, cost: str, **kw: Any) -> TransformInfo:
    if kw.get("device") and "hint" not in kw:
        kw["hint"] = DEVICE_HINTS[kw["device"]]
    return TransformInfo(name=path.rsplit(".", 1)[1], origin="timm", op=op, cost=cost, class_paths=(path,), **kw)


ENTRIES: tuple[TransformInfo, ...] = (
    _timm("timm.data.transforms.RandomResizedCropAndInterpolation", "resized_crop", "resize", random=True,
          size="fixed", device="replay", replay=_replay_crop_and_interpolation),
    _timm("timm.data.transforms.MaybeToTensor", "to_tensor", "convert", device="batch", exactness="bitwise",
          to_device=batch_to_tensor, replay=replay_to_tensor),
    _timm("timm.data.transforms.MaybePILToTensor", "to_uint8", "convert", device="batch", exactness="bitwise",
          to_device=batch_to_uint8, replay=replay_to_uint8),
    _timm("timm.data.transforms.ToNumpy", "to_uint8", "convert", replay=replay_to_uint8),
    _timm("timm.data.auto_augment.RandAugment", "policy", "policy", random=True, device="replay",
          replay=_replay_policy),
    _timm("timm.data.auto_augment.AutoAugment", "policy", "policy", random=True, device="replay",
          replay=_replay_policy),
    _timm("timm.data.auto_augment.AugMixAugment", "policy", "policy", random=True, replay=_refuse_augmix),
    _timm("timm.data.random_erasing.RandomErasing", "erase", "erase", random=True, device="replay",
          replay=_replay_erase),
)

for _info in ENTRIES:
    register(_info)
