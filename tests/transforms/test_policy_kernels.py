"""Each auto-augment operation on a batch against torchvision's own, per sample, on photo-like images (CPU).

Measured here (copied into docs/gpu_ops.md): on PIL images every operation is bit-identical to
Pillow (torchvision's PIL path), nearest and bilinear geometry included; on uint8 tensors every
operation is bit-identical to torchvision v1's tensor kernels and within one level of v2's
(sharpness and autocontrast: v2 orders its float arithmetic differently, mean 0.02 levels).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.autoaugment as tv_autoaugment
import torchvision.transforms.v2 as T2
from torchvision.transforms import InterpolationMode

from pipeline_opt.datasets import _photo_like
from pipeline_opt.transforms.policy_kernels import GEOMETRIC_OPS, apply_op, pillow_equalize_divisor

MAGNITUDES = {
    "Identity": [0.0] * 6,
    "ShearX": [-0.99, -0.3, 0.05, 0.2, 0.5, 0.99], "ShearY": [-0.99, -0.3, 0.05, 0.2, 0.5, 0.99],
    "TranslateX": [-32.0, -5.5, 0.0, 3.2, 17.0, 31.9], "TranslateY": [-32.0, -5.5, 0.0, 3.2, 17.0, 31.9],
    "Rotate": [-135.0, -90.0, -30.0, 0.0, 90.0, 180.0],
    "Brightness": [-0.99, -0.5, 0.0, 0.3, 0.6, 0.99], "Color": [-0.99, -0.5, 0.0, 0.3, 0.6, 0.99],
    "Contrast": [-0.99, -0.5, 0.0, 0.3, 0.6, 0.99], "Sharpness": [-0.99, -0.5, 0.0, 0.3, 0.6, 0.99],
    "Posterize": [2, 3, 4, 6, 7, 8], "Solarize": [255.0, 246.5, 170.0, 85.0, 12.75, 0.0],
    "AutoContrast": [0.0] * 6, "Equalize": [0.0] * 6, "Invert": [0.0] * 6,
}
CASES = [(op, interp) for op in MAGNITUDES for interp in ("nearest", "bilinear")
         if interp == "nearest" or op in GEOMETRIC_OPS]


def _levels(pils):
    return torch.stack([torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1) for p in pils]).float()


@pytest.fixture(scope="module", params=[(128, 96), (64, 64)], ids=["128x96", "square"])
def photos(request):
    rng = np.random.default_rng(11)
    pils = [_photo_like(rng, *request.param) for _ in range(6)]
    return pils, _levels(pils)


@pytest.mark.parametrize("op, interpolation", CASES)
def test_pil_flavour_is_bit_identical_to_pillow(photos, op, interpolation):
    pils, batch = photos
    mode = InterpolationMode(interpolation)
    got = apply_op(op, batch, MAGNITUDES[op], "pil", interpolation, None)
    want = _levels([tv_autoaugment._apply_op(p, op, float(m), interpolation=mode, fill=None)
                    for p, m in zip(pils, MAGNITUDES[op])])
    assert torch.equal(got, want), float((got - want).abs().max())


@pytest.mark.parametrize("op, interpolation", CASES)
def test_uint8_flavour_matches_torchvision_tensor_kernels(photos, op, interpolation):
    _, batch = photos
    mode = InterpolationMode(interpolation)
    u8 = batch.to(torch.uint8)
    got = apply_op(op, batch, MAGNITUDES[op], "uint8", interpolation, None)
    v1 = torch.stack([tv_autoaugment._apply_op(img, op, float(m), interpolation=mode, fill=None)
                      for img, m in zip(u8, MAGNITUDES[op])]).float()
    assert torch.equal(got, v1), float((got - v1).abs().max())
    policy = T2.TrivialAugmentWide(interpolation=mode)
    v2 = torch.stack([policy._apply_image_or_video_transform(
        img, op, float(m) / 255.0 if op == "Solarize" else float(m), interpolation=mode, fill=policy._fill)
        for img, m in zip(u8, MAGNITUDES[op])]).float()
    diff = (got - v2).abs()  # v2 orders its float blends differently: sharpness / autocontrast move by one level
    assert diff.max() <= 1 and diff.mean() < 0.03, (float(diff.max()), float(diff.mean()))


@pytest.mark.parametrize("fill", [(128.0,), (10.0, 200.0, 30.0)])
@pytest.mark.parametrize("flavour", ["pil", "uint8"])
def test_a_fill_colour_covers_what_the_geometry_uncovers(photos, flavour, fill):
    pils, batch = photos
    mags = MAGNITUDES["Rotate"]
    got = apply_op("Rotate", batch, mags, flavour, "nearest", fill)
    tv_fill = [int(v) for v in fill] if flavour == "pil" else list(fill)
    inputs = pils if flavour == "pil" else batch.to(torch.uint8)
    outs = [tv_autoaugment._apply_op(img, "Rotate", float(m), interpolation=InterpolationMode.NEAREST,
                                     fill=tv_fill * (3 // len(tv_fill))) for img, m in zip(inputs, mags)]
    want = _levels(outs) if flavour == "pil" else torch.stack(outs).float()
    assert torch.equal(got, want)


def test_the_pillow_equalize_divisor_is_measured():
    assert pillow_equalize_divisor() in (255, 256)


def test_unknown_ops_and_interpolations_are_named():
    x = torch.zeros(1, 3, 8, 8)
    with pytest.raises(ValueError, match="'Blur' is not one of"):
        apply_op("Blur", x, [0.0], "pil", "nearest", None)
    with pytest.raises(ValueError, match="interpolation='bicubic'"):
        apply_op("Rotate", x, [10.0], "pil", "bicubic", None)


@pytest.mark.cuda
@pytest.mark.parametrize("flavour", ["pil", "uint8"])
def test_on_cuda_every_operation_equals_the_cpu_kernels(photos, flavour):
    _, batch = photos
    worst = {}
    for op, interpolation in CASES:
        cpu = apply_op(op, batch, MAGNITUDES[op], flavour, interpolation, None)
        gpu = apply_op(op, batch.cuda(), MAGNITUDES[op], flavour, interpolation, None).cpu()
        diff = (cpu - gpu).abs()
        worst[f"{op}-{interpolation}"] = (float(diff.max()), float(diff.mean()))
    print(f"cuda vs cpu, {flavour}: {worst}")  # the measured table in docs/gpu_ops.md
    assert all(m <= 1 and mean < 0.01 for m, mean in worst.values()), worst
