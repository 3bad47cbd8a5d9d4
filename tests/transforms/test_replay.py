"""The CPU side of the replay: the same draws as the original Compose, from the JPEG header alone.

"Same draws" is checked three ways for several seeds, v1 and v2: every parameter-sampling call the
original pipeline makes (``get_params`` / ``make_params`` with the image size it passes, every
``torch.rand``) is recorded, and the replay must make the identical sequence of calls with identical
arguments and results; the torch RNG must end in the same state; the parameter rows must hold the
recorded crop boxes, colour factors and order, erase boxes.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.datasets import ImageFolder

from pipeline_opt.datasets import make_image_folder
from pipeline_opt.transforms.replay import (
    ReplayBatch,
    ReplayDataset,
    ReplaySampler,
    UnsupportedTransform,
    recognise,
    replay_collate,
)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """12 photo-like JPEGs of two sizes (so crop boxes depend on the header size)."""
    root = tmp_path_factory.mktemp("replay_images")
    make_image_folder(n_images=6, size=(320, 240), num_classes=2, seed=1, root=root / "a", workers=1)
    make_image_folder(n_images=6, size=(200, 260), num_classes=2, seed=2, root=root / "b", workers=1)
    return root


def _folder_ds(folder, transform):
    a = ImageFolder(str(next((folder / "a").iterdir())), transform=transform)
    b = ImageFolder(str(next((folder / "b").iterdir())), transform=transform)
    a.samples = a.samples + b.samples
    a.targets = [y for _, y in a.samples]
    return a


def _pipelines():
    return {
        "v1-train": T1.Compose([T1.RandomResizedCrop(64), T1.RandomHorizontalFlip(), T1.ColorJitter(0.4, 0.4, 0.4, 0.1),
                                T1.RandomGrayscale(0.3), T1.ToTensor(), T1.Normalize(MEAN, STD),
                                T1.RandomErasing(p=0.8)]),
        "v1-crop": T1.Compose([T1.Resize(80), T1.RandomCrop(64, padding=4, pad_if_needed=True), T1.RandomVerticalFlip(),
                               T1.ToTensor(), T1.RandomErasing(p=0.9, value="random")]),
        "v2-train": T2.Compose([T2.RandomResizedCrop(64), T2.RandomHorizontalFlip(), T2.ColorJitter(0.3, 0.3, 0.3, 0.2),
                                T2.RandomGrayscale(0.3), T2.ToImage(), T2.ToDtype(torch.float32, scale=True),
                                T2.Normalize(MEAN, STD), T2.RandomErasing(p=0.8, value=(0.1, 0.2, 0.3))]),
        "v2-tensor": T2.Compose([T2.ToImage(), T2.RandomCrop(64, padding=6, padding_mode="reflect"),
                                 T2.RandomHorizontalFlip(), T2.ColorJitter(brightness=0.5, hue=0.1),
                                 T2.ToDtype(torch.float32, scale=True), T2.RandomErasing(p=0.9, value="random")]),
    }


class _Recorder:
    """Record every parameter-sampling call (name, input size, result) and every ``torch.rand``."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list = []
        rand = torch.rand

        def recorded_rand(*args, **kwargs):
            out = rand(*args, **kwargs)
            self.calls.append(("rand", tuple(out.tolist())))
            return out

        monkeypatch.setattr(torch, "rand", recorded_rand)
        for cls in (T1.RandomResizedCrop, T1.RandomCrop, T1.RandomErasing):
            self._wrap_static(monkeypatch, cls, cls.get_params, size_arg=True)
        self._wrap_static(monkeypatch, T1.ColorJitter, T1.ColorJitter.get_params, size_arg=False)
        for cls in (T2.RandomResizedCrop, T2.RandomCrop, T2.ColorJitter, T2.RandomErasing):
            self._wrap_make(monkeypatch, cls)

    def _wrap_static(self, monkeypatch, cls, fn, size_arg):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            size = tuple(T1.functional.get_dimensions(args[0])[1:]) if size_arg else None
            self.calls.append((cls.__name__ + ".get_params", size, _plain(out)))
            return out

        monkeypatch.setattr(cls, "get_params", staticmethod(wrapped))

    def _wrap_make(self, monkeypatch, cls):
        make = cls.make_params

        def wrapped(this, flat_inputs):
            out = make(this, flat_inputs)
            size = T2.query_size(flat_inputs) if hasattr(T2, "query_size") else None
            self.calls.append((cls.__name__ + ".make_params", size, _plain(out)))
            return out

        monkeypatch.setattr(cls, "make_params", wrapped)


def _plain(value):
    """Comparable form of sampled parameters (tensors as lists; the erase fallback's image as its size)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.flatten()[:64].tolist())
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def _cpu_run(compose, paths):
    for path in paths:
        with open(path, "rb") as f:
            compose(Image.open(f).convert("RGB"))


@pytest.mark.parametrize("name", list(_pipelines()))
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_same_draws_as_the_original_compose(folder, monkeypatch, name, seed):
    compose = _pipelines()[name]
    ds = _folder_ds(folder, compose)
    paths = [p for p, _ in ds.samples]
    replay = ReplayDataset.from_image_folder(ds)

    recorder = _Recorder(monkeypatch)
    torch.manual_seed(seed)
    _cpu_run(compose, paths)
    cpu_calls, cpu_state = list(recorder.calls), torch.get_rng_state()

    recorder.calls.clear()
    torch.manual_seed(seed)
    items = [replay[i] for i in range(len(paths))]
    assert recorder.calls == cpu_calls
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert len(cpu_calls) > 2 * len(paths)  # something was drawn per image

    # the rows hold what the recorded calls returned (crop boxes, colour factors and order)
    sampled = [c for c in cpu_calls if c[0] != "rand"]
    boxes = [c[2] for c in sampled if c[0].startswith("RandomResizedCrop")]
    for (_, params, _), box in zip(items, boxes):
        got = [int(v) for v in params.row[:4].tolist()]
        want = list(box) if isinstance(box[0], int) else [dict(box)[k] for k in ("top", "left", "height", "width")]
        assert got == want


def test_rows_hold_colour_order_and_factors(folder):
    jitter = T1.ColorJitter(0.4, 0.4, 0.4, 0.1)
    sampler = ReplaySampler.from_compose(T1.Compose([T1.CenterCrop(64), jitter, T1.ToTensor()]))
    torch.manual_seed(3)
    row = sampler.sample(100, 120).row
    torch.manual_seed(3)
    order, b, c, s, h = jitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
    assert row[:4].tolist() == [float(i) for i in order.tolist()]
    assert row[4:8].tolist() == [b, c, s, h]


def test_sizes_follow_torchvision(folder):
    sampler = ReplaySampler.from_compose(T1.Compose([T1.Resize(100), T1.CenterCrop(90), T1.ToTensor()]))
    assert sampler.output_size(240, 320) == (90, 90)
    sampler = ReplaySampler.from_compose(T2.Compose([T2.Resize((50, 70)), T2.ToImage()]))
    assert sampler.output_size(240, 320) == (50, 70) and sampler.width == 0


def test_dataset_collate_and_pickle(folder):
    ds = _folder_ds(folder, _pipelines()["v1-crop"])
    replay = pickle.loads(pickle.dumps(ReplayDataset.from_image_folder(ds)))
    torch.manual_seed(0)
    batch = replay_collate([replay[i] for i in range(5)])
    assert isinstance(batch, ReplayBatch)
    assert batch.params.shape == (5, replay.sampler.width) and batch.params.dtype == torch.float64
    assert batch.sizes.tolist() == [len(open(p, "rb").read()) for p, _ in replay.samples[:5]]
    erased = batch.params[:, -5] > 0.5
    boxes = batch.params[:, -2:]
    assert batch.patch_sizes.tolist() == [int(3 * h * w) if e else 0 for e, (h, w) in zip(erased, boxes.tolist())]
    assert batch.patches.numel() == int(batch.patch_sizes.sum())


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_real_dataloader_with_two_workers(folder, context):
    ds = _folder_ds(folder, _pipelines()["v2-train"])
    replay = ReplayDataset.from_image_folder(ds)
    loader = DataLoader(replay, batch_size=4, num_workers=2, collate_fn=replay_collate, multiprocessing_context=context)
    batches = list(loader)
    assert len(batches) == 3 and all(isinstance(b, ReplayBatch) for b in batches)
    assert torch.cat([b.labels for b in batches]).tolist() == replay.targets


@pytest.mark.parametrize("compose, match", [
    (T1.Compose([T1.RandomResizedCrop(64), T1.RandomRotation(10), T1.ToTensor()]), "RandomRotation is not replayed"),
    (T1.Compose([T1.RandomResizedCrop(64, interpolation=T1.InterpolationMode.BICUBIC), T1.ToTensor()]), "bilinear"),
    (T1.Compose([T1.RandomHorizontalFlip(), T1.ToTensor()]), "one size"),
    (T1.Compose([T1.RandomResizedCrop(64)]), "ends with a PIL image"),
    (T1.Compose([T1.RandomResizedCrop(64), T1.RandomErasing(), T1.ToTensor()]), "erase after ToTensor"),
    (T1.Compose([T1.RandomResizedCrop(64), T1.ToTensor(), T1.TrivialAugmentWide()]), "on a float tensor"),
    (T1.Compose([T1.RandomResizedCrop(64), T1.ToTensor(), T1.AugMix()]), "AugMix on a float tensor"),
    (T1.Compose([T1.RandomResizedCrop(64), T1.RandAugment(interpolation=T1.InterpolationMode.BICUBIC),
                 T1.ToTensor()]), "only nearest and bilinear"),
    (T2.Compose([T2.RandomResizedCrop(64), T2.AutoAugment(fill={tv_tensors.Image: 3}), T2.ToImage()]), "fill per input"),
    (T1.Compose([T1.CenterCrop(64), T1.Grayscale(1), T1.ToTensor()]), "num_output_channels=3"),
    ([T1.RandomResizedCrop(64)], "Compose"),
])
def test_unsupported_transforms_are_named(compose, match):
    with pytest.raises(UnsupportedTransform, match=match):
        recognise(compose)


def test_subclasses_are_not_replayed():
    class MyCrop(T1.RandomResizedCrop):
        pass

    with pytest.raises(UnsupportedTransform, match="MyCrop"):
        recognise(T1.Compose([MyCrop(64), T1.ToTensor()]))


def test_a_policy_is_a_step_with_two_numbers_per_operation_slot():
    compose = T2.Compose([T2.RandomResizedCrop(64), T2.RandAugment(num_ops=3), T2.ToImage()])
    sampler = ReplaySampler.from_compose(compose)
    assert [s.kind for s in sampler.steps] == ["resized_crop", "auto_augment", "to_uint8"]
    assert sampler.steps[1].width == 6 and sampler.width == 4 + 6
    with pytest.warns(DeprecationWarning, match="changes nothing"):
        again = ReplaySampler.from_compose(compose, same_distribution=True)
    assert [s.kind for s in again.steps] == [s.kind for s in sampler.steps]
