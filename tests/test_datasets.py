"""Synthetic datasets: file counts, label validity, determinism, cache reuse."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from PIL import Image

from pipeline_opt.datasets import make_image_folder, make_yolo_dataset


def _digest(folder: Path, pattern: str) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.rglob(pattern))}


def _mtimes(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_image_folder_layout(tiny_image_folder):
    classes = sorted(p.name for p in tiny_image_folder.iterdir() if p.is_dir())
    assert classes == [f"class_{c:03d}" for c in range(4)]
    files = sorted(tiny_image_folder.rglob("*.jpg"))
    assert len(files) == 48
    assert all(len(list((tiny_image_folder / c).glob("*.jpg"))) == 12 for c in classes)
    with Image.open(files[0]) as img:
        assert img.format == "JPEG" and img.size == (320, 240) and img.mode == "RGB"


def test_images_compress_like_photos_not_noise(tiny_image_folder):
    path = next(tiny_image_folder.rglob("*.jpg"))
    raw = 320 * 240 * 3
    assert path.stat().st_size < raw / 4  # pure noise at q=90 would be close to raw size


def test_image_folder_is_deterministic_and_seed_dependent(tmp_path):
    a = make_image_folder(n_images=6, size=(64, 48), num_classes=2, seed=3, root=tmp_path / "a", workers=1)
    b = make_image_folder(n_images=6, size=(64, 48), num_classes=2, seed=3, root=tmp_path / "b", workers=2)
    c = make_image_folder(n_images=6, size=(64, 48), num_classes=2, seed=4, root=tmp_path / "c", workers=1)
    assert _digest(a, "*.jpg") == _digest(b, "*.jpg")
    assert _digest(a, "*.jpg") != _digest(c, "*.jpg")


def test_image_folder_cache_is_reused(tmp_path):
    first = make_image_folder(n_images=6, size=(64, 48), num_classes=2, root=tmp_path, workers=1)
    before = _mtimes(first)
    again = make_image_folder(n_images=6, size=(64, 48), num_classes=2, root=tmp_path, workers=1)
    assert again == first and _mtimes(again) == before
    other = make_image_folder(n_images=8, size=(64, 48), num_classes=2, root=tmp_path, workers=1)
    assert other != first and len(list(other.rglob("*.jpg"))) == 8


def test_default_root_follows_the_cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_OPT_CACHE", str(tmp_path / "cache"))
    folder = make_image_folder(n_images=2, size=(32, 32), num_classes=1, workers=1)
    assert tmp_path / "cache" in folder.parents


@pytest.mark.parametrize("kwargs, message", [
    ({"n_images": 0}, "n_images"), ({"size": (4, 4)}, "size"), ({"num_classes": 0}, "num_classes"),
])
def test_image_folder_rejects_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_image_folder(root=tmp_path, **{"n_images": 2, "size": (32, 32), **kwargs})


@pytest.fixture(scope="module")
def yolo_yaml(tmp_path_factory):
    return make_yolo_dataset(n_train=8, n_val=3, size=(160, 120), num_classes=3, seed=1,
                             root=tmp_path_factory.mktemp("yolo"), workers=1)


def test_yolo_dataset_layout_and_yaml(yolo_yaml):
    root = yolo_yaml.parent
    text = yolo_yaml.read_text()
    assert f"path: {root.resolve()}" in text and "train: images/train" in text and "val: images/val" in text
    assert all(f"  {k}: class{k}" in text for k in range(3))
    for split, n in (("train", 8), ("val", 3)):
        images = sorted((root / "images" / split).glob("*.jpg"))
        labels = sorted((root / "labels" / split).glob("*.txt"))
        assert len(images) == len(labels) == n
        assert [p.stem for p in images] == [p.stem for p in labels]


def test_yolo_labels_are_valid(yolo_yaml):
    labels = list((yolo_yaml.parent / "labels").rglob("*.txt"))
    n_boxes = 0
    for path in labels:
        for line in path.read_text().splitlines():
            cls, *coords = line.split()
            assert 0 <= int(cls) < 3
            x, y, w, h = map(float, coords)
            assert 0 < w <= 1 and 0 < h <= 1
            assert 0 <= x - w / 2 - 1e-6 and x + w / 2 <= 1 + 1e-6
            assert 0 <= y - h / 2 - 1e-6 and y + h / 2 <= 1 + 1e-6
            n_boxes += 1
    assert n_boxes >= len(labels)  # at least one box per image


def test_yolo_dataset_deterministic_and_cached(tmp_path, yolo_yaml):
    again = make_yolo_dataset(n_train=8, n_val=3, size=(160, 120), num_classes=3, seed=1, root=tmp_path, workers=2)
    assert _digest(again.parent, "*.txt") == _digest(yolo_yaml.parent, "*.txt")
    assert _digest(again.parent, "*.jpg") == _digest(yolo_yaml.parent, "*.jpg")
    before = _mtimes(again.parent)
    assert make_yolo_dataset(n_train=8, n_val=3, size=(160, 120), num_classes=3, seed=1, root=tmp_path) == again
    assert _mtimes(again.parent) == before
