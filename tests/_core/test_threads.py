"""Tests for pipeline_opt._core.threads: small CPU tensor work without the intra-op pool."""

from __future__ import annotations

import threading

import pytest
import torch

import pipeline_opt.transforms.affine as affine_module
from pipeline_opt._core.threads import single_intra_op_thread
from pipeline_opt.transforms.augment import RandomPerspective
from pipeline_opt.transforms.boxes import BatchBoxes
from pipeline_opt.transforms.detection import DetectionGPUAugment


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_the_block_runs_with_one_thread_and_the_count_comes_back(two_threads):
    with single_intra_op_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_the_count_comes_back_after_an_error(two_threads):
    with pytest.raises(RuntimeError, match="boom"), single_intra_op_thread():
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_other_threads_keep_their_count(two_threads):
    inside, seen = threading.Event(), {}

    def hold() -> None:
        with single_intra_op_thread():
            inside.set()
            release.wait(5)

    release = threading.Event()
    worker = threading.Thread(target=hold)
    worker.start()
    assert inside.wait(5)
    seen["main"] = torch.get_num_threads()
    release.set()
    worker.join(5)
    assert seen["main"] == 2


def _boxes(n_images: int, n_boxes: int) -> BatchBoxes:
    g = torch.Generator().manual_seed(0)
    return BatchBoxes(torch.rand(n_boxes, 4, generator=g) * 0.3 + 0.2,
                      torch.randint(0, n_images, (n_boxes,), generator=g).float(), torch.zeros(n_boxes, 1),
                      fmt="xywhn")


def test_the_affine_box_math_runs_on_one_thread_and_the_image_warp_keeps_the_pool(two_threads, monkeypatch):
    counts: dict[str, int] = {}
    real_candidates, real_warp = affine_module.box_candidates, affine_module._warp

    def candidates(*a, **k):
        counts["boxes"] = torch.get_num_threads()
        return real_candidates(*a, **k)

    def warp(*a, **k):
        counts["warp"] = torch.get_num_threads()
        return real_warp(*a, **k)

    monkeypatch.setattr(affine_module, "box_candidates", candidates)
    monkeypatch.setattr(affine_module, "_warp", warp)
    aug = RandomPerspective(degrees=5.0, translate=0.1, scale=0.5, seed=0)
    images = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)
    out, boxes = aug(images, _boxes(4, 12))
    assert counts == {"boxes": 1, "warp": 2}  # CPU images keep their parallel warp
    assert out.shape == images.shape and len(boxes) <= 12


def test_the_detection_augment_moves_boxes_on_one_thread(two_threads, monkeypatch):
    counts: list[int] = []
    real = BatchBoxes.clip

    def clip(self, size):
        counts.append(torch.get_num_threads())
        return real(self, size)

    monkeypatch.setattr(BatchBoxes, "clip", clip)
    aug = DetectionGPUAugment(degrees=5.0, seed=0)
    boxes = _boxes(4, 12)
    batch = {"img": torch.zeros(4, 3, 32, 32, dtype=torch.uint8), "bboxes": boxes.boxes,
             "batch_idx": boxes.batch_idx, "cls": boxes.cls}
    out = aug(batch)
    assert counts and set(counts) == {1}
    assert torch.get_num_threads() == 2
    assert out["bboxes"].shape[0] == out["cls"].shape[0] == out["batch_idx"].shape[0]
