"""The measured GPU-augmentation decision: kept only when it beats the CPU stages beyond the noise."""

from __future__ import annotations

import pytest

from pipeline_opt.integrations.ultralytics import (
    YoloTuneResult,
    build_yolo_pipeline,
    decide_yolo_augment,
    tune_yolo,
)
from pipeline_opt.integrations.ultralytics._augment import active_cpu_stages
from pipeline_opt.integrations.ultralytics._callbacks import AttachOptions
from pipeline_opt.tune.measure import Measurement, TrialFailed
from pipeline_opt.tune.result import TuneResult

CPU_STAGES = ["RandomHSV", "RandomFlip(horizontal)"]


class FakeMeasure:
    """``measure_throughput`` stand-in: ``rates[gpu]`` samples/s (x ``wobble`` across the windows).

    It records, per trial, whether the step applied the GPU augmentation and which CPU stages the
    dataset still had active, so the tests see that both halves switched together.
    """

    def __init__(self, cpu: float, gpu: float, dataset, wobble: float = 0.01, fail_gpu: bool = False) -> None:
        self.rates = {False: cpu, True: gpu}
        self.dataset = dataset
        self.wobble = wobble
        self.fail_gpu = fail_gpu
        self.seen: list[tuple[bool, list[str]]] = []

    def __call__(self, loader, model, step_fn, device, *, windows, steps, warmup, deadline, seed):
        gpu = step_fn.augment is not None
        self.seen.append((gpu, active_cpu_stages(self.dataset)))
        assert loader is not None and loader.dataset is self.dataset and seed == 0
        if gpu and self.fail_gpu:
            raise TrialFailed("step", "step_fn raised RuntimeError: out of memory")
        r = self.rates[gpu]
        return Measurement(windows=(r * (1 - self.wobble), r, r * (1 + self.wobble)), steps_per_window=steps,
                           batch_size=4, startup_s=0.0, elapsed_s=0.0)


@pytest.fixture
def pipe(yolo_data):
    p = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=True)
    yield p
    p.close()


def _hsv_flip(dataset):
    from ultralytics.data.augment import RandomFlip, RandomHSV

    from pipeline_opt.integrations.ultralytics._augment import iter_transforms

    ts = iter_transforms(dataset.transforms)
    hsv = next(t for t in ts if isinstance(t, RandomHSV))
    flip = next(t for t in ts if isinstance(t, RandomFlip) and t.direction == "horizontal")
    return (hsv.hgain, hsv.sgain, hsv.vgain), flip.p


def test_gpu_augment_that_loses_restores_the_cpu_stages(pipe):
    assert pipe.gpu_augment_active and pipe.cpu_stages_disabled == tuple(CPU_STAGES)  # a candidate after build
    fake = FakeMeasure(cpu=100.0, gpu=80.0, dataset=pipe.dataset)
    decision = decide_yolo_augment(pipe, measure=fake)
    assert [gpu for gpu, _ in fake.seen] == [False, True, False, True]  # interleaved A B A B
    assert [stages for _, stages in fake.seen] == [CPU_STAGES, [], CPU_STAGES, []]
    assert decision.order == ("cpu", "gpu", "cpu", "gpu") and not decision.applied
    assert decision.cpu_throughput == pytest.approx(100.0) and decision.gpu_throughput == pytest.approx(80.0)
    assert decision.noise == pytest.approx(0.01) and decision.threshold == pytest.approx(0.03)
    assert decision.gain == pytest.approx(-0.2) and "CPU augmentation stays" in decision.verdict
    # the CPU stages are back with the run's own gains, and the step does not augment
    assert active_cpu_stages(pipe.dataset) == CPU_STAGES
    assert _hsv_flip(pipe.dataset) == ((pytest.approx(0.015), pytest.approx(0.7), pytest.approx(0.4)), 0.5)
    assert pipe.step_fn.augment is None and not pipe.gpu_augment_active and pipe.cpu_stages_disabled == ()
    assert pipe.augment_decision is decision
    assert decide_yolo_augment(pipe, measure=fake) is decision and len(fake.seen) == 4  # decided once


def test_gpu_augment_that_wins_beyond_the_noise_is_applied(pipe):
    fake = FakeMeasure(cpu=100.0, gpu=125.0, dataset=pipe.dataset)
    decision = decide_yolo_augment(pipe, measure=fake)
    assert decision.applied and decision.gain == pytest.approx(0.25)
    assert "GPU augmentation kept" in decision.verdict
    assert active_cpu_stages(pipe.dataset) == [] and pipe.step_fn.augment is pipe.augment
    assert pipe.cpu_stages_disabled == tuple(CPU_STAGES)
    assert decision.to_dict()["gpu_throughput"] == pytest.approx(125.0)


@pytest.mark.parametrize("gpu, wobble, why", [
    (102.0, 0.01, "below the 3% minimum"),
    (108.0, 0.20, "within the measured noise (windows spread 40% -> noise 20%)"),
])
def test_gpu_augment_within_the_threshold_is_not_applied(pipe, gpu, wobble, why):
    decision = decide_yolo_augment(pipe, measure=FakeMeasure(cpu=100.0, gpu=gpu, dataset=pipe.dataset, wobble=wobble))
    assert not decision.applied, why
    assert decision.threshold == pytest.approx(max(wobble, 0.03))
    assert active_cpu_stages(pipe.dataset) == CPU_STAGES and pipe.step_fn.augment is None


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers, steps, expected", [(0, 10, 10), (1, 10, 10), (3, 10, 12), (8, 10, 16),
                                                     (8, 16, 16), (12, 10, 12)])
def test_windows_hold_whole_rounds_of_the_workers(pipe, workers, steps, expected):
    """10-step windows over 8 workers hold one burst of batches or two: the decision rounds them up."""
    from pipeline_opt.integrations.ultralytics._decide import decide_gpu_augment
    from pipeline_opt.loading.dataloader import clone_loader

    loader = clone_loader(pipe.loader, num_workers=workers)  # never iterated: the measurement is injected
    asked: list[int] = []
    fake = FakeMeasure(cpu=100.0, gpu=90.0, dataset=pipe.dataset)

    def measure(*args, steps, **kw):
        asked.append(steps)
        return fake(*args, steps=steps, **kw)

    decision = decide_gpu_augment(loader, pipe.model, pipe.step_fn, pipe.device, pipe.switch, measure=measure,
                                  steps=steps)
    assert asked == [expected] * 4 and decision.window_steps == expected
    assert decision.to_dict()["window_steps"] == expected


def test_a_failing_gpu_trial_keeps_the_cpu_stages(pipe):
    decision = decide_yolo_augment(pipe, measure=FakeMeasure(cpu=100.0, gpu=500.0, dataset=pipe.dataset,
                                                             fail_gpu=True))
    assert not decision.applied and "gpu trial failed (step)" in decision.verdict
    assert decision.order == ("cpu",) and active_cpu_stages(pipe.dataset) == CPU_STAGES


def test_forced_gpu_augment_is_not_measured(yolo_data):
    pipe = build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment="force")
    try:
        fake = FakeMeasure(cpu=100.0, gpu=1.0, dataset=pipe.dataset)
        decision = decide_yolo_augment(pipe, measure=fake)
        assert decision.forced and decision.applied and fake.seen == []
        assert active_cpu_stages(pipe.dataset) == [] and pipe.step_fn.augment is not None
    finally:
        pipe.close()


def test_real_measurement_leaves_a_consistent_pipeline(pipe):
    before = {n: p.detach().clone() for n, p in pipe.model.named_parameters()}
    decision = decide_yolo_augment(pipe, rounds=1, windows=1, steps=1, warmup=0)
    assert decision.order == ("cpu", "gpu") and decision.cpu_throughput > 0 and decision.gpu_throughput > 0
    assert decision.warmup_s > 0  # the real measurement warms both sides up first
    assert len(decision.burn_in_windows) == 1  # ... and runs a CPU burn-in trial, left out of the verdict
    assert pipe.gpu_augment_active == decision.applied
    assert active_cpu_stages(pipe.dataset) == ([] if decision.applied else CPU_STAGES)
    assert all((before[n] == p).all() for n, p in pipe.model.named_parameters())  # the model is restored


def _record_warm_up(monkeypatch, calls, fail_gpu=False):
    import pipeline_opt.tune.measure as measure

    real = measure.step_once

    def step_once(step_fn, model, batch, device):
        gpu = step_fn.augment is not None
        calls.append(("warm-up", gpu))
        if gpu and fail_gpu:
            raise TrialFailed("step", "step_fn raised RuntimeError: CUDA error: out of memory")
        real(step_fn, model, batch, device)

    monkeypatch.setattr(measure, "step_once", step_once)


def test_warm_up_steps_both_sides_before_the_first_trial(pipe, monkeypatch):
    calls = []
    _record_warm_up(monkeypatch, calls)
    fake = FakeMeasure(cpu=100.0, gpu=150.0, dataset=pipe.dataset)
    measure = lambda *a, **kw: (calls.append(("trial", a[2].augment is not None)), fake(*a, **kw))[1]  # noqa: E731
    before = {n: p.detach().clone() for n, p in pipe.model.named_parameters()}
    decision = decide_yolo_augment(pipe, measure=measure, warm_up=True)
    assert calls == [("warm-up", False), ("warm-up", True), ("trial", False), ("trial", True), ("trial", False),
                     ("trial", True)]
    assert decision.applied and decision.warmup_s > 0 and decision.to_dict()["warmup_s"] == decision.warmup_s
    assert all((before[n] == p).all() for n, p in pipe.model.named_parameters())  # warm-up steps undone too
    assert [stages for _, stages in fake.seen] == [CPU_STAGES, [], CPU_STAGES, []]


def test_injected_measurements_skip_the_warm_up_unless_asked(pipe, monkeypatch):
    calls = []
    _record_warm_up(monkeypatch, calls)
    decision = decide_yolo_augment(pipe, measure=FakeMeasure(cpu=100.0, gpu=150.0, dataset=pipe.dataset))
    assert calls == [] and decision.warmup_s == 0.0


def test_a_failing_gpu_warm_up_keeps_the_cpu_stages(pipe, monkeypatch):
    calls = []
    _record_warm_up(monkeypatch, calls, fail_gpu=True)
    fake = FakeMeasure(cpu=100.0, gpu=150.0, dataset=pipe.dataset)
    decision = decide_yolo_augment(pipe, measure=fake, warm_up=True)
    assert calls == [("warm-up", False), ("warm-up", True)] and fake.seen == []
    assert not decision.applied and "the gpu warm-up step failed (step)" in decision.verdict
    assert "out of memory" in decision.verdict
    assert active_cpu_stages(pipe.dataset) == CPU_STAGES and not pipe.gpu_augment_active


def test_tune_yolo_decides_first_and_records_the_decision(pipe, monkeypatch):
    import pipeline_opt.integrations.ultralytics._pipeline as yolo_pipeline

    seen = []

    def fake_tune_loader(loader, model, step_fn, device, time_budget_s, **kwargs):
        seen.append((active_cpu_stages(pipe.dataset), step_fn.augment, kwargs))
        return TuneResult(loader=loader, config={"num_workers": 0, "pin_memory": False}, baseline=None, best=None,
                          trials=(), speedup=1.0, verdict="kept")

    monkeypatch.setattr(yolo_pipeline, "tune_loader", fake_tune_loader)
    fake = FakeMeasure(cpu=100.0, gpu=50.0, dataset=pipe.dataset)
    result = tune_yolo(pipe, time_budget_s=3, augment_kwargs={"measure": fake}, max_workers=2)
    assert isinstance(result, YoloTuneResult) and isinstance(result, TuneResult) and len(fake.seen) == 4
    assert seen == [(CPU_STAGES, None, {"max_workers": 2})]  # the loader is tuned for the pipeline kept
    assert result.verdict == "kept" and result.loader is pipe.loader
    saved = result.to_dict()["gpu_augment"]
    assert saved["applied"] is False and saved["cpu_throughput"] == pytest.approx(100.0)
    assert saved["gpu_throughput"] == pytest.approx(50.0) and saved["noise"] == pytest.approx(0.01)
    assert "CPU augmentation stays" in saved["verdict"]


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_gpu_augment_values_are_rejected(yolo_data, bad):
    with pytest.raises(ValueError, match="gpu_augment="):
        build_yolo_pipeline(yolo_data, imgsz=32, batch=4, workers=0, device="cpu", gpu_augment=bad)
    with pytest.raises(ValueError, match="gpu_augment="):
        AttachOptions(gpu_augment=bad)


def test_decision_arguments_are_checked(pipe):
    with pytest.raises(ValueError, match="rounds=0"):
        decide_yolo_augment(pipe, rounds=0)
    with pytest.raises(TypeError, match="augment_kwargs"):
        AttachOptions(augment_kwargs=[1])


class InflatedFirstTrial(FakeMeasure):
    """The first trial of a fresh pipeline reads high (as on the H200: 10-56% in 6 of 8 decisions)."""

    def __init__(self, first: float, **kw) -> None:
        super().__init__(**kw)
        self.first = first

    def __call__(self, *args, **kw):
        m = super().__call__(*args, **kw)
        if len(self.seen) == 1:
            return Measurement(windows=(self.first,) * 3, steps_per_window=m.steps_per_window, batch_size=4,
                               startup_s=0.0, elapsed_s=0.0)
        return m


def test_the_burn_in_trial_is_recorded_and_left_out_of_the_verdict(pipe):
    fake = InflatedFirstTrial(first=300.0, cpu=100.0, gpu=120.0, dataset=pipe.dataset)
    decision = decide_yolo_augment(pipe, measure=fake, burn_in=True)
    assert [gpu for gpu, _ in fake.seen] == [False, False, True, False, True]  # the burn-in is a CPU trial
    assert [stages for _, stages in fake.seen][0] == CPU_STAGES
    assert decision.burn_in_windows == (300.0, 300.0, 300.0) and decision.order == ("cpu", "gpu", "cpu", "gpu")
    assert decision.cpu_throughput == pytest.approx(100.0) and decision.applied  # +20% over the real CPU trials


def test_without_the_burn_in_an_inflated_first_trial_decides(pipe):
    fake = InflatedFirstTrial(first=300.0, cpu=100.0, gpu=120.0, dataset=pipe.dataset)
    decision = decide_yolo_augment(pipe, measure=fake)  # injected measurements: no burn-in unless asked
    assert decision.burn_in_windows == () and not decision.applied


def test_a_failing_burn_in_keeps_the_cpu_stages(pipe):
    class Failing(FakeMeasure):
        def __call__(self, *args, **kw):
            super().__call__(*args, **kw)
            raise TrialFailed("worker_died", "a worker died: killed by signal")

    decision = decide_yolo_augment(pipe, measure=Failing(cpu=100.0, gpu=500.0, dataset=pipe.dataset), burn_in=True)
    assert not decision.applied and "the cpu burn-in trial failed (worker_died)" in decision.verdict
    assert active_cpu_stages(pipe.dataset) == CPU_STAGES and pipe.step_fn.augment is None
