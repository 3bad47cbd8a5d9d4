"""The adapter: every import of ultralytics and every touch of its internals, in one place, gated on the
tested version range.

:data:`IMPORTED` declares every ultralytics name the integration uses (its other modules ask
:func:`ultralytics_name` for them and never import ultralytics themselves), :data:`PATCHED_ATTRIBUTES`
the attributes it replaces or calls; :func:`missing_internals` checks both lists against the installed
ultralytics and names what moved.

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

# Every ultralytics name the integration uses, under the name it is asked for: (module, attribute).
IMPORTED: dict[str, tuple[str, str]] = {
    "get_cfg": ("ultralytics.cfg", "get_cfg"),
    "DEFAULT_CFG": ("ultralytics.utils", "DEFAULT_CFG"),
    "check_det_dataset": ("ultralytics.data.utils", "check_det_dataset"),
    "check_imgsz": ("ultralytics.utils.checks", "check_imgsz"),
    "build_dataloader": ("ultralytics.data", "build_dataloader"),
    "build_yolo_dataset": ("ultralytics.data", "build_yolo_dataset"),
    "DetectionModel": ("ultralytics.nn.tasks", "DetectionModel"),
    "autocast": ("ultralytics.utils.torch_utils", "autocast"),
    "unwrap_model": ("ultralytics.utils.torch_utils", "unwrap_model"),
    "RandomFlip": ("ultralytics.data.augment", "RandomFlip"),
    "RandomHSV": ("ultralytics.data.augment", "RandomHSV"),
    "RandomPerspective": ("ultralytics.data.augment", "RandomPerspective"),
}

# (module, class, attribute): what the patches replace or call
PATCHED_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    ("ultralytics.engine.trainer", "BaseTrainer", "_close_dataloader_mosaic"),
    ("ultralytics.engine.trainer", "BaseTrainer", "_build_train_pipeline"),
    ("ultralytics.models.yolo.detect.train", "DetectionTrainer", "preprocess_batch"),
    ("ultralytics.data.augment", "RandomPerspective", "apply_image"),
    ("ultralytics.data.dataset", "YOLODataset", "collate_fn"),
)


# The trainer's methods that rebuild the dataset's transforms from trainer.args (and, True, its whole loader):
# the integration wraps them to re-apply itself afterwards.
REBUILDING_METHODS: tuple[tuple[str, bool], ...] = (
    ("_close_dataloader_mosaic", False),
    ("_build_train_pipeline", True),
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


def ultralytics_name(name: str) -> Any:
    """The ultralytics object the integration uses as ``name`` (one of :data:`IMPORTED`); imports ultralytics."""
    if name not in IMPORTED:
        raise KeyError(f"{name!r} is not declared in IMPORTED: add (module, attribute) there first")
    module, attr = IMPORTED[name]
    return getattr(importlib.import_module(module), attr)


def augment_stage_classes() -> tuple[type, type, type]:
    """ultralytics' ``(RandomHSV, RandomFlip, RandomPerspective)``: the CPU stages the GPU augmentation replaces."""
    return ultralytics_name("RandomHSV"), ultralytics_name("RandomFlip"), ultralytics_name("RandomPerspective")


def missing_internals() -> list[str]:
    """The names of :data:`IMPORTED` (``module.attribute``) and of :data:`PATCHED_ATTRIBUTES`
    (``module.Class.attribute``) the installed ultralytics lacks."""
    missing = []
    for module, attr in IMPORTED.values():
        try:
            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{attr}")
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
        return f"ultralytics {version} lacks {', '.join(missing)}, which the integration uses"
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
