"""The device side of the replay, run on the CPU: the same pixels as the CPU pipeline, step by step.

Stated tolerances (pixel levels, 1 = 1/255), measured by :func:`measure_replay_error` on photo-like
JPEGs with torchvision's CPU ``decode_jpeg`` (libjpeg, like Pillow):

* decode: 0 (same decoder);
* every step but the resizes, isolated (the device op on the CPU pipeline's own input): 0 on PIL
  images (Pillow's arithmetic emulated), 0 on float tensors except ColorJitter through Kornia
  (mean <= 0.01, max <= 0.05), and uint8-tensor hue at most 2 levels on rare pixels;
* RandomResizedCrop / Resize: torchvision's tensor kernel vs Pillow's 8-bit two-pass one, max 1
  level, mean <= 0.3;
* end to end: mean <= 0.5 (the plan's CPU-decode tolerance); single pixels can move further where a
  one-level resize difference changes the hue of a near-grey pixel.

The batched Kornia path (AugmentationSequential, per-sample colour order grouped per op) must give
bit-for-bit the per-image stepping's result.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.datasets import ImageFolder
from torchvision.transforms.v2 import functional as F2

from pipeline_opt.datasets import make_image_folder
from pipeline_opt.loading.random_plan import Tolerance
from pipeline_opt.transforms.replay import ReplayDataset, ReplaySampler, replay_collate, step_of
from pipeline_opt.transforms.replay_parity import measure_replay_error

kornia = pytest.importorskip("kornia")
import kornia.augmentation as KA  # noqa: E402

from pipeline_opt.transforms.random_gpu import (  # noqa: E402
    RandomGpuPipeline,
    ReplayColorJitter,
    ReplayHorizontalFlip,
    ReplayResizedCrop,
)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(n_images=12, size=(320, 240), num_classes=2, seed=4,
                             root=tmp_path_factory.mktemp("gpu_replay_images"), workers=1)


PIPELINES = {
    "v1-imagenet": lambda: T1.Compose([T1.RandomResizedCrop(64), T1.RandomHorizontalFlip(),
                                       T1.ColorJitter(0.4, 0.4, 0.4, 0.1), T1.RandomGrayscale(0.2), T1.ToTensor(),
                                       T1.Normalize(MEAN, STD), T1.RandomErasing(p=0.7)]),
    "v1-random-erase": lambda: T1.Compose([T1.RandomResizedCrop(64, scale=(0.3, 1)), T1.RandomVerticalFlip(),
                                           T1.ToTensor(), T1.RandomErasing(p=0.9, value="random")]),
    "v1-float-jitter": lambda: T1.Compose([T1.RandomResizedCrop(64), T1.ToTensor(), T1.ColorJitter(0.4, 0.4, 0.4, 0.1),
                                           T1.RandomGrayscale(0.3)]),
    "v1-crop-pad": lambda: T1.Compose([T1.Resize(72), T1.RandomCrop(64, padding=8, padding_mode="symmetric"),
                                       T1.RandomHorizontalFlip(), T1.PILToTensor()]),
    "v2-imagenet": lambda: T2.Compose([T2.RandomResizedCrop(64), T2.RandomHorizontalFlip(),
                                       T2.ColorJitter(0.3, 0.3, 0.3, 0.2), T2.ToImage(),
                                       T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD),
                                       T2.RandomErasing(p=0.8, value=(0.1, 0.2, 0.3))]),
    "v2-uint8": lambda: T2.Compose([T2.ToImage(), T2.RandomResizedCrop(64), T2.RandomHorizontalFlip(),
                                    T2.ColorJitter(0.4, 0.4, 0.4, 0.1), T2.RandomGrayscale(0.3),
                                    T2.ToDtype(torch.float32, scale=True)]),
    "v2-crop-fill": lambda: T2.Compose([T2.CenterCrop(200), T2.RandomCrop(64, padding=4, fill=(10, 200, 30)),
                                        T2.Grayscale(3), T2.ToImage()]),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_pixels_match_the_cpu_pipeline(folder, name):
    ds = ImageFolder(str(folder), transform=PIPELINES[name]())
    parity = measure_replay_error(ds, n=12, seed=11)
    assert parity.same_draws
    assert parity.decode_max == 0
    for step in parity.steps:
        if step.kind in ("resized_crop", "resize"):
            assert step.isolated_max <= 1 and step.isolated_mean <= 0.3, step
        elif step.kind == "color_jitter" and step.flavour == "float":
            assert step.isolated_max <= 0.05 and step.isolated_mean <= 0.01, step
        elif step.kind == "color_jitter" and step.flavour == "uint8":
            assert step.isolated_max <= 2 and step.isolated_mean <= 0.01, step
        else:
            assert step.isolated_max == 0, step
    assert parity.end_to_end_mean <= 0.5
    # the batched Kornia path equals the per-image stepping
    assert parity.end_to_end_mean == pytest.approx(parity.steps[-1].cumulative_mean, abs=1e-9)
    assert parity.end_to_end_max == pytest.approx(parity.steps[-1].cumulative_max, abs=1e-6)
    assert "end to end" in parity.table()


def test_device_stage_draws_nothing(folder):
    """Replaying consumes no torch RNG: with num_workers=0 the draws stay the CPU pipeline's."""
    ds = ImageFolder(str(folder), transform=PIPELINES["v1-imagenet"]())
    replay = ReplayDataset.from_image_folder(ds)
    batch = replay_collate([replay[i] for i in range(6)])
    pipeline = RandomGpuPipeline(replay.sampler, device="cpu")
    state = torch.get_rng_state()
    pipeline(batch)
    assert torch.equal(state, torch.get_rng_state())


def test_pipeline_output_dtype_and_labels(folder):
    ds = ImageFolder(str(folder), transform=PIPELINES["v1-crop-pad"]())
    replay = ReplayDataset.from_image_folder(ds)
    pipeline = RandomGpuPipeline(replay.sampler, device="cpu")
    images, labels = pipeline(replay_collate([replay[i] for i in range(4)]))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 64, 64)
    assert labels.tolist() == [replay.targets[i] for i in range(4)]
    assert any("per sample" in line for line in pipeline.describe())


def test_real_dataloader_two_workers_same_draws(folder):
    """The loader the tuner builds: ReplayDataset in 2 workers + RandomGpuPipeline, against the
    original loader with the same seed — same draws per worker, pixels within tolerance."""
    compose = PIPELINES["v1-imagenet"]()
    ds = ImageFolder(str(folder), transform=compose)
    original = DataLoader(ds, batch_size=4, num_workers=2)
    replay = ReplayDataset.from_image_folder(ds)
    loader = DataLoader(replay, batch_size=4, num_workers=2, collate_fn=replay_collate)
    pipeline = RandomGpuPipeline(replay.sampler, device="cpu")
    torch.manual_seed(21)
    want = [x for x, _ in original]
    torch.manual_seed(21)
    got = [pipeline(b)[0] for b in loader]
    for a, b in zip(want, got):
        diff = ((a - b) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
        assert diff.mean() <= 0.5


def test_then_runs_a_users_kornia_stage(folder):
    ds = ImageFolder(str(folder), transform=PIPELINES["v2-uint8"]())
    replay = ReplayDataset.from_image_folder(ds)
    then = KA.AugmentationSequential(KA.RandomGaussianNoise(std=0.05, p=1.0))
    plain = RandomGpuPipeline(replay.sampler, device="cpu")
    noisy = RandomGpuPipeline(replay.sampler, device="cpu", then=then)
    batch = replay_collate([replay[i] for i in range(3)])
    a, _ = plain(batch)
    b, _ = noisy(batch)
    assert a.shape == b.shape and 0.01 < (a - b).abs().mean() < 0.1
    assert "then AugmentationSequential" in noisy.describe()[-1]


def test_replay_modules_compose_in_augmentation_sequential_with_boxes():
    """Geometric Replay* augmentations carry boxes, mapped as torchvision maps them."""
    torch.manual_seed(0)
    x = torch.rand(3, 3, 40, 60)
    boxes = torch.tensor([[[5.0, 6.0, 20.0, 30.0]], [[0.0, 0.0, 60.0, 40.0]], [[33.0, 1.0, 59.0, 12.0]]])
    crop = ReplayResizedCrop(step_of(T1.RandomResizedCrop((24, 32)), "float"))
    flip = ReplayHorizontalFlip(step_of(T1.RandomHorizontalFlip(), "float"))
    seq = KA.AugmentationSequential(crop, flip, data_keys=["input", "bbox_xyxy"])
    rows = torch.tensor([[2, 3, 30, 40], [0, 0, 40, 60], [5, 10, 20, 45]], dtype=torch.float64)
    flips = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    params = [kornia.augmentation.container.params.ParamItem(name, module.replay_params(p, shape=s))
              for (name, module), p, s in zip(seq.named_children(), (rows, flips), (x.shape, (3, 3, 24, 32)))]
    out, out_boxes = seq(x, boxes, params=params)
    for i, ((top, left, h, w), f) in enumerate(zip(rows.long().tolist(), flips[:, 0].tolist())):
        want = F2.resized_crop(x[i], top, left, h, w, [24, 32], antialias=True)
        want = want.flip(-1) if f else want
        assert torch.allclose(out[i], want, atol=1e-6)
        tvb = tv_tensors.BoundingBoxes(boxes[i], format="XYXY", canvas_size=(40, 60))
        tvb = F2.resized_crop(tvb, top, left, h, w, [24, 32])
        tvb = F2.horizontal_flip(tvb) if f else tvb
        ours = out_boxes[i].clone()  # Kornia does not clip boxes to the canvas; torchvision does
        ours[..., 0::2] = ours[..., 0::2].clamp(0, 32)
        ours[..., 1::2] = ours[..., 1::2].clamp(0, 24)
        assert torch.allclose(ours, tvb.as_subclass(torch.Tensor), atol=1e-4)


def test_own_draws_follow_the_same_distribution():
    """Without params the Replay* augmentations draw for themselves with torchvision's sampling."""
    torch.manual_seed(1)
    flip = ReplayHorizontalFlip(step_of(T1.RandomHorizontalFlip(0.3), "float"))
    x = torch.arange(4.0).view(1, 1, 1, 4).expand(4000, 1, 1, 4).contiguous()
    flipped = (flip(x)[:, 0, 0, 0] == 3).float().mean()
    assert 0.27 < float(flipped) < 0.33
    jitter = ReplayColorJitter(step_of(T1.ColorJitter(brightness=(0.5, 0.6)), "float"))
    out = jitter(torch.full((8, 3, 4, 4), 0.5))
    assert ((out >= 0.25 - 1e-6) & (out <= 0.3 + 1e-6)).all()
    crop = ReplayResizedCrop(step_of(T2.RandomResizedCrop(16), "float"))
    assert crop(torch.rand(5, 3, 50, 70)).shape == (5, 3, 16, 16)


_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_BILINEAR = T1.InterpolationMode.BILINEAR
RECIPES = {  # torchvision's reference recipe (references/classification presets) with each policy, v1 and v2
    "ref-trivialaugment": lambda: T1.Compose([
        T1.RandomResizedCrop(64, interpolation=_BILINEAR, antialias=True), T1.RandomHorizontalFlip(),
        T1.TrivialAugmentWide(interpolation=_BILINEAR), T1.PILToTensor(), T1.ConvertImageDtype(torch.float),
        T1.Normalize(_MEAN, _STD), T1.RandomErasing(0.25)]),
    "ref-randaugment": lambda: T1.Compose([
        T1.RandomResizedCrop(64), T1.RandomHorizontalFlip(), T1.RandAugment(interpolation=_BILINEAR, magnitude=9),
        T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize(_MEAN, _STD), T1.RandomErasing(0.25)]),
    "ref-autoaugment": lambda: T1.Compose([
        T1.RandomResizedCrop(64), T1.RandomHorizontalFlip(), T1.AutoAugment(T1.AutoAugmentPolicy.IMAGENET),
        T1.PILToTensor(), T1.ConvertImageDtype(torch.float), T1.Normalize(_MEAN, _STD)]),
    "ref-augmix": lambda: T1.Compose([
        T1.RandomResizedCrop(64), T1.RandomHorizontalFlip(), T1.AugMix(interpolation=_BILINEAR), T1.PILToTensor(),
        T1.ConvertImageDtype(torch.float), T1.Normalize(_MEAN, _STD), T1.RandomErasing(0.25)]),
    "v2-uint8-augmix-depth2": lambda: T2.Compose([
        T2.RandomResizedCrop(64, antialias=True), T2.PILToTensor(), T2.AugMix(chain_depth=2, mixture_width=2),
        T2.ToDtype(torch.float32, scale=True)]),
    "v2-uint8-trivialaugment": lambda: T2.Compose([
        T2.RandomResizedCrop(64, antialias=True), T2.RandomHorizontalFlip(), T2.PILToTensor(),
        T2.TrivialAugmentWide(), T2.ToDtype(torch.float32, scale=True), T2.Normalize(_MEAN, _STD),
        T2.RandomErasing(0.25)]),
    "v2-pil-randaugment-3ops": lambda: T2.Compose([
        T2.RandomResizedCrop(64, antialias=True), T2.RandAugment(num_ops=3), T2.PILToTensor(),
        T2.ToDtype(torch.float32, scale=True)]),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_policies_are_replayed_with_the_same_draws(folder, name):
    """The recipe's CPU pipeline against the replay (CPU decode): same RNG state after, the policy step
    itself bit-identical on PIL images and v1 tensors (v2 uint8: mean under 0.05 levels), the whole
    output within the tolerance the tuner accepts."""
    report = measure_replay_error(ImageFolder(str(folder), transform=RECIPES[name]()), n=12, seed=5)
    assert report.same_draws
    (policy,) = [s for s in report.steps if s.kind in ("auto_augment", "augmix")]
    exact = policy.flavour == "pil" or (policy.kind == "augmix" and name.startswith("ref"))
    if exact:  # Pillow's code paths, and v1's tensor kernels (AugMix converts to a tensor itself)
        assert policy.isolated_max == 0.0, policy
    else:  # v2's uint8 kernels: one level on rare pixels, which a later threshold op of a chain can amplify
        assert policy.isolated_mean < 0.05, policy
    assert report.end_to_end_mean < Tolerance().mean_levels_cpu_decode, report.end_to_end_mean


def test_mismatched_sampler_and_pipeline_are_refused(folder):
    ds = ImageFolder(str(folder), transform=PIPELINES["v1-imagenet"]())
    replay = ReplayDataset.from_image_folder(ds)
    other = RandomGpuPipeline(ReplaySampler.from_compose(PIPELINES["v1-crop-pad"]()), device="cpu")
    with pytest.raises(ValueError, match="different Composes"):
        other(replay_collate([replay[0]]))
    with pytest.raises(TypeError, match="ReplayBatch"):
        other((torch.zeros(3), torch.zeros(1)))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["v1-imagenet", "v2-uint8"])
def test_nvjpeg_replay_within_tolerance(folder, name):
    """On the GPU: nvJPEG decode + the replay, against Pillow + the CPU pipeline."""
    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline

    ds = ImageFolder(str(folder), transform=PIPELINES[name]())
    plan, why = plan_random_gpu_pipeline(ds)
    assert plan is not None, why
    parity = plan.measure_error(device="cuda", n=12)
    ok, why = plan.within_tolerance(parity)
    assert ok, why + "\n" + parity.table()
    assert parity.decoder.startswith("nvJPEG") and parity.decode_mean < 2.0


@pytest.mark.cuda
def test_device_loader_on_cuda(folder):
    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline

    loader = DataLoader(ImageFolder(str(folder), transform=PIPELINES["v1-imagenet"]()), batch_size=4, num_workers=2)
    plan, why = plan_random_gpu_pipeline(loader)
    assert plan is not None, why
    built = plan.build(loader, "cuda", {"num_workers": 2, "pin_memory": True})
    batches = list(built)
    assert len(batches) == 3
    for images, labels in batches:
        assert images.is_cuda and images.shape == (4, 3, 64, 64) and labels.is_cuda
