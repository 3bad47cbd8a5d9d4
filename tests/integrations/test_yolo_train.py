"""A real ultralytics training run with the integration attached (CPU, tiny data, offline)."""

from __future__ import annotations

import json

import pytest
from ultralytics import YOLO
from ultralytics.data.build import InfiniteDataLoader

from pipeline_opt.integrations.ultralytics import GpuAugmentedPreprocess, active_cpu_stages, attach
from pipeline_opt.loader_clone import loader_config
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
    assert trainer.args.degrees == 0.0 and trainer.args.translate == pytest.approx(0.1)  # args untouched
    summary = json.loads((trainer.save_dir / "pipeline_opt" / "integration.json").read_text())
    affine = summary["gpu_augment"]["affine"]
    assert affine["applied"] is True and affine["decision"]["subject"] == "gpu_affine"
    assert affine["decision"]["gpu_throughput"] == pytest.approx(160.0)
    assert any(n.startswith("GPU warp kept") for n in summary["notes"])
