"""The workers' draws of torchvision's auto-augment policies equal the originals' (CPU).

Each policy's ``forward`` is run on an image with its operation recorded (torchvision's op
dispatcher replaced for the test only), then :func:`draw_policy` is run from the same seed: the
operations, their magnitudes and the torch RNG state after 256 samples must be the same.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.autoaugment as tv_autoaugment
import torchvision.transforms.v2 as T2

from pipeline_opt.transforms.policy_draws import (
    NO_OP,
    OPS,
    augmix_width,
    check_policy,
    draw_augmix,
    draw_policy,
    policy_slots,
)
from pipeline_opt.transforms.transform_info import UnsupportedTransform

N = 256
POLICIES = [
    T1.TrivialAugmentWide(), T1.TrivialAugmentWide(num_magnitude_bins=7), T1.RandAugment(),
    T1.RandAugment(num_ops=3, magnitude=5, num_magnitude_bins=11), T1.AutoAugment(T1.AutoAugmentPolicy.IMAGENET),
    T1.AutoAugment(T1.AutoAugmentPolicy.CIFAR10), T1.AutoAugment(T1.AutoAugmentPolicy.SVHN),
    T2.TrivialAugmentWide(), T2.RandAugment(), T2.RandAugment(num_ops=1, magnitude=30),
    T2.AutoAugment(T2.AutoAugmentPolicy.IMAGENET), T2.AutoAugment(T2.AutoAugmentPolicy.CIFAR10),
    T2.AutoAugment(T2.AutoAugmentPolicy.SVHN),
]


def _recorded_forward(policy, monkeypatch, height, width):
    """``(ops applied, RNG state)`` after ``N`` calls of the original ``forward`` from seed 3."""
    applied = []
    if isinstance(policy, T2.Transform):
        def record(image, op, magnitude, interpolation, fill):
            applied.append((op, magnitude * 255.0 if op == "Solarize" else magnitude))  # v2: threshold in [0, 1]
            return image
        monkeypatch.setattr(policy, "_apply_image_or_video_transform", record)
    else:
        def record(image, op, magnitude, interpolation, fill):
            applied.append((op, magnitude))
            return image
        monkeypatch.setattr(tv_autoaugment, "_apply_op", record)
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    torch.manual_seed(3)
    for _ in range(N):
        policy(image)
    return applied, torch.get_rng_state()


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{type(p).__module__.split('.')[-2]}-{p!r}"[:60])
@pytest.mark.parametrize("height, width", [(37, 53), (224, 224)])
def test_the_draws_and_the_rng_state_equal_the_originals(policy, height, width, monkeypatch):
    applied, state = _recorded_forward(policy, monkeypatch, height, width)
    torch.manual_seed(3)
    rows = [draw_policy(policy, height, width) for _ in range(N)]
    assert torch.equal(torch.get_rng_state(), state)
    assert all(len(r) == 2 * policy_slots(policy) for r in rows)
    drawn = [(OPS[int(code)], magnitude) for row in rows for code, magnitude in zip(row[::2], row[1::2])
             if code != NO_OP]
    assert drawn == applied
    assert len({op for op, _ in drawn}) >= 10  # the test covers most operations, not one


def test_only_the_exact_policy_classes_are_accepted():
    class MyTrivial(T1.TrivialAugmentWide):
        pass

    with pytest.raises(UnsupportedTransform, match="MyTrivial is not a torchvision policy"):
        check_policy(MyTrivial())


def test_a_torchvision_without_the_magnitude_tables_is_refused_by_name(monkeypatch):
    policy = T2.RandAugment()
    monkeypatch.delattr(T2.RandAugment, "_AUGMENTATION_SPACE")
    with pytest.raises(UnsupportedTransform, match="has no _AUGMENTATION_SPACE"):
        check_policy(policy)


AUGMIXES = [T1.AugMix(), T1.AugMix(severity=7, mixture_width=2, chain_depth=2, all_ops=False),
            T2.AugMix(), T2.AugMix(severity=1, mixture_width=4, chain_depth=1, alpha=0.5)]


@pytest.mark.parametrize("augmix", AUGMIXES, ids=lambda p: f"{type(p).__module__.split('.')[-2]}-{p!r}"[:60])
def test_augmix_draws_and_weights_equal_the_originals(augmix, monkeypatch):
    weights = []
    dirichlet = augmix._sample_dirichlet
    monkeypatch.setattr(augmix, "_sample_dirichlet", lambda p: weights.append(dirichlet(p)) or weights[-1])
    applied, state = _recorded_forward(augmix, monkeypatch, 40, 56)
    torch.manual_seed(3)
    rows = [draw_augmix(augmix, 40, 56) for _ in range(N)]
    assert torch.equal(torch.get_rng_state(), state)
    k = augmix.mixture_width
    assert all(len(r) == augmix_width(augmix) for r in rows)
    drawn = [(OPS[int(c)], m) for r in rows for c, m in zip(r[1 + k::2], r[2 + k::2]) if c != NO_OP]
    assert drawn == applied
    m0 = [float(w[0, 0]) for w in weights[:2 * N:2]]  # the original's draws (the replay's follow)
    assert [r[0] for r in rows] == m0 and all(abs(sum(r[:1 + k]) - 1.0) < 1e-5 for r in rows)
