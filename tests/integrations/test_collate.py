"""ultralytics' collate with the images stacked into shared memory in a worker: the same batches."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from pipeline_opt.integrations.ultralytics import _collate
from pipeline_opt.integrations.ultralytics._collate import (
    SharedImageCollate,
    install_shared_image_collate,
    is_ultralytics_collate,
    stackable_images,
)

ultralytics_dataset = pytest.importorskip("ultralytics.data.dataset")
COLLATE = ultralytics_dataset.YOLODataset.collate_fn


def _samples(n=4, size=8, shape=None):
    out = []
    for i in range(n):
        k = 1 + i % 3
        img = torch.full(shape or (size, size, 3), i, dtype=torch.uint8)
        out.append({"img": img, "cls": torch.full((k, 1), float(i)), "bboxes": torch.full((k, 4), 0.1 * i),
                    "batch_idx": torch.zeros(k), "im_file": f"im{i}.jpg", "ori_shape": (size, size)})
    return out


def _assert_same_batch(got, want):
    assert list(got) == list(want)  # the keys in ultralytics' (sorted) order
    for k, v in want.items():
        assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k


def test_in_a_worker_the_images_are_stacked_into_shared_memory(monkeypatch):
    wrapped = SharedImageCollate(COLLATE)
    assert not wrapped(_samples())["img"].is_shared()  # the training process: the function as it is
    for module in (_collate, torch.utils.data):  # as in a DataLoader worker (default_collate asks torch's)
        monkeypatch.setattr(module, "get_worker_info", lambda: object())
    got, want = wrapped(_samples()), COLLATE(_samples())
    _assert_same_batch(got, want)
    assert got["img"].is_shared() and not want["img"].is_shared()
    assert got["img"].shape == (4, 8, 8, 3) and got["batch_idx"].tolist() == [0, 1, 1, 2, 2, 2, 3]


def test_images_that_cannot_be_stacked_are_left_to_ultralytics(monkeypatch):
    monkeypatch.setattr(_collate, "get_worker_info", lambda: object())
    mixed = _samples(2) + _samples(1, shape=(4, 8, 3))
    assert stackable_images(mixed) is None
    with pytest.raises(RuntimeError):  # torch.stack's own error, from ultralytics' function
        SharedImageCollate(COLLATE)(mixed)
    assert stackable_images([{"cls": 1}]) is None and stackable_images([]) is None
    assert stackable_images([(torch.zeros(2), 0)]) is None  # not ultralytics' dict samples


def test_real_workers_deliver_the_same_batches():
    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            k = 1 + i % 3
            return {"img": torch.full((16, 16, 3), i, dtype=torch.uint8), "cls": torch.full((k, 1), float(i)),
                    "bboxes": torch.full((k, 4), 0.01 * i), "batch_idx": torch.zeros(k), "im_file": f"{i}.jpg"}

    def batches(collate):
        return list(DataLoader(Samples(), batch_size=4, num_workers=2, collate_fn=collate))

    want, got = batches(COLLATE), batches(SharedImageCollate(COLLATE))
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        _assert_same_batch(a, b)


def test_install_only_on_an_unstarted_loader_with_ultralytics_collate(monkeypatch):
    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return _samples(4)[i]

    loader = DataLoader(Samples(), batch_size=2, collate_fn=COLLATE)
    assert install_shared_image_collate(loader) and isinstance(loader.collate_fn, SharedImageCollate)
    assert not install_shared_image_collate(loader)  # once
    assert is_ultralytics_collate(loader.collate_fn) and not is_ultralytics_collate(torch.stack)
    assert not install_shared_image_collate(DataLoader(Samples(), batch_size=2))  # torch's default_collate
    started = DataLoader(Samples(), batch_size=2, collate_fn=COLLATE)
    started.iterator = iter(started)  # ultralytics' InfiniteDataLoader keeps its running iterator here
    assert not install_shared_image_collate(started) and started.collate_fn is COLLATE
    with pytest.raises(TypeError, match="must be callable"):
        SharedImageCollate(None)
