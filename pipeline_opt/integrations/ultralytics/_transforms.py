"""ultralytics' training transforms in the transform registry, by name (ultralytics is not imported).

The worker profiler records each transform's class name; with these entries the diagnosis knows which
of ultralytics' stages the integration moves to the GPU (:func:`~pipeline_opt.integrations.ultralytics.attach`
with its GPU augmentation) and what the others spend their time on.
"""

from __future__ import annotations

from pipeline_opt.transforms.registry import TransformInfo, register

_ATTACH = ("attach(model) from pipeline_opt.integrations.ultralytics moves it to the GPU when that measures "
           "faster (AttachOptions.gpu_augment; gpu_affine for RandomPerspective's warp)")

RANDOM_HSV = TransformInfo(name="RandomHSV", origin="ultralytics", op="hsv", cost="colour", random=True,
                           device="attach", hint=_ATTACH)
RANDOM_FLIP = TransformInfo(name="RandomFlip", origin="ultralytics", op="flip", cost="flip", random=True,
                            device="attach", hint=_ATTACH)
RANDOM_PERSPECTIVE = TransformInfo(name="RandomPerspective", origin="ultralytics", op="perspective", cost="geometry",
                                   random=True, device="attach", hint=_ATTACH)

ENTRIES = (
    RANDOM_HSV,
    RANDOM_FLIP,
    RANDOM_PERSPECTIVE,
    TransformInfo(name="Mosaic", origin="ultralytics", op="mosaic", cost="geometry", random=True, size=None),
    TransformInfo(name="LetterBox", origin="ultralytics", op="letterbox", cost="geometry", size="fixed"),
    TransformInfo(name="Format", origin="ultralytics", op="format", cost="convert"),
)


def register_entries() -> None:
    """Add :data:`ENTRIES` to the registry once."""
    for info in ENTRIES:
        register(info)


register_entries()
