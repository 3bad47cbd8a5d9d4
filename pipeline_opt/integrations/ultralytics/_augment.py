"""Move ultralytics' colour / flip (and optionally affine) augmentation from the workers to the device.

Two halves that must always be applied together, or images are augmented twice (or not at all):

* :func:`disable_cpu_augment` makes the dataset's CPU ``RandomHSV`` and ``RandomFlip`` stages
  no-ops in place (gains 0, ``p=0``) and, with ``affine=True``, reduces ``RandomPerspective`` to
  the plain centre crop of the Mosaic canvas that :class:`DetectionGPUAugment` expects (all gains
  0, output size kept). The transform objects stay where they are, so Mosaic / MixUp / CopyPaste,
  which hold references to the same ``RandomPerspective``, see the change too.
* :class:`GpuAugmentedPreprocess` wraps a ``preprocess_batch`` function: it moves the batch to the
  device, applies :class:`pipeline_opt.transforms.detection.DetectionGPUAugment` on the uint8
  images (autocast off) and then calls the original preprocessing (``/255``, multi-scale).

The GPU augmentation is built from the ORIGINAL hyperparameters; the CPU stages are silenced on
the transform objects, never in ``trainer.args``, so checkpoints and ``args.yaml`` keep the values
the user asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline_opt._core.log import get_logger
from pipeline_opt.integrations.ultralytics._internals import augment_stage_classes, patch, unpatch
from pipeline_opt.integrations.ultralytics._protocol import RANDOM_HSV, RANDOM_PERSPECTIVE
from pipeline_opt.integrations.ultralytics._step import images_to_device
from pipeline_opt.integrations.ultralytics._walk import iter_transforms
from pipeline_opt.transforms.detection import DetectionGPUAugment

log = get_logger("integrations.ultralytics")

AFFINE_GAINS = ("degrees", "translate", "scale", "shear", "perspective")  # RandomPerspective's warp gains


@dataclass(frozen=True)
class DisabledStages:
    """What :func:`disable_cpu_augment` silenced (class name and the settings it had before)."""

    stages: tuple[tuple[str, dict[str, Any]], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"stages": [{"name": n, "before": dict(b)} for n, b in self.stages]}


def disable_cpu_augment(dataset: Any, *, affine: bool = False) -> DisabledStages:
    """Silence the CPU stages that :class:`GpuAugmentedPreprocess` replaces, in ``dataset.transforms``.

    Idempotent: stages already silenced are not listed again. Raises ``TypeError`` when the dataset
    has no ultralytics transform pipeline (a validation set, or not an ultralytics dataset).
    """
    RandomHSV, RandomFlip, RandomPerspective = augment_stage_classes()  # noqa: N806 (classes)

    root = getattr(dataset, "transforms", None)
    if root is None:
        raise TypeError(
            f"{type(dataset).__name__} has no .transforms; GPU augmentation needs an ultralytics training dataset "
            "(YOLODataset built with augment=True)"
        )
    stages: list[tuple[str, dict[str, Any]]] = []
    for t in iter_transforms(root):
        if isinstance(t, RandomHSV):
            before = {"hgain": t.hgain, "sgain": t.sgain, "vgain": t.vgain}
            if any(before.values()):
                t.hgain = t.sgain = t.vgain = 0.0
                stages.append((RANDOM_HSV.name, before))
        elif isinstance(t, RandomFlip):
            if t.p > 0:
                stages.append((f"RandomFlip({t.direction})", {"p": t.p}))
                t.p = 0.0
        elif affine and isinstance(t, RandomPerspective):
            before = {k: getattr(t, k) for k in AFFINE_GAINS}
            if any(before.values()):
                for k in AFFINE_GAINS:
                    setattr(t, k, 0.0)
                _crop_instead_of_warp(t)
                stages.append((RANDOM_PERSPECTIVE.name, before))
    if stages:
        log.info("CPU augmentation moved to the device: %s", ", ".join(n for n, _ in stages))
    return DisabledStages(tuple(stages))


def active_cpu_stages(dataset: Any, *, affine: bool = False) -> list[str]:
    """Names of the CPU stages that are still active (what :func:`disable_cpu_augment` would silence)."""
    RandomHSV, RandomFlip, RandomPerspective = augment_stage_classes()  # noqa: N806 (classes)

    out = []
    for t in iter_transforms(getattr(dataset, "transforms", None)):
        if isinstance(t, RandomHSV) and (t.hgain or t.sgain or t.vgain):
            out.append(RANDOM_HSV.name)
        elif isinstance(t, RandomFlip) and t.p > 0:
            out.append(f"RandomFlip({t.direction})")
        elif affine and isinstance(t, RandomPerspective) and any(getattr(t, k) for k in AFFINE_GAINS):
            out.append(RANDOM_PERSPECTIVE.name)
    return out


BORDER_VALUE = 114  # ultralytics' RandomPerspective fills with (114, 114, 114)


def _crop_instead_of_warp(transform: Any) -> None:
    """Give a silenced ``RandomPerspective`` a crop for its image warp (:class:`TranslationAsCrop`).

    With every gain at 0 its matrix is a whole-pixel translation, and ``cv2.warpAffine`` then
    makes only a crop of the Mosaic canvas at the cost of a full bilinear warp (a few ms per
    image in every worker). Versions whose ``RandomPerspective`` has no ``apply_image`` keep their warp."""
    if callable(getattr(type(transform), "apply_image", None)):
        patch(transform, "apply_image", TranslationAsCrop(transform))


def integer_translation(M: Any) -> tuple[int, int] | None:
    """``(tx, ty)`` when the 3x3 matrix ``M`` is exactly a whole-pixel translation, else None."""
    import numpy as np

    M = np.asarray(M, dtype=np.float64)
    if M.shape != (3, 3) or not np.array_equal(M[:, :2], np.eye(3)[:, :2]) or M[2, 2] != 1.0:
        return None
    tx, ty = M[0, 2], M[1, 2]
    if tx != round(tx) or ty != round(ty):
        return None
    return int(tx), int(ty)


def translate_image(img: Any, tx: int, ty: int, size: tuple[int, int]) -> Any:
    """``img`` moved by ``(tx, ty)`` into a ``size`` = ``(w, h)`` canvas filled with 114: equal to
    ``cv2.warpAffine(img, [[1, 0, tx], [0, 1, ty]], size, borderValue=114)`` for integer shifts."""
    import numpy as np

    w, h = int(size[0]), int(size[1])
    if tx <= 0 and ty <= 0 and img.shape[1] + tx >= w and img.shape[0] + ty >= h:  # no border: a plain crop
        return np.ascontiguousarray(img[-ty:h - ty, -tx:w - tx])
    out = np.full((h, w, *img.shape[2:]), BORDER_VALUE, dtype=img.dtype)
    x0, y0 = max(0, tx), max(0, ty)  # the destination's part that has a source pixel
    x1, y1 = min(w, img.shape[1] + tx), min(h, img.shape[0] + ty)
    if x1 > x0 and y1 > y0:
        out[y0:y1, x0:x1] = img[y0 - ty:y1 - ty, x0 - tx:x1 - tx]
    return out


class TranslationAsCrop:
    """``RandomPerspective.apply_image`` for a stage whose gains are all 0: a whole-pixel translation
    is copied as a crop (:func:`translate_image`), anything else goes to the class's own warp."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform
        self.crops = 0  # images cropped instead of warped (in this process)

    def __call__(self, labels: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        t = self.transform
        shift = None if params is None or t.perspective else integer_translation(params.get("M"))
        img = labels.get("img")
        if shift is None or img is None or img.ndim not in (2, 3):
            return type(t).apply_image(t, labels, params)
        out = translate_image(img, shift[0], shift[1], params["size"])
        if out.ndim == 2 or out.shape[2] == 1:  # cv2 returns HxW for one channel; ultralytics adds it back
            out = out.reshape(out.shape[0], out.shape[1], 1)
        labels["img"] = out
        labels["resized_shape"] = out.shape[:2]
        self.crops += 1
        return labels


class GpuAugmentedPreprocess:
    """``preprocess_batch`` replacement: device copy, GPU augmentation on uint8, then the original.

    Only the images go to the device before the augmentation: the boxes stay on the CPU, where a
    warp's box filter runs without making the host wait, and the augmentation copies them over.

    ``calls`` counts the batches augmented (the report and the tests read it).
    """

    def __init__(self, preprocess: Callable[[dict], dict], augment: Callable[[dict], dict],
                 device: torch.device | str) -> None:
        if not callable(preprocess) or not callable(augment):
            raise TypeError("preprocess and augment must be callables taking and returning a batch dict")
        self.preprocess = preprocess
        self.augment = augment
        self.device = torch.device(device)
        self.calls = 0

    def __call__(self, batch: dict) -> dict:
        batch = images_to_device(batch, self.device)
        with torch.autocast(device_type=self.device.type, enabled=False):
            batch = self.augment(batch)
        self.calls += 1
        return self.preprocess(batch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.augment!r}, device={self.device})"


def build_gpu_augment(hyp: Any, *, affine: bool = False, device: torch.device | str = "cpu") -> torch.nn.Module:
    """:class:`DetectionGPUAugment` from ultralytics hyperparameters (``affine=False``: colour + flips)."""

    return DetectionGPUAugment.from_hyp(hyp, affine=affine).to(device)


def restore_cpu_augment(dataset: Any, disabled: DisabledStages) -> list[str]:
    """Undo :func:`disable_cpu_augment`: give the silenced stages their recorded settings back.

    Stages are matched by name in the order they were silenced; a stage that is active again
    (e.g. the trainer rebuilt the transforms from its args) is left as it is. Returns the names restored.
    """
    RandomHSV, RandomFlip, RandomPerspective = augment_stage_classes()  # noqa: N806 (classes)

    pending = list(disabled.stages)
    restored = []
    for t in iter_transforms(getattr(dataset, "transforms", None)):
        if isinstance(t, RandomHSV) and not (t.hgain or t.sgain or t.vgain):
            name = RANDOM_HSV.name
        elif isinstance(t, RandomFlip) and t.p == 0:
            name = f"RandomFlip({t.direction})"
        elif isinstance(t, RandomPerspective) and not any(getattr(t, k) for k in AFFINE_GAINS):
            name = RANDOM_PERSPECTIVE.name
        else:
            continue
        match = next((i for i, (n, _) in enumerate(pending) if n == name), None)
        if match is None:
            continue
        _, before = pending.pop(match)
        for key, value in before.items():
            setattr(t, key, value)
        if name == RANDOM_PERSPECTIVE.name:
            unpatch(t, "apply_image")  # the class's warp again
        restored.append(name)
    if restored:
        log.info("CPU augmentation restored: %s", ", ".join(restored))
    return restored
