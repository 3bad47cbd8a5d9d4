"""timm's training recipe replayed: the workers' draws equal timm's, its ops equal Pillow's, the output the CPU's.

* Draws: timm's Compose is run on N=256 images of varying sizes with its op functions recorded
  (timm's ``NAME_TO_OP`` replaced for the test only, so no pixels are made), then the
  :class:`ReplaySampler` from the same seeds: the ops, their arguments, the erase boxes, and the
  torch / Python / numpy RNG states after every sample must be the same.
* Ops: each timm op on a batch (:func:`apply_timm_op`) against timm's own Pillow op, per sample,
  on photo-like images: bit-identical.
* End to end (CPU decode): the whole recipe against the replay on JPEGs, within the tuner's tolerance.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from pipeline_opt._core import rng
from pipeline_opt.datasets import _photo_like, make_image_folder
from pipeline_opt.loading.random_plan import Tolerance
from pipeline_opt.transforms import registry
from pipeline_opt.transforms.policy_kernels import apply_timm_op
from pipeline_opt.transforms.replay import ReplayDataset, ReplaySampler, recognise, replay_collate
from pipeline_opt.transforms.replay_parity import measure_replay_error
from pipeline_opt.transforms.timm_draws import KERNEL_OF, NO_OP, TIMM_OPS
from pipeline_opt.transforms.transform_info import UnsupportedTransform

timm_data = pytest.importorskip("timm.data")
import timm.data.auto_augment as timm_aa  # noqa: E402

N = 256
RECIPES = {  # create_transform keyword arguments: timm's train recipes
    "rand-m9-mstd0.5-inc1": dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25),
    "rand-n3-pixel-count2": dict(auto_augment="rand-m9-n3-mstd0.5", re_prob=0.9, re_mode="pixel", re_count=2),
    "rand-mstd101-rand": dict(auto_augment="rand-m7-mstd101", re_prob=0.8, re_mode="rand"),
    "rand-m12-mmax15-p0.8-n1": dict(auto_augment="rand-m12-mmax15-p0.8-n1", re_prob=0.0),
    "autoaugment-original": dict(auto_augment="original", re_prob=0.5),
    "autoaugment-v0r": dict(auto_augment="v0r", re_prob=0.5),
}


def _recipe(name: str, size: int = 48):
    return timm_data.create_transform(size, is_training=True, **RECIPES[name])


def _sizes(n: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(0)
    return [(int(rng.integers(40, 90)), int(rng.integers(40, 90))) for _ in range(n)]  # (height, width)


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_draws_and_the_rng_states_equal_timms(name, monkeypatch):
    applied: list[list[tuple[str, float]]] = []

    def recorder(op_name):
        def record(img, *args, **kwargs):
            applied[-1].append((op_name, float(args[0]) if args else 0.0))
            return img
        return record

    for op_name in list(timm_aa.NAME_TO_OP):
        monkeypatch.setitem(timm_aa.NAME_TO_OP, op_name, recorder(op_name))
    compose = _recipe(name)  # its ops hold the recording functions (timm's own table, so they are accepted)
    sampler = ReplaySampler(recognise(compose))
    sizes = _sizes(N)

    rng.seed_all(7)
    original_states, outputs = [], []
    for h, w in sizes:
        applied.append([])
        outputs.append(compose(Image.new("RGB", (w, h), (90, 120, 150))))
        original_states.append(rng.states())
    rng.seed_all(7)
    rows = []
    for (h, w), want in zip(sizes, original_states):
        rows.append(sampler.sample(h, w))
        assert rng.same_states(rng.states(), want)

    (policy,) = [s for s in sampler.steps if s.kind == "timm_augment"]
    for ops, params in zip(applied, rows):
        row = params.row[policy.offset:policy.offset + policy.width].tolist()
        drawn = [(TIMM_OPS[int(c)], v) for c, v in zip(row[0::2], row[1::2]) if c != NO_OP]
        # timm's Rel translations get a fraction and scale it by the (48 x 48) image inside the op
        kernels = [(KERNEL_OF[op], v * 48 if op.endswith("Rel") else v) for op, v in ops]
        assert [k for k, _ in drawn] == [k for k, _ in kernels]
        for (op, got), (_, want) in zip(drawn, kernels):
            assert got == pytest.approx(want, abs=1e-9), op
    (erase,) = [s for s in sampler.steps if s.kind == "timm_erase"] or [None]
    if erase is not None:
        for params, out in zip(rows, outputs):
            r = params.row[erase.offset:erase.offset + erase.width].tolist()
            for i in range(int(r[0])):  # a 'const' box reads zero in timm's output
                top, left, bh, bw = (int(v) for v in r[1 + 4 * i:5 + 4 * i])
                if compose.transforms[-1].mode == "const":
                    assert torch.all(out[:, top:top + bh, left:left + bw] == 0)


OP_VALUES = {
    "AutoContrast": [0.0] * 4, "Equalize": [0.0] * 4, "Invert": [0.0] * 4,
    "Rotate": [-27.0, -3.3, 12.5, 30.0], "Posterize": [1, 2, 3, 4], "Solarize": [0, 26, 128, 256],
    "SolarizeAdd": [0, 11, 66, 110], "Color": [0.1, 0.55, 1.0, 1.9], "Contrast": [0.1, 0.55, 1.0, 1.9],
    "Brightness": [0.1, 0.55, 1.0, 1.9], "Sharpness": [0.1, 0.55, 1.0, 1.9],
    "ShearX": [-0.3, -0.07, 0.12, 0.3], "ShearY": [-0.3, -0.07, 0.12, 0.3],
    "TranslateX": [-21.6, -3.0, 0.4, 17.3], "TranslateY": [-21.6, -3.0, 0.4, 17.3],
}


_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
OP_CASES = [(op, r) for op in TIMM_OPS for r in (Image.Resampling.NEAREST, Image.Resampling.BILINEAR)
            if op in _GEOMETRIC or r == Image.Resampling.BILINEAR]


@pytest.mark.parametrize("op, resample", OP_CASES, ids=lambda v: getattr(v, "name", v))
def test_each_op_is_bit_identical_to_timms_pillow_op(op, resample):
    rng = np.random.default_rng(5)
    pils = [_photo_like(rng, 72, 56) for _ in range(4)]
    batch = torch.stack([torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1) for p in pils]).float()
    fill = (124, 116, 104)
    fn = timm_aa.NAME_TO_OP[op]
    want = [fn(p, v, fillcolor=fill, resample=resample) if op not in ("AutoContrast", "Equalize", "Invert")
            else fn(p) for p, v in zip(pils, OP_VALUES[op])]
    want = torch.stack([torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1) for p in want]).float()
    interpolation = "nearest" if resample == Image.Resampling.NEAREST else "bilinear"
    got = apply_timm_op(op, batch, OP_VALUES[op], interpolation, tuple(float(v) for v in fill))
    assert torch.equal(got, want), float((got - want).abs().max())


def test_posterize_to_zero_bits_gives_black_where_pillow_now_refuses():
    """PosterizeIncreasing at magnitude 10 keeps 0 bits: Pillow 13 raises there (bits must be 1 to 8) (timm's CPU path fails on
    that draw); the replay gives what timm means and older Pillow gave, every level 0."""
    x = torch.full((1, 3, 4, 4), 200.0)
    assert torch.equal(apply_timm_op("Posterize", x, [0], "bilinear", None), torch.zeros_like(x))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(n_images=12, size=(320, 240), num_classes=2, seed=4,
                             root=tmp_path_factory.mktemp("timm_replay_images"), workers=1)


@pytest.mark.parametrize("name", ["rand-m9-mstd0.5-inc1", "rand-n3-pixel-count2", "autoaugment-original"])
def test_the_recipe_is_replayed_within_the_tolerance(folder, name):
    report = measure_replay_error(ImageFolder(str(folder), transform=_recipe(name, 64)), n=12, seed=5)
    assert report.same_draws
    by_kind = {s.kind: s for s in report.steps}
    assert by_kind["timm_augment"].isolated_max == 0.0, by_kind["timm_augment"]
    assert by_kind["timm_erase"].isolated_max == 0.0, by_kind["timm_erase"]
    assert report.end_to_end_mean < Tolerance().mean_levels_cpu_decode, report.end_to_end_mean


def test_a_two_worker_loader_delivers_the_originals_pixels(folder):
    """Python's ``random`` is seeded per worker by the DataLoader, so the replay in workers draws as timm does."""
    compose = _recipe("rand-m9-mstd0.5-inc1", 64)
    original = ImageFolder(str(folder), transform=compose)
    replay = ReplayDataset.from_image_folder(original)
    rk = pytest.importorskip("pipeline_opt.transforms.random_gpu")
    pipeline = rk.RandomGpuPipeline(replay.sampler, device="cpu")

    def batches(ds, collate):
        np.random.seed(3)
        loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=True, collate_fn=collate,
                            generator=torch.Generator().manual_seed(11), multiprocessing_context="fork")
        return list(loader)

    want = batches(original, None)
    got = [pipeline(b) for b in batches(replay, replay_collate)]
    for (x, y), (gx, gy) in zip(want, got):
        assert torch.equal(y, gy)
        levels = (gx - x).abs() * 255.0 * 0.226
        assert float(levels.mean()) < Tolerance().mean_levels_cpu_decode


def test_what_is_not_replayed_is_named():
    with pytest.raises(UnsupportedTransform, match="interpolation='random'"):
        recognise(timm_data.create_transform(48, is_training=True, interpolation="random"))
    aa = timm_aa.rand_augment_transform("rand-m9", {"interpolation": (2, 3), "img_mean": (1, 2, 3)})
    with pytest.raises(UnsupportedTransform, match="bicubic"):
        registry.info_of(aa).replay(aa, "pil")
    with pytest.raises(UnsupportedTransform, match="AugMixAugment"):
        recognise(timm_data.create_transform(48, is_training=True, auto_augment="augmix-m5-w3"))
    erasing = timm_data.random_erasing.RandomErasing(0.5, device="cuda")
    with pytest.raises(UnsupportedTransform, match="device='cuda'"):
        registry.info_of(erasing).replay(erasing, "float")
    gray = timm_aa.rand_augment_transform("rand-m9", {"img_mean": (1, 2, 3)}, transforms=["Desaturate"])
    with pytest.raises(UnsupportedTransform, match="Desaturate op is not replayed"):
        registry.info_of(gray).replay(gray, "pil")
    custom = timm_aa.rand_augment_transform("rand-m9", {"img_mean": (1, 2, 3)})
    custom.ops[0].aug_fn = lambda img, *a, **k: img
    with pytest.raises(UnsupportedTransform, match="other than timm's own"):
        registry.info_of(custom).replay(custom, "pil")


def test_a_timm_that_moved_its_tables_is_refused_by_name(monkeypatch):
    aa = timm_aa.rand_augment_transform("rand-m9", {"img_mean": (1, 2, 3)})
    monkeypatch.delattr(timm_aa, "_LEVEL_DENOM")
    with pytest.raises(UnsupportedTransform, match="_LEVEL_DENOM"):
        registry.info_of(aa).replay(aa, "pil")


def test_timm_is_not_imported_to_know_its_classes():
    code = ("import sys, pipeline_opt, pipeline_opt.transforms.replay; "
            "from pipeline_opt.transforms import registry; "
            "assert 'timm' not in sys.modules, 'timm imported'; "
            "print(sorted(i.name for i in registry.registered() if i.origin == 'timm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RandomResizedCropAndInterpolation" in out.stdout and "RandAugment" in out.stdout


def test_a_single_level_fill_is_replayed_on_every_channel():
    aa = timm_aa.rand_augment_transform("rand-m9", {"img_mean": 128, "interpolation": 2})
    spec = registry.info_of(aa).replay(aa, "pil")
    assert spec.options["fill"] == (128.0,)
