"""Budget arithmetic with injected numbers, and the probe on this machine."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader
from tune_fixtures import CPUBound, SlowIO

from pipeline_opt.tune.budget import affinity_cpus, compute_budget, probe_batch, probe_budget, tensor_bytes

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
