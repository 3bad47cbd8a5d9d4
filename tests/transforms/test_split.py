"""split_transforms: gpu_part(collate(cpu_part(img) ...)) == original pipeline, on real JPEGs.

Tolerance: 1/255 in pixel units (before normalisation) where a PIL resize moves to the batch
Resize; exact where only dtype / normalize / crop / tensor resize move.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torch.utils.data import DataLoader, Subset, default_collate
from torchvision.datasets import ImageFolder

from pipeline_opt.transforms import gpu
from pipeline_opt.transforms.split import GpuPipeline, ToUint8CHW, offload_dataset_transform, split_transforms

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def images(tiny_image_folder):
    ds = ImageFolder(str(tiny_image_folder))
    return [ds[i][0] for i in range(0, 48, 6)]  # 8 RGB PIL images, all 320x240


def _to_float(api):
    return [api.ToTensor()] if api is T1 else [api.ToImage(), api.ToDtype(torch.float32, scale=True)]


def _max_pixel_diff(got: torch.Tensor, want: torch.Tensor, normalized: bool) -> float:
    diff = got - want
    if normalized:
        diff = diff * torch.tensor(STD).view(3, 1, 1)
    return float(diff.abs().max() * 255)


def _check(compose, imgs, assume_equal_sizes, expect_moved, tol):
    cpu, gpu_part = split_transforms(compose, assume_equal_sizes=assume_equal_sizes)
    assert gpu_part.moved == expect_moved, gpu_part.describe()
    shipped = [cpu(im) for im in imgs]
    for t in shipped:
        assert type(t) is torch.Tensor and t.dtype == torch.uint8 and t.dim() == 3
    got = gpu_part(default_collate(shipped))
    want = torch.stack([compose(im) for im in imgs])
    assert got.shape == want.shape and got.dtype == want.dtype
    normalized = any(isinstance(t, (T1.Normalize, T2.Normalize)) for t in compose.transforms)
    assert _max_pixel_diff(got, want, normalized) <= tol + 1e-3
    return cpu, gpu_part


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
def test_resize_hw_totensor_normalize(api, images):
    compose = api.Compose([api.Resize((224, 224)), *_to_float(api), api.Normalize(MEAN, STD)])
    tail = ("ToTensor",) if api is T1 else ("ToDtype",)
    # Inputs may differ in size: the Resize that equalises them stays on the CPU (exact result).
    _, g = _check(compose, images, False, (*tail, "Normalize"), tol=0.0)
    assert "Resize" in g.kept and "differ in size" in g.reason
    # Declared equal: the resize moves too.
    _, g = _check(compose, images, True, ("Resize", *tail, "Normalize"), tol=1.0)
    assert isinstance(g[0], gpu.Resize) and g.kept == ("ToUint8CHW",)  # it does the work of v2 ToImage


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
def test_resize_shorter_side_center_crop(api, images):
    compose = api.Compose([api.Resize(256), api.CenterCrop(224), *_to_float(api), api.Normalize(MEAN, STD)])
    tail = ("ToTensor",) if api is T1 else ("ToDtype",)
    _check(compose, images, True, ("Resize", "CenterCrop", *tail, "Normalize"), tol=1.0)
    cpu, g = _check(compose, images, False, (*tail, "Normalize"), tol=0.0)
    assert [type(t).__name__ for t in cpu.transforms][:2] == ["Resize", "CenterCrop"]


def test_v2_tensor_pipeline_is_exact(images):
    """ToImage first: every later op is a tensor op, reproduced bit for bit (v2 tensor resize on CPU
    uses a fixed-point uint8 kernel: within one level)."""
    compose = T2.Compose([T2.ToImage(), T2.CenterCrop(200), T2.ToDtype(torch.float32, scale=True),
                          T2.Resize((100, 120)), T2.Normalize(MEAN, STD)])
    _check(compose, images, True, ("CenterCrop", "ToDtype", "Resize", "Normalize"), tol=0.0)


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
def test_exact_split_moves_only_bit_identical_ops(api, images):
    """exact=True: the Resize (within 1/255 of PIL on the device) stays with everything before it; a
    CenterCrop after a Resize((h, w)) still moves, and the device part gives the CPU's bytes."""
    compose = api.Compose([api.Resize((200, 180)), api.CenterCrop(160), *_to_float(api), api.Normalize(MEAN, STD)])
    tail = ("ToTensor",) if api is T1 else ("ToDtype",)
    _, loose = split_transforms(compose, assume_equal_sizes=True)
    assert loose.moved[0] == "Resize" and loose.exactness == "tolerance"
    cpu, g = _check(compose, images, False, ("CenterCrop", *tail, "Normalize"), tol=0.0)
    exact_cpu, exact = split_transforms(compose, assume_equal_sizes=True, exact=True)
    assert exact.moved == g.moved and exact.exactness == "bitwise"
    assert [type(t).__name__ for t in exact_cpu.transforms] == ["Resize", "ToUint8CHW"]
    got = exact(default_collate([exact_cpu(im) for im in images]))
    assert torch.equal(got, torch.stack([compose(im) for im in images]))


def test_variable_sizes_keep_shorter_side_resize_on_cpu(images):
    imgs = [im.crop((0, 0, 320 - 8 * i, 240 - 4 * i)) for i, im in enumerate(images)]
    compose = T1.Compose([T1.Resize(256), T1.CenterCrop(224), T1.ToTensor(), T1.Normalize(MEAN, STD)])
    cpu, g = _check(compose, imgs, False, ("ToTensor", "Normalize"), tol=0.0)
    assert g.kept == ("Resize", "CenterCrop", "ToUint8CHW")


@pytest.mark.parametrize("api", [T1, T2], ids=["v1", "v2"])
def test_random_and_unknown_ops_stay_in_order(api, images):
    def custom(img):
        return img

    ops = [api.RandomResizedCrop(160), api.RandomHorizontalFlip(), api.Lambda(custom), *_to_float(api),
           api.Normalize(MEAN, STD)]
    cpu, g = split_transforms(api.Compose(ops))
    assert cpu.transforms[:3] == ops[:3]  # the same objects, same order, none dropped
    assert "Lambda" in g.reason
    torch.manual_seed(0)
    want = torch.stack([api.Compose(ops)(im) for im in images])
    torch.manual_seed(0)
    got = g(default_collate([cpu(im) for im in images]))
    assert _max_pixel_diff(got, want, True) <= 1e-3


def test_ops_after_an_unmovable_op_stay_on_cpu(images):
    ops = [T1.ToTensor(), T1.RandomErasing(p=1.0), T1.Normalize(MEAN, STD)]
    cpu, g = split_transforms(T1.Compose(ops))
    assert g.moved == () and len(g) == 0 and cpu.transforms == ops  # float before the erasing: no uint8 boundary
    assert "nothing moved" in g.reason
    ops = [T1.Resize((64, 64)), T1.ColorJitter(0.4), T1.ToTensor(), T1.Normalize(MEAN, STD)]
    cpu, g = split_transforms(T1.Compose(ops), assume_equal_sizes=True)
    assert g.moved == ("ToTensor", "Normalize") and cpu.transforms[:2] == ops[:2]


def test_non_bilinear_resize_stays(images):
    compose = T1.Compose([T1.Resize((64, 64), interpolation=T1.InterpolationMode.BICUBIC), T1.ToTensor()])
    _, g = split_transforms(compose, assume_equal_sizes=True)
    assert g.moved == ("ToTensor",)


def test_describe_and_pickle(images):
    compose = T2.Compose([T2.Resize((64, 64)), *_to_float(T2), T2.Normalize(MEAN, STD)])
    cpu, g = split_transforms(compose, assume_equal_sizes=True)
    lines = g.describe()
    assert lines[0] == "cpu: ToUint8CHW" and any(line.startswith("gpu: Resize -> Resize(") for line in lines)
    cpu2 = pickle.loads(pickle.dumps(cpu))  # the CPU part goes to spawned workers
    assert torch.equal(cpu2(images[0]), cpu(images[0]))
    g2 = copy.deepcopy(g)
    assert isinstance(g2, GpuPipeline) and g2.moved == g.moved


def test_bad_input_raises():
    with pytest.raises(TypeError, match="Compose"):
        split_transforms([T1.ToTensor()])
    with pytest.raises(TypeError, match="uint8"):
        ToUint8CHW()(torch.zeros(3, 4, 4))
    with pytest.raises(TypeError, match="PIL"):
        ToUint8CHW()("not an image")


def test_to_uint8_chw_accepts_arrays_and_tensors(images):
    import numpy as np

    arr = np.asarray(images[0])
    want = T1.functional.pil_to_tensor(images[0])
    assert torch.equal(ToUint8CHW()(arr), want)
    assert torch.equal(ToUint8CHW()(T2.ToImage()(images[0])), want)
    assert ToUint8CHW()(np.zeros((5, 6), np.uint8)).shape == (1, 5, 6)


def test_offload_dataset_transform_copies(tiny_image_folder):
    compose = T1.Compose([T1.Resize((64, 64)), T1.ToTensor(), T1.Normalize(MEAN, STD)])
    ds = ImageFolder(str(tiny_image_folder), transform=compose)
    sub = Subset(ds, list(range(8)))
    new, g = offload_dataset_transform(sub, assume_equal_sizes=True)
    assert ds.transform is compose and sub.dataset is ds  # originals untouched
    assert new is not sub and new.dataset is not ds and new.dataset.transform is not compose
    assert new.dataset.transforms.transform is new.dataset.transform  # StandardTransform rebuilt
    assert g.moved == ("Resize", "ToTensor", "Normalize")
    loader = DataLoader(new, batch_size=4, num_workers=2)
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8
    want = torch.stack([ds[i][0] for i in range(4)])
    assert _max_pixel_diff(g(images), want, True) <= 1.0 + 1e-3
    with pytest.raises(TypeError, match="transform"):
        offload_dataset_transform(torch.utils.data.TensorDataset(torch.zeros(2)))
