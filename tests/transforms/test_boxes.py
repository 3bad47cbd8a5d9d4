"""Box formats, clipping, candidate filtering and the BatchBoxes container."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_opt.transforms.boxes import (
    BatchBoxes,
    box_candidates,
    clip_xyxy,
    degenerate_mask,
    xywhn_to_xyxy,
    xyxy_to_xywhn,
)

SIZE = (240, 320)  # H, W


def _random_xyxy(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * torch.tensor([300.0, 220.0])
    wh = torch.rand(n, 2, generator=g) * 60 + 1
    return torch.cat((xy, xy + wh), 1)


def test_format_round_trip_and_known_values():
    xyxy = torch.tensor([[32.0, 24.0, 96.0, 120.0]])
    xywhn = xyxy_to_xywhn(xyxy, SIZE)
    torch.testing.assert_close(xywhn, torch.tensor([[64 / 320, 72 / 240, 64 / 320, 96 / 240]]))
    boxes = _random_xyxy(50)
    torch.testing.assert_close(xywhn_to_xyxy(xyxy_to_xywhn(boxes, SIZE), SIZE), boxes)


def test_clip_keeps_boxes_inside_the_image():
    boxes = torch.tensor([[-10.0, -5.0, 50.0, 300.0], [310.0, 10.0, 400.0, 20.0]])
    clipped = clip_xyxy(boxes, SIZE)
    torch.testing.assert_close(clipped, torch.tensor([[0.0, 0.0, 50.0, 240.0], [310.0, 10.0, 320.0, 20.0]]))


def test_box_candidates_match_ultralytics():
    augment = pytest.importorskip("ultralytics.data.augment")
    before = _random_xyxy(200, seed=1)
    # shrink, squash or keep boxes to hit every criterion of the filter
    g = torch.Generator().manual_seed(2)
    factors = torch.rand(200, 2, generator=g) * 1.2
    after = before.clone()
    after[:, 2:] = after[:, :2] + (before[:, 2:] - before[:, :2]) * factors
    ours = box_candidates(before, after)
    ref = augment.RandomPerspective.box_candidates(before.numpy().T, after.numpy().T)
    assert ours.tolist() == ref.tolist()
    assert 0 < int(ours.sum()) < 200  # the test data exercises both outcomes


def test_degenerate_mask_flags_empty_and_small_boxes():
    boxes = torch.tensor(
        [[0.0, 0.0, 5.0, 5.0], [3.0, 3.0, 3.0, 9.0], [1.0, 1.0, 2.5, 9.0], [4.0, 4.0, 2.0, 9.0]]
    )
    assert degenerate_mask(boxes).tolist() == [False, True, False, True]
    assert degenerate_mask(boxes, min_size=2.0).tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="min_size"):
        degenerate_mask(boxes, min_size=-1)


def test_batch_boxes_select_keeps_rows_aligned():
    boxes = _random_xyxy(6)
    bb = BatchBoxes(boxes, torch.tensor([0, 0, 1, 1, 2, 2.0]), torch.arange(6.0).view(-1, 1))
    sub = bb.select(torch.tensor([True, False, True, False, False, True]))
    assert sub.cls.view(-1).tolist() == [0.0, 2.0, 5.0]
    assert sub.batch_idx.tolist() == [0.0, 1.0, 2.0]
    torch.testing.assert_close(sub.boxes, boxes[[0, 2, 5]])
    assert sub.sample_index.dtype == torch.int64


def test_batch_boxes_formats_clip_and_drop():
    xyxy = torch.tensor([[-20.0, 10.0, 40.0, 50.0], [330.0, 0.0, 400.0, 10.0]])
    bb = BatchBoxes(xyxy_to_xywhn(xyxy, SIZE), torch.zeros(2), fmt="xywhn")
    torch.testing.assert_close(bb.xyxy(SIZE), xyxy)
    clipped = bb.clip(SIZE)
    assert clipped.fmt == "xywhn"
    torch.testing.assert_close(
        clipped.xyxy(SIZE), torch.tensor([[0.0, 10.0, 40.0, 50.0], [320.0, 0.0, 320.0, 10.0]])
    )
    kept = clipped.drop_degenerate(SIZE)
    assert len(kept) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"boxes": torch.zeros(3, 5), "batch_idx": torch.zeros(3)}, r"\(N, 4\)"),
        ({"boxes": torch.zeros(3, 4), "batch_idx": torch.zeros(2)}, "row-aligned"),
        ({"boxes": torch.zeros(3, 4), "batch_idx": torch.zeros(3), "fmt": "cxcywh"}, "fmt="),
        ({"boxes": torch.zeros(3, 4), "batch_idx": torch.zeros(3), "cls": torch.zeros(2, 1)}, "cls"),
    ],
)
def test_batch_boxes_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchBoxes(**kwargs)


def test_batch_boxes_rejects_non_tensor():
    with pytest.raises(TypeError, match="torch.Tensor"):
        BatchBoxes(np.zeros((2, 4)), torch.zeros(2))  # type: ignore[arg-type]
