"""The dataset's own decode setting: named for an uncached ultralytics dataset, with its memory cost."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PIL import Image

from pipeline_opt.profile import decode_advice as advice_mod
from pipeline_opt.profile.decode_advice import (
    cached_image_bytes,
    decode_advice,
    is_uncached_ultralytics_dataset,
)


def _fake_ultralytics(files, cache=None, imgsz=64):
    return SimpleNamespace(im_files=[str(f) for f in files], ims=[None] * len(files), buffer=[],
                           load_image=lambda i: None, imgsz=imgsz, cache=cache, channels=3)


@pytest.fixture
def jpegs(tmp_path):
    files = []
    for i, size in enumerate([(160, 120), (120, 160), (64, 64), (32, 16)]):
        f = tmp_path / f"im{i}.jpg"
        Image.new("RGB", size, (i * 40, 10, 200)).save(f)
        files.append(f)
    return files


def test_the_cache_estimate_is_the_decoded_size_load_image_would_keep(jpegs):
    ds = _fake_ultralytics(jpegs, imgsz=64)
    # long side to 64 (ceil, capped): 64x48, 48x64, 64x64 as it is, 32x16 up to 64x32; 3 channels each
    want = (64 * 48 + 48 * 64 + 64 * 64 + 64 * 32) * 3
    assert cached_image_bytes(ds) == pytest.approx(want)
    ds.im_files = ds.im_files * 5  # 20 files, the same 4 sizes: the mean times the count
    assert cached_image_bytes(ds, headers=20) == pytest.approx(5 * want)
    assert cached_image_bytes(_fake_ultralytics([jpegs[0].with_suffix(".missing")])) is None


def test_advice_names_cache_ram_with_its_size_or_disk_when_ram_is_short(jpegs, monkeypatch):
    ds = _fake_ultralytics(jpegs, imgsz=64)
    gib = 1 << 30
    monkeypatch.setattr(advice_mod, "cached_image_bytes", lambda d: 2.0 * gib)
    monkeypatch.setattr("psutil.virtual_memory", lambda: SimpleNamespace(available=4 * gib))  # 2x fits
    text = decode_advice(ds)
    assert "cache='ram'" in text and "about 2.0 GB for 4 images at imgsz=64" in text and "4.0 GB available" in text
    assert "cache='disk'" in text
    monkeypatch.setattr("psutil.virtual_memory", lambda: SimpleNamespace(available=int(3.9 * gib)))
    short = decode_advice(ds)  # ultralytics wants 2x 2.0 GB free > 3.9 GB
    assert "asks for 2x that free, more than the 3.9 GB available now" in short and "train(..., cache='disk'" in short


def test_no_advice_for_a_cached_or_foreign_dataset_and_loaders_are_looked_through(jpegs):
    assert decode_advice(_fake_ultralytics(jpegs, cache="ram")) == ""
    assert decode_advice(_fake_ultralytics(jpegs, cache="disk")) == ""
    assert decode_advice(SimpleNamespace(dataset=list(range(4)))) == ""
    assert decode_advice(None) == ""
    assert not is_uncached_ultralytics_dataset(_fake_ultralytics(jpegs, imgsz=(64, 48)))  # a fixed eval shape
    ds = _fake_ultralytics(jpegs)
    loader = SimpleNamespace(dataset=SimpleNamespace(dataset=ds))  # a loader around the profiler's proxy
    assert decode_advice(loader) == decode_advice(ds) != ""
    device_loader = SimpleNamespace(loader=loader)
    assert decode_advice(device_loader) == decode_advice(ds)

