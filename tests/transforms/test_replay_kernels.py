"""Each batched replay kernel against torchvision on the same inputs (CPU), in pixel levels (1/255).

Measured here (and copied into docs/gpu_ops.md): on PIL images (flavour "pil") the colour kernels
are bit-identical to Pillow (ImageEnhance + 8-bit HSV); on uint8 tensors they equal torchvision's
uint8 kernels except hue (float hue + truncation: at most 2 levels on rare pixels); on float tensors
Kornia's kernels are within 0.02 levels of torchvision's (contrast / saturation: Kornia's grey
weights 0.299 vs torchvision's 0.2989; hue: float rounding). Kornia's own ``adjust_brightness``
(additive) and ``adjust_saturation`` (HSV) are not torchvision's and are not used.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2

from pipeline_opt.datasets import _photo_like
from pipeline_opt.transforms import replay_kernels as K

kornia = pytest.importorskip("kornia")


@pytest.fixture(scope="module")
def photos():
    """Four photo-like 96x128 images (PIL) and the same as a float (B, 3, H, W) batch of 0..255 levels."""
    rng = np.random.default_rng(7)
    pils = [_photo_like(rng, 128, 96) for _ in range(4)]
    batch = torch.stack([torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1) for p in pils]).float()
    return pils, batch


def _levels(pil_list):
    return torch.stack([torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1) for p in pil_list]).float()


FACTORS = torch.tensor([0.55, 1.0, 1.37, 0.0])
HUES = torch.tensor([-0.5, -0.07, 0.0, 0.31])


@pytest.mark.parametrize("op, tv, factors", [
    (K.adjust_brightness, TF.adjust_brightness, FACTORS),
    (K.adjust_contrast, TF.adjust_contrast, FACTORS),
    (K.adjust_saturation, TF.adjust_saturation, FACTORS),
    (K.adjust_hue, TF.adjust_hue, HUES),
], ids=["brightness", "contrast", "saturation", "hue"])
def test_pil_flavour_is_bit_identical_to_pillow(photos, op, tv, factors):
    pils, batch = photos
    got = op(batch, factors, "pil")
    want = _levels([tv(p, float(f)) for p, f in zip(pils, factors)])
    assert torch.equal(got, want)


def test_pil_grayscale_and_quantize(photos):
    pils, batch = photos
    assert torch.equal(K.to_grayscale(batch, "pil"), _levels([TF.to_grayscale(p, 3) for p in pils]))
    assert torch.equal(K.quantize(torch.tensor([0.5, 1.5, 2.49, -3.0, 300.0]), "pil"),
                       torch.tensor([1.0, 2.0, 2.0, 0.0, 255.0]))


@pytest.mark.parametrize("op, tv, factors, max_levels", [
    (K.adjust_brightness, TF.adjust_brightness, FACTORS, 0),
    (K.adjust_contrast, TF.adjust_contrast, FACTORS, 0),
    (K.adjust_saturation, TF.adjust_saturation, FACTORS, 0),
    (K.adjust_hue, TF.adjust_hue, HUES, 2),
], ids=["brightness", "contrast", "saturation", "hue"])
def test_uint8_flavour_matches_torchvision_uint8_kernels(photos, op, tv, factors, max_levels):
    _, batch = photos
    u8 = batch.to(torch.uint8)
    got = op(batch, factors, "uint8")
    for api in (TF, F2):
        fn = getattr(api, tv.__name__)
        want = torch.stack([fn(img, float(f)) for img, f in zip(u8, factors)]).float()
        diff = (got - want).abs()
        # v2 computes the same blends as mul + add_(alpha=...): float rounding moves a truncation by one level
        bound = max_levels if api is TF else max(max_levels, 1)
        assert diff.max() <= bound and diff.mean() < 0.01, (api.__name__, float(diff.max()), float(diff.mean()))


@pytest.mark.parametrize("op, tv, factors, mean_levels, max_levels", [
    (K.adjust_brightness, TF.adjust_brightness, FACTORS, 0.0, 0.0),
    (K.adjust_contrast, TF.adjust_contrast, FACTORS, 0.02, 0.03),
    (K.adjust_saturation, TF.adjust_saturation, FACTORS, 0.02, 0.03),
    (K.adjust_hue, TF.adjust_hue, HUES, 0.001, 0.01),
], ids=["brightness", "contrast", "saturation", "hue"])
def test_float_flavour_uses_kornia_within_tolerance(photos, op, tv, factors, mean_levels, max_levels):
    _, batch = photos
    x = batch / 255
    got = op(x, factors, "float")
    want = torch.stack([tv(img, float(f)) for img, f in zip(x, factors)])
    diff = (got - want).abs() * 255
    assert diff.mean() <= mean_levels and diff.max() <= max_levels


def test_float_grayscale_is_torchvision_exactly(photos):
    _, batch = photos
    x = batch / 255
    assert torch.equal(K.to_grayscale(x, "float"), TF.rgb_to_grayscale(x, 3))
    u8 = batch.to(torch.uint8)
    assert torch.equal(K.to_grayscale(batch, "uint8"), TF.rgb_to_grayscale(u8, 3).float())


def test_kornia_alternatives_we_do_not_use_are_far_off(photos):
    """Why the table says "own": Kornia's brightness is additive, its saturation works in HSV."""
    import kornia.enhance as KE

    _, batch = photos
    x = batch / 255
    f = torch.tensor([0.6, 0.6, 1.4, 1.4])
    brightness = torch.stack([TF.adjust_brightness(i, float(v)) for i, v in zip(x, f)])
    saturation = torch.stack([TF.adjust_saturation(i, float(v)) for i, v in zip(x, f)])
    assert (KE.adjust_brightness(x, f - 1) - brightness).abs().mean() * 255 > 10
    assert (KE.adjust_saturation(x, f) - saturation).abs().mean() * 255 > 5


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_pad_modes_match_torchvision(photos, mode):
    pils, batch = photos
    padding = (3, 5, 7, 2)  # left, top, right, bottom
    fill = (10, 20, 30) if mode == "constant" else 0
    want = _levels([TF.pad(p, list(padding), fill=fill, padding_mode=mode) for p in pils])
    assert torch.equal(K.pad(batch, padding, fill, mode), want)


def test_crop_resize_within_one_level_of_pillow(photos):
    pils, batch = photos
    diffs = []
    for img, pil in zip(batch, pils):
        want = _levels([TF.resized_crop(pil, 7, 11, 61, 83, [40, 50])])
        got = K.crop_resize(img.unsqueeze(0), 7, 11, 61, 83, (40, 50), True, "pil")
        diffs.append((got - want).abs())
        tensor_want = TF.resized_crop(img.to(torch.uint8), 7, 11, 61, 83, [40, 50], antialias=True).float()
        assert torch.equal(K.crop_resize(img.unsqueeze(0), 7, 11, 61, 83, (40, 50), True, "uint8")[0], tensor_want)
    d = torch.cat(diffs)
    assert d.max() <= 1 and d.mean() < 0.3


def test_erase_kernels_match_torchvision(photos):
    _, batch = photos
    x = batch / 255
    boxes = torch.tensor([[1, 2, 10, 20], [0, 0, 5, 5], [30, 40, 7, 3], [0, 0, 96, 128]])
    apply = torch.tensor([True, False, True, False])
    value = torch.tensor([0.1, 0.2, 0.3])
    got = K.erase_constant(x, boxes, apply, value)
    want = torch.stack([TF.erase(img, *b.tolist(), value.view(3, 1, 1)) if a else img
                        for img, b, a in zip(x, boxes, apply)])
    assert torch.equal(got, want)
    patches = [torch.randn(3, 10, 20), torch.randn(3, 7, 3)]
    got = K.erase_patches(x, [(1, 2, 10, 20), (30, 40, 7, 3)], [0, 2], patches)
    assert torch.equal(got[0], TF.erase(x[0], 1, 2, 10, 20, patches[0]))
    assert torch.equal(got[2], TF.erase(x[2], 30, 40, 7, 3, patches[1]))
    assert torch.equal(got[1], x[1])


def test_hue_shift_follows_numpy_wrapping():
    for h in (-0.5, -0.013, 0.0, 0.004, 0.25, 0.5):
        assert K.hue_shift_pil([h])[0] == int(np.int32(h * 255).astype(np.uint8))
    assert math.isclose(K.hue_shift_pil([0.5])[0], 127)


def test_flavour_is_validated(photos):
    with pytest.raises(ValueError, match="flavour='pillow'"):
        K.adjust_brightness(photos[1], FACTORS, "pillow")
