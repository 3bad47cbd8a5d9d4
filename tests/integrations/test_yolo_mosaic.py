"""Mosaic builds only the window of its canvas that the silenced warp keeps: the same samples, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_opt.integrations.ultralytics import WorkerOptions, build_yolo_pipeline
from pipeline_opt.integrations.ultralytics._augment import (
    DisabledStages,
    TranslationAsCrop,
    disable_cpu_augment,
    iter_transforms,
    restore_cpu_augment,
)
from pipeline_opt.integrations.ultralytics._mosaic import (
    MOSAIC_STAGE,
    WINDOW_KEY,
    MosaicWindow,
    WindowParams,
    centre_window,
    paste_window,
)


def _stage(ds, cls):
    return next(t for t in iter_transforms(ds.transforms) if type(t) is cls)


@pytest.fixture
def make_pipe(yolo_data):
    """``make_pipe(imgsz=..., **overrides)``: a trainer-free pipeline on the test set, closed at teardown."""
    pipes = []

    def make(imgsz=64, **overrides):
        pipes.append(build_yolo_pipeline(yolo_data, imgsz=imgsz, batch=4, workers=0, device="cpu", **overrides))
        return pipes[-1]

    yield make
    for pipe in pipes:
        pipe.close()


def _assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a) == set(b) and WINDOW_KEY not in a
        assert torch.equal(a["img"], b["img"])
        assert torch.equal(a["bboxes"], b["bboxes"]) and torch.equal(a["cls"], b["cls"])
        assert a["resized_shape"] == b["resized_shape"] and a["ori_shape"] == b["ori_shape"]


def test_centre_window_is_the_part_of_the_canvas_a_gainless_warp_keeps():
    assert centre_window(640, (640, 640)) == (320, 320, 640, 640)
    assert centre_window(32, (64, 48)) == (0, 8, 64, 48)
    assert centre_window(640, (641, 640)) is None  # half a pixel off the centre: ultralytics warps
    assert centre_window(32, (66, 64)) is None  # wider than the canvas
    assert centre_window(640, None) is None and centre_window(640, (0, 640)) is None


def test_paste_window_shows_the_full_canvas_through_the_window():
    rng = np.random.default_rng(0)
    s = 40
    for trial in range(200):
        xc, yc = (int(v) for v in rng.integers(s // 2, 3 * s // 2, size=2))
        canvas = np.full((2 * s, 2 * s, 3), 114, dtype=np.uint8)
        layout = []
        for i in range(4):  # ultralytics' 4-image layout around (xc, yc)
            h, w = (int(v) for v in rng.integers(5, 2 * s, size=2))
            img = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            if i == 0:
                x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
                x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
            elif i == 1:
                x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
                x1b, y1b = 0, h - (y2a - y1a)
            elif i == 2:
                x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
                x1b, y1b = w - (x2a - x1a), 0
            else:
                x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
                x1b, y1b = 0, 0
            canvas[y1a:y2a, x1a:x2a] = img[y1b:y1b + y2a - y1a, x1b:x1b + x2a - x1a]
            layout.append({"labels_patch": {"img": img}, "x1a": x1a, "y1a": y1a, "x2a": x2a, "y2a": y2a,
                           "x1b": x1b, "y1b": y1b})
        x0, y0, w, h = (int(v) for v in (*rng.integers(0, s, size=2), *rng.integers(1, s + 1, size=2)))
        out = paste_window(np.full((h, w, 3), 114, dtype=np.uint8), (x0, y0), layout)
        assert np.array_equal(out, canvas[y0:y0 + h, x0:x0 + w]), trial


def test_mosaic_window_gives_the_same_samples_as_the_full_canvas(make_pipe, replayable):
    """The 128x96 images leave 114-filled gaps in a 192 window at some draws: both parts are compared."""
    from ultralytics.data.augment import Mosaic, RandomPerspective

    ds = make_pipe(imgsz=96).dataset
    samples = replayable(ds, n=12, seed=5)
    disabled = disable_cpu_augment(ds, affine=True)
    assert disabled.names.count(MOSAIC_STAGE) == 1
    mosaic, warp = _stage(ds, Mosaic), _stage(ds, RandomPerspective)
    built = mosaic.__dict__["apply_image"]
    assert isinstance(built, MosaicWindow) and isinstance(warp.__dict__["get_params"], WindowParams)
    assert disable_cpu_augment(ds, affine=True).names == ()  # installed once
    windowed = samples()
    assert built.windows == len(windowed) and warp.apply_image.crops == len(windowed)
    assert any((s["img"] == 114).all(-1).any() for s in windowed)  # some samples show the canvas's fill
    assert restore_cpu_augment(ds, DisabledStages(((MOSAIC_STAGE, {}),))) == [MOSAIC_STAGE]
    assert "apply_image" not in mosaic.__dict__
    _assert_same(windowed, samples())  # the whole canvas, cropped by the same silenced warp
    assert built.windows == len(windowed)
    assert set(restore_cpu_augment(ds, disabled)) == set(disabled.names) - {MOSAIC_STAGE}
    assert "get_params" not in warp.__dict__ and warp.scale != 0.0


@pytest.mark.parametrize("overrides, mosaics", [
    ({"mixup": 0.5}, 1),  # MixUp's images come through the same Mosaic + warp
    ({"cutmix": 0.5}, 1),
    ({"mosaic": 0.5}, 1),  # half the samples are no Mosaic: the warp crops them as before
    ({"copy_paste_mode": "mixup", "copy_paste": 0.5}, 2),  # CopyPaste's own Mosaic + warp gets a window too
])
def test_mosaic_window_keeps_the_samples_of_other_mixing_settings(make_pipe, replayable, overrides, mosaics):
    from ultralytics.data.augment import Mosaic

    ds = make_pipe(imgsz=96, **overrides).dataset
    samples = replayable(ds, n=16, seed=5)
    assert disable_cpu_augment(ds, affine=True).names.count(MOSAIC_STAGE) == mosaics
    built = [t.__dict__["apply_image"] for t in iter_transforms(ds.transforms) if type(t) is Mosaic]
    windowed = samples()
    assert len(built) == mosaics and built[0].windows > 0
    for window in built:
        del window.mosaic.apply_image
    _assert_same(windowed, samples())


def test_mosaic_window_builds_the_full_canvas_when_the_pipeline_no_longer_allows_a_window(make_pipe, replayable):
    from ultralytics.data.augment import CopyPaste, Mosaic, RandomPerspective

    ds = make_pipe(imgsz=64).dataset
    samples = replayable(ds, n=6, seed=5)
    disable_cpu_augment(ds, affine=True)
    built = _stage(ds, Mosaic).__dict__["apply_image"]
    paste, warp = _stage(ds, CopyPaste), _stage(ds, RandomPerspective)
    assert built.between == (paste,) and built.window() == (32, 32, 64, 64)
    paste.p = 0.5  # CopyPaste would paste onto the whole canvas
    assert built.window() is None
    samples()
    assert built.windows == 0
    paste.p = 0.0
    warp.scale = 0.5  # a real warp needs the whole canvas
    assert built.window() is None
    warp.scale = 0.0
    crop = warp.__dict__.pop("apply_image")  # ultralytics' own warp
    assert built.window() is None
    warp.apply_image = crop
    assert built.window() == (32, 32, 64, 64)


def test_no_window_is_installed_with_the_option_off_or_without_the_warp(make_pipe):
    from ultralytics.data.augment import Mosaic

    ds = make_pipe(imgsz=64).dataset
    assert MOSAIC_STAGE not in disable_cpu_augment(ds, affine=False).names  # the warp stays in the workers
    off = WorkerOptions(mosaic_window=False)
    assert MOSAIC_STAGE not in disable_cpu_augment(ds, affine=True, options=off).names
    assert "apply_image" not in _stage(ds, Mosaic).__dict__


def test_a_window_the_crop_cannot_serve_is_an_error_not_a_wrong_image():
    from ultralytics.data.augment import RandomPerspective

    warp = RandomPerspective(degrees=0, translate=0, scale=0, shear=0, perspective=0, size=(32, 32))
    crop = TranslationAsCrop(warp)
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    shift = np.array([[1, 0, -16], [0, 1, -16], [0, 0, 1]], dtype=np.float32)
    labels = crop({"img": img}, {"M": shift, "size": (32, 32), "window": (16, 16)})
    assert np.shares_memory(labels["img"], img) and labels["img"].shape == img.shape  # the window, no copy
    with pytest.raises(RuntimeError, match="mosaic_window=False"):
        crop({"img": img}, {"M": shift, "size": (32, 32), "window": (8, 16)})  # 8 columns short
    half = np.array([[1, 0, -15.5], [0, 1, -16], [0, 0, 1]], dtype=np.float32)
    with pytest.raises(RuntimeError, match="cannot crop"):
        crop({"img": img}, {"M": half, "size": (32, 32), "window": (16, 16)})


def test_a_pickled_dataset_keeps_its_windows_as_spawned_workers_get_it(make_pipe, replayable):
    """DataLoader workers started with "spawn" (macOS, Windows) get the dataset pickled: the windows,
    the warp's window-aware params and crop travel with it and give the same samples."""
    import pickle

    from ultralytics.data.augment import Mosaic, RandomPerspective

    ds = make_pipe(imgsz=96).dataset
    disable_cpu_augment(ds, affine=True)
    copy = pickle.loads(pickle.dumps(ds))
    built, warp = _stage(copy, Mosaic).__dict__["apply_image"], _stage(copy, RandomPerspective)
    assert isinstance(built, MosaicWindow) and built.mosaic is _stage(copy, Mosaic) and built.perspective is warp
    assert isinstance(warp.__dict__["get_params"], WindowParams) and warp.__dict__["get_params"].transform is warp
    _assert_same(replayable(copy, n=8, seed=5)(), replayable(ds, n=8, seed=5)())
    assert built.windows == 8
