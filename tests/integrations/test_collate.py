"""The collate helpers shared slots use: ultralytics' batch around images stacked elsewhere, the same batch."""

from __future__ import annotations

import pytest
import torch

from pipeline_opt.integrations.ultralytics._collate import collate_around, stackable_images
from pipeline_opt.integrations.ultralytics._internals import is_ultralytics_collate_fn
from pipeline_opt.loading.batch_formats import find_collate

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


def test_collating_around_stacked_images_gives_ultralytics_batch():
    samples = _samples()
    images = stackable_images(samples)
    assert images is not None and len(images) == 4
    got, want = collate_around(COLLATE, samples, torch.stack(images)), COLLATE(_samples())
    _assert_same_batch(got, want)
    assert got["img"].shape == (4, 8, 8, 3) and got["batch_idx"].tolist() == [0, 1, 1, 2, 2, 2, 3]


def test_images_that_cannot_be_stacked_are_left_to_ultralytics():
    mixed = _samples(2) + _samples(1, shape=(4, 8, 3))
    assert stackable_images(mixed) is None
    assert stackable_images([{"cls": 1}]) is None and stackable_images([]) is None
    assert stackable_images([(torch.zeros(2), 0)]) is None  # not ultralytics' dict samples


def test_ultralytics_collate_is_recognised_and_a_wrapper_found_under_others():
    class Wrapper:  # collate wrappers (the profiler's, shared slots') keep the function they wrap
        def __init__(self, collate_fn):
            self.collate_fn = collate_fn

    class Slot(Wrapper):
        pass

    assert is_ultralytics_collate_fn(COLLATE) and not is_ultralytics_collate_fn(torch.stack)
    slot = Slot(COLLATE)
    assert find_collate(Wrapper(Wrapper(slot)), Slot) is slot and find_collate(slot, Slot) is slot
    assert find_collate(Wrapper(COLLATE), Slot) is None and find_collate(None, Slot) is None
