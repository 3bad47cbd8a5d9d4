"""Build only the part of ultralytics' Mosaic canvas that the silenced warp keeps.

With the warp on the device (``gpu_affine``), the workers' ``RandomPerspective`` has every gain at 0
and only crops the middle ``imgsz`` x ``imgsz`` window out of the ``2 imgsz`` x ``2 imgsz`` Mosaic
canvas (:class:`~pipeline_opt.integrations.ultralytics._augment.TranslationAsCrop`). ultralytics still fills
the whole canvas with 114 and copies the four images into it, four times the pixels the crop keeps,
and the crop then copies the window out again.

:class:`MosaicWindow` (``Mosaic.apply_image``) fills and copies only that window and marks the labels
with where the window lies on the canvas; :class:`WindowParams` (``RandomPerspective.get_params``)
computes the warp's matrix for the whole canvas, as ultralytics does (the same draws from ``random``),
and passes the window on, so the crop becomes the window itself, without a copy. The boxes are not
touched: Mosaic and the warp compute them on the whole canvas as before. The images are the same, bit
for bit (tested against the full canvas).

Only a Mosaic of 4 followed by the silenced warp (with nothing in between but a ``CopyPaste`` of
``p=0``) gets a window; it checks at every call that this still holds and builds the full canvas
otherwise. Mosaic's labels, and anything else than the image, stay ultralytics' own.
"""

from __future__ import annotations

from typing import Any

from pipeline_opt.integrations.ultralytics._internals import patch, patched_with, unpatch
from pipeline_opt.integrations.ultralytics._walk import transform_lists, unwrap

MOSAIC_STAGE = "Mosaic(full canvas)"
WINDOW_KEY = "pipeline_opt_mosaic_window"  # labels key from Mosaic to the warp: (x0, y0, canvas h, canvas w)
_FILL = 114  # ultralytics' Mosaic canvas fill
AFFINE_GAINS = ("degrees", "translate", "scale", "shear", "perspective")  # RandomPerspective's warp gains


def centre_window(imgsz: int, size: Any) -> tuple[int, int, int, int] | None:
    """``(x0, y0, w, h)``: the part of a ``2 imgsz`` square Mosaic canvas that a warp with all gains 0
    and output ``size`` = ``(w, h)`` keeps (its matrix moves the canvas centre to the output's centre),
    or None when that is no whole-pixel window inside the canvas."""
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        return None
    if w <= 0 or h <= 0 or w % 2 or h % 2 or w > 2 * imgsz or h > 2 * imgsz:
        return None
    return imgsz - w // 2, imgsz - h // 2, w, h


def paste_window(out: Any, window: tuple[int, int], layout: list[dict[str, Any]]) -> Any:
    """Copy the part of each Mosaic patch (ultralytics' 4-image layout) that falls in ``out``, which
    shows the canvas from ``window`` = ``(x0, y0)`` on. Returns ``out``."""
    x0, y0 = window
    h, w = out.shape[:2]
    for item in layout:
        x1, y1 = max(item["x1a"], x0), max(item["y1a"], y0)
        x2, y2 = min(item["x2a"], x0 + w), min(item["y2a"], y0 + h)
        if x2 <= x1 or y2 <= y1:
            continue
        sx, sy = item["x1b"] + x1 - item["x1a"], item["y1b"] + y1 - item["y1a"]  # the patch pixel at (x1, y1)
        out[y1 - y0:y2 - y0, x1 - x0:x2 - x0] = item["labels_patch"]["img"][sy:sy + y2 - y1, sx:sx + x2 - x1]
    return out


class WindowParams:
    """``RandomPerspective.get_params`` that takes a Mosaic window (:class:`MosaicWindow`) for the whole
    canvas: the matrix, the draws and ``orig_shape`` are those of the full canvas, and ``params["window"]``
    tells the crop where the window lies. Labels without a window go to the class's own method."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, labels: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        t = self.transform
        window = labels.pop(WINDOW_KEY, None)
        if window is None:
            return type(t).get_params(t, labels)
        x0, y0, canvas_h, canvas_w = window
        img = labels["img"]
        canvas = np.broadcast_to(np.zeros((), dtype=img.dtype), (canvas_h, canvas_w, *img.shape[2:]))  # shape only
        params = type(t).get_params(t, {**labels, "img": canvas})
        params["window"] = (x0, y0)
        return params


def _is_window_crop(perspective: Any) -> bool:
    """``perspective`` is a silenced ``RandomPerspective`` whose params and crop both take windows."""
    d = perspective.__dict__
    return isinstance(d.get("get_params"), WindowParams) and getattr(d.get("apply_image"), "takes_windows", False) \
        and not any(getattr(perspective, k, 1) for k in AFFINE_GAINS)


class MosaicWindow:
    """``Mosaic.apply_image`` that builds only the window of the canvas that the silenced warp keeps.

    ``between`` are the transforms that run between the Mosaic and the warp (``CopyPaste``): each must
    have ``p == 0`` at the time of the call, or the whole canvas is built as ultralytics does.
    ``windows`` counts the canvases built as a window (in this process).
    """

    def __init__(self, mosaic: Any, perspective: Any, between: tuple[Any, ...] = ()) -> None:
        self.mosaic = mosaic
        self.perspective = perspective
        self.between = between
        self.windows = 0

    def window(self) -> tuple[int, int, int, int] | None:
        """The window to build now, or None (the whole canvas) when the pipeline no longer allows one."""
        m = self.mosaic
        if m.n != 4 or any(getattr(b, "p", 1) for b in self.between) or not _is_window_crop(self.perspective):
            return None
        return centre_window(m.imgsz, self.perspective.size)

    def __call__(self, labels: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        import numpy as np

        m = self.mosaic
        window = self.window() if params is not None else None
        if window is None:
            return type(m).apply_image(m, labels, params)
        x0, y0, w, h = window
        out = np.full((h, w, labels["img"].shape[2]), _FILL, dtype=np.uint8)
        labels["img"] = paste_window(out, (x0, y0), params["layout"])
        labels[WINDOW_KEY] = (x0, y0, 2 * m.imgsz, 2 * m.imgsz)
        self.windows += 1
        return labels


def install_mosaic_windows(root: Any) -> int:
    """Give every 4-image Mosaic that feeds the silenced warp a :class:`MosaicWindow`; returns how many
    were installed now (0 when each already has one)."""
    from ultralytics.data.augment import CopyPaste, Mosaic, RandomPerspective

    installed = 0
    for transforms in transform_lists(root):
        items = [unwrap(t) for t in transforms]
        for i, mosaic in enumerate(items):
            if type(mosaic) is not Mosaic or patched_with(mosaic, "apply_image", MosaicWindow):
                continue
            j = i + 1
            while j < len(items) and type(items[j]) is CopyPaste:
                j += 1
            if j == len(items) or not isinstance(items[j], RandomPerspective) or not _is_window_crop(items[j]):
                continue
            patch(mosaic, "apply_image", MosaicWindow(mosaic, items[j], tuple(items[i + 1:j])))
            installed += 1
    return installed


def remove_mosaic_window(mosaic: Any) -> bool:
    """Give ``mosaic`` its class's full canvas again; True when it had a window."""
    if not patched_with(mosaic, "apply_image", MosaicWindow):
        return False
    unpatch(mosaic, "apply_image")
    return True
