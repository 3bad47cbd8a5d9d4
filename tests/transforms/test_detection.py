"""DetectionGPUAugment on ultralytics-style batch dicts, against ultralytics' CPU transforms."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline_opt.transforms.boxes import xywhn_to_xyxy, xyxy_to_xywhn
from pipeline_opt.transforms.detection import DetectionGPUAugment

ua = pytest.importorskip("ultralytics.data.augment")
from ultralytics.utils.instance import Instances  # noqa: E402

S = 160
RECTS = [(20, 30, 60, 70), (100, 20, 140, 110), (40, 120, 150, 150)]
COLORS = [(250, 20, 20), (20, 250, 20), (20, 20, 250)]
NO_HSV = {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}


def _scene() -> torch.Tensor:
    img = torch.full((3, S, S), 90, dtype=torch.uint8)
    for (x1, y1, x2, y2), c in zip(RECTS, COLORS):
        img[:, y1:y2, x1:x2] = torch.tensor(c, dtype=torch.uint8).view(3, 1, 1)
    return img


def _batch(n: int) -> dict:
    """n copies of the scene, collated like ultralytics (RGB uint8, normalised xywh, float batch_idx)."""
    xyxy = torch.tensor(RECTS, dtype=torch.float32)
    return {
        "img": _scene().unsqueeze(0).repeat(n, 1, 1, 1),
        "bboxes": xyxy_to_xywhn(xyxy, (S, S)).repeat(n, 1),
        "cls": torch.arange(3.0).repeat(n).view(-1, 1),
        "batch_idx": torch.arange(n).repeat_interleave(3).float(),
        "im_file": [f"img{i}.jpg" for i in range(n)],
    }


def _pixel_box(img: torch.Tensor, color) -> tuple[float, float, float, float] | None:
    diff = (img.int() - torch.tensor(color).view(3, 1, 1)).abs().amax(0)
    ys, xs = torch.nonzero(diff <= 40, as_tuple=True)
    if not len(xs):
        return None
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def test_from_hyp_reads_ultralytics_args():
    from ultralytics.cfg import get_cfg

    args = get_cfg(overrides={"hsv_h": 0.02, "fliplr": 0.25, "degrees": 7.0, "flipud": 0.1})
    aug = DetectionGPUAugment.from_hyp(args)
    assert aug.hsv.gains == (0.02, 0.7, 0.4)
    assert aug.fliplr.p == 0.25 and aug.flipud.p == 0.1
    assert aug.affine.degrees == 7.0 and aug.affine.translate == 0.1 and aug.affine.scale_range == (0.5, 1.5)
    assert DetectionGPUAugment.from_hyp(args, affine=False).affine.is_identity
    partial = DetectionGPUAugment.from_hyp({"hsv_v": 0.1, "scale": [0.8, 1.2]})
    assert partial.hsv.gains == (0.015, 0.7, 0.1) and partial.affine.scale_range == (0.8, 1.2)
    assert DetectionGPUAugment.from_hyp(SimpleNamespace(fliplr=0.0)).fliplr.p == 0.0
    with pytest.raises(TypeError, match="namespace"):
        DetectionGPUAugment.from_hyp(None)


def test_batch_contract_is_kept():
    batch = _batch(4)
    original = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    out = DetectionGPUAugment(degrees=10, seed=0)(batch)
    assert out["img"].dtype == torch.uint8 and out["img"].shape == batch["img"].shape
    n = out["bboxes"].shape[0]
    assert out["cls"].shape == (n, 1) and out["batch_idx"].shape == (n,)
    assert out["batch_idx"].dtype == batch["batch_idx"].dtype
    assert ((out["bboxes"] >= 0) & (out["bboxes"] <= 1)).all()
    xyxy = xywhn_to_xyxy(out["bboxes"], (S, S))
    assert (xyxy[:, 2:] > xyxy[:, :2]).all()  # no empty box survives
    assert out["im_file"] == batch["im_file"]
    for k, v in original.items():  # the input batch is untouched
        assert torch.equal(batch[k], v) if isinstance(v, torch.Tensor) else batch[k] == v


def test_horizontal_flip_only():
    batch = _batch(3)
    out = DetectionGPUAugment(fliplr=1.0, translate=0.0, scale=0.0, **NO_HSV, seed=0)(batch)
    assert torch.equal(out["img"], batch["img"].flip(-1))
    expected = batch["bboxes"].clone()
    expected[:, 0] = 1 - expected[:, 0]
    torch.testing.assert_close(out["bboxes"], expected)
    assert torch.equal(out["cls"], batch["cls"])


def test_labels_stay_with_their_pixels():
    n = 8
    aug = DetectionGPUAugment(
        fliplr=0.5, flipud=0.5, degrees=10, translate=0.1, scale=0.3, shear=2, **NO_HSV, seed=3
    )
    out = aug(_batch(n))
    assert out["bboxes"].shape[0] >= n  # most boxes survive these mild warps
    for box, i, k in zip(
        xywhn_to_xyxy(out["bboxes"], (S, S)), out["batch_idx"].long(), out["cls"].view(-1).long()
    ):
        px = _pixel_box(out["img"][i], COLORS[k])
        assert px is not None, f"class {k} kept in sample {i} but its pixels are gone"
        assert px[0] >= box[0] - 1 and px[1] >= box[1] - 1 and px[2] <= box[2] + 1 and px[3] <= box[3] + 1


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.sort(np.concatenate((a, b)))
    cdf = lambda x: np.searchsorted(np.sort(x), grid, side="right") / len(x)  # noqa: E731
    return float(np.abs(cdf(a) - cdf(b)).max())


def test_box_distribution_matches_ultralytics_cpu():
    """Same hyperparameters, many draws: ultralytics' CPU affine + flip vs the GPU batch version."""
    hyp = {"degrees": 10.0, "translate": 0.1, "scale": 0.5, "shear": 2.0, "fliplr": 0.5}
    n = 600
    ks_critical = 1.95 * (2 / n) ** 0.5  # two-sample KS at alpha = 0.001
    scene = np.ascontiguousarray(_scene().permute(1, 2, 0).numpy()[..., ::-1])  # BGR, as in the dataset
    xywhn = xyxy_to_xywhn(torch.tensor(RECTS, dtype=torch.float32), (S, S)).numpy()
    random.seed(0)
    affine = ua.RandomPerspective(degrees=10.0, translate=0.1, scale=0.5, shear=2.0, size=(S, S))
    flip = ua.RandomFlip(p=0.5, direction="horizontal")
    cpu = []
    for _ in range(n):
        labels = {
            "img": scene.copy(),
            "cls": np.arange(3.0).reshape(-1, 1),
            "instances": Instances(xywhn.copy(), bbox_format="xywh", normalized=True),
        }
        labels = flip(affine(labels))
        inst = labels["instances"]
        inst.convert_bbox("xywh")
        cpu += [(k, *b) for k, b in zip(labels["cls"].reshape(-1), inst.bboxes / S)]
    out = DetectionGPUAugment(**hyp, **NO_HSV, seed=0)(_batch(n))
    gpu = torch.cat((out["cls"], out["bboxes"]), 1).numpy()
    cpu = np.array(cpu)
    for k in range(3):
        a, b = cpu[cpu[:, 0] == k], gpu[gpu[:, 0] == k]
        assert abs(len(a) - len(b)) < 0.1 * n, f"class {k}: survival {len(a)} (cpu) vs {len(b)} (gpu)"
        for col, name in ((1, "cx"), (2, "cy"), (3, "w"), (4, "h")):
            assert _ks(a[:, col], b[:, col]) < ks_critical, f"class {k} {name}"


def test_seeded_and_per_sample():
    a = DetectionGPUAugment(degrees=5, seed=7)(_batch(4))
    b = DetectionGPUAugment(degrees=5, seed=7)(_batch(4))
    assert torch.equal(a["img"], b["img"]) and torch.equal(a["bboxes"], b["bboxes"])
    assert len({a["img"][i].float().mean().item() for i in range(4)}) == 4


def test_empty_and_missing_labels():
    batch = _batch(2)
    batch.update(bboxes=torch.zeros(0, 4), cls=torch.zeros(0, 1), batch_idx=torch.zeros(0))
    out = DetectionGPUAugment(seed=0)(batch)
    assert out["bboxes"].shape == (0, 4) and out["cls"].shape == (0, 1)
    out = DetectionGPUAugment(seed=0)({"img": batch["img"]})
    assert out["bboxes"].shape == (0, 4)
    with pytest.raises(ValueError, match="batch_idx"):
        DetectionGPUAugment(seed=0)({"img": batch["img"], "bboxes": torch.zeros(2, 4)})


def test_refuses_keypoints_under_geometric_augmentation():
    batch = _batch(2)
    batch["keypoints"] = torch.zeros(6, 17, 3)
    with pytest.raises(ValueError, match="keypoints"):
        DetectionGPUAugment(seed=0)(batch)
    colour_only = DetectionGPUAugment.from_hyp({"fliplr": 0.0}, affine=False, seed=0)
    assert torch.equal(colour_only(batch)["keypoints"], batch["keypoints"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    hyp = {"degrees": 10.0, "translate": 0.1, "scale": 0.5, "shear": 2.0, "fliplr": 0.5, "seed": 1}
    cpu = DetectionGPUAugment(**hyp)(_batch(8))
    gpu_batch = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in _batch(8).items()}
    gpu = DetectionGPUAugment(**hyp)(gpu_batch)
    assert gpu["img"].is_cuda and gpu["img"].dtype == torch.uint8
    assert (gpu["img"].cpu().int() - cpu["img"].int()).abs().max() <= 1
    assert torch.equal(gpu["cls"].cpu(), cpu["cls"]) and torch.equal(gpu["batch_idx"].cpu(), cpu["batch_idx"])
    torch.testing.assert_close(gpu["bboxes"].cpu(), cpu["bboxes"], atol=1e-5, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_warp_with_boxes_on_the_cpu_never_waits_for_the_device_and_matches_the_device_path():
    hyp = {"degrees": 10.0, "translate": 0.1, "scale": 0.5, "shear": 2.0, "fliplr": 0.5, "flipud": 0.5}
    on_device = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in _batch(8).items()}
    images_only = dict(_batch(8), img=on_device["img"])  # what the step hands over: boxes still on the CPU
    DetectionGPUAugment(**hyp, seed=3)(images_only)  # first call: kernels compiled, staging buffers made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = DetectionGPUAugment(**hyp, seed=3)(images_only)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = DetectionGPUAugment(**hyp, seed=3)(on_device)  # filtered on the device (waits once per mask)
    assert all(out[k].is_cuda for k in ("img", "bboxes", "cls", "batch_idx"))
    assert torch.equal(out["img"], ref["img"])
    assert torch.equal(out["cls"], ref["cls"]) and torch.equal(out["batch_idx"], ref["batch_idx"])
    torch.testing.assert_close(out["bboxes"], ref["bboxes"], atol=1e-5, rtol=0)
