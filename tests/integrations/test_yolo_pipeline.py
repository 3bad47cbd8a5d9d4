"""The trainer-free pipeline, the augmentation wiring, the offline set-up and the CLI's argument checks."""

from __future__ import annotations

import os

import pytest
import torch
from ultralytics.data.build import InfiniteDataLoader

from pipeline_opt.integrations.ultralytics import (
    build_yolo_pipeline,
    cli_main,
    prepare_offline_env,
    profile_yolo,
)
from pipeline_opt.integrations.ultralytics._augment import (
    GpuAugmentedPreprocess,
    active_cpu_stages,
    disable_cpu_augment,
    iter_transforms,
)
from pipeline_opt.integrations.ultralytics._tune import (
    config_changed,
    delivers_through_slots,
    plain_loader_of,
    rebuild_loader,
)
from pipeline_opt.loading.dataloader import loader_config


def test_prepare_offline_env_sets_variables_and_fonts(tmp_path, monkeypatch):
    for name in ("YOLO_CONFIG_DIR", "YOLO_OFFLINE", "YOLO_AUTOINSTALL"):
        monkeypatch.delenv(name, raising=False)
    user_dir = prepare_offline_env(tmp_path / "cfg")
    assert os.environ["YOLO_OFFLINE"] == "1" and os.environ["YOLO_AUTOINSTALL"] == "0"
    assert os.environ["YOLO_CONFIG_DIR"] == str((tmp_path / "cfg").resolve())
    assert user_dir == (tmp_path / "cfg").resolve() / "Ultralytics"
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        assert (user_dir / name).stat().st_size > 10_000
    assert prepare_offline_env(tmp_path / "cfg") == user_dir  # idempotent


def test_gpu_preprocess_moves_then_augments_then_preprocesses():
    calls = []

    def augment(batch):
        calls.append(("augment", batch["img"].dtype, torch.is_autocast_enabled("cpu")))
        return {**batch, "img": batch["img"].flip(-1)}

    def preprocess(batch):
        calls.append(("preprocess", batch["img"].dtype, None))
        return {**batch, "img": batch["img"].float() / 255}

    hook = GpuAugmentedPreprocess(preprocess, augment, "cpu")
    img = torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).reshape(2, 3, 4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hook({"img": img, "im_file": ["a", "b"]})
    assert calls == [("augment", torch.uint8, False), ("preprocess", torch.uint8, None)]
    assert torch.equal(out["img"], img.flip(-1).float() / 255) and out["im_file"] == ["a", "b"]
    assert hook.calls == 1
    with pytest.raises(TypeError, match="callables"):
        GpuAugmentedPreprocess(preprocess, None, "cpu")


def test_disable_cpu_augment_is_in_place_and_idempotent(yolo_data):
    from ultralytics.data.augment import RandomPerspective

    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu")
    try:
        assert active_cpu_stages(pipe.dataset) == ["RandomHSV", "RandomFlip(horizontal)"]  # flipud is 0 by default
        first = disable_cpu_augment(pipe.dataset, affine=True)
        assert "RandomHSV" in first.names and "RandomPerspective" in first.names
        assert active_cpu_stages(pipe.dataset, affine=True) == []
        assert disable_cpu_augment(pipe.dataset, affine=True).names == ()
        affine = [t for t in pipe.dataset.transforms.transforms[0].transforms if isinstance(t, RandomPerspective)][0]
        assert affine.size == (32, 32) and affine.scale == 0.0  # the centre crop the GPU affine expects
    finally:
        pipe.close()
    with pytest.raises(TypeError, match="no .transforms"):
        disable_cpu_augment(object())


@pytest.mark.parametrize("shape", [(64, 48, 3), (40, 30), (33, 65, 1), (20, 20, 5)])
@pytest.mark.parametrize("tx, ty", [(-16, -12), (0, 0), (5, -7), (-100, 3), (70, 80)])
def test_an_integer_translation_crops_exactly_as_cv2_warps(shape, tx, ty):
    import cv2
    import numpy as np

    from pipeline_opt.integrations.ultralytics._augment import integer_translation, translate_image

    img = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    M = np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]], dtype=np.float32)
    size = (32, 24)
    want = cv2.warpAffine(img, M[:2], dsize=size, borderValue=(114, 114, 114, 114))
    got = translate_image(img, *integer_translation(M), size)
    assert np.array_equal(got.reshape(want.shape), want)
    assert integer_translation(np.array([[1, 0, 0.5], [0, 1, 0], [0, 0, 1]])) is None  # half a pixel: a real warp
    assert integer_translation(np.array([[1.01, 0, 0], [0, 1, 0], [0, 0, 1]])) is None


def test_a_silenced_affine_crops_the_mosaic_exactly_as_ultralytics_warps_it(yolo_data):
    """Same seed, the same samples with the crop and with ultralytics' own warp (all gains 0)."""
    import random

    import numpy as np
    from ultralytics.data.augment import RandomPerspective

    from pipeline_opt.integrations.ultralytics._augment import TranslationAsCrop, restore_cpu_augment

    pipe = build_yolo_pipeline(yolo_data, imgsz=64, batch=4, workers=0, device="cpu")
    try:
        disabled = disable_cpu_augment(pipe.dataset, affine=True)
        stage = next(t for t in pipe.dataset.transforms.transforms[0].transforms if isinstance(t, RandomPerspective))
        crop = stage.__dict__.get("apply_image")
        assert isinstance(crop, TranslationAsCrop)

        ds = pipe.dataset
        buffer = (list(ds.buffer), list(ds.ims), list(ds.im_hw0), list(ds.im_hw))

        def samples():  # the same draws from the same Mosaic buffer each time
            ds.buffer, ds.ims, ds.im_hw0, ds.im_hw = (list(x) for x in buffer)
            random.seed(3)
            np.random.seed(3)
            return [ds[i] for i in range(6)]

        cropped = samples()
        assert crop.crops >= 6  # every Mosaic canvas was cropped, none warped
        del stage.apply_image  # ultralytics' own warp, same gains (0), same draws
        warped = samples()
        for a, b in zip(cropped, warped):
            assert torch.equal(a["img"], b["img"]) and torch.equal(a["bboxes"], b["bboxes"])
            assert torch.equal(a["cls"], b["cls"])
        stage.apply_image = crop
        assert "RandomPerspective" in restore_cpu_augment(pipe.dataset, disabled)
        assert "apply_image" not in stage.__dict__ and stage.scale != 0.0  # the class's warp and gains again
    finally:
        pipe.close()


def test_trainer_free_pipeline_profiles_ultralytics_workers(yolo_data):
    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=1, device="cpu", gpu_augment=True)
    try:
        assert isinstance(pipe.loader, InfiniteDataLoader) and pipe.loader.num_workers == 1
        assert set(pipe.cpu_stages_disabled) == {"RandomHSV", "RandomFlip(horizontal)"}
        assert active_cpu_stages(pipe.dataset) == []
        tuned = rebuild_loader(pipe.loader, {"num_workers": 1, "pin_memory": False, "prefetch_factor": 1})
        assert type(tuned) is InfiniteDataLoader and tuned.dataset is pipe.dataset
        cfg = loader_config(tuned)
        assert (cfg["num_workers"], cfg["prefetch_factor"], cfg["batch_size"]) == (1, 1, 4)

        before = {n: p.detach().clone() for n, p in pipe.model.named_parameters()}
        report = profile_yolo(pipe, steps=2, warmup=1, limit=False, loader=tuned)  # the real loss step
        assert len(report.steps) == 2 and report.throughput > 0
        assert [w.pid != os.getpid() for w in report.workers] == [True]  # recorded inside the worker process
        assert {"Mosaic", "RandomPerspective"} <= set(report.workers[0].transform_s)
        assert all(torch.equal(before[n], p) for n, p in pipe.model.named_parameters())
        tuned.close()
    finally:
        pipe.close()


def test_rebuild_with_shared_slots_wraps_an_infinite_loader_and_back(yolo_data):
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.loading.shared_slots import slot_pool_of

    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=1, device="cpu")
    try:
        slots = {"num_workers": 2, "pin_memory": True, "prefetch_factor": 2, "shared_slots": True}
        assert config_changed(pipe.loader, slots)
        with pytest.raises(ValueError, match="device="):
            rebuild_loader(pipe.loader, slots)
        slotted = rebuild_loader(pipe.loader, slots, "cpu")
        assert isinstance(slotted, DeviceLoader) and delivers_through_slots(slotted)
        assert type(slotted.loader) is InfiniteDataLoader and slotted.dataset is pipe.dataset
        assert slot_pool_of(slotted.loader).num_workers == 2 and len(slotted) == len(pipe.loader)
        assert not config_changed(slotted, slots)  # page-locked slots count as pinned
        assert config_changed(slotted, {**slots, "prefetch_factor": 4})
        plain = {**slots, "shared_slots": False}
        assert config_changed(slotted, plain)
        back = rebuild_loader(slotted, plain)  # from the slotted loader: its own collate function again
        assert type(back) is InfiniteDataLoader and slot_pool_of(back) is None
        assert back.collate_fn is pipe.loader.collate_fn and loader_config(back)["num_workers"] == 2
        assert plain_loader_of(pipe.loader) is pipe.loader
        no_workers = {**slots, "num_workers": 0}
        assert type(rebuild_loader(pipe.loader, no_workers, "cpu")) is InfiniteDataLoader  # nothing to reuse
        slotted.close()
    finally:
        pipe.close()


@pytest.mark.parametrize("argv, message", [
    (["--data", "/nonexistent/data.yaml"], "no such file"),
    (["--budget", "0"], "--budget"),
    (["--no-gpu-augment", "--gpu-affine"], "--gpu-affine"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_augmenting_step_moves_only_the_images_before_the_augmentation(monkeypatch):
    import torch

    from pipeline_opt.integrations.ultralytics import _step as _yolo_step
    from pipeline_opt.integrations.ultralytics._step import YoloStep, images_to_device

    batch = {"img": torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "bboxes": torch.rand(3, 4),
             "batch_idx": torch.tensor([0.0, 0.0, 1.0]), "cls": torch.zeros(3, 1)}
    moved = images_to_device(batch, torch.device("meta"))  # a device other than the CPU, without a GPU
    assert moved["img"].is_meta and moved["bboxes"] is batch["bboxes"]  # boxes stay where they are
    assert batch["img"].device.type == "cpu"  # the caller's dict is not changed

    calls = []
    monkeypatch.setattr(_yolo_step, "images_to_device", lambda b, d: calls.append("images") or b)
    step = YoloStep("cpu", augment=lambda b: calls.append("augment") or b)
    out = step.preprocess(batch)
    assert calls == ["images", "augment"]  # the images go first, the boxes with the augmentation
    assert out["img"].dtype == torch.float32


def test_cli_profiles_tunes_and_reports_on_the_cpu(yolo_data, tmp_path, capsys, monkeypatch):
    import json

    from pipeline_opt.integrations.ultralytics import _cli as _yolo_cli

    caches = []
    build = _yolo_cli.build_yolo_pipeline

    def spy(*args, **kwargs):
        pipe = build(*args, **kwargs)
        caches.append(pipe.dataset.cache)
        return pipe

    monkeypatch.setattr(_yolo_cli, "build_yolo_pipeline", spy)
    out = tmp_path / "cli"
    argv = ["--data", str(yolo_data), "--imgsz", "32", "--batch", "4", "--workers", "1", "--device", "cpu",
            "--budget", "2", "--steps", "2", "--warmup", "1", "--no-gpu-augment", "--shared-slots", "--cache", "ram",
            "--out", str(out)]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "before = ultralytics as built" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["before_throughput"] > 0 and summary["after_throughput"] > 0 and summary["cache"] == "ram"
    assert caches == ["ram", "ram"]  # the before and the after pipeline read decoded images from memory
    assert summary["config"]["shared_slots"] is False  # not tried on the CPU, and the tuning says why:
    tuned = json.loads((out / "tune" / "tune.json").read_text())
    assert any(line.startswith("shared_slots: device is cpu") for line in tuned["not_tried"])
    assert (out / "before" / "report.json").is_file() and (out / "after" / "report.json").is_file()


def test_decode_advice_recognises_an_ultralytics_training_set_and_its_cache(yolo_data):
    from pipeline_opt.profile.decode_advice import decode_advice

    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu")
    try:
        text = decode_advice(pipe.loader)
        assert "cache='ram'" in text and "for 16 images at imgsz=32" in text
    finally:
        pipe.close()
    cached = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", cache="ram")
    try:
        assert decode_advice(cached.loader) == ""
    finally:
        cached.close()


def test_the_gpu_augmentation_leaves_mosaic_format_and_the_collate_function_as_ultralytics_built_them(yolo_data):
    """Only the silenced stages change: the workers hand over ultralytics' own channel-first RGB batches."""
    from ultralytics.data.augment import Format, Mosaic

    from pipeline_opt.integrations.ultralytics._internals import is_ultralytics_collate_fn

    pipe = build_yolo_pipeline(yolo_data, imgsz=64, batch=4, workers=1, device="cpu", gpu_augment="force",
                               gpu_affine="force")
    try:
        assert set(pipe.cpu_stages_disabled) == {"RandomHSV", "RandomFlip(horizontal)", "RandomPerspective"}
        for t in iter_transforms(pipe.dataset.transforms):
            if isinstance(t, (Format, Mosaic)):
                assert not {"_format_img", "apply_image", "get_params"} & set(vars(t)), type(t).__name__
        assert is_ultralytics_collate_fn(pipe.loader.collate_fn)
        batch = next(iter(pipe.loader))
        assert batch["img"].shape == (4, 3, 64, 64) and batch["img"].dtype == torch.uint8
    finally:
        pipe.close()
