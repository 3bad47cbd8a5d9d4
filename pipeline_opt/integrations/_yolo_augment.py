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

from pipeline_opt._logging import get_logger
from pipeline_opt._step import move_to_device

log = get_logger("integrations.ultralytics")

_AFFINE_GAINS = ("degrees", "translate", "scale", "shear", "perspective")
_MAX_DEPTH = 6


@dataclass(frozen=True)
class DisabledStages:
    """What :func:`disable_cpu_augment` silenced (class name and the settings it had before)."""

    stages: tuple[tuple[str, dict[str, Any]], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"stages": [{"name": n, "before": dict(b)} for n, b in self.stages]}


def _unwrap(obj: Any) -> Any:
    """The transform under a profiler wrapper (``TimedTransform`` keeps it in ``_inner``)."""
    for _ in range(_MAX_DEPTH):
        inner = getattr(obj, "_inner", None) if type(obj).__name__ == "TimedTransform" else None
        if inner is None:
            return obj
        obj = inner
    return obj


def iter_transforms(root: Any) -> list[Any]:
    """Every transform object reachable from ``root`` (Compose lists, ``pre_transform``), each once."""
    out: list[Any] = []
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> None:
        node = _unwrap(node)
        if node is None or id(node) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(node))
        children = getattr(node, "transforms", None)
        if isinstance(children, list):
            for child in children:
                visit(child, depth + 1)
        else:
            out.append(node)
        pre = getattr(node, "pre_transform", None)
        if pre is not None:
            visit(pre, depth + 1)

    visit(root, 0)
    return out


def disable_cpu_augment(dataset: Any, *, affine: bool = False) -> DisabledStages:
    """Silence the CPU stages that :class:`GpuAugmentedPreprocess` replaces, in ``dataset.transforms``.

    Idempotent: stages already silenced are not listed again. Raises ``TypeError`` when the dataset
    has no ultralytics transform pipeline (a validation set, or not an ultralytics dataset).
    """
    from ultralytics.data.augment import RandomFlip, RandomHSV, RandomPerspective

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
                stages.append(("RandomHSV", before))
        elif isinstance(t, RandomFlip):
            if t.p > 0:
                stages.append((f"RandomFlip({t.direction})", {"p": t.p}))
                t.p = 0.0
        elif affine and isinstance(t, RandomPerspective):
            before = {k: getattr(t, k) for k in _AFFINE_GAINS}
            if any(before.values()):
                for k in _AFFINE_GAINS:
                    setattr(t, k, 0.0)
                stages.append(("RandomPerspective", before))
    if stages:
        log.info("CPU augmentation moved to the device: %s", ", ".join(n for n, _ in stages))
    return DisabledStages(tuple(stages))


def active_cpu_stages(dataset: Any, *, affine: bool = False) -> list[str]:
    """Names of the CPU stages that are still active (what :func:`disable_cpu_augment` would silence)."""
    from ultralytics.data.augment import RandomFlip, RandomHSV, RandomPerspective

    out = []
    for t in iter_transforms(getattr(dataset, "transforms", None)):
        if isinstance(t, RandomHSV) and (t.hgain or t.sgain or t.vgain):
            out.append("RandomHSV")
        elif isinstance(t, RandomFlip) and t.p > 0:
            out.append(f"RandomFlip({t.direction})")
        elif affine and isinstance(t, RandomPerspective) and any(getattr(t, k) for k in _AFFINE_GAINS):
            out.append("RandomPerspective")
    return out


class GpuAugmentedPreprocess:
    """``preprocess_batch`` replacement: device copy, GPU augmentation on uint8, then the original.

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
        batch = move_to_device(batch, self.device, non_blocking=self.device.type == "cuda")
        with torch.autocast(device_type=self.device.type, enabled=False):
            batch = self.augment(batch)
        self.calls += 1
        return self.preprocess(batch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.augment!r}, device={self.device})"


def build_gpu_augment(hyp: Any, *, affine: bool = False, device: torch.device | str = "cpu") -> torch.nn.Module:
    """:class:`DetectionGPUAugment` from ultralytics hyperparameters (``affine=False``: colour + flips)."""
    from pipeline_opt.transforms.detection import DetectionGPUAugment

    return DetectionGPUAugment.from_hyp(hyp, affine=affine).to(device)


def restore_cpu_augment(dataset: Any, disabled: DisabledStages) -> list[str]:
    """Undo :func:`disable_cpu_augment`: give the silenced stages their recorded settings back.

    Stages are matched by name in the order they were silenced; a stage that is active again
    (e.g. the trainer rebuilt the transforms from its args) is left as it is. Returns the names restored.
    """
    from ultralytics.data.augment import RandomFlip, RandomHSV, RandomPerspective

    pending = list(disabled.stages)
    restored = []
    for t in iter_transforms(getattr(dataset, "transforms", None)):
        if isinstance(t, RandomHSV) and not (t.hgain or t.sgain or t.vgain):
            name = "RandomHSV"
        elif isinstance(t, RandomFlip) and t.p == 0:
            name = f"RandomFlip({t.direction})"
        elif isinstance(t, RandomPerspective) and not any(getattr(t, k) for k in _AFFINE_GAINS):
            name = "RandomPerspective"
        else:
            continue
        match = next((i for i, (n, _) in enumerate(pending) if n == name), None)
        if match is None:
            continue
        _, before = pending.pop(match)
        for key, value in before.items():
            setattr(t, key, value)
        restored.append(name)
    if restored:
        log.info("CPU augmentation restored: %s", ", ".join(restored))
    return restored
