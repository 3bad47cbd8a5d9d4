"""What the rest of the library knows of ultralytics, given through its protocols (ultralytics is not imported).

* **transforms** (:mod:`pipeline_opt.transforms.registry`, by name): the worker profiler records each
  transform's class name; with these entries the diagnosis knows which of ultralytics' stages
  :func:`~pipeline_opt.integrations.ultralytics.attach` moves to the GPU and what the others cost;
* **loader** (:class:`~pipeline_opt.loading.dataloader.LoaderKind`): ``InfiniteDataLoader`` keeps one
  iterator (``.iterator``) over a repeating batch sampler that wraps the user's;
* **batch format** (:class:`~pipeline_opt.loading.batch_formats.StackedCollate`): ``YOLODataset.collate_fn``
  stacks each sample's ``img``; shared slots stack them into the slot and let it collate the rest.

:mod:`pipeline_opt.integrations` imports this module, so the entries are there whenever pipeline_opt is.
"""

from __future__ import annotations

from typing import Any

from pipeline_opt.integrations.ultralytics._collate import collate_around, stackable_images
from pipeline_opt.integrations.ultralytics._internals import is_infinite_loader, is_ultralytics_collate_fn
from pipeline_opt.loading.batch_formats import StackedCollate, register_stacked_collate
from pipeline_opt.loading.dataloader import LoaderKind, register_loader_kind
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




def _user_batch_sampler(loader: Any) -> Any:
    return loader.batch_sampler.sampler  # the _RepeatSampler wraps the batch sampler the loader was given


INFINITE_LOADER = LoaderKind(name="ultralytics InfiniteDataLoader", matches=is_infinite_loader,
                             user_batch_sampler=_user_batch_sampler, iterator_attr="iterator")
YOLO_COLLATE = StackedCollate(name="ultralytics YOLODataset.collate_fn", matches=is_ultralytics_collate_fn,
                              images=stackable_images, collate_around=collate_around)


def register_protocols() -> None:
    """Add the transforms, the loader kind and the batch format (each once)."""
    for info in ENTRIES:
        register(info)
    register_loader_kind(INFINITE_LOADER)
    register_stacked_collate(YOLO_COLLATE)


register_protocols()
