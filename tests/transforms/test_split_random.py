"""split_random_transforms: a training Compose -> (parameter sampler, GPU replay); split_transforms unchanged."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T1
from torchvision.datasets import ImageFolder

from pipeline_opt.transforms.replay import ReplayDataset, ReplaySampler, UnsupportedTransform, replay_collate
from pipeline_opt.transforms.split import split_random_transforms, split_transforms

kornia = pytest.importorskip("kornia")
import kornia.augmentation as KA  # noqa: E402

from pipeline_opt.transforms.random_gpu import RandomGpuPipeline  # noqa: E402

TRAIN = T1.Compose([T1.RandomResizedCrop(32), T1.RandomHorizontalFlip(), T1.ToTensor(),
                    T1.Normalize([0.5] * 3, [0.25] * 3), T1.RandomErasing()])


def test_split_random_transforms(tiny_image_folder):
    sampler, gpu_part = split_random_transforms(TRAIN, device="cpu")
    assert isinstance(sampler, ReplaySampler) and sampler.same_draws
    assert isinstance(gpu_part, RandomGpuPipeline) and gpu_part.device.type == "cpu"
    ds = ImageFolder(str(tiny_image_folder))
    replay = ReplayDataset(ds.samples[:3], sampler)
    images, labels = gpu_part(replay_collate([replay[i] for i in range(3)]))
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32


def test_users_kornia_stage_runs_after(tiny_image_folder):
    then = KA.AugmentationSequential(KA.RandomGrayscale(p=1.0))
    sampler, gpu_part = split_random_transforms(T1.Compose([T1.RandomResizedCrop(32), T1.ToTensor()]), then=then,
                                                device="cpu")
    replay = ReplayDataset(ImageFolder(str(tiny_image_folder)).samples[:2], sampler)
    images, _ = gpu_part(replay_collate([replay[0], replay[1]]))
    assert torch.allclose(images[:, 0], images[:, 1]) and torch.allclose(images[:, 1], images[:, 2])


def test_unsupported_and_deterministic_behaviour_unchanged():
    with pytest.raises(UnsupportedTransform, match="RandomPerspective"):
        split_random_transforms(T1.Compose([T1.RandomResizedCrop(32), T1.RandomPerspective(), T1.ToTensor()]))
    cpu, gpu = split_transforms(TRAIN)  # random transforms never move with split_transforms
    assert gpu.moved == () and cpu is TRAIN
