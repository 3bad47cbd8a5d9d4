"""Classification benchmark: ResNet-50 at 224 px, batch 128, bf16 autocast, channels_last.

A generated JPEG image folder (2048 images of 1280x960) feeds one training step (forward, cross
entropy, backward, SGD step — the benchmark owns the optimizer; the library never touches it).

Rows
    limit          the same step on a device-resident batch replayed (no data pipeline at all)
    default        num_workers=4, pin_memory off, Resize((224, 224)) + ToTensor + Normalize on the CPU
    grid ...       num_workers x pin x offload x decode (pil | draft | nvjpeg | nvjpeg-thread), every
                   point measured; ``-thread``: the GPU decode in a background thread
                   (``DeviceLoader(prepare_in_thread=True)``), pinned points only
                   once (coarse pass, in an order that puts the likely-fast points first, under a time
                   budget: points the budget cut are listed under not_measured with that reason)
    autotune       the loader po.autotune returned from the default loader (its tuning time is a field)
With ``--pipeline train`` the loader is a random training pipeline (RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize) and the grid's GPU decode is the random-augmentation replay
(the workers draw the parameters, the device decodes with nvJPEG and replays them: decode=replay);
draft decoding does not apply to a random crop. With ``--pipeline tvref`` it is torchvision's reference
training recipe (references/classification, ``ClassificationPresetTrain`` with ``--auto-augment ta_wide
--random-erase 0.25``): RandomResizedCrop(224, bilinear), RandomHorizontalFlip, TrivialAugmentWide
(bilinear), PILToTensor, ConvertImageDtype(float), Normalize, RandomErasing(0.25); its replay moves the
policy's draws into the workers and its pixels to the device. With ``--pipeline timm`` it is timm's
recipe (``create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)``),
and the final pass adds timm's own ``create_loader`` (its CUDA prefetcher: normalize and erasing on the
GPU) at 4 workers and at every core. The random pipelines' final pass also
measures the best coarse CPU point (``final: grid ... decode=pil``), the row "best CPU grid point" compares.
A final interleaved pass (rounds of limit, default, the top grid points — rows ``final: grid ...`` —
and autotune, alternating order) gives the medians the ratios are computed from.

    python -m benchmarks.bench_classification --out DIR          # H200: about 7 minutes
    python -m benchmarks.bench_classification --quick --device cpu   # smoke test
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_classification.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402
from torchvision import transforms as T  # noqa: E402

from benchmarks import harness as H  # noqa: E402

NAME = "bench_classification"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DECODES = ("nvjpeg", "nvjpeg-thread", "draft", "pil")
TRAIN_DECODES = ("replay", "replay-thread", "pil")
THREAD = "-thread"  # the GPU decode called from a background thread, overlapping the step


@dataclass(frozen=True)
class Sizes:
    n_images: int = 2048
    image_size: tuple[int, int] = (1280, 960)
    crop: int = 224
    batch: int = 128
    model: str = "resnet50"
    workers: tuple[int, ...] = (2, 4, 8, 12, 0)  # 0 = every usable core
    default_workers: int = 4
    budget_s: float = 430.0  # whole benchmark (run_gpu.sh gives it a hard limit above this)
    autotune_budget_s: float = 90.0
    final_reserve_s: float = 75.0  # kept for the final interleaved pass
    rounds: int = 3
    top_k: int = 3
    min_steps: int = 4
    min_seconds: float = 1.0
    max_seconds: float = 6.0
    pipeline: str = "eval"  # "eval": Resize/ToTensor/Normalize; "train": RandomResizedCrop/flip/ToTensor/Normalize;
    # "tvref": torchvision's reference recipe (TrivialAugmentWide + RandomErasing)


QUICK = Sizes(n_images=48, image_size=(320, 240), crop=32, batch=8, model="resnet18", workers=(2,),
              default_workers=1, budget_s=60.0, autotune_budget_s=6.0, final_reserve_s=8.0, rounds=2, top_k=1,
              min_steps=2, min_seconds=0.0, max_seconds=1.0)


@dataclass(frozen=True)
class Point:
    """One grid point."""

    workers: int
    pin: bool
    offload: bool
    decode: str

    @property
    def name(self) -> str:
        return (f"grid nw={self.workers:<2d} pin={'on ' if self.pin else 'off'} "
                f"offload={'on ' if self.offload else 'off'} decode={self.decode}")


# --------------------------------------------------------------------------------------------------
# the training step


class Trainer:
    """Model, optimizer and the benchmark's training step (bf16 autocast and channels_last on CUDA)."""

    def __init__(self, model_name: str, device: torch.device, num_classes: int) -> None:
        self.device = device
        self.amp = device.type == "cuda"
        model = getattr(torchvision.models, model_name)(weights=None, num_classes=num_classes)
        self.model = model.to(device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def step_fn(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """step_fn(model, batch) for po.autotune and for the harness (forward, loss, backward, SGD)."""
        images, labels = batch[0], batch[1]
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if not images.is_floating_point():
            raise TypeError(f"the classification step expects normalised float images, got {images.dtype}")
        images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = self.loss(model(images), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def step(self, batch: Any) -> None:
        self.step_fn(self.model, batch)


# --------------------------------------------------------------------------------------------------
# pipelines


PIPELINES = ("eval", "train", "tvref", "timm")
TIMM_RECIPE = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}  # timm's ImageNet training recipe


def is_random(pipeline: str) -> bool:
    """A random training pipeline: its GPU decode is the replay of the workers' draws."""
    return pipeline != "eval"


def cpu_compose(crop: int, pipeline: str = "eval") -> T.Compose:
    """The all-on-CPU pipeline of the default row (``"train"``: the random training one; ``"tvref"``:
    torchvision's reference recipe with TrivialAugmentWide and RandomErasing; ``"timm"``: timm's
    ``create_transform(is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)``)."""
    if pipeline == "timm":
        from timm.data import create_transform

        return create_transform(crop, is_training=True, **TIMM_RECIPE)
    if pipeline == "tvref":
        bilinear = T.InterpolationMode.BILINEAR
        return T.Compose([T.RandomResizedCrop(crop, interpolation=bilinear, antialias=True),
                          T.RandomHorizontalFlip(), T.TrivialAugmentWide(interpolation=bilinear), T.PILToTensor(),
                          T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.25)])
    if pipeline == "train":
        return T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return T.Compose([T.Resize((crop, crop)), T.ToTensor(), T.Normalize(MEAN, STD)])


def replay_source(root: Path, sizes: Sizes, point: Point, device: torch.device) -> Any:
    """The random training pipeline replayed on the device (what po.autotune offers for it)."""
    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline

    dataset = torchvision.datasets.ImageFolder(root, transform=cpu_compose(sizes.crop, sizes.pipeline))
    loader = make_loader(dataset, sizes, point.workers, point.pin)
    plan, why = plan_random_gpu_pipeline(loader)
    if plan is None:
        raise RuntimeError(f"the training pipeline cannot be replayed on the device: {why}")
    overrides = {"num_workers": point.workers, "pin_memory": point.pin and device.type == "cuda"}
    return plan.build(loader, device, overrides, prepare_in_thread=point.decode.endswith(THREAD))


def make_loader(dataset: Any, sizes: Sizes, workers: int, pin: bool, collate_fn: Any = None,
                seed: int = 0) -> DataLoader:
    """A long-epoch loader (sampling with replacement): a large dataset's steady state, no epoch ends."""
    gen = torch.Generator().manual_seed(seed)
    sampler = RandomSampler(dataset, replacement=True, num_samples=sizes.batch * 100_000, generator=gen)
    return DataLoader(dataset, batch_size=sizes.batch, sampler=sampler, num_workers=workers,
                      pin_memory=pin and torch.cuda.is_available(), drop_last=True, collate_fn=collate_fn,
                      prefetch_factor=2 if workers > 0 else None, persistent_workers=False)


class LongEpoch(torch.utils.data.Dataset):
    """``folder`` repeated ``times`` over (index modulo its length), its ``transform`` shared: timm's
    ``create_loader`` shuffles without replacement, so one epoch of this outlasts the benchmark."""

    def __init__(self, folder: Any, times: int) -> None:
        self.folder, self.times = folder, int(times)

    @property
    def transform(self) -> Any:
        return self.folder.transform

    @transform.setter
    def transform(self, value: Any) -> None:
        self.folder.transform = value

    def __len__(self) -> int:
        return len(self.folder) * self.times

    def __getitem__(self, index: int) -> Any:
        return self.folder[index % len(self.folder)]


def timm_loader(root: Path, sizes: Sizes, workers: int, device: torch.device) -> Any:
    """timm's own training loader for its recipe: ``create_loader(..., use_prefetcher=True)`` (uint8 out of
    the workers, normalize and random erasing on the GPU in its CUDA-stream prefetcher)."""
    from timm.data import create_loader

    dataset = LongEpoch(torchvision.datasets.ImageFolder(root), times=100_000 * sizes.batch // sizes.n_images + 1)
    return create_loader(dataset, input_size=(3, sizes.crop, sizes.crop), batch_size=sizes.batch, is_training=True,
                         use_prefetcher=device.type == "cuda", num_workers=workers, pin_memory=device.type == "cuda",
                         device=device, **TIMM_RECIPE)


def draft_folder(root: Path, transform: Any, crop: int) -> Any:
    """An ImageFolder whose loader is the library's draft (JPEG DCT-scaling) decoder, as autotune uses it."""
    from pipeline_opt.loading.decode import draft_loader

    return torchvision.datasets.ImageFolder(root, transform=transform, loader=draft_loader((crop, crop)))


def nvjpeg_source(root: Path, sizes: Sizes, point: Point, device: torch.device) -> Any:
    """Encoded bytes out of the workers (packed per batch), decoded and resized on the GPU (nvJPEG).

    On a CPU device the same decoder runs libjpeg through torchvision (the smoke test's path).
    """
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.loading.decode import EncodedJpegDataset as dataset_cls
    from pipeline_opt.loading.decode import GpuJpegDecoder as decoder_cls
    from pipeline_opt.loading.decode import packed_jpeg_collate as collate

    dataset = dataset_cls.from_image_folder(root)
    loader = make_loader(dataset, sizes, point.workers, point.pin, collate_fn=collate)
    decoder = decoder_cls(size=(sizes.crop, sizes.crop), mean=MEAN, std=STD, device=device)
    return DeviceLoader(loader, device=device, batch_transform=decoder, prepare_in_thread=point.decode.endswith(THREAD))


def build_source(root: Path, sizes: Sizes, point: Point, device: torch.device) -> Any:
    """The batch source of one grid point."""
    if point.decode.removesuffix(THREAD) == "nvjpeg":
        return nvjpeg_source(root, sizes, point, device)
    if point.decode.removesuffix(THREAD) == "replay":
        return replay_source(root, sizes, point, device)
    compose = cpu_compose(sizes.crop, sizes.pipeline)
    gpu_part = None
    if point.offload:
        from pipeline_opt.transforms import split_transforms

        compose, gpu_part = split_transforms(compose)
    if point.decode == "draft":
        dataset = draft_folder(root, compose, sizes.crop)
    else:
        dataset = torchvision.datasets.ImageFolder(root, transform=compose)
    loader = make_loader(dataset, sizes, point.workers, point.pin)
    if not point.offload:
        return loader
    from pipeline_opt.loading import DeviceLoader

    return DeviceLoader(loader, device=device, transform=gpu_part)


def grid_points(sizes: Sizes, cores: int) -> list[Point]:
    """Every point, likely-fast first (GPU decode, then draft, then PIL; more workers first)."""
    workers = sorted({w if w > 0 else cores for w in sizes.workers}, reverse=True)
    points = []
    for decode in (TRAIN_DECODES if is_random(sizes.pipeline) else DECODES):
        for offload in (True, False):
            if decode.removesuffix(THREAD) in ("nvjpeg", "replay") and not offload:
                continue  # GPU decoding is an offload by definition
            for nw in workers:
                for pin in ((True,) if decode.endswith(THREAD) else (True, False)):
                    points.append(Point(nw, pin, offload, decode))
    return points


def impossible(point: Point, device: torch.device) -> str | None:
    if device.type != "cuda" and point.pin:
        return "pinned memory needs CUDA"
    return None


# --------------------------------------------------------------------------------------------------
# the run


def candidate_of(name: str, factory: Any, trainer: Trainer, meta: dict[str, Any]) -> H.Candidate:
    return H.Candidate(name, factory, trainer.step, meta=meta)


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = H.sizes_for(args, Sizes(), QUICK)
    sizes = replace(sizes, pipeline=getattr(args, "pipeline", None) or sizes.pipeline)
    deadline = H.Deadline(sizes.budget_s)
    device = H.pick_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    cores = H.usable_cores()
    root, gen_s = H.image_folder(sizes.n_images, sizes.image_size, seed=args.seed)
    H.log.info("dataset %s ready in %.1f s", root, gen_s)
    num_classes = len(torchvision.datasets.folder.find_classes(root)[0])
    trainer = Trainer(sizes.model, device, num_classes)
    window = {"min_steps": sizes.min_steps, "min_seconds": sizes.min_seconds, "max_seconds": sizes.max_seconds}

    limit_batch = (torch.randn(sizes.batch, 3, sizes.crop, sizes.crop, device=device)
                   .contiguous(memory_format=torch.channels_last),
                   torch.randint(0, num_classes, (sizes.batch,), device=device))
    limit = H.Candidate("limit (device-resident replay)", lambda: H.replay(limit_batch), trainer.step,
                        discard=3, meta={"what": "same step, one synthetic batch already on the device"})
    limit.window(device, min_steps=3, min_seconds=0.0, max_seconds=5.0)  # cuDNN autotune + allocator warm-up

    default_point = Point(sizes.default_workers, False, False, "pil")
    rows: list[H.Row] = []
    coarse: dict[str, H.Row] = {}
    points = grid_points(sizes, cores)
    if getattr(args, "grid_points", None):
        points = points[: args.grid_points]  # likely-fast first: a short re-run measures the top of the grid
    grid_deadline_s = sizes.budget_s - sizes.autotune_budget_s - sizes.final_reserve_s
    for point in points:
        reason = impossible(point, device)
        if reason:
            coarse[point.name] = H.not_run(point.name, "skipped", reason, asdict(point))
            continue
        if deadline.elapsed() > grid_deadline_s:
            coarse[point.name] = H.not_run(point.name, "skipped", f"time budget: the coarse pass is limited to "
                                           f"{grid_deadline_s:.0f} s of the {sizes.budget_s:.0f} s budget",
                                           asdict(point))
            continue
        coarse[point.name] = measure_point(root, sizes, point, device, trainer, window)
    coarse_ok = sorted((r for r in coarse.values() if r.status == "ok"), key=lambda r: -r.median)

    tuned, tune_info = run_autotune(root, sizes, default_point, device, trainer, deadline)

    finals = [limit, candidate_of(f"default (nw={default_point.workers}, CPU transforms)",
                                  lambda: build_source(root, sizes, default_point, device), trainer,
                                  asdict(default_point))]
    top = coarse_ok[: sizes.top_k]
    best_cpu = next((r for r in coarse_ok if r.name.endswith("decode=pil")), None)
    if is_random(sizes.pipeline) and best_cpu is not None and best_cpu not in top:
        top = [*top, best_cpu]  # the CPU path's best point, measured in the same final pass
    by_name = {p.name: p for p in points}
    for r in top:
        p = by_name[r.name]
        finals.append(candidate_of(f"final: {r.name}", lambda p=p: build_source(root, sizes, p, device), trainer,
                                   asdict(p)))
    if sizes.pipeline == "timm":  # timm's own loader at the default worker count and at every core
        for nw in sorted({sizes.default_workers, cores}):
            finals.append(candidate_of(f"timm create_loader nw={nw} (prefetcher)",
                                       lambda nw=nw: timm_loader(root, sizes, nw, device), trainer,
                                       {"workers": nw, "what": "timm.data.create_loader(use_prefetcher=True)"}))
    if tuned is not None:
        finals.append(candidate_of("autotune", lambda: tuned.loader, trainer, tune_info))
    final_deadline = H.Deadline(max(5.0, deadline.left()))
    measured = H.interleave(finals, sizes.rounds, device, deadline=final_deadline, **window)
    final_rows = H.rows_of(finals, measured)
    limit_row = final_rows[0]
    noise = median_spread(final_rows)
    for r in final_rows:
        eff = H.ratio(r, limit_row)
        rows.append(r.with_extra(efficiency=eff, phase="final (interleaved)"))
    if tuned is None:
        rows.append(H.not_run("autotune", tune_info.get("status", "failed"), tune_info.get("reason", "")))
    for r in coarse.values():
        if r.status == "ok":  # one window has no spread of its own: carry the noise measured above
            r = r.with_extra(efficiency=H.ratio(r, limit_row), phase="coarse (one window)",
                             spread_source="median spread of the repeated rows" if noise else "one window")
            r = replace(r, stats={**r.stats, "spread": noise})
        rows.append(r)

    summary = summarize(rows, final_rows, coarse_ok, tune_info, noise, gen_s, pipeline=sizes.pipeline)
    path = H.write_result(
        args.out, NAME if sizes.pipeline == "eval" else f"{NAME}_{sizes.pipeline}", rows,
        config={**asdict(sizes), "device": str(device), "dataset": str(root), "grid_points": len(points)},
        summary=summary, started=started,
        ledger={"model": sizes.model, "batch": sizes.batch, "resolution": sizes.crop, "ddp": False,
                "amp": "bf16" if trainer.amp else "fp32"})
    print(H.format_table(rows, title=f"{NAME} ({device})", reference=limit_row if limit_row.status == "ok" else None))
    print({k: v for k, v in summary.items() if k.startswith(("autotune", "grid_best", "targets"))})
    return path


def measure_point(root: Path, sizes: Sizes, point: Point, device: torch.device, trainer: Trainer,
                  window: dict[str, Any]) -> H.Row:
    """One coarse window of one grid point (fresh loader, closed afterwards)."""
    cand = candidate_of(point.name, lambda: build_source(root, sizes, point, device), trainer, asdict(point))
    cand.start()
    measured = H.interleave([cand], 1, device, **window)
    return H.rows_of([cand], measured)[0]


def run_autotune(root: Path, sizes: Sizes, point: Point, device: torch.device, trainer: Trainer,
                 deadline: H.Deadline) -> tuple[Any, dict[str, Any]]:
    """po.autotune on the default loader; returns (TuneResult or None, info)."""
    from pipeline_opt import autotune

    budget = min(sizes.autotune_budget_s, max(5.0, deadline.left() - sizes.final_reserve_s))
    loader = build_source(root, sizes, point, device)
    t0 = time.perf_counter()
    try:
        result = autotune(loader, trainer.model, step_fn=trainer.step_fn, device=device, time_budget_s=budget,
                          gpu_transforms=True)
    except Exception as exc:
        H.log.exception("autotune failed")
        return None, {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    wall = time.perf_counter() - t0
    info = {"tuning_time_s": getattr(result, "tuning_time_s", None) or wall, "tuning_wall_s": wall,
            "time_budget_s": budget, "config": result.config, "speedup_reported": result.speedup,
            "noise_reported": getattr(result, "noise", None), "trials": len(result.trials),
            "accepted": [t.config for t in result.trials if t.accepted], "trial_log": H.trial_log(result),
            "not_tried": list(result.not_tried)}
    return result, info


def median_spread(rows: list[H.Row]) -> float:
    spreads = sorted(r.stats["spread"] for r in rows if r.status == "ok" and r.stats["n"] >= 2)
    return spreads[len(spreads) // 2] if spreads else 0.0


def grid_point_of(config: dict[str, Any] | None, pipeline: str = "eval") -> Point | None:
    """The grid point with autotune's configuration (workers, pinning, offload, decode), or None
    for a configuration the grid has no point for (shared slots)."""
    if not config or config.get("shared_slots"):
        return None
    decode = config.get("decode") or "pil"
    if decode == "nvjpeg" and is_random(pipeline):
        decode = "replay"  # the training pipeline's GPU decode replays the workers' random draws
    gpu = decode in ("nvjpeg", "replay")
    return Point(int(config.get("num_workers") or 0), bool(config.get("pin_memory")),
                 gpu or bool(config.get("gpu_transforms")), decode + (THREAD if config.get("decode_thread") else ""))


def summarize(rows: list[H.Row], final_rows: list[H.Row], coarse_ok: list[H.Row], tune_info: dict[str, Any],
              noise: float, gen_s: float, pipeline: str = "eval") -> dict[str, Any]:
    by = {r.name: r for r in final_rows}
    limit = final_rows[0]
    default = final_rows[1]
    grid_final = [r for r in final_rows if r.name.startswith("final: grid") and r.status == "ok"]
    grid_best = max(grid_final, key=lambda r: r.median, default=None)
    cpu_best = max((r for r in grid_final if r.name.endswith("decode=pil")), key=lambda r: r.median, default=None)
    auto = by.get("autotune")
    out: dict[str, Any] = {
        "dataset_generation_s": gen_s,
        "noise_median_spread": noise,
        "grid_best": None if grid_best is None else grid_best.name,
        "grid_best_coarse": coarse_ok[0].name if coarse_ok else None,
        "grid_measured": sum(1 for r in rows if r.name.startswith("grid") and r.status == "ok"),
        "autotune_vs_grid_best": H.ratio(auto, grid_best),
        "autotune_vs_default": H.ratio(auto, default),
        "autotune_vs_limit": H.ratio(auto, limit),
        "grid_best_vs_limit": H.ratio(grid_best, limit),
        "cpu_grid_best": None if cpu_best is None else cpu_best.name,
        "autotune_vs_cpu_grid_best": H.ratio(auto, cpu_best),
        "default_vs_limit": H.ratio(default, limit),
        "autotune_tuning_time_s": tune_info.get("tuning_time_s"),
        "autotune_info": tune_info,
    }
    # what autotune claimed (its own interleaved trials) against what it delivered here (the final pass)
    claimed, delivered = tune_info.get("speedup_reported"), out["autotune_vs_default"]
    # autotune's configuration as the grid measured it in the same final pass: the choice apart from
    # the spread between two loaders of one configuration
    point = grid_point_of(tune_info.get("config"), pipeline)
    same = None if point is None else by.get(f"final: {point.name}")
    out["autotune_config_in_grid"] = None if same is None or same.status != "ok" else \
        {"row": same.name, "vs_grid_best": H.ratio(same, grid_best)}
    out["autotune_claimed_vs_delivered"] = None if not claimed or not delivered else claimed / delivered
    out["claim_within_noise"] = None if out["autotune_claimed_vs_delivered"] is None \
        else abs(out["autotune_claimed_vs_delivered"] - 1.0) <= max(noise, 0.05)
    out["decode_thread"] = thread_comparison(rows, noise)
    out["targets"] = {
        "autotune >= 0.95x grid best": _meets(out["autotune_vs_grid_best"], 0.95),
        "autotune >= 8x default": _meets(out["autotune_vs_default"], 8.0),
        "autotune >= 0.8x limit": _meets(out["autotune_vs_limit"], 0.8),
        "tuning <= 90 s": None if out["autotune_tuning_time_s"] is None else out["autotune_tuning_time_s"] <= 90.0,
    }
    if pipeline in ("tvref", "timm"):  # the recipes' own targets: half the limit, 1.5x the CPU path's best
        out["targets"].update({"autotune >= 0.5x limit": _meets(out["autotune_vs_limit"], 0.5),
                               "autotune >= 1.5x best CPU grid point": _meets(out["autotune_vs_cpu_grid_best"], 1.5)})
    timm_rows = [r for r in final_rows if r.name.startswith("timm create_loader") and r.status == "ok"]
    timm_best = max(timm_rows, key=lambda r: r.median, default=None)
    if pipeline == "timm":
        out["timm_loader_best"] = None if timm_best is None else timm_best.name
        out["autotune_vs_timm_loader_best"] = H.ratio(auto, timm_best)
        out["targets"]["autotune >= 1.5x timm's loader"] = _meets(out["autotune_vs_timm_loader_best"], 1.5)
    return out


def thread_comparison(rows: list[H.Row], noise: float) -> dict[str, Any] | None:
    """The best grid point decoding on the GPU from a background thread against the best pinned one
    decoding in the training loop (same decode; coarse grid rows): the evidence the thread option needs."""
    ok = [r for r in rows if r.name.startswith("grid") and r.status == "ok" and "pin=on" in r.name]
    threaded = max((r for r in ok if r.name.endswith(THREAD)), key=lambda r: r.median, default=None)
    if threaded is None:
        return None
    base = threaded.name.rsplit("decode=", 1)[1].removesuffix(THREAD)
    plain = max((r for r in ok if r.name.endswith(f"decode={base}")), key=lambda r: r.median, default=None)
    from pipeline_opt.tune.ab import judge

    ratio = H.ratio(threaded, plain)
    j = None if ratio is None else judge(threaded.median, plain.median, noise)
    return {"threaded": threaded.name, "plain": None if plain is None else plain.name, "ratio": ratio,
            "verdict": None if j is None else j.sentence, "wins_beyond_noise": None if j is None else j.accepted}


def _meets(value: float | None, threshold: float) -> bool | None:
    return None if value is None else value >= threshold


def main(argv: list[str] | None = None) -> int:
    parser = H.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--pipeline", choices=PIPELINES, default=None,
                        help="eval: Resize/ToTensor/Normalize (default); train: RandomResizedCrop/flip/ToTensor/"
                             "Normalize; tvref: torchvision's reference recipe (TrivialAugmentWide, RandomErasing); "
                             "timm: timm's recipe (rand-m9-mstd0.5-inc1, RandomErasing 0.25) and its create_loader")
    parser.add_argument("--grid-points", type=int, default=None,
                        help="measure only the first N grid points (likely-fast first), for a short re-run")
    args = parser.parse_args(argv)
    return H.main_of(args, run)


if __name__ == "__main__":
    sys.exit(main())
