"""What the tuner's changes do to the samples: classes, measured decode errors, exact=True, the bound."""

from __future__ import annotations

import glob
import hashlib

import pytest
import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T
from tune_fixtures import tiny_model

import pipeline_opt as po
from pipeline_opt.datasets import make_image_folder
from pipeline_opt.loading.decode import measure_draft_error
from pipeline_opt.tune import exactness
from pipeline_opt.tune.exactness import (
    PixelChange,
    changes_in,
    exactness_of,
    measure_draft,
    measure_nvjpeg,
    measure_offload,
    refusal,
    sample_indices,
)
from pipeline_opt.tune.gpu_decode import plan_nvjpeg_decode
from pipeline_opt.tune.offload import plan_draft_decode, plan_gpu_offload

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # large JPEGs resized far down: draft decoding (1/8 DCT scale) cuts most of the per-sample work
    return make_image_folder(n_images=32, size=(640, 480), num_classes=2, seed=5,
                             root=tmp_path_factory.mktemp("exact_jpegs"), workers=1)


def _dataset(folder, transform=None):
    transform = transform or T.Compose([T.Resize((32, 32)), T.ToTensor(), T.Normalize(MEAN, STD)])
    return torchvision.datasets.ImageFolder(str(folder), transform=transform)


def _no_step(model, batch) -> None:
    return None


def _digest(loader) -> list[str]:
    return [hashlib.sha1(images.contiguous().numpy().tobytes()).hexdigest() for images, _ in loader]


# ------------------------------------------------------------------------------------------- classes

def test_every_change_has_a_class():
    base = {"num_workers": 4, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4,
            "gpu_transforms": [], "decode": "pil", "draft_decode": False, "shared_slots": True}
    assert exactness_of(base) == "bitwise"
    assert exactness_of({**base, "gpu_transforms": ["ToFloat", "Normalize", "CenterCrop"]}) == "bitwise"
    assert exactness_of({**base, "gpu_transforms": ["Resize", "ToFloat"]}) == "tolerance"
    assert exactness_of({**base, "decode": "draft", "draft_decode": True}) == "decode"
    assert exactness_of({**base, "decode": "nvjpeg"}) == "decode"


def test_changes_in_a_config_and_the_bound():
    draft = PixelChange("JPEG draft decoding", "decode", "decode=draft", 1.12, 14.0, 12)
    resize = PixelChange("Resize on the device", "tolerance", "gpu_transforms=Resize", 0.2, 1.0, 12)
    cfg = {"decode": "draft", "gpu_transforms": ["Resize", "ToFloat"]}
    assert changes_in(cfg, [draft, resize]) == (draft, resize)
    assert changes_in({"decode": "pil", "gpu_transforms": []}, [draft, resize]) == ()
    assert refusal(draft) == ""
    assert "max 40/255 > 32/255" in refusal(PixelChange("x", "decode", "decode=draft", 1.0, 40.0, 12))
    assert "mean 2.5/255" in refusal(PixelChange("x", "decode", "decode=draft", 2.5, 10.0, 12))
    assert "mean 1.12/255, max 14/255 per pixel value over 12 of your images" in draft.describe()
    assert sample_indices(5) == [0, 1, 2, 3, 4] and sample_indices(100, 4) == [0, 33, 66, 99]


# -------------------------------------------------------------------------------------- measurements

def test_draft_error_is_measured_on_the_users_images(folder):
    ds = _dataset(folder)
    plan, why = plan_draft_decode(ds)
    assert plan is not None, why
    change = measure_draft(ds, plan)
    paths = [ds.samples[i][0] for i in sample_indices(len(ds.samples))]
    expected = measure_draft_error(paths, plan.target)
    assert change.n_images == len(paths) == exactness.SAMPLE_IMAGES
    assert (change.mean_error, change.max_error) == (expected.mean_abs, expected.max_abs)
    assert change.kind == "decode" and change.allowed and change.setting == "decode=draft"


@pytest.mark.parametrize("target", [256, (300, 400)])
def test_draft_decoding_that_reduces_no_image_is_not_offered(folder, target):
    """640x480 JPEGs with Resize(256): no 1/2 draft stays at least the target, so the draft decodes
    the full image and would change nothing (it was listed as a change with a 0/255 error)."""
    ds = _dataset(folder, T.Compose([T.Resize(target), T.ToTensor()]))
    plan, why = plan_draft_decode(ds)
    assert plan is not None, why
    change = measure_draft(ds, plan)
    assert not change.allowed and change.max_error == 0
    assert "reduces none of 12 of your images" in change.note and "it would change nothing" in change.note


def test_gpu_decoder_error_is_measured_against_the_pil_pipeline(folder):
    ds = _dataset(folder)
    plan, why = plan_nvjpeg_decode(DataLoader(ds, batch_size=4))
    assert plan is not None, why
    change = measure_nvjpeg(ds, plan, CPU)  # libjpeg through the same call off CUDA
    assert change.allowed and change.n_images == exactness.SAMPLE_IMAGES
    assert 0 < change.mean_error < 1.0 and change.max_error <= 2.0  # the float resize vs PIL's rounded one


def test_device_resize_is_measured_and_bitwise_transforms_are_not_listed(folder):
    resize_moves = T.Compose([T.CenterCrop(256), T.Resize((32, 32)), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = _dataset(folder, resize_moves)
    plan, _ = plan_gpu_offload(ds)
    assert plan.names == ("Resize", "ToFloat", "Normalize")
    change = measure_offload(ds, plan, CPU)
    assert change.kind == "tolerance" and change.n_images == exactness.SAMPLE_IMAGES
    assert change.max_error <= exactness.RESIZE_BOUND + 1e-3  # the documented bound holds on these images
    exact_plan, why = plan_gpu_offload(ds, exact=True)
    assert exact_plan.names == ("ToFloat", "Normalize") and "Resize stays on the CPU" in why
    assert measure_offload(ds, exact_plan, CPU) is None  # nothing in it changes a bit
    # and the bitwise claim holds: the CPU part + device part give the original bytes
    from pipeline_opt.tune.offload import variant_dataset

    variant = variant_dataset(ds, exact_plan, None)
    for i in (0, 7):
        got = exact_plan.gpu_transform(variant[i][0].unsqueeze(0))[0]
        assert torch.equal(got, ds[i][0])


# --------------------------------------------------------------------------------------- end to end

@pytest.mark.timeout(120)
def test_a_tuned_loader_with_draft_decoding_is_labelled_with_its_measured_error(folder):
    loader = DataLoader(_dataset(folder), batch_size=8)
    # a step that costs nothing: the loader sets the pace, so decoding 640x480 JPEGs for a 32 px
    # input is nearly all of it and draft decoding (1/8 DCT scale) wins by far even on a busy machine
    result = po.autotune(loader, tiny_model(), step_fn=_no_step, time_budget_s=15, progress=False)
    draft = [c for c in result.pixel_checks if c.setting == "decode=draft"]
    assert len(draft) == 1 and draft[0].allowed  # measured before any trial, within the bound
    assert result.config["decode"] == "draft", result.table()  # 640x480 -> 32 px: draft wins by far here
    assert result.exactness == "decode" and result.pixel_changes == (draft[0],)
    text = result.table()
    assert "samples: NOT bit-for-bit identical" in text and "JPEG draft decoding (decode=draft" in text
    assert f"mean {draft[0].mean_error:.3g}/255, max {draft[0].max_error:.3g}/255" in text
    assert "NOT bit-for-bit identical" in result.verdict and "JPEG draft decoding" in result.verdict
    d = result.to_dict()
    assert d["exactness"] == "decode" and d["pixel_changes"][0]["max_error"] == draft[0].max_error
    from pipeline_opt.report.html import render_tune_html

    html = render_tune_html(d)
    assert "Not bit-for-bit identical" in html and f"{draft[0].max_error:.3g}/255" in html


@pytest.mark.timeout(90)
def test_exact_refuses_draft_decoding_and_keeps_the_bytes(folder):
    def make():
        return DataLoader(_dataset(folder), batch_size=8)

    result = po.autotune(make(), tiny_model(), time_budget_s=5, progress=False, exact=True)
    assert any(x.startswith("draft_decode: exact=True allows only bit-identical changes") for x in result.not_tried)
    assert result.config["decode"] == "pil" and result.exactness == "bitwise" and result.exact
    assert result.pixel_changes == () and result.pixel_checks == ()  # nothing measured: nothing offered
    assert "samples: bit-for-bit identical" in result.table()
    assert _digest(result.loader) == _digest(make())


@pytest.mark.timeout(90)
def test_a_decoder_beyond_the_bound_is_refused(folder, monkeypatch):
    monkeypatch.setattr(exactness, "DECODE_MAX_ERROR", 0.5)
    result = po.autotune(DataLoader(_dataset(folder), batch_size=8), tiny_model(), time_budget_s=5, progress=False)
    refused = [c for c in result.pixel_checks if c.setting == "decode=draft"]
    assert len(refused) == 1 and not refused[0].allowed
    why = next(x for x in result.not_tried if x.startswith("draft_decode:"))
    assert "beyond the bound" in why and "> 0.5/255" in why and "not offered" in why
    assert result.config["decode"] == "pil" and result.exactness == "bitwise"
    assert not any(t.config.get("decode") == "draft" for t in result.trials)  # never timed


def test_exact_must_be_a_bool(folder):
    with pytest.raises(TypeError, match="exact"):
        po.autotune(DataLoader(_dataset(folder), batch_size=8), tiny_model(), exact="yes")


def test_draft_decoding_files_exist(folder):
    assert len(glob.glob(str(folder / "*" / "*.jpg"))) == 32


def test_a_random_training_pipeline_replayed_is_measured_as_a_decode_change(tiny_image_folder):
    """The tuner's hook for the random-augmentation replay: same draws required, the error measured
    on the user's files (libjpeg on the CPU here; nvJPEG on CUDA)."""
    pytest.importorskip("kornia")
    import torchvision.transforms as T

    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline
    from pipeline_opt.tune.exactness import REPLAY_NAME, measure_random_replay

    train = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.2, 0.2, 0.2),
                       T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    loader = DataLoader(torchvision.datasets.ImageFolder(str(tiny_image_folder), transform=train), batch_size=8)
    plan, why = plan_random_gpu_pipeline(loader)
    assert plan is not None, why
    change = measure_random_replay(plan, torch.device("cpu"), n=6)
    assert change.name == REPLAY_NAME and change.setting == "decode=nvjpeg" and change.n_images == 6
    assert change.allowed and change.mean_error < 0.5 and "same draws: True" in change.note, change


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_autotune_offers_the_gpu_replay_for_a_random_training_pipeline(tiny_image_folder):
    pytest.importorskip("kornia")
    import torchvision.transforms as T

    train = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.Normalize([0.5] * 3, [0.25] * 3)])
    loader = DataLoader(torchvision.datasets.ImageFolder(str(tiny_image_folder), transform=train), batch_size=8,
                        num_workers=1)
    result = po.autotune(loader, tiny_model().cuda(), time_budget_s=40, progress=False)
    replay = [c for c in result.pixel_checks if c.name.startswith("JPEG decoding + random augmentation")]
    assert len(replay) == 1 and replay[0].allowed, result.pixel_checks
    assert any(t.config.get("decode") == "nvjpeg" for t in result.trials)  # tried as a candidate


class _FakeReplayPlan:
    """A replay plan whose measured parity is given: the decode bounds' verdict without a GPU."""

    def __init__(self, decode_max: float, end_max: float, end_mean: float = 0.3, same_draws: bool = True,
                 full_resolution_max: float = 57.0):
        from types import SimpleNamespace

        from pipeline_opt.transforms.replay_parity import StepError

        crop = StepError("RandomResizedCrop", "resized_crop", "pil", 0.1, 1.0, 0.4, decode_max)
        policy = StepError("TrivialAugmentWide", "auto_augment", "pil", 0.0, 0.0, 0.3, end_max)
        self.parity = SimpleNamespace(same_draws=same_draws, decoder="nvJPEG (cuda)", images=12, decode_mean=0.6,
                                      decode_max=full_resolution_max, steps=(crop, policy), end_to_end_mean=end_mean,
                                      end_to_end_max=end_max)

    def measure_error(self, device, n):
        return self.parity

    def within_tolerance(self, parity):
        return (True, "") if parity.same_draws else (False, "the replay did not reproduce the CPU pipeline's draws")


def test_the_replays_decode_bounds_apply_to_the_decoder_not_to_what_threshold_ops_make_of_it():
    from pipeline_opt.tune.exactness import DECODE_MAX_ERROR, measure_random_replay

    # a recipe with solarize / posterize: nvJPEG moves single full-resolution pixels by 57 levels (chroma
    # upsampling at colour edges), 3 through the pipeline's crop; the recipe's output by 54
    change = measure_random_replay(_FakeReplayPlan(decode_max=3, end_max=54), torch.device("cpu"))
    assert change.allowed, change.note
    assert change.max_error == 54 and change.mean_error == 0.3  # the user is told what the samples see
    assert "the decoder alone: mean 0.6/255, max 57/255 at full resolution" in change.note
    assert "mean 0.4/255, max 3/255 through the pipeline's RandomResizedCrop" in change.note
    # a decoder beyond the bound through the resize is refused, and the refusal names that error
    refused = measure_random_replay(_FakeReplayPlan(decode_max=DECODE_MAX_ERROR + 8, end_max=54), torch.device("cpu"))
    assert not refused.allowed, refused.note
    assert refused.note.startswith("nvJPEG (cuda) through the pipeline's RandomResizedCrop:")
    assert "max 40/255 > 32/255" in refused.note
    # different draws are refused whatever the error
    assert not measure_random_replay(_FakeReplayPlan(1, 1, same_draws=False), torch.device("cpu")).allowed


def test_torchvisions_reference_recipe_replayed_is_offered_with_its_end_to_end_error_named(folder):
    """TrivialAugmentWide after the crop: the device resize's one-level rounding differences become
    jumps of tens of levels at the pixels a solarize / posterize threshold splits, with the decoder
    exact (libjpeg on both sides here); the replay is offered and the jump is named."""
    pytest.importorskip("kornia")
    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline
    from pipeline_opt.tune.exactness import DECODE_MAX_ERROR, measure_random_replay

    recipe = T.Compose([T.RandomResizedCrop(64, interpolation=T.InterpolationMode.BILINEAR), T.RandomHorizontalFlip(),
                        T.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR), T.PILToTensor(),
                        T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.25)])
    plan, why = plan_random_gpu_pipeline(DataLoader(_dataset(folder, recipe), batch_size=8))
    assert plan is not None, why
    change = measure_random_replay(plan, CPU)
    assert change.allowed, change.note
    assert change.mean_error < 0.5 and "the decoder alone: mean 0/255, max 0/255 at full resolution" in change.note
    # on these images (seeded) a pixel moves by 52 levels end to end, beyond the decode bound the
    # replay was once refused on, though no decoder differs: named, not refused
    assert change.max_error > DECODE_MAX_ERROR
