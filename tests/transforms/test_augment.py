"""GPU batch augmentations against ultralytics' CPU originals, with boxes.

Tolerances (documented in pipeline_opt/transforms/flip.py, hsv.py and affine.py):
* flips: exact.
* HSV: max 1/255; at most 0.1% of values differ on rows whose width is a multiple of 64 (OpenCV's
  vectorised HSV2RGB fuses a multiply-add), more on other widths (OpenCV's scalar row tail rounds).
* affine / perspective with the same matrix: max 2/255, mean below 0.05/255 against cv2.warpAffine.
"""

from __future__ import annotations

import copy
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline_opt.transforms.augment import (
    AffineParams,
    FlipParams,
    HSVParams,
    RandomAffine,
    RandomHorizontalFlip,
    RandomHSV,
    RandomPerspective,
    RandomVerticalFlip,
    affine_matrices,
    hsv_to_rgb_u8,
    rgb_to_hsv_u8,
)
from pipeline_opt.transforms.boxes import BatchBoxes, xyxy_to_xywhn

cv2 = pytest.importorskip("cv2")
ua = pytest.importorskip("ultralytics.data.augment")
from ultralytics.utils.instance import Instances  # noqa: E402

HSV_GAINS = (0.015, 0.7, 0.4)


@pytest.fixture(scope="module")
def bgr_image() -> np.ndarray:
    """A real photo (ultralytics' bus.jpg), 256 wide x 320 high, BGR uint8 as ultralytics holds it."""
    path = Path(ua.__file__).parents[1] / "assets" / "bus.jpg"
    img = cv2.imread(str(path))
    assert img is not None, f"cannot read {path}"
    return cv2.resize(img, (256, 320), interpolation=cv2.INTER_AREA)


def _to_batch(bgr: np.ndarray) -> torch.Tensor:
    """BGR HWC numpy -> RGB (1, 3, H, W) uint8 tensor, as ultralytics' Format + collate produce."""
    return torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1])).permute(2, 0, 1).unsqueeze(0).contiguous()


def _to_bgr(batch: torch.Tensor, i: int = 0) -> np.ndarray:
    return np.ascontiguousarray(batch[i].permute(1, 2, 0).numpy()[..., ::-1])


def _rect_image(h: int, w: int, rects: list[tuple[int, int, int, int]], color=(250, 20, 20)) -> torch.Tensor:
    img = torch.full((3, h, w), 90, dtype=torch.uint8)
    for x1, y1, x2, y2 in rects:
        img[:, y1:y2, x1:x2] = torch.tensor(color, dtype=torch.uint8).view(3, 1, 1)
    return img


def _pixel_box(img: torch.Tensor, color=(250, 20, 20), tol: int = 40) -> tuple[float, float, float, float]:
    """Continuous xyxy extent of the pixels close to ``color`` in a (3, H, W) image."""
    diff = (img.int() - torch.tensor(color).view(3, 1, 1)).abs().amax(0)
    ys, xs = torch.nonzero(diff <= tol, as_tuple=True)
    assert len(xs), "the coloured rectangle vanished"
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


# ---------------------------------------------------------------------------------------------- flips
def test_flip_is_torch_flip_and_mirrors_boxes():
    images = torch.randint(0, 256, (4, 3, 20, 30), dtype=torch.uint8)
    xyxy = torch.tensor([[1.0, 2.0, 11.0, 7.0], [0.0, 0.0, 30.0, 20.0], [5.0, 5.0, 6.0, 6.0]])
    boxes = BatchBoxes(xyxy, torch.tensor([0.0, 1.0, 2.0]), torch.tensor([[3.0], [4.0], [5.0]]))
    params = FlipParams(torch.tensor([True, False, True, False]))
    out, moved = RandomHorizontalFlip().apply(images, params, boxes)
    assert torch.equal(out[0], images[0].flip(-1)) and torch.equal(out[2], images[2].flip(-1))
    assert torch.equal(out[1], images[1]) and torch.equal(out[3], images[3])
    expected = torch.tensor([[19.0, 2.0, 29.0, 7.0], [0.0, 0.0, 30.0, 20.0], [24.0, 5.0, 25.0, 6.0]])
    torch.testing.assert_close(moved.boxes, expected)  # x -> W - x, not Kornia's (W - 1) - x
    assert torch.equal(moved.cls, boxes.cls) and torch.equal(moved.batch_idx, boxes.batch_idx)
    # the same in normalised xywh
    out_n, moved_n = RandomHorizontalFlip().apply(
        images, params, BatchBoxes(xyxy_to_xywhn(xyxy, (20, 30)), boxes.batch_idx, fmt="xywhn")
    )
    torch.testing.assert_close(moved_n.xyxy((20, 30)), expected)


def test_vertical_flip_mirrors_y():
    images = torch.randint(0, 256, (2, 3, 20, 30), dtype=torch.uint8)
    boxes = BatchBoxes(torch.tensor([[1.0, 2.0, 11.0, 7.0]]), torch.tensor([0]))
    out, moved = RandomVerticalFlip(p=1.0).apply(images, FlipParams(torch.tensor([True, True])), boxes)
    assert torch.equal(out, images.flip(-2))
    torch.testing.assert_close(moved.boxes, torch.tensor([[1.0, 13.0, 11.0, 18.0]]))


def test_flipped_box_still_covers_the_rectangle():
    rect = (3, 10, 41, 30)
    img = _rect_image(48, 64, [rect]).unsqueeze(0)
    out, moved = RandomHorizontalFlip(p=1.0, seed=0)(
        img, BatchBoxes(torch.tensor([rect], dtype=torch.float32), torch.zeros(1))
    )
    assert moved.boxes[0].tolist() == list(_pixel_box(out[0]))


def test_flip_float_and_probability_extremes():
    images = torch.rand(3, 3, 8, 8)
    assert torch.equal(RandomHorizontalFlip(p=1.0, seed=1)(images), images.flip(-1))
    assert torch.equal(RandomHorizontalFlip(p=0.0, seed=1)(images), images)
    with pytest.raises(ValueError, match="p=1.5"):
        RandomHorizontalFlip(p=1.5)


# ------------------------------------------------------------------------------------------------ HSV
def test_rgb_to_hsv_is_bit_exact_with_opencv():
    # every (max, min) pair, with the middle channel at both ends and midway, in all 6 channel orders
    v, lo = torch.meshgrid(torch.arange(256), torch.arange(256), indexing="ij")
    v, lo = v[v >= lo], lo[v >= lo]
    cols = []
    for mid in (lo, (v + lo) // 2, v):
        for order in ((v, mid, lo), (v, lo, mid), (mid, v, lo), (lo, v, mid), (mid, lo, v), (lo, mid, v)):
            cols.append(torch.stack(order, 0))
    rgb = torch.cat(cols, 1).to(torch.uint8).view(3, 1, -1)
    ours = rgb_to_hsv_u8(rgb)
    ref = cv2.cvtColor(np.ascontiguousarray(rgb.permute(1, 2, 0).numpy()), cv2.COLOR_RGB2HSV)
    assert torch.equal(ours, torch.from_numpy(ref).permute(2, 0, 1).int())


def test_hsv_to_rgb_matches_opencv_within_one_level():
    h, s, v = torch.meshgrid(
        torch.arange(180), torch.arange(0, 256, 5), torch.arange(0, 256, 5), indexing="ij"
    )
    hsv = torch.stack((h, s, v)).reshape(3, -1, 64).to(torch.uint8)  # rows of 64 pixels
    ours = hsv_to_rgb_u8(hsv)
    ref = torch.from_numpy(
        cv2.cvtColor(np.ascontiguousarray(hsv.permute(1, 2, 0).numpy()), cv2.COLOR_HSV2RGB)
    ).permute(2, 0, 1)
    diff = (ours.int() - ref.int()).abs()
    assert int(diff.max()) <= 1
    assert float((diff > 0).float().mean()) < 1e-3


@pytest.mark.parametrize("u", [(0.3, -0.8, 0.5), (-1.0, 1.0, -1.0), (0.999, 0.05, 0.999)])
def test_hsv_matches_ultralytics_with_the_same_gains(bgr_image, u, monkeypatch):
    monkeypatch.setattr(ua.np.random, "uniform", lambda *a, **k: np.array(u))
    ref = ua.RandomHSV(*HSV_GAINS)({"img": bgr_image.copy()})["img"]
    gains = HSVParams(
        torch.tensor(u, dtype=torch.float64).view(1, 3) * torch.tensor(HSV_GAINS, dtype=torch.float64)
    )
    rgb = RandomHSV(*HSV_GAINS).apply(_to_batch(bgr_image), gains)
    diff = np.abs(_to_bgr(rgb).astype(int) - ref.astype(int))
    assert diff.max() <= 1
    assert (diff > 0).mean() < 1e-3
    # channel_order="BGR" on the OpenCV layout gives the same result
    bgr = RandomHSV(*HSV_GAINS, channel_order="BGR").apply(_to_batch(bgr_image).flip(1), gains)
    assert torch.equal(bgr.flip(1), rgb)
    # float in [0, 1] in, float out, same values
    as_float = RandomHSV(*HSV_GAINS).apply(_to_batch(bgr_image).float() / 255, gains)
    assert as_float.dtype == torch.float32
    torch.testing.assert_close(as_float, rgb.float() / 255)


def test_hsv_luts_are_ultralytics_tables_exactly():
    from pipeline_opt.transforms.augment import hsv_luts

    rng = np.random.default_rng(0)
    r = np.concatenate((rng.uniform(-1, 1, (200, 3)) * np.array(HSV_GAINS), rng.uniform(-1, 1, (200, 3)),
                        rng.uniform(-3, 3, (20, 3))))  # ultralytics' gains, hgain 1, and beyond
    r[:6] = [[-1.0, 0.0, 0.0], [1.0, -1.0, 1.0], [0.0, 0.0, 0.0], [-0.5 / 180, 0.7, -0.4],
             [-1e-17, 0.0, 0.0], [np.nextafter(-1.0, 0.0), 0.0, 0.0]]  # edges
    luts = hsv_luts(torch.from_numpy(r))
    assert luts.shape == (len(r), 3, 256) and luts.dtype == torch.uint8
    x = np.arange(256, dtype=np.float64)
    for i, ri in enumerate(r):  # ultralytics' RandomHSV.__call__, line by line
        hue = ((x + ri[0] * 180) % 180).astype(np.uint8)
        sat = np.clip(x * (ri[1] + 1), 0, 255).astype(np.uint8)
        val = np.clip(x * (ri[2] + 1), 0, 255).astype(np.uint8)
        sat[0] = 0
        assert np.array_equal(luts[i].numpy(), np.stack((hue, sat, val))), i


def _hsv_means(bgr: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV).reshape(-1, 3).mean(0)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate((a, b)))
    cdf = lambda x: np.searchsorted(np.sort(x), grid, side="right") / len(x)  # noqa: E731
    return float(np.abs(cdf(a) - cdf(b)).max())


def test_hsv_distribution_matches_ultralytics(bgr_image):
    small = cv2.resize(bgr_image, (64, 80), interpolation=cv2.INTER_AREA)
    n = 256
    np.random.seed(0)
    cpu = np.stack([_hsv_means(ua.RandomHSV(*HSV_GAINS)({"img": small.copy()})["img"]) for _ in range(n)])
    batch = _to_batch(small).repeat(n, 1, 1, 1)
    out = RandomHSV(*HSV_GAINS, seed=0)(batch)
    gpu = np.stack([_hsv_means(_to_bgr(out, i)) for i in range(n)])
    base = _hsv_means(small)
    for c in range(3):
        # KS critical value for n = m = 256 at alpha = 0.001 is 1.95 * sqrt(2 / 256) = 0.172
        assert _ks(cpu[:, c], gpu[:, c]) < 0.172, f"channel {'HSV'[c]}"
        spread = np.percentile(cpu[:, c], 90) - np.percentile(cpu[:, c], 10)
        assert spread > 0
        for q in (10, 50, 90):
            assert (
                abs(np.percentile(cpu[:, c] - base[c], q) - np.percentile(gpu[:, c] - base[c], q))
                < 0.15 * spread + 0.5
            )


def test_hsv_is_per_sample_and_seeded(bgr_image):
    batch = _to_batch(cv2.resize(bgr_image, (32, 40))).repeat(6, 1, 1, 1)
    a = RandomHSV(*HSV_GAINS, seed=3)(batch)
    b = RandomHSV(*HSV_GAINS, seed=3)(batch)
    c = RandomHSV(*HSV_GAINS, seed=4)(batch)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len({a[i].float().mean().item() for i in range(6)}) == 6  # each sample drew its own gains
    params = RandomHSV(*HSV_GAINS, seed=3).sample_params(6)
    assert params.gains.shape == (6, 3)
    assert (params.gains.abs() <= torch.tensor(HSV_GAINS, dtype=torch.float64)).all()


def test_hsv_passes_through_when_it_has_nothing_to_do():
    gray = torch.randint(0, 256, (2, 1, 8, 8), dtype=torch.uint8)
    assert torch.equal(RandomHSV(seed=0)(gray), gray)
    rgb = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    assert torch.equal(RandomHSV(0, 0, 0, seed=0)(rgb), rgb)
    with pytest.raises(ValueError, match="channel_order"):
        RandomHSV(channel_order="RBG")


# --------------------------------------------------------------------------------------------- affine
def _ultralytics_params(bgr: np.ndarray, seed: int, **kw) -> tuple[dict, ua.RandomPerspective]:
    random.seed(seed)
    rp = ua.RandomPerspective(**kw)
    return rp.get_params({"img": bgr}), rp


def _ours(params: dict, h: int, w: int, perspective: bool) -> AffineParams:
    return AffineParams(
        torch.tensor(params["M"], dtype=torch.float64).unsqueeze(0),
        torch.tensor([params["scale"]], dtype=torch.float64),
        (int(params["size"][1]), int(params["size"][0])),
        perspective,
    )


@pytest.mark.parametrize(
    "seed, kw",
    [
        (1, {"degrees": 10, "translate": 0.1, "scale": 0.5, "shear": 5}),
        (2, {"degrees": 0, "translate": 0.2, "scale": 0.3}),
        (3, {"degrees": 20, "translate": 0.1, "scale": 0.2, "shear": 3, "perspective": 0.0005}),
        (4, {"degrees": 5, "translate": 0.1, "scale": 0.5, "size": (192, 160)}),
    ],
)
def test_warp_matches_ultralytics_pixels_and_boxes(bgr_image, seed, kw):
    h, w = bgr_image.shape[:2]
    params, rp = _ultralytics_params(bgr_image, seed, **kw)
    # pixels
    ref = rp.apply_image({"img": bgr_image.copy()}, params)["img"]
    module = RandomPerspective(perspective=kw.get("perspective", 0.0))
    ours = module.apply(_to_batch(bgr_image), _ours(params, h, w, bool(kw.get("perspective"))))
    diff = np.abs(_to_bgr(ours).astype(int) - ref.astype(int))
    assert ours.shape[-2:] == ref.shape[:2]
    assert diff.max() <= 2 and diff.mean() < 0.05
    # boxes: transformed, clipped and filtered like ultralytics
    g = np.random.default_rng(seed)
    xy = g.uniform(0, [w - 10, h - 10], (40, 2))
    xyxy = np.concatenate((xy, np.minimum(xy + g.uniform(2, 90, (40, 2)), [w, h])), 1).astype(np.float32)
    labels = {
        "img": bgr_image,
        "cls": np.arange(40, dtype=np.float32).reshape(-1, 1),
        "instances": Instances(xyxy.copy(), bbox_format="xyxy", normalized=False),
    }
    out = rp.apply_instances(labels, params)
    ref_boxes, ref_cls = out["instances"].bboxes, out["cls"]
    boxes = BatchBoxes(torch.from_numpy(xyxy), torch.zeros(40), torch.arange(40.0).view(-1, 1))
    _, moved = module.apply(_to_batch(bgr_image), _ours(params, h, w, bool(kw.get("perspective"))), boxes)
    assert moved.cls.view(-1).tolist() == ref_cls.reshape(-1).tolist()
    np.testing.assert_allclose(moved.boxes.numpy(), ref_boxes, atol=1e-3)


def test_matrix_is_built_like_ultralytics(bgr_image, monkeypatch):
    draws = iter([0.0004, -0.0003, 12.0, 1.3, 4.0, -2.0, 0.55, 0.43])
    monkeypatch.setattr(ua.random, "uniform", lambda a, b: next(draws))
    ref, _ = ua.RandomPerspective(degrees=1)._compute_affine_matrix(bgr_image, (200, 180))
    v = [torch.tensor([x], dtype=torch.float64) for x in (12.0, 1.3, 4.0, -2.0, 0.55, 0.43, 0.0004, -0.0003)]
    ours = affine_matrices(bgr_image.shape[:2], (180, 200), *v)[0]
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-4)


def test_sampled_ranges_are_per_sample_and_seeded():
    module = RandomPerspective(degrees=10, translate=0.1, scale=0.5, shear=2, seed=5)
    p = module.sample_params(64, (100, 120))
    assert p.matrix.shape == (64, 3, 3) and len(set(p.scale.tolist())) == 64
    assert ((p.scale >= 0.5) & (p.scale <= 1.5)).all()
    q = RandomPerspective(degrees=10, translate=0.1, scale=0.5, shear=2, seed=5).sample_params(64, (100, 120))
    assert torch.equal(p.matrix, q.matrix)
    # the centre of the input lands within +-translate of the output centre
    centre = p.matrix @ torch.tensor([60.0, 50.0, 1.0], dtype=torch.float64)
    assert (centre[:, 0] - 60).abs().max() <= 12 + 1e-9 and (centre[:, 1] - 50).abs().max() <= 10 + 1e-9


def test_boxes_move_with_the_pixels_under_affine():
    rects = [(20, 30, 60, 70), (100, 20, 140, 110), (40, 120, 150, 150)]
    colors = [(250, 20, 20), (20, 250, 20), (20, 20, 250)]
    img = torch.full((3, 160, 160), 90, dtype=torch.uint8)
    for (x1, y1, x2, y2), c in zip(rects, colors):
        img[:, y1:y2, x1:x2] = torch.tensor(c, dtype=torch.uint8).view(3, 1, 1)
    n = 6
    batch = img.unsqueeze(0).repeat(n, 1, 1, 1)
    boxes = BatchBoxes(
        torch.tensor(rects, dtype=torch.float32).repeat(n, 1),
        torch.arange(n).repeat_interleave(3).float(),
        torch.arange(3.0).repeat(n).view(-1, 1),
    )
    out, moved = RandomPerspective(degrees=15, translate=0.05, scale=0.2, shear=3, seed=11)(batch, boxes)
    assert len(moved) > 0
    for box, i, k in zip(moved.boxes, moved.sample_index, moved.cls.view(-1).long()):
        px = _pixel_box(out[i], colors[k])
        # the box encloses its object's pixels (to within one pixel of interpolation) and is tight
        # for a box that was not clipped
        assert px[0] >= box[0] - 1 and px[1] >= box[1] - 1 and px[2] <= box[2] + 1 and px[3] <= box[3] + 1
        inner = (box[0] > 1) & (box[1] > 1) & (box[2] < 159) & (box[3] < 159)
        if inner:
            assert max(abs(a - b) for a, b in zip(px, box.tolist())) <= 2.0


def test_boxes_clipped_and_degenerate_dropped():
    img = torch.zeros(2, 3, 100, 100, dtype=torch.uint8)
    shift = torch.eye(3, dtype=torch.float64).repeat(2, 1, 1)
    shift[:, 0, 2] = torch.tensor([70.0, 0.0])  # sample 0 moves right by 70 px, sample 1 stays
    boxes = BatchBoxes(
        torch.tensor(
            [
                [10.0, 10.0, 20.0, 20.0],
                [20.0, 40.0, 60.0, 60.0],
                [40.0, 5.0, 80.0, 9.0],
                [1.0, 1.0, 2.0, 50.0],
                [5.0, 5.0, 50.0, 50.0],
            ]
        ),
        torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0]),
        torch.arange(5.0).view(-1, 1),
    )
    params = AffineParams(shift, torch.ones(2, dtype=torch.float64), (100, 100))
    _, moved = RandomPerspective().apply(img, params, boxes)
    # box 1 keeps 10 of its 40 px (25% of its area > 10%: clipped, kept); box 2 leaves the image
    # entirely; box 3 is 1 px wide (below ultralytics' 2 px)
    assert moved.cls.view(-1).tolist() == [0.0, 1.0, 4.0]
    expected = torch.tensor([[80.0, 10.0, 90.0, 20.0], [90.0, 40.0, 100.0, 60.0], [5.0, 5.0, 50.0, 50.0]])
    torch.testing.assert_close(moved.boxes, expected)
    assert moved.batch_idx.tolist() == [0.0, 0.0, 1.0]


def test_affine_float_matches_uint8_and_identity_is_exact(bgr_image):
    batch = _to_batch(bgr_image).repeat(2, 1, 1, 1)
    module = RandomPerspective(degrees=8, translate=0.1, scale=0.3, seed=2)
    params = module.sample_params(2, batch.shape[-2:])
    as_u8 = module.apply(batch, params)
    as_f = module.apply(batch.float() / 255, params)
    assert as_f.dtype == torch.float32 and as_u8.dtype == torch.uint8
    assert (as_f * 255 - as_u8.float()).abs().max() <= 0.5 + 1e-3
    identity = RandomAffine(translate=0.0, scale=0.0, seed=0)
    assert identity.is_identity
    assert torch.equal(identity(batch), batch)


def test_validation_errors():
    with pytest.raises(TypeError, match="uint8"):
        RandomHorizontalFlip()(torch.zeros(1, 3, 4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="batch dim"):
        RandomHSV()(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="BatchBoxes"):
        RandomHorizontalFlip()(torch.zeros(1, 3, 4, 4), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="either seed"):
        RandomHSV(seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="scale="):
        RandomPerspective(scale=1.5)
    with pytest.raises(TypeError, match="perspective"):
        RandomAffine(perspective=0.1)


def test_modules_copy_and_pickle_with_their_generator():
    module = RandomPerspective(degrees=5, seed=9)
    clone = copy.deepcopy(module)
    restored = pickle.loads(pickle.dumps(module))
    a = module.sample_params(4, (32, 32)).matrix
    assert torch.equal(a, clone.sample_params(4, (32, 32)).matrix)
    assert torch.equal(a, restored.sample_params(4, (32, 32)).matrix)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(bgr_image):
    batch = _to_batch(bgr_image).repeat(4, 1, 1, 1)
    boxes = BatchBoxes(
        torch.tensor([[20.0, 30.0, 120.0, 200.0], [0.0, 0.0, 256.0, 320.0]]).repeat(4, 1),
        torch.arange(4).repeat_interleave(2).float(),
        torch.arange(8.0).view(-1, 1),
    )
    for make in (
        lambda: RandomHorizontalFlip(seed=1),
        lambda: RandomHSV(*HSV_GAINS, seed=1),
        lambda: RandomPerspective(degrees=10, translate=0.1, scale=0.5, shear=3, perspective=0.0003, seed=1),
    ):
        cpu_img, cpu_boxes = make()(batch, boxes)
        gpu_img, gpu_boxes = make()(batch.cuda(), boxes.to("cuda"))
        assert gpu_img.device.type == "cuda" and gpu_img.dtype == torch.uint8
        assert (gpu_img.cpu().int() - cpu_img.int()).abs().max() <= 1
        assert torch.equal(gpu_boxes.cls.cpu(), cpu_boxes.cls)
        torch.testing.assert_close(gpu_boxes.boxes.cpu(), cpu_boxes.boxes, atol=1e-3, rtol=0)
