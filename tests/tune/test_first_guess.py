"""The first guess: a capped, data-bound loader with a GPU-decode plan starts with the GPU decode."""

from types import SimpleNamespace

import pytest

from pipeline_opt.tune.candidates import LoaderConfig
from pipeline_opt.tune.first_guess import capped_on_data, combined_guess, gpu_decode_guess
from pipeline_opt.tune.gpu_decode import NVJPEG_WORKERS


def _report(batch_cpu_s: float, compute_s: float, bottleneck: str = "data", wait: float = 0.8):
    return SimpleNamespace(batch_cpu_s=batch_cpu_s, compute_time_s=compute_s, step_time_s=compute_s / (1 - wait),
                           data_wait_frac=wait, bottleneck=bottleneck)


BUDGET = SimpleNamespace(max_workers=15)
PLAN = object()  # any non-None decode plan (nvJPEG or the replay)


def test_a_capped_data_bound_loader_with_a_plan_starts_with_the_gpu_decode_in_a_thread():
    # 1.6 s of worker time per batch / 35 ms per step asks for ~60 workers; the budget allows 15
    report = _report(1.6, 0.035)
    assert capped_on_data(report, None, BUDGET, 0.035)
    guess = gpu_decode_guess(LoaderConfig(15), report, None, BUDGET, 0.035, PLAN)
    assert guess == LoaderConfig(NVJPEG_WORKERS, decode="nvjpeg", pin_memory=True, decode_thread=True)


@pytest.mark.parametrize(("report", "plan", "why"), [
    (_report(1.6, 0.035), None, "no GPU-decode plan"),
    (_report(0.2, 0.035), PLAN, "7 workers fit the budget of 15"),
    (_report(1.6, 0.035, bottleneck="compute", wait=0.1), PLAN, "the step does not wait on data"),
])
def test_otherwise_the_first_guess_stays_on_the_cpu(report, plan, why):
    assert gpu_decode_guess(LoaderConfig(15), report, None, BUDGET, 0.035, plan) is None, why


def test_the_cpu_guess_carries_its_levers_only_when_capped_on_data():
    offload = SimpleNamespace(names=("Normalize",))
    guess, levers = combined_guess(LoaderConfig(15), _report(1.6, 0.035), None, BUDGET, 0.035, offload, None)
    assert guess.gpu_transforms == ("Normalize",) and levers == ["Normalize on the device"]
    guess, levers = combined_guess(LoaderConfig(7), _report(0.2, 0.035), None, BUDGET, 0.035, offload, None)
    assert guess == LoaderConfig(7) and levers == []
