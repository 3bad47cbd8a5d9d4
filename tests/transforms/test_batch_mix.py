"""MixUp / CutMix in the collate_fn, replayed: recognised, checked, same draws, same labels, same pixels (CPU).

torchvision's reference recipe: ``lambda batch: RandomChoice([CutMix, MixUp])(*default_collate(batch))``.
The worker makes the mix's draws and mixes the labels; the device mixes the images with the
original's arithmetic. Over N=256 batches the torch RNG state after every batch, the labels and the
mixed images must equal the original's (bit for bit on the same images).
"""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torch.utils.data import DataLoader, default_collate
from torchvision.datasets import ImageFolder

from pipeline_opt.datasets import make_image_folder
from pipeline_opt.loading.random_plan import Tolerance, plan_random_gpu_pipeline
from pipeline_opt.transforms.batch_mix import (
    MIX_WIDTH,
    BatchMix,
    ReplayCollate,
    apply_batch_mix,
    find_batch_mix,
)
from pipeline_opt.transforms.replay import ReplayBatch

N = 256
CLASSES = 5
MIXES = {
    "choice": lambda: T2.RandomChoice([T2.CutMix(num_classes=CLASSES), T2.MixUp(num_classes=CLASSES, alpha=0.2)]),
    "mixup": lambda: T2.MixUp(num_classes=CLASSES, alpha=0.8),
    "cutmix": lambda: T2.CutMix(num_classes=CLASSES),
    "weighted-choice": lambda: T2.RandomChoice([T2.CutMix(num_classes=CLASSES), T2.MixUp(num_classes=CLASSES)],
                                               p=[0.2, 0.8]),
}
_GLOBAL_MIX = T2.MixUp(num_classes=CLASSES)


def _global_form(batch):
    return _GLOBAL_MIX(*default_collate(batch))


def _batches(n: int, shape=(3, 20, 16)):
    gen = torch.Generator().manual_seed(2)
    return [[(torch.rand(shape, generator=gen), int(torch.randint(CLASSES, (1,), generator=gen))) for _ in range(6)]
            for _ in range(n)]


@pytest.mark.parametrize("name", list(MIXES))
def test_the_draws_labels_and_rng_state_equal_the_originals(name):
    mix = MIXES[name]()
    collate = lambda batch: mix(*default_collate(batch))  # noqa: E731  (the reference recipe's own form)
    found, why = find_batch_mix(collate)
    assert found is not None, why
    batches = _batches(N)
    torch.manual_seed(9)
    want, states = [], []
    for b in batches:
        want.append(collate(b))
        states.append(torch.get_rng_state())
    torch.manual_seed(9)
    kinds = set()
    for b, (wx, wy), state in zip(batches, want, states):
        images, labels = default_collate(b)
        member, row = found.draw(tuple(images.shape))
        kinds.add(int(row[0]))
        assert torch.equal(torch.get_rng_state(), state)
        assert torch.equal(found.mix_labels(member, labels, row), wy)
        assert torch.equal(apply_batch_mix(images, row), wx)
    assert kinds == ({1, 2} if "choice" in name else {1} if name == "mixup" else {2})


def test_the_forms_a_collate_takes_are_recognised_or_named():
    mix = MIXES["choice"]()

    def closure(batch):
        return mix(*default_collate(batch))

    assert find_batch_mix(closure)[0] is not None
    assert find_batch_mix(_global_form)[0] is not None

    def scaled(batch):  # does more than the mix: refused by the probe, not by its shape
        x, y = mix(*default_collate(batch))
        return x * 2, y

    found, why = find_batch_mix(scaled)
    assert found is None and "does more than" in why

    def plain(batch):
        return default_collate(batch)

    found, why = find_batch_mix(plain)
    assert found is None and "own collate_fn (test_the_forms" in why and "MixUp" in why
    found, why = find_batch_mix(lambda batch: T2.MixUp()(*default_collate(batch)))  # built inside: not found
    assert found is None


def test_replay_collate_appends_the_draw_and_mixes_the_labels():
    mix = BatchMix(MIXES["cutmix"]())
    packed = ReplayBatch(torch.zeros(10, dtype=torch.uint8), torch.tensor([5, 5]), torch.zeros(2, 3, dtype=torch.float64),
                         torch.zeros(0), torch.zeros(2, dtype=torch.int64), torch.tensor([1, 3]))
    out = ReplayCollate(mix, lambda batch: packed, (20, 16))([None, None])
    assert out.params.shape == (2, 3 + MIX_WIDTH)
    assert torch.equal(out.params[0, 3:], out.params[1, 3:]) and out.params[0, 3] == 2.0
    assert out.labels.shape == (2, CLASSES) and torch.allclose(out.labels.sum(1), torch.ones(2))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(n_images=16, size=(160, 120), num_classes=2, seed=6,
                             root=tmp_path_factory.mktemp("mix_images"), workers=1)


def test_a_two_worker_loader_with_the_reference_collate_is_replayed(folder):
    pytest.importorskip("kornia")
    compose = T1.Compose([T1.RandomResizedCrop(48), T1.RandomHorizontalFlip(), T1.TrivialAugmentWide(),
                          T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize([0.5] * 3, [0.25] * 3),
                          T1.RandomErasing(0.25)])
    mix = T2.RandomChoice([T2.CutMix(num_classes=2), T2.MixUp(num_classes=2)])
    gen = torch.Generator()
    loader = DataLoader(ImageFolder(str(folder), transform=compose), batch_size=4, shuffle=True, num_workers=2,
                        collate_fn=lambda batch: mix(*default_collate(batch)), multiprocessing_context="fork",
                        generator=gen)
    plan, why = plan_random_gpu_pipeline(loader)
    assert plan is not None, why
    assert "then the collate_fn's RandomChoice" in plan.describe()[0]
    gen.manual_seed(3)  # the clone copies the generator's state: the same order and worker seeds
    replayed = plan.build(loader, "cpu", {"num_workers": 2}, prepare_in_thread=False)
    want = list(loader)
    got = list(replayed)
    assert len(got) == len(want) == 4
    for (wx, wy), (gx, gy) in zip(want, got):
        assert torch.equal(wy, gy.cpu())  # the soft labels, bit for bit
        assert float(((gx.cpu() - wx).abs() * 255 * 0.25).mean()) < Tolerance().mean_levels_cpu_decode


def test_a_mix_on_uint8_output_is_refused(folder):
    pytest.importorskip("kornia")
    compose = T1.Compose([T1.RandomResizedCrop(48), T1.PILToTensor()])
    mix = T2.MixUp(num_classes=2)
    loader = DataLoader(ImageFolder(str(folder), transform=compose), batch_size=4,
                        collate_fn=lambda batch: mix(*default_collate(batch)))
    plan, why = plan_random_gpu_pipeline(loader)
    assert plan is None
    assert "float" in why


def test_a_collate_that_mixes_only_some_batches_is_refused_and_the_callers_rng_is_kept():
    import random

    mix = T2.MixUp(num_classes=CLASSES)
    some = lambda b: mix(*default_collate(b)) if random.random() < 0.5 else default_collate(b)  # noqa: E731
    for seed in range(10):
        random.seed(seed)
        state = random.getstate()
        found, why = find_batch_mix(some)
        assert found is None and "does more than" in why, seed
        assert random.getstate() == state  # the probe restores Python's RNG too
