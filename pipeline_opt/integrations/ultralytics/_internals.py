"""Every touch of ultralytics internals, in one place, gated on the tested version range.

The integration replaces a few attributes of ultralytics objects on the instance (never on the
class, so one ``vars(obj).pop`` undoes each): the trainer's ``preprocess_batch`` (GPU augmentation)
and its private ``_close_dataloader_mosaic`` / ``_build_train_pipeline`` (they rebuild the
transforms, which must be silenced again) and ``RandomPerspective.apply_image`` (the crop that
replaces a silenced warp); it recognises ultralytics' collate function by its qualified name
(shared slots stack its images straight into a slot). These are private in ultralytics and may
change in any release: the patches are applied only on the range the integration is tested with
(:data:`TESTED_RANGE`); elsewhere :func:`attach` profiles only and says why.
"""

from __future__ import annotations

import importlib
from typing import Any

TESTED_RANGE = ((8, 3), (8, 5))  # >= 8.3, < 8.5: the range pinned in pyproject's ``yolo`` extra

# (module, class, attribute): what the patches replace or call
PATCHED_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    ("ultralytics.engine.trainer", "BaseTrainer", "_close_dataloader_mosaic"),
    ("ultralytics.engine.trainer", "BaseTrainer", "_build_train_pipeline"),
    ("ultralytics.models.yolo.detect.train", "DetectionTrainer", "preprocess_batch"),
    ("ultralytics.data.augment", "RandomPerspective", "apply_image"),
    ("ultralytics.data.dataset", "YOLODataset", "collate_fn"),
)


def installed_version() -> str | None:
    """The installed ultralytics version, or None when it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version("ultralytics")
    except PackageNotFoundError:
        return None


def _release(text: str) -> tuple[int, int]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def is_tested_version(text: str | None) -> bool:
    """Whether ``text`` (e.g. ``"8.4.190"``) lies in :data:`TESTED_RANGE`."""
    if not text:
        return False
    low, high = TESTED_RANGE
    return low <= _release(text) < high


def missing_internals() -> list[str]:
    """The ``module.Class.attribute`` names of :data:`PATCHED_ATTRIBUTES` the installed ultralytics lacks."""
    missing = []
    for module, cls, attr in PATCHED_ATTRIBUTES:
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{cls}")
            continue
        if not callable(getattr(owner, attr, None)):
            missing.append(f"{module}.{cls}.{attr}")
    return missing


def support_problem(version: str | None = None) -> str | None:
    """Why the patches cannot be applied to the installed ultralytics (None when they can)."""
    version = installed_version() if version is None else version
    if version is None:
        return "ultralytics is not installed (pip install 'pipeline-opt[yolo]')"
    low, high = TESTED_RANGE
    if not is_tested_version(version):
        return (f"ultralytics {version} is outside the tested range >={low[0]}.{low[1]},<{high[0]}.{high[1]}; "
                f"install a tested version (pip install 'ultralytics>={low[0]}.{low[1]},<{high[0]}.{high[1]}') "
                "for tuning and GPU augmentation")
    missing = missing_internals()
    if missing:
        return f"ultralytics {version} lacks {', '.join(missing)}, which the integration patches"
    return None


def patch(obj: Any, name: str, value: Any) -> None:
    """Replace ``obj.name`` on the instance (the class keeps its own; :func:`unpatch` restores it)."""
    setattr(obj, name, value)


def unpatch(obj: Any, name: str) -> None:
    """Drop the instance's ``name`` set by :func:`patch`: the class's attribute shows again."""
    vars(obj).pop(name, None)


def is_infinite_loader(loader: Any) -> bool:
    """Whether ``loader`` is ultralytics' ``InfiniteDataLoader`` over its ``_RepeatSampler`` (by names:
    ultralytics is not imported for it)."""
    cls, sampler = type(loader), getattr(loader, "batch_sampler", None)
    return cls.__name__ == "InfiniteDataLoader" and str(cls.__module__).startswith("ultralytics.") \
        and type(sampler).__name__ == "_RepeatSampler" and hasattr(sampler, "sampler")


def is_ultralytics_collate_fn(fn: Any) -> bool:
    """Whether ``fn`` itself is ultralytics' ``YOLODataset.collate_fn`` (recognised by its name)."""
    return getattr(fn, "__qualname__", "").endswith("Dataset.collate_fn") \
        and str(getattr(fn, "__module__", "")).startswith("ultralytics.")
