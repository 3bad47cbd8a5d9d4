"""The nvJPEG candidate: when a plan exists, why not otherwise, and that its loader decodes like PIL."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T
from tune_fixtures import Fast, tiny_model

import pipeline_opt as po
from pipeline_opt.datasets import make_image_folder
from pipeline_opt.tune.build import CandidateBuilder
from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.gpu_decode import NVJPEG_WORKERS, plan_nvjpeg_decode
from pipeline_opt.tune.measure import Measurement

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(n_images=12, size=(96, 72), num_classes=2, root=tmp_path_factory.mktemp("jpegs"))


def _loader(folder, transform, **kw):
    return DataLoader(torchvision.datasets.ImageFolder(folder, transform=transform), batch_size=4, **kw)


def test_plan_reproduces_the_pil_pipeline_in_the_same_order(folder):
    compose = T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)])
    gen = torch.Generator().manual_seed(3)
    loader = _loader(folder, compose, shuffle=True, generator=gen)
    plan, why = plan_nvjpeg_decode(loader)
    assert plan is not None and why == "" and plan.size == (32, 40) and plan.mean == MEAN
    cfg = LoaderConfig(1, decode="nvjpeg")
    built = CandidateBuilder(loader, torch.device("cpu"), nvjpeg=plan).build(cfg, trial=False)
    assert isinstance(built.loader, DataLoader) and built.loader.num_workers == 1
    reference = _loader(folder, compose, shuffle=True, generator=torch.Generator().manual_seed(3))
    std = torch.tensor(STD).view(1, 3, 1, 1)
    n = 0
    for (got, labels), (want, want_labels) in zip(built, reference, strict=True):
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.equal(labels, want_labels)
        assert ((got - want) * std).abs().mean() < 2 / 255  # in /255 pixel units before normalising
        n += len(labels)
    assert n == 12


def test_plan_with_shorter_side_and_center_crop(folder):
    loader = _loader(folder, T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()]))
    plan, _ = plan_nvjpeg_decode(loader)
    assert plan is not None and plan.size == 36 and plan.crop == (32, 32) and plan.mean is None
    images, _ = next(iter(CandidateBuilder(loader, torch.device("cpu"), nvjpeg=plan).build(
        LoaderConfig(0, decode="nvjpeg"))))
    want, _ = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and (images - want).abs().mean() < 2 / 255


def test_decoding_in_a_thread_is_a_config_of_its_own_with_the_same_batches(folder):
    compose = T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, compose)
    plan, _ = plan_nvjpeg_decode(loader)
    builder = CandidateBuilder(loader, torch.device("cpu"), nvjpeg=plan)
    threaded_cfg = LoaderConfig(2, decode="nvjpeg", decode_thread=True)
    assert threaded_cfg.label().endswith("nvjpeg-in-thread") and threaded_cfg != LoaderConfig(2, decode="nvjpeg")
    assert LoaderConfig.from_dict(threaded_cfg.to_dict()) == threaded_cfg
    assert not LoaderConfig(2, decode="pil", decode_thread=True).decode_thread  # only a GPU decode blocks
    threaded = builder.build(threaded_cfg, trial=False)
    assert threaded.prepare_in_thread
    plain = builder.build(LoaderConfig(2, decode="nvjpeg"), trial=False)
    for (a, la), (b, lb) in zip(threaded, plain, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("transform, words", [
    (T.Compose([T.RandomResizedCrop(32), T.ToTensor()]), "not a Resize"),
    (T.Compose([T.Resize(32), T.ToTensor()]), "differ in size"),
    (T.Compose([T.Resize((32, 32), interpolation=T.InterpolationMode.NEAREST), T.ToTensor()]), "interpolation"),
    (T.Compose([T.Resize((32, 32)), T.ToTensor(), T.RandomHorizontalFlip()]), "RandomHorizontalFlip"),
    (T.Compose([T.Resize((32, 32)), T.PILToTensor()]), "ToTensor"),
])
def test_transforms_the_decoder_cannot_reproduce_are_refused(folder, transform, words):
    plan, why = plan_nvjpeg_decode(_loader(folder, transform))
    assert plan is None and words in why, why


def test_datasets_and_loaders_it_cannot_rebuild_are_refused(folder):
    compose = T.Compose([T.Resize((32, 32)), T.ToTensor()])
    assert "ImageFolder-like" in plan_nvjpeg_decode(DataLoader(Fast(), batch_size=4))[1]
    ds = torchvision.datasets.ImageFolder(folder, transform=compose, target_transform=int)
    assert "target_transform" in plan_nvjpeg_decode(DataLoader(ds, batch_size=4))[1]
    ds = torchvision.datasets.ImageFolder(folder, transform=compose)
    assert "collate_fn" in plan_nvjpeg_decode(DataLoader(ds, batch_size=4, collate_fn=list))[1]


def test_on_cpu_autotune_skips_it_with_a_reason(folder):
    loader = _loader(folder, T.Compose([T.Resize((32, 32)), T.ToTensor(), T.Normalize(MEAN, STD)]))
    result = po.autotune(loader, tiny_model(), time_budget_s=3, progress=False)
    assert any(x.startswith("nvjpeg decode") and "CUDA" in x for x in result.not_tried), result.not_tried
    assert result.config["decode"] in ("pil", "draft")


@pytest.mark.cuda
def test_on_cuda_the_candidate_decodes_on_the_device(folder):
    compose = T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, compose)
    plan, _ = plan_nvjpeg_decode(loader)
    dev = torch.device("cuda")
    images, labels = next(iter(CandidateBuilder(loader, dev, nvjpeg=plan).build(LoaderConfig(2, decode="nvjpeg"))))
    want, _ = next(iter(loader))
    assert images.is_cuda and ((images.cpu() - want) * torch.tensor(STD).view(1, 3, 1, 1)).abs().mean() < 4 / 255


@pytest.mark.cuda
def test_on_cuda_decoding_in_a_thread_gives_the_same_images(folder):
    compose = T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, compose)
    plan, _ = plan_nvjpeg_decode(loader)
    builder = CandidateBuilder(loader, torch.device("cuda"), nvjpeg=plan)
    plain = [x.cpu() for x, _ in builder.build(LoaderConfig(2, decode="nvjpeg"))]
    threaded = [x.cpu() for x, _ in builder.build(LoaderConfig(2, decode="nvjpeg", decode_thread=True))]
    assert len(plain) == len(threaded) and all(torch.equal(a, b) for a, b in zip(plain, threaded))


class _RecordingSearch:
    """The part of :class:`~pipeline_opt.tune.search.Search` the GPU-decode step uses, recording its calls;
    ``rates`` gives each tried worker count's images/s, ``compute_s`` the step's own seconds."""

    def __init__(self, incumbent: LoaderConfig, wins, rates=None, compute_s: float = 0.0) -> None:
        from types import SimpleNamespace

        self.incumbent, self.wins, self.calls, self.history = incumbent, wins, [], {}
        self.rates, self.compute_s = rates or {}, compute_s
        self.budget = SimpleNamespace(max_workers=8)

    def try_change(self, what: str, **changes) -> bool:
        self.calls.append(("try", what, changes))
        cfg = self.incumbent.with_(**changes)
        rate = self.rates.get(cfg.num_workers, 1000.0)
        self.history[cfg] = [Measurement(windows=(rate,), steps_per_window=4, batch_size=128, startup_s=0.0,
                                         elapsed_s=1.0, compute_s=self.compute_s)]
        won = self.wins(cfg.num_workers) if callable(self.wins) else self.wins
        if won:
            self.incumbent = cfg
        return won

    def evidence(self, cfg: LoaderConfig):
        return self.history.get(cfg, [])

    def tune_workers(self, what: str) -> None:
        self.calls.append(("workers", what, {}))

    def skip(self, what: str, why: str) -> None:
        self.calls.append(("skip", what, {"why": why}))


@pytest.mark.parametrize("wins", [True, False])
def test_the_gpu_decode_candidate_decodes_in_the_thread_in_one_trial_with_few_workers(folder, wins):
    from pipeline_opt.tune.steps import tune_gpu_decode

    loader = _loader(folder, T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)]))
    plan, _ = plan_nvjpeg_decode(loader)
    # the step keeps up (1000 img/s of 128-image batches is 0.128 s a step, the step's own 0.12 s)
    search = _RecordingSearch(LoaderConfig(6, gpu_transforms=("Normalize",)), wins, compute_s=0.12)
    tune_gpu_decode(search, plan, "")
    tries = [c for c in search.calls if c[0] == "try"]
    assert len(tries) == 1, search.calls  # no second trial of the same decode in the training loop
    changes = tries[0][2]
    # the workers only read files: 4, not the 6 that fed the CPU decode
    assert changes == {"decode": "nvjpeg", "gpu_transforms": (), "num_workers": NVJPEG_WORKERS, "pin_memory": True,
                       "decode_thread": True}
    assert "background thread" in tries[0][1] and f"with {NVJPEG_WORKERS} workers" in tries[0][1]
    assert [c[0] for c in search.calls] == (["try", "workers"] if wins else ["try"])
    if wins:
        assert search.incumbent.decode_thread and search.incumbent.label().endswith("nvjpeg-in-thread")


def test_a_gpu_decode_that_lost_waiting_on_data_is_tried_again_with_the_incumbents_workers(folder):
    from pipeline_opt.tune.steps import tune_gpu_decode

    loader = _loader(folder, T.Compose([T.Resize((32, 40)), T.ToTensor(), T.Normalize(MEAN, STD)]))
    plan, _ = plan_nvjpeg_decode(loader)
    # slow file reads: 4 workers deliver 400 img/s (0.32 s a batch) for a 0.05 s step; 8 workers win
    search = _RecordingSearch(LoaderConfig(8, gpu_transforms=("Normalize",)), wins=lambda n: n == 8,
                              rates={4: 400.0, 8: 900.0}, compute_s=0.05)
    tune_gpu_decode(search, plan, "")
    tries = [c for c in search.calls if c[0] == "try"]
    assert [t[2]["num_workers"] for t in tries] == [4, 8]
    assert "Little's law asks for" in tries[1][1]
    assert search.calls[-1][0] == "workers" and search.incumbent.decode == "nvjpeg"


@pytest.mark.parametrize("workers", [2, 4])
def test_gpu_decode_starts_with_no_more_workers_than_the_incumbent(workers):
    from pipeline_opt.tune.steps import gpu_decode_workers

    assert gpu_decode_workers(workers, 16) == workers
    assert gpu_decode_workers(15, 16) == NVJPEG_WORKERS
    assert gpu_decode_workers(0, 16) == NVJPEG_WORKERS  # the loader had none: the decoder needs a few
    assert gpu_decode_workers(15, 2) == 2  # the budget's cap


def test_without_a_plan_the_gpu_decode_is_skipped_with_the_reason():
    from pipeline_opt.tune.steps import tune_gpu_decode

    search = _RecordingSearch(LoaderConfig(2), wins=True)
    tune_gpu_decode(search, None, "the Compose has a RandomRotation")
    assert search.calls == [("skip", "nvjpeg decode", {"why": "the Compose has a RandomRotation"})]
