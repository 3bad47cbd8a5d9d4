"""The measured warp decision (gpu_affine=True): RandomPerspective's warp moves to the device only
when colour/flip + warp beats colour/flip alone beyond the noise, after the colour/flip was kept."""

from __future__ import annotations

import pytest

from pipeline_opt.integrations.ultralytics import build_yolo_pipeline, decide_yolo_augment, tune_yolo
from pipeline_opt.integrations.ultralytics._augment import active_cpu_stages, iter_transforms
from pipeline_opt.integrations.ultralytics._callbacks import AttachOptions
from pipeline_opt.integrations.ultralytics._decide import AugmentDecision, AugmentSwitch
from pipeline_opt.tune.measure import Measurement, TrialFailed
from pipeline_opt.tune.result import TuneResult

COLOUR = ["RandomHSV", "RandomFlip(horizontal)"]
ALL = ["RandomPerspective", *COLOUR]  # in the transforms' order


def _state(step_fn) -> str:
    augment = step_fn.augment
    if augment is None:
        return "cpu"
    return "warp" if augment.warps else "colour"


class ThreeWayMeasure:
    """``measure_throughput`` stand-in keyed by what the step runs: CPU stages, GPU colour/flip, or
    GPU colour/flip + warp; it records the state and the dataset's active CPU stages per trial."""

    def __init__(self, dataset, cpu: float, colour: float, warp: float, fail_warp: bool = False) -> None:
        self.dataset, self.rates, self.fail_warp = dataset, {"cpu": cpu, "colour": colour, "warp": warp}, fail_warp
        self.seen: list[tuple[str, list[str]]] = []

    def __call__(self, loader, model, step_fn, device, *, windows, steps, warmup, deadline, seed):
        state = _state(step_fn)
        self.seen.append((state, active_cpu_stages(self.dataset, affine=True)))
        if state == "warp" and self.fail_warp:
            raise TrialFailed("step", "step_fn raised RuntimeError: CUDA error: out of memory")
        r = self.rates[state]
        return Measurement(windows=(0.99 * r, r, 1.01 * r), steps_per_window=steps, batch_size=4, startup_s=0.0,
                           elapsed_s=0.0)


@pytest.fixture
def pipe(yolo_data):
    p = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=True,
                            gpu_affine=True)
    yield p
    p.close()


def _perspective(dataset):
    from ultralytics.data.augment import RandomPerspective

    return next(t for t in iter_transforms(dataset.transforms) if isinstance(t, RandomPerspective))


def test_the_warp_stays_with_the_workers_until_measured(pipe):
    assert pipe.gpu_augment_active and not pipe.gpu_affine_active and pipe.affine_decision is None
    assert pipe.augment.warp_enabled is False and not pipe.augment.warps
    assert active_cpu_stages(pipe.dataset, affine=True) == ["RandomPerspective"]


def test_a_warp_that_wins_moves_to_the_device_after_the_colour_decision(pipe):
    fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=130.0, warp=160.0)
    colour = decide_yolo_augment(pipe, measure=fake)
    # colour/flip first (the workers warp in both of its sides), then the warp, each A B A B
    assert [s for s, _ in fake.seen] == ["cpu", "colour", "cpu", "colour", "colour", "warp", "colour", "warp"]
    assert [stages for _, stages in fake.seen] == [ALL, ["RandomPerspective"], ALL, ["RandomPerspective"],
                                                   ["RandomPerspective"], [], ["RandomPerspective"], []]
    warp = pipe.affine_decision
    assert colour.applied and colour.subject == "gpu_augment"
    assert warp.applied and warp.subject == "gpu_affine" and warp.gain == pytest.approx(160 / 130 - 1)
    assert (warp.cpu_throughput, warp.gpu_throughput) == (pytest.approx(130.0), pytest.approx(160.0))
    assert "GPU warp kept" in warp.verdict and "GPU colour/flip + warp 160.0 vs GPU colour/flip 130.0" in warp.verdict
    assert pipe.gpu_affine_active and pipe.augment.warps and pipe.cpu_stages_disabled == (*COLOUR, "RandomPerspective")
    assert active_cpu_stages(pipe.dataset, affine=True) == []
    assert decide_yolo_augment(pipe, measure=fake) is colour and len(fake.seen) == 8  # decided once


def test_a_warp_that_loses_gives_the_workers_their_warp_back(pipe):
    perspective = _perspective(pipe.dataset)
    gains = (perspective.translate, perspective.scale)
    fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=130.0, warp=120.0)
    decide_yolo_augment(pipe, measure=fake)
    warp = pipe.affine_decision
    assert not warp.applied and "7.7% slower (noise ±1.0%); the workers keep the warp" in warp.verdict
    assert pipe.gpu_augment_active and not pipe.gpu_affine_active and not pipe.augment.warps
    assert (perspective.translate, perspective.scale) == gains and gains != (0.0, 0.0)
    assert "apply_image" not in vars(perspective)  # the class's warp again, not the crop
    assert active_cpu_stages(pipe.dataset, affine=True) == ["RandomPerspective"]
    assert pipe.cpu_stages_disabled == tuple(COLOUR)


def test_the_warp_is_not_tried_when_the_colour_stays_on_the_cpu(pipe):
    fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=90.0, warp=500.0)
    decide_yolo_augment(pipe, measure=fake)
    assert [s for s, _ in fake.seen] == ["cpu", "colour", "cpu", "colour"]
    warp = pipe.affine_decision
    assert not warp.applied and "not tried" in warp.verdict and warp.order == ()
    assert not pipe.gpu_augment_active and not pipe.gpu_affine_active
    assert active_cpu_stages(pipe.dataset, affine=True) == ALL


def test_a_failing_warp_trial_keeps_the_colour_and_gives_the_warp_back(pipe):
    fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=130.0, warp=500.0, fail_warp=True)
    decide_yolo_augment(pipe, measure=fake)
    warp = pipe.affine_decision
    assert not warp.applied and "gpu trial failed (step)" in warp.verdict
    assert pipe.gpu_augment_active and not pipe.gpu_affine_active
    assert active_cpu_stages(pipe.dataset, affine=True) == ["RandomPerspective"]


def test_no_warp_to_measure_when_the_affine_ranges_are_zero(yolo_data):
    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=True,
                               gpu_affine=True, degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0)
    try:
        fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=130.0, warp=500.0)
        decide_yolo_augment(pipe, measure=fake)
        assert [s for s, _ in fake.seen] == ["cpu", "colour", "cpu", "colour"]
        assert not pipe.affine_decision.applied and "ranges are all 0" in pipe.affine_decision.verdict
        assert pipe.gpu_augment_active and not pipe.gpu_affine_active
    finally:
        pipe.close()


def test_forced_warp_is_part_of_the_measured_colour_decision(yolo_data):
    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=True,
                               gpu_affine="force")
    try:
        assert pipe.gpu_affine_active and pipe.affine_decision.forced
        fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=1.0, warp=130.0)
        decide_yolo_augment(pipe, measure=fake)
        assert [s for s, _ in fake.seen] == ["cpu", "warp", "cpu", "warp"]  # no warp decision of its own
        assert pipe.gpu_affine_active and active_cpu_stages(pipe.dataset, affine=True) == []
    finally:
        pipe.close()


def test_forced_gpu_augment_forces_the_warp_too(yolo_data):
    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment="force",
                               gpu_affine=True)
    try:
        fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=1.0, warp=1.0)
        decide_yolo_augment(pipe, measure=fake)
        assert fake.seen == [] and pipe.gpu_affine_active and pipe.affine_decision.forced
    finally:
        pipe.close()


def test_tune_yolo_records_the_warp_decision(pipe, monkeypatch):
    import pipeline_opt.integrations.ultralytics._pipeline as yolo_pipeline

    seen = []

    def fake_tune_loader(loader, model, step_fn, device, time_budget_s, **kwargs):
        seen.append((_state(step_fn), active_cpu_stages(pipe.dataset, affine=True)))
        return TuneResult(loader=loader, config={"num_workers": 0, "pin_memory": False}, baseline=None, best=None,
                          trials=(), speedup=1.0, verdict="kept")

    monkeypatch.setattr(yolo_pipeline, "tune_loader", fake_tune_loader)
    fake = ThreeWayMeasure(pipe.dataset, cpu=100.0, colour=130.0, warp=160.0)
    result = tune_yolo(pipe, time_budget_s=3, augment_kwargs={"measure": fake})
    assert seen == [("warp", [])]  # the loader is tuned for the pipeline kept
    saved = result.to_dict()
    assert saved["gpu_augment"]["applied"] and saved["gpu_affine"]["applied"]
    assert saved["gpu_affine"]["subject"] == "gpu_affine" and saved["gpu_affine"]["gpu_throughput"] == pytest.approx(160)


def test_real_measurement_of_the_warp_leaves_a_consistent_pipeline(pipe):
    before = {n: p.detach().clone() for n, p in pipe.model.named_parameters()}
    pipe.switch.decision = AugmentDecision.forced_on()  # the colour/flip kept: only the warp is measured
    decide_yolo_augment(pipe, rounds=1, windows=1, steps=1, warmup=0)
    warp = pipe.affine_decision
    assert warp.order == ("cpu", "gpu") and warp.cpu_throughput > 0 and warp.gpu_throughput > 0
    assert warp.warmup_s > 0 and len(warp.burn_in_windows) == 1  # warm-up and burn-in, as the colour's
    assert pipe.gpu_affine_active == warp.applied == pipe.augment.warps
    assert active_cpu_stages(pipe.dataset, affine=True) == ([] if warp.applied else ["RandomPerspective"])
    assert all((before[n] == p).all() for n, p in pipe.model.named_parameters())  # the model is restored


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_gpu_affine_values_are_rejected(yolo_data, bad):
    with pytest.raises(ValueError, match="gpu_affine="):
        build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=True, gpu_affine=bad)
    with pytest.raises(ValueError, match="gpu_affine="):
        AttachOptions(gpu_affine=bad)


@pytest.mark.parametrize("affine", [True, "force"])
def test_the_warp_needs_the_gpu_augmentation(yolo_data, affine):
    with pytest.raises(ValueError, match="needs gpu_augment=True"):
        build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=False,
                            gpu_affine=affine)
    with pytest.raises(ValueError, match="needs gpu_augment=True"):
        AttachOptions(gpu_augment=False, gpu_affine=affine)


def test_set_affine_needs_the_augmentation_module(pipe):
    bare = AugmentSwitch(pipe.dataset, lambda on: None)
    with pytest.raises(TypeError, match="augment=<DetectionGPUAugment>"):
        bare.set_affine(True)
