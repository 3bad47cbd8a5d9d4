"""A real ultralytics training run with the integration attached (CPU, tiny data, offline)."""

from __future__ import annotations

import json

import pytest
from ultralytics import YOLO
from ultralytics.data.build import InfiniteDataLoader

from pipeline_opt.integrations.ultralytics import attach
from pipeline_opt.integrations.ultralytics._augment import (
    GpuAugmentedPreprocess,
    active_cpu_stages,
    iter_transforms,
)
from pipeline_opt.loading.dataloader import loader_config
from pipeline_opt.tune.measure import Measurement

CPU_STAGES = ["RandomHSV", "RandomFlip(horizontal)"]


class TrainerMeasure:
    """``measure_throughput`` stand-in for the trainer's decision: ``gpu`` / ``cpu`` samples/s."""

    def __init__(self, cpu: float, gpu: float) -> None:
        self.rates = {False: cpu, True: gpu}
        self.seen: list[bool] = []

    def __call__(self, loader, model, step_fn, device, *, windows, steps, warmup, deadline, seed):
        gpu = isinstance(step_fn.trainer.preprocess_batch, GpuAugmentedPreprocess)
        assert active_cpu_stages(loader.dataset) == ([] if gpu else CPU_STAGES)  # both halves switched together
        self.seen.append(gpu)
        r = self.rates[gpu]
        return Measurement(windows=(0.99 * r, r, 1.01 * r), steps_per_window=steps, batch_size=4, startup_s=0.0,
                           elapsed_s=0.0)


def test_train_one_epoch_with_profile_tune_and_gpu_augment(yolo_data, tmp_path, no_network, quick_profile, train_args):
    model = YOLO("yolo11n.yaml")
    wins = TrainerMeasure(cpu=100.0, gpu=130.0)
    integration = attach(model, steps=2, warmup=1, tune_budget_s=3, tune_kwargs={"profiler": quick_profile},
                         augment_kwargs={"measure": wins})
    model.train(data=str(yolo_data), project=str(tmp_path), name="run", **train_args)

    trainer = model.trainer
    run = integration.run
    out = trainer.save_dir / "pipeline_opt"
    assert no_network == []

    # profile: report and the merged trace next to the run's outputs
    report = json.loads((out / "report.json").read_text())
    assert len(report["steps"]) == 2 and report["throughput"] > 0
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("name") == "data_wait" for e in trace["traceEvents"])
    transforms = {name for w in report["workers"] for name in w["transform_s"]}
    assert {"Mosaic", "RandomPerspective", "Format"} <= transforms

    # tuning: saved, and the trainer trained on an InfiniteDataLoader with the chosen settings
    assert (out / "tune" / "tune.json").is_file()
    chosen = run.tunes[0]["config"]
    assert isinstance(trainer.train_loader, InfiniteDataLoader)
    got = loader_config(trainer.train_loader)
    assert (got["num_workers"], got["pin_memory"]) == (chosen["num_workers"], chosen["pin_memory"])
    summary = json.loads((out / "integration.json").read_text())
    assert any("device is cpu" in n for n in summary["notes"])  # says why there is little to try

    # GPU augmentation: measured A B A B, won; CPU HSV / flip silenced, the device-side augmentation ran
    assert wins.seen == [False, True, False, True]
    decision = summary["gpu_augment"]["decision"]
    assert summary["gpu_augment"]["applied"] is True and decision["applied"] is True
    assert (decision["cpu_throughput"], decision["gpu_throughput"]) == (pytest.approx(100.0), pytest.approx(130.0))
    assert decision["noise"] == pytest.approx(0.01) and "GPU augmentation kept" in decision["verdict"]
    assert isinstance(trainer.preprocess_batch, GpuAugmentedPreprocess)
    assert active_cpu_stages(trainer.train_loader.dataset) == []
    assert {s["name"] for s in run.disabled} == {"RandomHSV", "RandomFlip(horizontal)"}
    assert trainer.args.hsv_s == pytest.approx(0.7) and trainer.args.fliplr == pytest.approx(0.5)  # args untouched
    assert run.augment.calls >= len(trainer.train_loader)  # 4 training batches, plus the tuner's steps
    assert summary["gpu_augment"]["cpu_stages_still_active"] == []


def test_gpu_augment_that_loses_is_not_used(yolo_data, tmp_path, no_network, train_args):
    model = YOLO("yolo11n.yaml")
    loses = TrainerMeasure(cpu=100.0, gpu=80.0)
    integration = attach(model, profile=False, tune=False, augment_kwargs={"measure": loses})
    model.train(data=str(yolo_data), project=str(tmp_path), name="lose", **train_args)

    trainer, run = model.trainer, integration.run
    assert loses.seen == [False, True, False, True]
    assert "preprocess_batch" not in vars(trainer)  # the trainer's own method, not wrapped
    assert not isinstance(trainer.preprocess_batch, GpuAugmentedPreprocess) and run.augment.calls == 0
    assert active_cpu_stages(trainer.train_loader.dataset) == CPU_STAGES and run.disabled == []
    summary = json.loads((trainer.save_dir / "pipeline_opt" / "integration.json").read_text())
    gpu = summary["gpu_augment"]
    assert gpu["applied"] is False and gpu["cpu_stages_still_active"] == CPU_STAGES
    assert (gpu["decision"]["cpu_throughput"], gpu["decision"]["gpu_throughput"]) == (pytest.approx(100.0),
                                                                                      pytest.approx(80.0))
    assert any(n.startswith("GPU augmentation not used") for n in summary["notes"])


def test_perf_bench_exits_zero_after_the_fixed_profile(yolo_data, tmp_path, monkeypatch, no_network, train_args):
    monkeypatch.setenv("PERF_BENCH", "1")
    model = YOLO("yolo11n.yaml")
    attach(model, steps=2, warmup=1, output_dir=tmp_path / "bench",
           augment_kwargs={"rounds": 1, "windows": 1, "steps": 1, "warmup": 0})  # the real measurement, short
    with pytest.raises(SystemExit) as exit_info:
        model.train(data=str(yolo_data), project=str(tmp_path), name="bench_run", **train_args)
    assert exit_info.value.code == 0
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    assert len(report["steps"]) == 2
    assert not (tmp_path / "bench" / "tune").exists()  # the standard report measures the loader as configured
    gpu = json.loads((tmp_path / "bench" / "integration.json").read_text())["gpu_augment"]
    assert gpu["decision"]["order"] == ["cpu", "gpu"] and gpu["decision"]["cpu_throughput"] > 0
    assert gpu["decision"]["gpu_throughput"] > 0 and gpu["applied"] is gpu["decision"]["applied"]
    assert gpu["cpu_stages_still_active"] == ([] if gpu["applied"] else CPU_STAGES)
    assert no_network == []


class WarpMeasure:
    """``measure_throughput`` stand-in for both trainer decisions: CPU stages, GPU colour/flip, + warp."""

    def __init__(self, cpu: float, colour: float, warp: float) -> None:
        self.rates = {"cpu": cpu, "colour": colour, "warp": warp}
        self.seen: list[str] = []

    def __call__(self, loader, model, step_fn, device, *, windows, steps, warmup, deadline, seed):
        wrapper = step_fn.trainer.preprocess_batch
        state = "cpu" if not isinstance(wrapper, GpuAugmentedPreprocess) else (
            "warp" if wrapper.augment.warps else "colour")
        on_cpu = active_cpu_stages(loader.dataset, affine=True)
        assert ("RandomPerspective" in on_cpu) == (state != "warp")  # the workers warp unless the device does
        self.seen.append(state)
        r = self.rates[state]
        return Measurement(windows=(0.99 * r, r, 1.01 * r), steps_per_window=steps, batch_size=4, startup_s=0.0,
                           elapsed_s=0.0)


def test_a_warp_that_wins_is_trained_with(yolo_data, tmp_path, no_network, train_args):
    model = YOLO("yolo11n.yaml")
    wins = WarpMeasure(cpu=100.0, colour=130.0, warp=160.0)
    integration = attach(model, profile=False, tune=False, gpu_affine=True, augment_kwargs={"measure": wins})
    model.train(data=str(yolo_data), project=str(tmp_path), name="warp", **train_args)

    trainer, run = model.trainer, integration.run
    assert wins.seen == ["cpu", "colour", "cpu", "colour", "colour", "warp", "colour", "warp"]
    assert isinstance(trainer.preprocess_batch, GpuAugmentedPreprocess) and run.augment.augment.warps
    assert active_cpu_stages(trainer.train_loader.dataset, affine=True) == []
    assert run.augment.calls >= len(trainer.train_loader)  # trained through the warping step
    assert {s["name"] for s in run.disabled} == {"RandomHSV", "RandomFlip(horizontal)", "RandomPerspective"}
    (warp,) = [t for t in iter_transforms(trainer.train_loader.dataset.transforms)
               if type(t).__name__ == "RandomPerspective"]
    assert warp.apply_image.crops >= len(trainer.train_loader.dataset)  # the workers (here: 0) cropped the canvas
    assert trainer.args.degrees == 0.0 and trainer.args.translate == pytest.approx(0.1)  # args untouched
    summary = json.loads((trainer.save_dir / "pipeline_opt" / "integration.json").read_text())
    assert summary["image_cache"] is None
    affine = summary["gpu_augment"]["affine"]
    assert affine["applied"] is True and affine["decision"]["subject"] == "gpu_affine"
    assert affine["decision"]["gpu_throughput"] == pytest.approx(160.0)
    assert any(n.startswith("GPU warp kept") for n in summary["notes"])


def _record_files(model, files: list) -> None:
    """Record every training batch's ``im_file`` list as the trainer preprocesses it (the tuner's
    steps, which preprocess the batches of its trials, are not training batches)."""
    training = [False]

    def wrap(trainer):
        original = trainer.preprocess_batch

        def preprocess(batch):
            if training[0]:
                files.append(list(batch["im_file"]))
                training[0] = False
            return original(batch)

        trainer.preprocess_batch = preprocess

    def batch_start(trainer):
        training[0] = True

    model.add_callback("on_pretrain_routine_end", wrap)  # after attach's own callback
    model.add_callback("on_train_batch_start", batch_start)


def test_forced_shared_slots_train_every_sample_through_reused_buffers(yolo_data, tmp_path, no_network, train_args):
    import torch

    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.tune.measure import live_children

    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, tune=False, gpu_augment=False, workers=2, shared_slots="force")
    files: list = []
    _record_files(model, files)
    before = live_children()
    # two epochs, mosaic closed for the second: the trainer resets its loader in between
    model.train(data=str(yolo_data), project=str(tmp_path), name="slots", **{**train_args, "epochs": 2,
                                                                             "close_mosaic": 1})
    trainer, run = model.trainer, integration.run
    loader = trainer.train_loader
    assert isinstance(loader, DeviceLoader) and loader.reuses_buffers and loader.num_workers == 2
    assert run.loader_setting["shared_slots"] is True
    per_epoch = len(loader)
    assert per_epoch == 4 and len(files) == 2 * per_epoch
    for epoch in range(2):  # every sample once per epoch: nothing lost or repeated
        seen = [f for batch in files[epoch * per_epoch:(epoch + 1) * per_epoch] for f in batch]
        assert len(seen) == len(set(seen)) == 16
    stats = loader.slot_stats()
    # every batch the workers made came through a slot (they also made the ones prefetched ahead of
    # each epoch's end, which ultralytics' reset() for the closed mosaic and the final close() drop)
    assert stats.slotted == stats.total >= 2 * per_epoch
    losses = trainer.tloss.values() if isinstance(trainer.tloss, dict) else [trainer.tloss]
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in losses)  # trained on real batches
    summary = json.loads((trainer.save_dir / "pipeline_opt" / "integration.json").read_text())
    assert summary["shared_slots"]["applied"] is True and summary["shared_slots"]["requested"] == "force"
    assert summary["shared_slots"]["stats"]["slotted"] >= 2 * per_epoch
    assert live_children() - before == set(), "worker processes left behind"


def test_shared_slots_without_workers_say_why_they_were_not_used(yolo_data, tmp_path, no_network, train_args):
    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, tune=False, gpu_augment=False, shared_slots="force")
    model.train(data=str(yolo_data), project=str(tmp_path), name="noslots", **train_args)  # workers=0 on CPU
    assert isinstance(model.trainer.train_loader, InfiniteDataLoader)
    assert any("shared_slots='force' not applied" in n for n in integration.run.notes)


def test_shared_slots_as_a_candidate_are_passed_to_the_tuner(yolo_data, tmp_path, no_network, quick_profile,
                                                            train_args):
    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, gpu_augment=False, workers=2, tune_budget_s=3, shared_slots=True,
                         tune_kwargs={"profiler": quick_profile})
    model.train(data=str(yolo_data), project=str(tmp_path), name="slotcand", **train_args)
    tuned = json.loads((model.trainer.save_dir / "pipeline_opt" / "tune" / "tune.json").read_text())
    # on the CPU the tuner does not try them, and says so (on CUDA they are a measured candidate)
    assert any(line.startswith("shared_slots: device is cpu") for line in tuned["not_tried"]), tuned["not_tried"]
    assert isinstance(model.trainer.train_loader, InfiniteDataLoader)
    assert not any("were not tried" in n for n in integration.run.notes)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_shared_slots_values_are_rejected(bad):
    from pipeline_opt.integrations.ultralytics._callbacks import AttachOptions

    with pytest.raises(ValueError, match="shared_slots="):
        AttachOptions(shared_slots=bad)
    with pytest.raises(ValueError, match="shared_slots="):
        attach(YOLO("yolo11n.yaml"), shared_slots=bad)


def test_a_retune_replaces_a_shared_slots_loader_without_losing_samples(yolo_data, tmp_path, no_network,
                                                                         quick_profile, train_args):
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.tune.measure import live_children

    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, gpu_augment=False, workers=2, shared_slots="force", tune_budget_s=2,
                         retune_epoch=1, tune_kwargs={"profiler": quick_profile, "max_workers": 2})
    files: list = []
    _record_files(model, files)
    before = live_children()
    model.train(data=str(yolo_data), project=str(tmp_path), name="retune", **{**train_args, "epochs": 2})
    trainer, run = model.trainer, integration.run
    assert [t["when"] for t in run.tunes] == ["before the first epoch", "at the start of epoch 1"]
    assert all(t["config"]["shared_slots"] is True for t in run.tunes)
    loader = trainer.train_loader
    assert isinstance(loader, DeviceLoader) and loader.reuses_buffers
    per_epoch = len(loader)
    assert len(files) == 2 * per_epoch
    for epoch in range(2):
        seen = [f for batch in files[epoch * per_epoch:(epoch + 1) * per_epoch] for f in batch]
        assert len(seen) == len(set(seen)) == 16
    assert live_children() - before == set(), "worker processes left behind"


@pytest.mark.cuda
def test_cuda_training_through_shared_slots_and_gpu_augmentation(yolo_data, tmp_path, no_network, train_args):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.tune.measure import live_children

    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, tune=False, gpu_augment="force", gpu_affine="force", workers=2,
                         shared_slots="force")
    files: list = []
    _record_files(model, files)
    try:
        import polars  # noqa: F401  (ultralytics reads its results CSV with it when it saves a checkpoint)
    except ImportError:  # the GPU machine gets ultralytics without it: skip that read
        model.add_callback("on_pretrain_routine_start", lambda trainer: setattr(trainer, "read_results_csv", dict))
    before = live_children()
    model.train(data=str(yolo_data), project=str(tmp_path), name="cuda_slots",
                **{**train_args, "device": 0, "imgsz": 64, "epochs": 2, "close_mosaic": 1})
    trainer, run = model.trainer, integration.run
    loader = trainer.train_loader
    assert isinstance(loader, DeviceLoader) and loader.reuses_buffers and loader.device.type == "cuda"
    per_epoch = len(loader)
    assert len(files) == 2 * per_epoch
    for epoch in range(2):
        seen = [f for batch in files[epoch * per_epoch:(epoch + 1) * per_epoch] for f in batch]
        assert len(seen) == len(set(seen)) == 16
    stats = loader.slot_stats()
    assert stats.slotted == stats.total >= 2 * per_epoch
    assert run.augment.calls >= 2 * per_epoch  # the device-side colour / flip / warp ran on every batch
    assert "RandomPerspective" in {s["name"] for s in run.disabled}  # the workers cropped the Mosaic canvas
    losses = trainer.tloss.values() if isinstance(trainer.tloss, dict) else [trainer.tloss]
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in losses)
    assert live_children() - before == set(), "worker processes left behind"


def _validation_burn(validator):
    import time

    end, x = time.perf_counter() + 0.25, 0
    while time.perf_counter() < end:
        for i in range(1000):
            x += i * i


def test_the_steps_after_each_validation_pass_are_measured_and_its_hotspot_named(yolo_data, tmp_path, no_network,
                                                                                  train_args):
    model = YOLO("yolo11n.yaml")
    integration = attach(model, profile=False, tune=False, gpu_augment=False, warmup=1)
    model.add_callback("on_val_batch_end", _validation_burn)  # a CPU-heavy validation (NMS-like), on purpose
    model.train(data=str(yolo_data), project=str(tmp_path), name="run",
                **{**train_args, "epochs": 3, "batch": 2, "val": True})
    run = integration.run
    assert len(run.validation.passes) == 2 + 1 and len(run.validation.steps) == 3 * 8 - 1  # 3 passes, 24 steps
    assert all(p.seconds >= 0.25 for p in run.validation.passes)
    summary = json.loads((model.trainer.save_dir / "pipeline_opt" / "integration.json").read_text())
    found = summary["validation"]
    assert "_validation_burn" in found["hotspot"] and found["steady_step_s"] > 0
    assert len(found["after_step_s"]) == 5 and found["summary"].startswith("the ")


def test_an_out_of_memory_retry_is_noted_and_cpu_memory_is_not_measured(tmp_path):
    from types import SimpleNamespace

    from pipeline_opt.integrations.ultralytics._run import Run

    integration = attach(_FakeModel(), profile=False, tune=False, gpu_augment=False)
    trainer = SimpleNamespace(batch_size=16, epoch=0, device="cpu", save_dir=tmp_path, args=SimpleNamespace(),
                              world_size=1)
    integration.run = Run(trainer, str(tmp_path))
    integration.on_train_epoch_start(trainer)
    trainer.batch_size = 8  # ultralytics halved the batch after an out-of-memory error and restarts the epoch
    integration.on_train_epoch_start(trainer)
    (note,) = integration.run.notes
    assert "ran out of memory in epoch 0 and retried with batch=8 (was 16)" in note
    assert integration.summary(integration.run)["memory"] == {"measured": False,
                                                              "note": "not measured on cpu (CUDA devices only)"}


class _FakeModel:
    def add_callback(self, event, fn):
        pass
