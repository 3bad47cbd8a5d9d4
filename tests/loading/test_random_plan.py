"""plan_random_gpu_pipeline: when the replay applies, why not otherwise, and the plan's hooks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from pipeline_opt.datasets import make_image_folder
from pipeline_opt.loading.random_plan import RandomGpuPlan, plan_random_gpu_pipeline
from pipeline_opt.transforms.replay import ReplayBatch, ReplayDataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TRAIN = T1.Compose([T1.RandomResizedCrop(48), T1.RandomHorizontalFlip(), T1.ColorJitter(0.2, 0.2, 0.2),
                    T1.ToTensor(), T1.Normalize(MEAN, STD)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(n_images=8, size=(160, 120), num_classes=2, seed=5,
                             root=tmp_path_factory.mktemp("plan_images"), workers=1)


def test_plan_for_a_training_loader(folder):
    pytest.importorskip("kornia")
    loader = DataLoader(ImageFolder(str(folder), transform=TRAIN), batch_size=4)
    plan, why = plan_random_gpu_pipeline(loader)
    assert why == "" and isinstance(plan, RandomGpuPlan)
    assert dataclasses.is_dataclass(plan) and plan.__dataclass_params__.frozen
    assert plan.exactness == "decode" and plan.moved[0] == "RandomResizedCrop"
    assert isinstance(plan.dataset(), ReplayDataset) and plan.collate_fn.__name__ == "replay_collate"
    built = plan.build(loader, "cpu", {"num_workers": 2})
    batches = list(built)
    assert len(batches) == 2 and batches[0][0].shape == (4, 3, 48, 48)
    assert isinstance(next(iter(built.loader)), ReplayBatch)
    parity = plan.measure_error("cpu", n=4)
    assert plan.within_tolerance(parity) == (True, "")
    worse = dataclasses.replace(parity, end_to_end_mean=3.0)
    ok, why = plan.within_tolerance(worse)
    assert not ok and "3.000 levels" in why
    ok, why = plan.within_tolerance(dataclasses.replace(parity, same_draws=False))
    assert not ok and "draws" in why


def test_a_policy_is_planned_with_the_same_draws(folder):
    pytest.importorskip("kornia")
    ds = ImageFolder(str(folder), transform=T2.Compose([T2.RandomResizedCrop(48), T2.RandAugment(), T2.ToImage()]))
    plan, why = plan_random_gpu_pipeline(ds)
    assert plan is not None and plan.exactness == "decode" and plan.moved[1] == "RandAugment", why
    assert "same draws" in plan.describe()[1]
    with pytest.warns(DeprecationWarning, match="same_distribution=True is no longer needed"):
        again, _ = plan_random_gpu_pipeline(ds, same_distribution=True)
    assert again is not None and again.moved == plan.moved


def _png_folder(tmp_path):
    (tmp_path / "c").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "c" / "a.png")
    return tmp_path


def _cmyk_folder(tmp_path):
    (tmp_path / "c").mkdir()
    Image.new("CMYK", (64, 64)).save(tmp_path / "c" / "a.jpg")
    return tmp_path


@pytest.mark.parametrize("make, match", [
    (lambda folder, tmp: DataLoader(ImageFolder(str(folder), transform=T1.Compose([
        T1.Resize(64), T1.CenterCrop(48), T1.ToTensor()])), batch_size=2), "nvJPEG decode plan"),
    (lambda folder, tmp: DataLoader(ImageFolder(str(folder), transform=TRAIN), batch_size=2,
                                    collate_fn=lambda b: b), "own collate_fn"),
    (lambda folder, tmp: DataLoader(ImageFolder(str(folder), transform=TRAIN), batch_size=None), "does not batch"),
    (lambda folder, tmp: ImageFolder(str(folder), transform=TRAIN, loader=lambda p: Image.open(p).convert("RGB")),
     "its own loader"),
    (lambda folder, tmp: ImageFolder(str(_png_folder(tmp)), transform=TRAIN), "not every image is a JPEG"),
    (lambda folder, tmp: ImageFolder(str(_cmyk_folder(tmp)), transform=TRAIN), "CMYK"),
    (lambda folder, tmp: ImageFolder(str(folder), transform=T1.Compose([T1.RandomResizedCrop(48), T1.RandomRotation(5),
                                                                        T1.ToTensor()])), "RandomRotation"),
    (lambda folder, tmp: torch.utils.data.TensorDataset(torch.zeros(4)), "not an ImageFolder-like dataset"),
], ids=["deterministic", "collate", "unbatched", "loader", "png", "cmyk", "rotation", "tensors"])
def test_reasons(folder, tmp_path, make, match):
    pytest.importorskip("kornia")
    plan, why = plan_random_gpu_pipeline(make(folder, tmp_path))
    assert plan is None and match in why


def test_target_transform_is_kept(folder):
    pytest.importorskip("kornia")
    ds = ImageFolder(str(folder), transform=TRAIN, target_transform=lambda y: y + 10)
    plan, _ = plan_random_gpu_pipeline(ds)
    assert plan.dataset()[0][2] == ds.targets[0] + 10


def test_library_imports_and_plans_without_kornia(folder):
    """Kornia missing: pipeline_opt imports, the plan says how to install it, random_gpu says it too."""
    code = f"""
import sys
sys.modules["kornia"] = None
import pipeline_opt
from pipeline_opt.transforms import *
from pipeline_opt.loading import plan_random_gpu_pipeline
from pipeline_opt.transforms import split_random_transforms
from torchvision.datasets import ImageFolder
import torchvision.transforms as T1
ds = ImageFolder({str(folder)!r}, transform=T1.Compose([T1.RandomResizedCrop(32), T1.ToTensor()]))
plan, why = plan_random_gpu_pipeline(ds)
assert plan is None, plan
print("PLAN:", why)
try:
    split_random_transforms(ds.transform)
except ImportError as e:
    print("SPLIT:", e)
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "PLAN: Kornia is not installed" in out.stdout and "pip install 'pipeline-opt[gpu]'" in out.stdout
    assert "SPLIT:" in out.stdout and "pip install 'pipeline-opt[gpu]'" in out.stdout.split("SPLIT:")[1]
