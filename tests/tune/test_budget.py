"""Budget arithmetic with injected numbers, and the probe on this machine."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from tune_fixtures import CPUBound, SlowIO, tiny_model

from pipeline_opt._core.step import tensor_bytes
from pipeline_opt.tune.budget import affinity_cpus, compute_budget, probe_batch, probe_budget

GIB = 2**30
MIB = 2**20


def _budget(**kw):
    args = {"cpus": 16, "ram_available_bytes": 64 * GIB, "ram_per_worker_bytes": 256 * MIB}
    return compute_budget(**{**args, **kw})


def test_cpu_bound_workers_get_the_cores_minus_main_and_pin_threads():
    b = _budget(cpus=16, pin_thread=True, cpu_fraction=1.0)
    assert (b.max_workers, b.binding, b.usable_cpus) == (14, "cpu", 14)
    assert "16 core(s)" in b.reasons[0] and "pin-memory" in b.reasons[0]


def test_local_ranks_share_the_cores():
    b = _budget(cpus=16, local_ranks=4, pin_thread=True)
    assert b.usable_cpus == 2 and b.max_workers == 2


def test_two_cores_cpu_bound_allows_one_worker():
    assert _budget(cpus=2, cpu_fraction=0.95).max_workers == 1


def test_waiting_workers_oversubscribe_but_boundedly():
    assert _budget(cpus=2, cpu_fraction=0.5).max_workers == 2
    assert _budget(cpus=2, cpu_fraction=0.01).max_workers == 8  # OVERSUBSCRIBE per usable core


def test_ram_binds():
    b = _budget(ram_available_bytes=2 * GIB, ram_per_worker_bytes=512 * MIB)
    assert (b.max_workers, b.binding, b.ram_cap) == (3, "ram", 3)


def test_shm_binds_and_checks_prefetch():
    b = _budget(shm_free_bytes=64 * MIB, bytes_per_batch=4 * MIB, prefetch_factor=2)
    assert (b.max_workers, b.binding) == (4, "shm")
    assert b.allows(4, 2) == (True, "")
    ok, why = b.allows(4, 4)
    assert not ok and "/dev/shm" in why and "prefetch 4" in why
    ok, why = b.allows(5, 2)
    assert not ok and "over the budget of 4" in why and "shm" in why


def test_batches_per_epoch_and_user_cap():
    assert _budget(batches_per_epoch=3).binding == "batches"
    b = _budget(user_max=2, batches_per_epoch=2)
    assert (b.max_workers, b.binding) == (2, "user")


@pytest.mark.parametrize("kw", [{"cpus": 0}, {"local_ranks": 0}])
def test_bad_numbers(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        _budget(**kw)


def test_probe_measures_cpu_fraction_and_bytes():
    io = probe_batch(DataLoader(SlowIO(n=16, latency_s=0.01), batch_size=8))
    cpu = probe_batch(DataLoader(CPUBound(n=16, cpu_s=0.005), batch_size=8))
    assert io.bytes == tensor_bytes(next(iter(DataLoader(SlowIO(n=16, latency_s=0), batch_size=8)))) > 0
    assert io.wall_s >= 0.07 and io.cpu_fraction < 0.5
    assert cpu.cpu_fraction > 0.6


def test_probe_budget_on_this_machine(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    b = probe_budget(DataLoader(CPUBound(n=64, cpu_s=0.003), batch_size=8), pin_thread=False)
    assert 1 <= b.max_workers <= max(1, affinity_cpus() - 1)
    assert b.batches_per_epoch == 8 and len(b.reasons) >= 3


# ---------------------------------------------------------------- the training process's reserve, measured


def test_a_main_thread_that_waits_86_percent_does_not_own_a_core():
    # 2 cores, no pinning; per step the training process uses 14% of the time the data takes in total
    step = 0.100
    b = _budget(cpus=2, cpu_fraction=0.95, main_cpu_s=0.14 * step, worker_cpu_s=0.86 * step)
    assert b.max_workers == 2 and b.binding == "cpu"
    assert b.reserved_cpus == pytest.approx(2 * 0.14, rel=1e-6) and b.usable_cpus == pytest.approx(1.72)
    assert "measured 14.0 ms of CPU per step" in b.reasons[0] and "86.0 ms per batch" in b.reasons[0]


def test_a_busy_main_thread_keeps_its_core_and_never_more_than_the_fixed_rule():
    b = _budget(cpus=2, cpu_fraction=0.95, main_cpu_s=0.5, worker_cpu_s=0.4)
    assert (b.max_workers, b.reserved_cpus) == (1, 1.0) and "at most 1, the fixed rule" in b.reasons[0]
    b = _budget(cpus=16, pin_thread=True, main_cpu_s=0.5, worker_cpu_s=0.1)
    assert b.reserved_cpus == 2.0 and b.max_workers == 14


def test_a_data_bound_gpu_step_leaves_the_workers_every_core():
    # 16 cores, ~35 ms of host work per step and ~15 ms of pinning per batch against 2.4 s of decoding
    b = _budget(cpus=16, pin_thread=True, main_cpu_s=0.035, worker_cpu_s=2.4, pin_cpu_s=0.015)
    assert b.max_workers == 16 and b.reserved_cpus < 0.4
    assert "pinning 15.0 ms included" in b.reasons[0]


def test_without_a_measurement_the_fixed_rule_stays():
    b = _budget(cpus=16, pin_thread=True, main_cpu_s=None, worker_cpu_s=2.4)
    assert (b.reserved_cpus, b.max_workers) == (2.0, 14) and "not measured" in b.reasons[0]


def test_measured_cpu_reads_the_profile_and_the_probe():
    from types import SimpleNamespace

    from pipeline_opt.tune.budget import BatchProbe, measured_cpu

    probe = BatchProbe(wall_s=0.5, cpu_s=0.25, bytes=0, pin_cpu_s=0.01)
    report = SimpleNamespace(main_cpu_s=0.02, batch_cpu_s=2.0, loader_config={"num_workers": 4, "pin_memory": False})
    assert measured_cpu(report, probe, pin_thread=True) == (0.02, 1.0, 0.01)
    report.loader_config["pin_memory"] = True  # the profiled process ran the pin-memory thread already
    assert measured_cpu(report, probe, pin_thread=True) == (0.02, 1.0, 0.0)
    assert measured_cpu(None, probe, pin_thread=False) == (None, 0.25, 0.0)


@pytest.mark.timeout(120)
def test_on_two_cores_a_waiting_main_thread_lets_the_tuner_try_two_workers(monkeypatch):
    import pipeline_opt as po
    from pipeline_opt.tune import budget as budget_mod

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(budget_mod, "affinity_cpus", lambda: 2)
    loader = DataLoader(CPUBound(n=64, cpu_s=0.01), batch_size=4)  # 40 ms of CPU per batch, a ~1 ms step
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a second intra-op thread on a shared 2-core machine spins for tens of ms a step
    try:
        report = po.profile(loader, tiny_model(), steps=6, warmup=1, limit=False, trace_steps=0)
    finally:
        torch.set_num_threads(threads)
    assert report.data_wait_frac > 0.6 and 0 < report.main_cpu_s < 0.5 * report.batch_cpu_s
    b = probe_budget(loader, pin_thread=False, report=report)
    assert b.cpus_in_affinity == 2 and b.reserved_cpus < 0.7 and b.max_workers == 2, b.reasons
