"""DeviceLoader: nested batches, transforms on the image tensor, pass-through attributes, workers."""

from __future__ import annotations

import gc
from collections import OrderedDict, namedtuple

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline_opt.loading.device_loader import DeviceLoader, apply_to_images
from pipeline_opt.transforms.gpu import Normalize, ToFloat

Pair = namedtuple("Pair", ["image", "label"])


class Images(Dataset):
    """Deterministic uint8 images with nested extras (module level: picklable for workers)."""

    def __init__(self, n: int = 12, kind: str = "tuple") -> None:
        self.n, self.kind = n, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        img = torch.full((3, 8, 8), i, dtype=torch.uint8)
        if self.kind == "dict":
            return {"meta": {"idx": torch.tensor(i), "name": f"s{i}"}, "img": img, "cls": torch.tensor([i % 3])}
        if self.kind == "namedtuple":
            return Pair(img, i)
        return img, (torch.tensor(i), [torch.tensor(float(i))])


def _double(x: torch.Tensor) -> torch.Tensor:
    return x.float() * 2


def test_tuple_batches_cpu_pass_through_with_transform():
    loader = DataLoader(Images(), batch_size=4)
    dl = DeviceLoader(loader, device="cpu", transform=ToFloat())
    batches = list(dl)
    assert len(batches) == len(dl) == 3
    img, (idx, [val]) = batches[1]
    assert img.dtype == torch.float32 and torch.allclose(img[:, 0, 0, 0], torch.arange(4, 8) / 255)
    assert idx.tolist() == [4, 5, 6, 7] and val.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert len(list(dl)) == 3  # a second pass works


def test_dict_and_namedtuple_batches():
    dl = DeviceLoader(DataLoader(Images(kind="dict"), batch_size=3), device="cpu", transform=_double)
    batch = next(iter(dl))
    assert batch["img"].dtype == torch.float32 and batch["img"][1, 0, 0, 0] == 2.0
    assert batch["meta"]["idx"].tolist() == [0, 1, 2] and batch["meta"]["name"] == ["s0", "s1", "s2"]
    assert list(batch) == ["meta", "img", "cls"]  # key order kept
    dl = DeviceLoader(DataLoader(Images(kind="namedtuple"), batch_size=3), device="cpu", transform=_double)
    batch = next(iter(dl))
    assert isinstance(batch, Pair) and batch.image[2, 0, 0, 0] == 4.0 and batch.label.tolist() == [0, 1, 2]


def test_apply_to_images_follows_extract_images():
    x = torch.zeros(2, 3, 4, 4)
    out = apply_to_images(OrderedDict(labels=torch.zeros(2), image=x), lambda t: t + 1)
    assert isinstance(out, OrderedDict) and out["image"].eq(1).all() and out["labels"].eq(0).all()
    out = apply_to_images({"boxes": torch.zeros(2), "feat": x}, lambda t: t + 1)  # first tensor of dim >= 2
    assert out["feat"].eq(1).all() and out["boxes"].eq(0).all()
    out = apply_to_images(["name", x, torch.zeros(2)], lambda t: t + 1)
    assert out[0] == "name" and out[1].eq(1).all() and out[2].eq(0).all()
    original = (x, 1)
    apply_to_images(original, lambda t: t + 1)
    assert original[0] is x and x.eq(0).all()  # the input batch is not modified
    with pytest.raises(TypeError, match="image"):
        apply_to_images({"a": 1}, lambda t: t)


def test_batch_transform_runs_before_transform():
    calls = []

    def batch_tf(batch):
        calls.append(batch[0].dtype)
        return batch[0][:, :1], batch[1]

    dl = DeviceLoader(DataLoader(Images(), batch_size=4), device="cpu", transform=ToFloat(), batch_transform=batch_tf)
    img, _ = next(iter(dl))
    assert calls == [torch.uint8] and img.shape == (4, 1, 8, 8) and img.dtype == torch.float32


def test_attributes_pass_through_and_validation():
    loader = DataLoader(Images(), batch_size=5, num_workers=0)
    dl = DeviceLoader(loader, device="cpu")
    assert dl.loader is loader and dl.dataset is loader.dataset and dl.batch_size == 5
    assert dl.sampler is loader.sampler and dl.num_workers == 0 and dl.device == torch.device("cpu")
    assert dl.transform is None and dl.non_blocking is True
    with pytest.raises(AttributeError):
        dl.no_such_attribute  # noqa: B018
    with pytest.raises(TypeError, match="iterable"):
        DeviceLoader(42)
    with pytest.raises(TypeError, match="one-shot"):
        DeviceLoader(iter(loader))
    with pytest.raises(TypeError, match="transform"):
        DeviceLoader(loader, transform="normalize")
    with pytest.raises(ValueError, match="device"):
        DeviceLoader(loader, device="no-such-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            DeviceLoader(loader, device="cuda")
        assert DeviceLoader(loader).device == torch.device("cpu")


def test_abandoned_pass_releases_workers():
    loader = DataLoader(Images(n=64), batch_size=2, num_workers=2)
    dl = DeviceLoader(loader, device="cpu", transform=ToFloat())
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    for _ in range(2):
        it = iter(dl)
        next(it)
        assert len({p.pid for p in me.children(recursive=True)} - before) == 2
        it.close()
        del it
        gc.collect()
    psutil.wait_procs([p for p in me.children(recursive=True) if p.pid not in before], timeout=10)
    assert {p.pid for p in me.children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE} - before == set()
    assert sum(b[0].shape[0] for b in dl) == 64  # full pass after the abandoned ones


@pytest.mark.cuda
def test_cuda_stream_prefetch_matches_cpu():
    loader = DataLoader(Images(n=24, kind="dict"), batch_size=4, pin_memory=True, num_workers=2)
    tf = torch.nn.Sequential(ToFloat(), Normalize([0.5] * 3, [0.25] * 3))
    ref = list(DeviceLoader(loader, device="cpu", transform=tf))
    dl = DeviceLoader(loader, device="cuda", transform=tf)
    heavy = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):  # twice: a fresh side stream and loader iterator each pass
        got = []
        for batch in dl:
            assert batch["img"].is_cuda and batch["meta"]["idx"].is_cuda and batch["meta"]["name"][0].startswith("s")
            for _ in range(5):  # keep the consumer stream busy while the next batch is copied
                heavy = (heavy @ heavy).tanh_()
            got.append({"img": batch["img"] * 1, "idx": batch["meta"]["idx"] + 0})
        torch.cuda.synchronize()
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert torch.equal(g["img"].cpu(), r["img"]) and torch.equal(g["idx"].cpu(), r["meta"]["idx"])


@pytest.mark.cuda
def test_cuda_on_a_non_default_consumer_stream():
    loader = DataLoader(Images(n=16), batch_size=4, pin_memory=True)
    dl = DeviceLoader(loader, device="cuda", transform=ToFloat())
    stream = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(stream):
        for img, _rest in dl:
            sums.append((img * 255).round().sum().item())
    expected = [float(sum(range(4 * k, 4 * k + 4)) * 3 * 64) for k in range(4)]
    assert sums == expected
