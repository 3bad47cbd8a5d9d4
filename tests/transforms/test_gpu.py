"""GPU batch transforms against torchvision's CPU originals (tensors and PIL) on real JPEGs.

Tolerances: tensor ops are bit-identical to torchvision; Resize is within 1/255 of PIL BILINEAR.
"""

from __future__ import annotations

import glob

import numpy as np
import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from PIL import Image

from pipeline_opt.transforms.gpu import CenterCrop, ConvertDtype, Normalize, Resize, ToFloat, resized_size

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def jpegs(tiny_image_folder):
    paths = sorted(glob.glob(str(tiny_image_folder / "*" / "*.jpg")))[:6]
    return [Image.open(p).convert("RGB") for p in paths]


@pytest.fixture(scope="module")
def batch_u8(jpegs):
    return torch.stack([T1.functional.pil_to_tensor(im) for im in jpegs])


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
@pytest.mark.parametrize("kwargs", [
    {"size": 224}, {"size": (100, 150)}, {"size": (300, 400)}, {"size": 200, "max_size": 250},
    {"size": 180, "antialias": False}, {"size": (239, 321)},
])
def test_resize_equals_torchvision_tensor_resize(api, kwargs, batch_u8):
    """Exact, except v2's fixed-point uint8 CPU kernel (v2 on CUDA is exact: see the cuda test)."""
    ours = Resize(**kwargs)
    theirs = api.Resize(**kwargs)
    for x in (batch_u8, batch_u8.float() / 255, batch_u8.double() / 255):
        got, want = ours(x), theirs(x)
        assert got.dtype == want.dtype == x.dtype
        assert got.shape == want.shape
        if api is T2 and x.dtype == torch.uint8:
            assert (got.int() - want.int()).abs().max() <= 1
        else:
            assert torch.equal(got, want), (kwargs, x.dtype, (got.double() - want.double()).abs().max())
    assert torch.equal(ours(batch_u8[0]), T1.Resize(**kwargs)(batch_u8[0]))  # a single CHW image


def test_resize_size_none_uses_max_size(batch_u8):
    assert Resize(None, max_size=250)(batch_u8).shape == T2.Resize(None, max_size=250)(batch_u8).shape
    assert resized_size(240, 320, None, max_size=160) == (120, 160)


@pytest.mark.parametrize("size", [224, (224, 224), (160, 200), 400])
def test_resize_within_one_level_of_pil_bilinear(size, jpegs, batch_u8):
    want = torch.stack([T1.functional.pil_to_tensor(T1.Resize(size)(im)) for im in jpegs]).int()
    got_u8 = Resize(size)(batch_u8).int()
    got_float = Resize(size)(batch_u8.float() / 255) * 255
    assert got_u8.shape == want.shape
    assert (got_u8 - want).abs().max() <= 1
    assert (got_float - want).abs().max() <= 1.0 + 1e-3


def test_resize_out_dtype_returns_unrounded_float(batch_u8):
    got = Resize((120, 160), out_dtype=torch.float32)(batch_u8)
    assert got.dtype == torch.float32
    want = Resize((120, 160))(batch_u8.float())
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.equal(got, got.round())


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
@pytest.mark.parametrize("size", [224, (225, 301), (239, 320), (300, 400), 241, (242, 10), (1, 1)])
def test_center_crop_equals_torchvision(api, size, batch_u8, jpegs):
    for x in (batch_u8, batch_u8.float() / 255):
        got = CenterCrop(size)(x)
        want = api.CenterCrop(size)(x)
        assert got.dtype == x.dtype and torch.equal(got, want), size
    pil = torch.stack([T1.functional.pil_to_tensor(api.CenterCrop(size)(im)) for im in jpegs])
    assert torch.equal(CenterCrop(size)(batch_u8), pil)


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
def test_normalize_bit_identical(api, batch_u8):
    x = batch_u8.float() / 255
    assert torch.equal(Normalize(MEAN, STD)(x), api.Normalize(MEAN, STD)(x))
    assert torch.equal(Normalize(MEAN, STD)(batch_u8), api.Normalize(MEAN, STD)(x))  # uint8 is scaled first
    assert torch.equal(Normalize([0.5], [0.25])(x), api.Normalize([0.5], [0.25])(x))  # one value broadcasts
    assert torch.equal(Normalize(MEAN, STD)(x.double()), api.Normalize(MEAN, STD)(x.double()))


def test_to_float_and_convert_dtype(batch_u8):
    x = batch_u8
    assert torch.equal(ToFloat()(x), T1.ConvertImageDtype(torch.float32)(x))
    assert torch.equal(ToFloat()(x[0]), T1.ToTensor()(T1.functional.to_pil_image(x[0])))
    assert torch.equal(ConvertDtype(torch.float32)(x), T2.ToDtype(torch.float32, scale=True)(x))  # v2 multiplies
    f = x.float() / 255
    assert ToFloat()(f) is f
    assert ToFloat(torch.float16)(x).dtype == torch.float16
    assert torch.equal(ConvertDtype(torch.float32)(x), T2.functional.to_dtype(x, torch.float32, scale=True))
    assert torch.equal(ConvertDtype(torch.uint8)(f), T1.ConvertImageDtype(torch.uint8)(f))
    assert torch.equal(ConvertDtype(torch.float32, scale=False)(x), x.float())


def test_pil_pipeline_equivalence_v1_and_v2(jpegs, batch_u8):
    """Resize + CenterCrop + ToTensor + Normalize on PIL vs the batch modules on uint8."""
    for api in (T1, T2):
        steps = [api.Resize(256), api.CenterCrop(224)]
        tail = [api.ToTensor()] if api is T1 else [api.ToImage(), api.ToDtype(torch.float32, scale=True)]
        ref = torch.stack([api.Compose([*steps, *tail, api.Normalize(MEAN, STD)])(im) for im in jpegs])
        ours = torch.nn.Sequential(Resize(256), CenterCrop(224), ToFloat(), Normalize(MEAN, STD))(batch_u8)
        pixel_diff = (ours - ref) * torch.tensor(STD).view(3, 1, 1) * 255
        assert pixel_diff.abs().max() <= 1.0 + 1e-3


def test_inside_kornia_augmentation_sequential(batch_u8):
    import kornia.augmentation as K

    x = batch_u8.float() / 255
    seq = K.AugmentationSequential(K.RandomHorizontalFlip(p=1.0), Normalize(MEAN, STD))
    assert torch.allclose(seq(x), T2.Normalize(MEAN, STD)(x.flip(-1)), atol=1e-6)
    seq = K.AugmentationSequential(Resize((120, 160)), CenterCrop(100))
    assert torch.allclose(seq(x), T2.CenterCrop(100)(T2.Resize((120, 160))(x)), atol=1e-6)


@pytest.mark.parametrize("make, error", [
    (lambda: Resize(0), ValueError), (lambda: Resize((1, 2, 3)), ValueError), (lambda: Resize(2.5), ValueError),
    (lambda: Resize((224, 224), max_size=300), ValueError), (lambda: Resize(224, max_size=200), ValueError),
    (lambda: Resize(None), ValueError), (lambda: Resize(10, antialias="yes"), ValueError),
    (lambda: CenterCrop(0), ValueError), (lambda: CenterCrop((3, "a")), ValueError),
    (lambda: Normalize([0.5, 0.5], [0.5]), ValueError), (lambda: Normalize([0.5], [0.0]), ValueError),
    (lambda: Normalize("abc", [1.0]), ValueError), (lambda: ToFloat(torch.uint8), ValueError),
    (lambda: ConvertDtype("float"), ValueError),
])
def test_bad_arguments_raise(make, error):
    with pytest.raises(error):
        make()


def test_bad_inputs_raise(batch_u8):
    with pytest.raises(TypeError, match="torch.Tensor"):
        Resize(10)(np.zeros((3, 8, 8)))
    with pytest.raises(ValueError, match="shape"):
        CenterCrop(2)(torch.zeros(8, 8))
    with pytest.raises(ValueError, match="channels"):
        Normalize(MEAN, STD)(torch.zeros(1, 4, 8, 8))
    with pytest.raises(TypeError, match="uint8"):
        ToFloat()(torch.zeros(1, 3, 4, 4, dtype=torch.int32))


@pytest.mark.cuda
def test_cuda_results_equal_torchvision_on_cuda(batch_u8):
    x = batch_u8.cuda()
    for size in (224, (160, 200)):
        assert torch.equal(Resize(size)(x), T2.Resize(size)(x))
        xf = x.float() / 255
        assert torch.equal(Resize(size)(xf), T2.Resize(size)(xf))
        # and within one level of the CPU (PIL-like) result
        assert (Resize(size)(x).cpu().int() - Resize(size)(batch_u8).int()).abs().max() <= 1
    assert torch.equal(CenterCrop((300, 301))(x), T2.CenterCrop((300, 301))(x))
    xf = x.float() / 255
    got = Normalize(MEAN, STD)(x)
    assert got.is_cuda and torch.equal(got, T2.Normalize(MEAN, STD)(xf))
