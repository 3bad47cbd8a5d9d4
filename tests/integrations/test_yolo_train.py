"""A real ultralytics training run with the integration attached (CPU, tiny data, offline)."""

from __future__ import annotations

import json

import pytest
from ultralytics import YOLO
from ultralytics.data.build import InfiniteDataLoader

from pipeline_opt.integrations.ultralytics import active_cpu_stages, attach
from pipeline_opt.loader_clone import loader_config


def test_train_one_epoch_with_profile_tune_and_gpu_augment(yolo_data, tmp_path, no_network, quick_profile, train_args):
    model = YOLO("yolo11n.yaml")
    integration = attach(model, steps=2, warmup=1, tune_budget_s=3, tune_kwargs={"profiler": quick_profile})
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

    # GPU augmentation: CPU HSV / flip silenced, the device-side augmentation ran on every batch
    assert active_cpu_stages(trainer.train_loader.dataset) == []
    assert {s["name"] for s in run.disabled} == {"RandomHSV", "RandomFlip(horizontal)"}
    assert trainer.args.hsv_s == pytest.approx(0.7) and trainer.args.fliplr == pytest.approx(0.5)  # args untouched
    assert run.augment.calls >= len(trainer.train_loader)  # 4 training batches, plus the tuner's steps
    assert summary["gpu_augment"]["cpu_stages_still_active"] == []


def test_perf_bench_exits_zero_after_the_fixed_profile(yolo_data, tmp_path, monkeypatch, no_network, train_args):
    monkeypatch.setenv("PERF_BENCH", "1")
    model = YOLO("yolo11n.yaml")
    attach(model, steps=2, warmup=1, output_dir=tmp_path / "bench")
    with pytest.raises(SystemExit) as exit_info:
        model.train(data=str(yolo_data), project=str(tmp_path), name="bench_run", **train_args)
    assert exit_info.value.code == 0
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    assert len(report["steps"]) == 2
    assert not (tmp_path / "bench" / "tune").exists()  # the standard report measures the loader as configured
    assert no_network == []
